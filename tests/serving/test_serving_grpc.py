"""TF Serving's gRPC API on ``--grpc-port``, spoken by a client written for TF Serving: only the official
``tensorflow-serving-api`` stubs and ``tf.make_tensor_proto``. Same replies as REST (uint8 pixels, float
pixels, JPEG bytes), metadata and status, each error as its gRPC status code, batching off and on, and
SIGTERM draining the gRPC and REST requests in flight. Without TensorFlow (the `notf` test), ``--grpc-port`` is
refused at start in one line."""

import base64
import http.client
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from keras_preact_serving.server import DRAIN_TIMEOUT
from support import images, never_sent_call

HAS_GRPC = all(importlib.util.find_spec(m) is not None for m in ("tensorflow", "grpc", "tensorflow_serving"))
needs_grpc = pytest.mark.skipif(not HAS_GRPC, reason="needs TensorFlow and the grpc extra")

if HAS_GRPC:
    import grpc
    import tensorflow as tf
    from tensorflow.core.protobuf import saved_model_pb2
    from tensorflow_serving.apis import (
        get_model_metadata_pb2,
        get_model_status_pb2,
        model_service_pb2_grpc,
        predict_pb2,
        prediction_service_pb2_grpc,
    )

MAX_BATCH = 4
MAX_BODY = 100_000
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}


def start(exported, batching):
    """(server, (REST port, gRPC port, batching)) of a make_server serving in a thread."""
    from keras_preact_serving.server import make_server

    server = make_server(exported.parent, port=0, grpc_port=0, max_request_instances=MAX_BATCH, max_body_bytes=MAX_BODY,
                         enable_batching=batching)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, (server.server_address[1], server.grpc_address[1], batching)


@pytest.fixture(scope="module")
def served(exported):
    """(REST port, gRPC port, False) of the unbatched server: what is answered or refused before a model call."""
    server, ports = start(exported, False)
    yield ports
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module", params=[False, True], ids=["unbatched", "batched"])
def served_both_ways(exported, request):
    """The unbatched server, then one with dynamic batching: model calls and what is counted of them."""
    if not request.param:
        yield request.getfixturevalue("served")
        return
    server, ports = start(exported, True)
    yield ports
    server.shutdown()
    server.server_close()


# A client program as written for TF Serving.
def predict(port, inputs, signature_name="serving_default", model="cifar", version=None, timeout=30):
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = signature_name
    if version is not None:
        request.model_spec.version.value = version
    for name, value in inputs.items():
        request.inputs[name].CopyFrom(tf.make_tensor_proto(value))
    try:
        response = stub.Predict(request, timeout)
    finally:
        channel.close()
    return {name: tf.make_ndarray(tensor) for name, tensor in response.outputs.items()}


def rest_predict(port, body):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request(
        "POST", "/v1/models/cifar:predict", body=json.dumps(body), headers={"Content-Type": "application/json"}
    )
    response = conn.getresponse()
    reply = json.loads(response.read())
    conn.close()
    assert response.status == 200, reply
    return reply["predictions"]


def batch_size_metric(port, signature):
    """(model calls, examples) of ``signature`` in the served Prometheus batch-size histogram."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/monitoring/prometheus/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    values = {}
    for line in text.splitlines():
        for field in ("count", "sum"):
            if line.startswith(f"keras_preact_serving_batch_size_{field}{{") and f'signature="{signature}"' in line:
                values[field] = float(line.rsplit(" ", 1)[1])
    return values.get("count", 0.0), values.get("sum", 0.0)


@needs_grpc
def test_the_documented_client_runs_against_this_server(served, tmp_path):
    """The gRPC client of "docs/export-and-serving.md", as written, against this module's server: only its port,
    the model's name and the image file are this test's. It prints the REST reply's top-3 classes."""
    from test_docs import run_serving_client

    from support import CLASS_NAMES

    printed, jpeg = run_serving_client(
        "tests/serving/test_serving_grpc.py", ['grpc.insecure_channel("localhost:8500")', 'name = "<name>"'],
        {"localhost:8500": f"localhost:{served[1]}", '"<name>"': '"cifar"'}, tmp_path)
    [rest] = rest_predict(served[0], {"signature_name": "serving_bytes",
                                      "instances": [{"b64": base64.b64encode(jpeg).decode()}]})
    top3 = re.findall(r"b'(\w+)'", printed)
    assert top3 == rest["class_names"] and set(top3) <= set(CLASS_NAMES), printed


def jpegs(batch):
    return [tf.io.encode_jpeg(image).numpy() for image in batch]


@needs_grpc
def test_predict_equals_rest_for_pixels_floats_and_jpeg_bytes(served_both_ways):
    rest_port, grpc_port, batching = served_both_ways
    batch = images(3)
    encoded = jpegs(batch)
    cases = [
        ("serving_default", {"images": batch}, batch.tolist()),
        ("serving_float", {"images": batch.astype(np.float32)}, batch.astype(float).tolist()),
        ("serving_bytes", {"image_bytes": np.array(encoded, dtype=object)},
         [{"b64": base64.b64encode(e).decode()} for e in encoded]),
    ]
    for signature, inputs, instances in cases:
        outputs = predict(grpc_port, inputs, signature)
        rows = rest_predict(rest_port, {"signature_name": signature, "instances": instances})
        assert sorted(outputs) == ["class_names", "classes", "probabilities", "scores"], signature
        assert outputs["probabilities"].dtype == np.float32 and outputs["probabilities"].shape == (3, 10)
        np.testing.assert_allclose(outputs["probabilities"], [r["probabilities"] for r in rows], atol=1e-6, rtol=0)
        np.testing.assert_allclose(outputs["scores"], [r["scores"] for r in rows], atol=1e-6, rtol=0)
        assert outputs["classes"].tolist() == [r["classes"] for r in rows], signature
        assert [[n.decode() for n in row] for row in outputs["class_names"]] == [r["class_names"] for r in rows]
    # With batching the request ran through the batcher, which says so in the trailing metadata.
    channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "cifar"
    request.inputs["images"].CopyFrom(tf.make_tensor_proto(batch))
    _, call = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict.with_call(request, 30)
    channel.close()
    assert {k: v for k, v in call.trailing_metadata() if k == "x-batch-size"} == (
        {"x-batch-size": "3"} if batching else {}
    )
    # Every model call is in the batch-size histogram, gRPC's too, with batching or without.
    before = batch_size_metric(rest_port, "serving_float")
    predict(grpc_port, {"images": images(2).astype(np.float32)}, "serving_float")
    count, total = (after - earlier for after, earlier in zip(batch_size_metric(rest_port, "serving_float"), before))
    assert (count, total) == (1, 2)
    # JPEG is lossy: the bytes signature saw other pixels than the pixel signatures, yet agrees with REST above.
    assert not np.allclose(predict(grpc_port, cases[2][1], "serving_bytes")["probabilities"],
                           predict(grpc_port, cases[0][1])["probabilities"], atol=1e-6)


@needs_grpc
def test_metadata_holds_the_saved_models_signature_defs_and_status_is_available(served, exported):
    _, port, _ = served
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    request.model_spec.name = "cifar"
    response = prediction_service_pb2_grpc.PredictionServiceStub(channel).GetModelMetadata(request, 30)
    assert (response.model_spec.name, response.model_spec.version.value) == ("cifar", 1)
    signature_defs = get_model_metadata_pb2.SignatureDefMap()
    assert response.metadata["signature_def"].Unpack(signature_defs)
    saved_model = saved_model_pb2.SavedModel.FromString((exported / "saved_model.pb").read_bytes())
    own = {k: v for k, v in saved_model.meta_graphs[0].signature_def.items() if not k.startswith("__")}
    assert sorted(signature_defs.signature_def) == sorted(own) == ["serving_bytes", "serving_default", "serving_float"]
    for name, signature_def in own.items():
        assert signature_defs.signature_def[name] == signature_def, name
    assert signature_defs.signature_def["serving_default"].inputs["images"].dtype == tf.uint8.as_datatype_enum

    status_request = get_model_status_pb2.GetModelStatusRequest()
    status_request.model_spec.name = "cifar"
    status = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(status_request, 30)
    [version] = status.model_version_status
    assert version.version == 1
    assert version.state == get_model_status_pb2.ModelVersionStatus.AVAILABLE
    assert version.status.error_code == 0 and version.status.error_message == ""
    channel.close()


def _code(call):
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value.code(), caught.value.details()


@needs_grpc
def test_a_model_spec_without_a_name_or_with_a_version_label_is_invalid_argument_as_in_tf_serving(served):
    """TF Serving's ServerCore: INVALID_ARGUMENT for an empty model name ("ModelSpec has no name specified.")
    and for a version label it does not know ("Unrecognized servable version label: ..."), on every RPC."""
    _, port, _ = served
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    prediction = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    models = model_service_pb2_grpc.ModelServiceStub(channel)
    for spec, message in (({"name": ""}, "ModelSpec has no name specified."),
                          ({"name": "cifar", "version_label": "stable"},
                           "Unrecognized servable version label: stable (this server defines no labels).")):
        request = predict_pb2.PredictRequest()
        request.model_spec.signature_name = "serving_default"
        request.inputs["images"].CopyFrom(tf.make_tensor_proto(images(1)))
        metadata = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
        status = get_model_status_pb2.GetModelStatusRequest()
        for message_spec in (request.model_spec, metadata.model_spec, status.model_spec):
            for field, value in spec.items():
                setattr(message_spec, field, value)
        for rpc, argument in ((prediction.Predict, request), (prediction.GetModelMetadata, metadata),
                              (models.GetModelStatus, status)):
            assert _code(lambda: rpc(argument, 30)) == (grpc.StatusCode.INVALID_ARGUMENT, message)  # noqa: B023
    assert predict(port, {"images": images(1)})["probabilities"].shape == (1, 10)
    channel.close()


@needs_grpc
def test_errors_are_grpc_status_codes_and_the_server_stays_up(served):
    _, port, _ = served
    good = {"images": images(1)}
    s = grpc.StatusCode
    cases = [
        (lambda: predict(port, good, model="other"), s.NOT_FOUND, "Latest(other)"),
        (lambda: predict(port, good, version=7), s.NOT_FOUND, "Specific(cifar, 7)"),
        (lambda: predict(port, good, "serving_nothing"), s.FAILED_PRECONDITION,
         'Serving signature key "serving_nothing" not found'),
        (lambda: predict(port, {"images": images(1).astype(np.float32)}), s.INVALID_ARGUMENT,
         "must be a uint8 tensor; got float32"),
        (lambda: predict(port, {"images": np.zeros((1, 16, 16, 3), np.uint8)}), s.INVALID_ARGUMENT,
         "has shape [1, 16, 16, 3]; the signature expects [N, 32, 32, 3]"),
        (lambda: predict(port, {"pixels": images(1)}), s.INVALID_ARGUMENT, "exactly the inputs ['images']"),
        (lambda: predict(port, {"images": np.zeros((0, 32, 32, 3), np.uint8)}), s.INVALID_ARGUMENT, "empty batch"),
        (lambda: predict(port, {"images": np.full((1, 32, 32, 3), np.nan, np.float32)}, "serving_float"),
         s.INVALID_ARGUMENT, "non-finite"),
        (lambda: predict(port, {"image_bytes": np.array([b"not an image"], dtype=object)}, "serving_bytes"),
         s.INVALID_ARGUMENT, "is not a JPEG/PNG/GIF/BMP image"),
        (lambda: predict(port, {"images": images(MAX_BATCH + 1)}), s.RESOURCE_EXHAUSTED,
         f"Batch size {MAX_BATCH + 1} exceeds the limit of {MAX_BATCH}"),
        (lambda: predict(port, {"image_bytes": np.array([b"\xff" * MAX_BODY], dtype=object)}, "serving_bytes"),
         s.RESOURCE_EXHAUSTED, "larger than max"),
    ]
    for call, code, message in cases:
        got_code, details = _code(call)
        assert got_code == code and message in details, (code, message, got_code, details)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    status_request = get_model_status_pb2.GetModelStatusRequest()
    status_request.model_spec.name = "other"
    assert _code(lambda: model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(status_request, 30))[0] \
        == s.NOT_FOUND
    metadata_request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    metadata_request.model_spec.name = "other"
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    assert _code(lambda: stub.GetModelMetadata(metadata_request, 30))[0] == s.NOT_FOUND
    metadata_request.model_spec.name = "cifar"
    metadata_request.metadata_field[:] = ["labels"]
    assert _code(lambda: stub.GetModelMetadata(metadata_request, 30))[0] == s.INVALID_ARGUMENT
    channel.close()
    assert predict(port, good)["probabilities"].shape == (1, 10)
    assert predict(port, {"images": images(MAX_BATCH)})["probabilities"].shape == (MAX_BATCH, 10)  # the limit itself


def metric_samples(port):
    """{(sample name, frozenset of labels): value} of the served Prometheus metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/monitoring/prometheus/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


@needs_grpc
def test_outputs_fill_the_typed_fields_and_signature_and_filter_errors_are_tf_servings(served_both_ways):
    """Issue 36, case 13: outputs in ``float_val``/``int_val``/``string_val`` as TF Serving's
    ``AsProtoField`` writes them (``tensor_content`` was used), ``tf.make_ndarray`` still reads them; an
    unknown signature is FAILED_PRECONDITION (was NOT_FOUND), a duplicate ``output_filter`` alias
    INVALID_ARGUMENT (was accepted), as in TF Serving's predict_util.cc."""
    _, port, _ = served_both_ways
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "cifar"
    request.inputs["images"].CopyFrom(tf.make_tensor_proto(images(2)))
    try:
        response = stub.Predict(request, 30)
        expected = predict(port, {"images": images(2)})
        probabilities = response.outputs["probabilities"]
        assert probabilities.tensor_content == b"" and len(probabilities.float_val) == 20
        np.testing.assert_array_equal(np.reshape(probabilities.float_val, (2, 10)), expected["probabilities"])
        classes = response.outputs["classes"]
        typed = classes.int64_val if classes.dtype == tf.int64.as_datatype_enum else classes.int_val
        assert classes.tensor_content == b"" and list(typed) == expected["classes"].ravel().tolist()
        assert len(response.outputs["class_names"].string_val) == expected["class_names"].size
        for name, tensor in response.outputs.items():
            assert tensor.tensor_content == b"", name
            np.testing.assert_array_equal(tf.make_ndarray(tensor), expected[name])

        request.output_filter[:] = ["scores"]
        assert sorted(stub.Predict(request, 30).outputs) == ["scores"]
        request.output_filter[:] = ["scores", "classes", "scores"]
        code, details = _code(lambda: stub.Predict(request, 30))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "duplicate output tensor alias" in details, details
        del request.output_filter[:]
        request.model_spec.signature_name = "serving_nothing"
        code, details = _code(lambda: stub.Predict(request, 30))
        assert code == grpc.StatusCode.FAILED_PRECONDITION and "serving_nothing" in details, details
    finally:
        channel.close()


@needs_grpc
def test_metadata_errors_name_the_field_without_echoing_a_long_value(served):
    """Issue 36, case 10: a 90 kB ``metadata_field`` (100 kB on a default server) was echoed into the
    error, past gRPC's metadata limit, so the client saw only "received metadata size exceeds hard limit";
    the error names the field and what is served, quoting at most 40 characters (a long input name, output
    filter or model name alike)."""
    _, port, _ = served
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["x" * 90_000])
    request.model_spec.name = "cifar"
    try:
        code, details = _code(lambda: stub.GetModelMetadata(request, 30))
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details[:200])
        assert "metadata_field" in details and "'signature_def'" in details and "x" * 40 in details, details
        assert "x" * 41 not in details and len(details) < 300, details
        predict_request = predict_pb2.PredictRequest()
        predict_request.model_spec.name = "cifar"
        predict_request.inputs["i" * 90_000].CopyFrom(tf.make_tensor_proto(images(1)[:, :1, :1]))
        code, details = _code(lambda: stub.Predict(predict_request, 30))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "i" * 40 in details and len(details) < 300, details[:200]
        del predict_request.inputs["i" * 90_000]
        predict_request.inputs["images"].CopyFrom(tf.make_tensor_proto(images(1)))
        predict_request.output_filter[:] = ["o" * 90_000]
        code, details = _code(lambda: stub.Predict(predict_request, 30))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "o" * 40 in details and len(details) < 300, details[:200]
        request.metadata_field[:] = ["signature_def"]
        request.model_spec.name = "m" * 90_000
        code, details = _code(lambda: stub.GetModelMetadata(request, 30))
        assert code == grpc.StatusCode.NOT_FOUND and len(details) < 300 and "serving model 'cifar'" in details, \
            (code, details[:200])
    finally:
        channel.close()


@needs_grpc
def test_grpc_requests_are_counted_and_timed_in_the_metrics(served_both_ways):
    """Issue 36, case 11: gRPC requests were missing from ``requests_total`` and the latency histogram;
    each is counted under ``api="grpc:..."`` with its gRPC status name as ``code``, success or failure."""
    rest_port, port, _ = served_both_ways
    before = metric_samples(rest_port)
    predict(port, {"images": images(1)})
    predict(port, {"images": images(2)})
    assert _code(lambda: predict(port, {"images": images(1).astype(np.float32)}))[0] == grpc.StatusCode.INVALID_ARGUMENT
    assert _code(lambda: predict(port, {"images": images(1)}, model="other"))[0] == grpc.StatusCode.NOT_FOUND
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    metadata_request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    metadata_request.model_spec.name = "cifar"
    prediction_service_pb2_grpc.PredictionServiceStub(channel).GetModelMetadata(metadata_request, 30)
    status_request = get_model_status_pb2.GetModelStatusRequest()
    status_request.model_spec.name = "cifar"
    model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(status_request, 30)
    channel.close()
    after = metric_samples(rest_port)

    def grown(name, **values):
        key = (name, frozenset(values.items()))
        return after.get(key, 0) - before.get(key, 0)

    total, latency = "keras_preact_serving_requests_total", "keras_preact_serving_request_latency_seconds"
    predicted = dict(model="cifar", api="grpc:predict", signature="serving_default")
    assert grown(total, **predicted, code="OK") == 2
    assert grown(total, **predicted, code="INVALID_ARGUMENT") == 1
    assert grown(total, model="", api="grpc:predict", signature="", code="NOT_FOUND") == 1
    assert grown(total, model="cifar", api="grpc:metadata", signature="", code="OK") == 1
    assert grown(total, model="cifar", api="grpc:status", signature="", code="OK") == 1
    assert grown(latency + "_count", **predicted) == 3
    assert grown(latency + "_bucket", **predicted, le="+Inf") == 3
    assert 0 < grown(latency + "_sum", **predicted) < 90
    assert grown(latency + "_count", model="", api="grpc:predict", signature="") == 1
    assert grown(latency + "_count", model="cifar", api="grpc:metadata", signature="") == 1


def inference_stats(rest_port):
    """The served model's Triton statistics (``inference_stats``), read over REST."""
    conn = http.client.HTTPConnection("127.0.0.1", rest_port, timeout=30)
    conn.request("GET", "/v2/models/cifar/stats")
    (stats,) = json.loads(conn.getresponse().read())["model_stats"]
    conn.close()
    return stats["inference_stats"]


@needs_grpc
def test_grpc_predicts_time_each_phase_in_tritons_statistics(served_both_ways):
    """Issue 58, case 15: a gRPC Predict's phases (compute_input, queue, compute_infer, compute_output) are
    measured as REST's are and counted in Triton's statistics; a refused one counts as a fail alone."""
    rest_port, port, _ = served_both_ways
    before = inference_stats(rest_port)
    for n in (1, 2, 3):
        predict(port, {"images": images(n)})
    assert _code(lambda: predict(port, {"images": images(1).astype(np.float32)}))[0] == grpc.StatusCode.INVALID_ARGUMENT
    after = inference_stats(rest_port)
    delta = {name: {key: after[name][key] - before[name][key] for key in ("count", "ns")} for name in after}
    assert delta["success"]["count"] == 3 and delta["fail"]["count"] == 1
    phases = ("queue", "compute_input", "compute_infer", "compute_output")
    assert all(delta[phase]["count"] == 3 and delta[phase]["ns"] > 0 for phase in phases), delta
    assert sum(delta[phase]["ns"] for phase in phases) <= delta["success"]["ns"], delta


@needs_grpc
@pytest.mark.parametrize("value", [300, -1, 256])
def test_uint8_values_out_of_range_are_invalid_argument_naming_the_range(served, value):
    """Issue 36, case 7: DT_UINT8 pixels sent in ``int_val`` (int32 on the wire) beyond [0, 255] were
    INTERNAL (an OverflowError); they are INVALID_ARGUMENT with REST's message (REST: 400)."""
    rest_port, port, _ = served
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "cifar"
    tensor = request.inputs["images"]
    tensor.dtype = tf.uint8.as_datatype_enum
    tensor.tensor_shape.dim.extend([tensor.tensor_shape.Dim(size=d) for d in (1, 32, 32, 3)])
    tensor.int_val.extend([7] * (32 * 32 * 3 - 1) + [value])
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        code, details = _code(lambda: prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, 30))
        assert (code, details) == (grpc.StatusCode.INVALID_ARGUMENT,
                                   "Input 'images' values must lie in [0, 255] (uint8)."), details
        tensor.int_val[-1] = 255
        assert prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, 30).outputs
    finally:
        channel.close()
    conn = http.client.HTTPConnection("127.0.0.1", rest_port, timeout=60)
    conn.request("POST", "/v1/models/cifar:predict", body=json.dumps({"instances": [[[[value] * 3] * 32] * 32]}))
    response = conn.getresponse()
    assert (response.status, json.loads(response.read())) == (400, {"error": details})
    conn.close()


@needs_grpc
def test_rpcs_beyond_the_concurrency_limit_are_refused_and_a_draining_server_is_unavailable(exported):
    """max_connections bounds the RPCs in flight (RESOURCE_EXHAUSTED beyond); once shutdown begins, a new
    RPC gets UNAVAILABLE while those in flight are answered."""
    from keras_preact_serving.server import make_server

    # A batching timeout of a minute: the two RPCs wait in the batcher's queue until the shutdown's flush runs them,
    # and that model call waits for ``answer``: they are in flight until the test has seen the draining server refuse.
    server = make_server(exported.parent, port=0, grpc_port=0, max_connections=2, enable_batching=True,
                         batching_timeout_ms=60000, batching_max_size=64)
    answer, model_predict = threading.Event(), server.batcher._predict

    def held_predict(signature_name, inputs):
        answer.wait(60)
        return model_predict(signature_name, inputs)

    server.batcher._predict = held_predict
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    port = server.grpc_address[1]
    held = [None, None]

    def client(i):
        held[i] = predict(port, {"images": images(1, seed=i)}, timeout=60)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(2)]
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        with server.batcher._condition:  # notified by each request the batcher queues
            assert server.batcher._condition.wait_for(lambda: server.batcher._queued >= 2, 60), "not both queued"
        code, details = _code(lambda: predict(port, {"images": images(1)}))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
        stopping = threading.Thread(target=server.shutdown)
        stopping.start()
        # Refused for want of a slot until the drain begins (within its 0.1 s poll), then UNAVAILABLE.
        while (code := _code(lambda: predict(port, {"images": images(1)}))[0]) == grpc.StatusCode.RESOURCE_EXHAUSTED:
            assert time.monotonic() < deadline, "the server did not start draining"
        assert code == grpc.StatusCode.UNAVAILABLE, code
        answer.set()
        for t in threads:
            t.join(60)
        stopping.join(60)
    finally:
        answer.set()
        server.shutdown()
        server.server_close()
    assert [h["probabilities"].shape for h in held] == [(1, 10), (1, 10)]


@needs_grpc
def test_a_predict_whose_message_never_arrives_ends_at_the_request_timeout(exported):
    """Issue 36, case 4: a Predict call whose client sends its headers and never its message (a request
    iterator that blocks: no DATA frame) held one of the ``max_connections`` slots until the client gave
    up; it ends with DEADLINE_EXCEEDED at the server's ``request_timeout`` (no client deadline), normal
    calls are answered meanwhile, and once both slots were held by stuck calls, again after; each is counted
    in the metrics as a REST body that does not arrive is (no route known)."""
    from keras_preact_serving.server import make_server

    timeout = 1.0
    server = make_server(exported.parent, port=0, grpc_port=0, max_connections=2, request_timeout=timeout)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    port = server.grpc_address[1]
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    open_stuck, release = never_sent_call(channel, "/tensorflow.serving.PredictionService/Predict",
                                          predict_pb2.PredictRequest, predict_pb2.PredictResponse)
    try:
        started = time.monotonic()
        first = open_stuck()
        time.sleep(0.2)
        assert predict(port, {"images": images(1)})["probabilities"].shape == (1, 10)  # a slot is free
        second = open_stuck()  # both slots held by calls that send nothing
        for stuck in (first, second):
            assert stuck.exception(timeout + 5) is not None, "the stuck call was not ended by the server"
            assert stuck.code() == grpc.StatusCode.DEADLINE_EXCEEDED, (stuck.code(), stuck.details())
            assert "did not arrive within 1 s" in stuck.details()
        assert timeout <= time.monotonic() - started < timeout + 5
        assert predict(port, {"images": images(1)})["probabilities"].shape == (1, 10)  # the slots were freed
        total = "keras_preact_serving_requests_total"
        counted = metric_samples(server.server_address[1])
        assert counted[(total, frozenset(dict(model="", api="", signature="", code="DEADLINE_EXCEEDED").items()))] == 2
    finally:
        release.set()
        channel.close()
        server.shutdown()
        server.server_close()


@needs_grpc
def test_a_model_not_loaded_yet_is_unavailable():
    import asyncio

    from keras_preact_serving import grpc_service
    from keras_preact_serving.app import ServingState

    state = ServingState(lambda: None)  # not started: no model yet

    async def ask():
        server, port = grpc_service.create_server(state, "127.0.0.1", 0)
        await server.start()
        try:
            return await asyncio.get_running_loop().run_in_executor(
                None, _code, lambda: predict(port, {"images": images(1)}))
        finally:
            await server.stop(None)

    code, details = asyncio.run(ask())
    assert code == grpc.StatusCode.UNAVAILABLE and "not loaded yet" in details


def queue_depth(port, model):
    """The server's ``queue_depth`` gauge for ``model``, read from its Prometheus metrics."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/monitoring/prometheus/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    key = f'keras_preact_serving_queue_depth{{model="{model}"}} '
    return next(float(line[len(key):]) for line in text.splitlines() if line.startswith(key))


@needs_grpc
def test_sigterm_answers_the_rest_and_grpc_requests_in_flight_then_exits_0(exported):
    """keras-preact-serve --grpc-port with every batching flag, named resnet, holding 4 REST and 4 gRPC
    requests (a 120 s batching timeout, longer than the 30 s drain: the batcher runs them once told to exit; SIGTERM
    once the metrics show all 8 waiting): all 8 get their predictions (the export's top 3), then the process exits 0
    well within the drain. (One process for both protocols; test_serving's console test
    serves unbatched.)"""
    process = subprocess.Popen(
        [sys.executable, "-m", "keras_preact_serving.server", str(exported.parent), "--port", "0", "--grpc-port", "0",
         "--model-name", "resnet", "--enable-batching", "--batching-timeout-ms", "120000", "--batching-max-size", "64",
         "--batching-max-queue", "10", "--batching-threads", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=ENV)
    try:
        line = process.stdout.readline()
        assert "Serving model 'resnet' version 1" in line, line
        rest_port = int(line.split("http://127.0.0.1:", 1)[1].split("/")[0])
        line = process.stdout.readline()
        assert line.startswith("gRPC (TF Serving's PredictionService and ModelService, Triton's GRPCInferenceService) "
                               "at 127.0.0.1:"), line
        port = int(line.rsplit(":", 1)[1])
        pool = images(8, seed=21)
        replies = [None] * 8

        def rest_client(i):
            conn = http.client.HTTPConnection("127.0.0.1", rest_port, timeout=60)
            conn.request("POST", "/v1/models/resnet:predict", body=json.dumps({"instances": pool[i:i + 1].tolist()}),
                         headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            replies[i] = response.status, json.loads(response.read())
            conn.close()

        def grpc_client(i):
            replies[i] = predict(port, {"images": pool[i:i + 1]}, model="resnet", timeout=60)

        threads = [threading.Thread(target=rest_client if i < 4 else grpc_client, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while (
            queue_depth(rest_port, "resnet") < 8
        ):  # all 8 wait in the batcher's queue (a fixed sleep raced a loaded CPU)
            assert time.monotonic() < deadline, queue_depth(rest_port, "resnet")
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        for t in threads:
            t.join(60)
        assert process.wait(timeout=60) == 0
        assert time.monotonic() - signalled < DRAIN_TIMEOUT, time.monotonic() - signalled
    finally:
        process.kill()
    reference = tf.saved_model.load(str(exported)).signatures["serving_default"](images=tf.constant(pool))
    classes = reference["classes"].numpy().tolist()
    for i, (code, reply) in enumerate(replies[:4]):  # REST
        assert code == 200 and reply["predictions"][0]["classes"] == classes[i], reply
        assert len(reply["predictions"][0]["classes"]) == 3  # the export's top_k
    for i, reply in enumerate(replies[4:], start=4):  # gRPC
        assert reply is not None and reply["classes"][0].tolist() == classes[i], i


@pytest.mark.notf
def test_grpc_port_without_grpcio_and_tritonclient_is_refused_in_one_line_before_any_work(tmp_path):
    """Without grpcio and tritonclient (hidden from this command line's process), ``--grpc-port`` is refused in one
    line naming what to install, before Keras loads; the gRPC check comes first: the missing directory is not even
    looked at. (Without TensorFlow, Triton's gRPC API is served alone: test_serving_triton_grpc.py.)"""
    hidden = ("import sys; sys.modules.update(grpc=None, tritonclient=None); "
              "from keras_preact_serving.console import serve; sys.exit(serve(sys.argv[1:]))")
    result = subprocess.run([sys.executable, "-c", hidden, str(tmp_path / "absent"), "--grpc-port", "0"],
                            capture_output=True, text=True, timeout=120, env=ENV)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr == (
        "keras-preact-serve: error: --grpc-port (Triton's gRPC API; TF Serving's too with TensorFlow) needs grpcio "
        "and tritonclient; not installed: grpc, tritonclient. Install them with: pip install 'keras-preact[grpc]' "
        "(without TensorFlow: 'keras-preact[triton-grpc]')\n")
