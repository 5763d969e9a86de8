"""Triton's gRPC API (KServe's Open Inference Protocol over gRPC) on ``--grpc-port``, spoken by ``tritonclient.grpc``'s
unchanged client (and, for typed ``contents``, the stub tritonclient generates): health, metadata, config,
repository index, statistics, infer with raw and typed tensors and BYTES images, requested outputs, classification,
async and concurrent calls, the errors as Triton's status codes, and the calls it refuses. Each answer is the REST
v2 path's for the same request.

The notf tests serve a numpy model (no TensorFlow: the Triton service needs grpcio and tritonclient alone); the
TensorFlow tests serve the export beside TF Serving's gRPC API on the same port."""

import io
import json
import threading

import numpy as np
import pytest

pytest.importorskip("grpc", reason="needs grpcio ([triton-grpc] or [grpc])")
import tritonclient.grpc as grpcclient
from google.protobuf import json_format
from test_serving_metrics import Model, Running
from test_serving_v2 import echo_model, pngs
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from keras_preact_serving import app, server
from keras_preact_serving.batching import BatchingOptions

pytestmark = pytest.mark.any_backend
NUMPY = [pytest.mark.notf, pytest.mark.once]  # a numpy model: nothing the backend or TensorFlow changes
BATCHING = [None, BatchingOptions(batching_max_size=8, batching_timeout_ms=10)]


def serve(model, batching=None, **kwargs):
    """A ``Running`` server of ``model`` with gRPC on a free port; ``.grpc`` is a tritonclient.grpc client of it."""
    state = app.ServingState(lambda: model, app.RequestLimits(max_request_instances=16, max_body_bytes=1_000_000),
                             batching, **kwargs)
    if not kwargs.get("load_in_background"):
        state.start()
    running = Running(state, server.Server(state, "127.0.0.1", 0, grpc_port=0))
    running.grpc_port = running.server.grpc_address[1]
    running.grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{running.grpc_port}")
    return running


@pytest.fixture(scope="module", params=BATCHING, ids=["unbatched", "batched"])
def numpy_served(request):
    running = serve(Model(), request.param)
    yield running, running.grpc
    running.close()


def x_input(values, datatype="FP32", name="x"):
    tensor = grpcclient.InferInput(name, list(values.shape), datatype)
    return tensor.set_data_from_numpy(values)


def error_of(call):
    """(gRPC status name, message) of the InferenceServerException ``call()`` raises."""
    with pytest.raises(InferenceServerException) as raised:
        call()
    return raised.value.status().removeprefix("StatusCode."), raised.value.message()


def rest_json(running, method, path, body=None):
    status, reply, _ = running.request(method, path, body)
    assert status == 200, reply
    return json.loads(reply)


def as_message(value, message):
    """REST's JSON ``value`` as the protobuf ``message`` (an exact comparison with the gRPC reply)."""
    return json_format.ParseDict(value, message)


@pytest.mark.notf
@pytest.mark.once
def test_health_metadata_config_and_repository_index_are_rest_v2s(numpy_served):
    running, client = numpy_served
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("m") and client.is_model_ready("m", "1")
    assert not client.is_model_ready("other") and not client.is_model_ready("m", "7")
    assert client.get_server_metadata(as_json=True) == rest_json(running, "GET", "/v2") == {
        "name": "keras-preact", "version": "0.1.0",
        "extensions": ["binary_tensor_data", "classification", "model_configuration", "statistics"]}
    metadata = client.get_model_metadata("m")
    assert metadata == as_message(rest_json(running, "GET", "/v2/models/m"), service_pb2.ModelMetadataResponse())
    assert client.get_model_metadata("m", "1", as_json=True) == {
        "name": "m", "versions": ["1"], "platform": "keras_preact",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": ["-1", "2"]}]}  # protobuf's JSON: int64 as strings
    config = client.get_model_config("m", "1")
    assert config == as_message({"config": rest_json(running, "GET", "/v2/models/m/config")},
                                service_pb2.ModelConfigResponse())
    assert config.config.max_batch_size == 16 and config.config.input[0].dims == [2]
    assert config.config.HasField("dynamic_batching") == (running.state.batching is not None)
    assert client.get_model_repository_index() == as_message(
        {"models": rest_json(running, "POST", "/v2/repository/index")}, service_pb2.RepositoryIndexResponse())
    assert client.get_model_repository_index(as_json=True) == {"models": [{"name": "m", "version": "1",
                                                                           "state": "READY"}]}
    for call in (lambda: client.get_model_metadata("m", "7"), lambda: client.get_model_config("m", "7")):
        assert error_of(call) == ("NOT_FOUND", "Request for unknown model: 'm' version 7 is not found; loaded "
                                               "version is 1.")
    assert error_of(lambda: client.get_model_metadata("other")) == (
        "NOT_FOUND", "Request for unknown model: 'other' is not found; serving model 'm'.")


@pytest.mark.notf
@pytest.mark.once
def test_infer_raw_tensors_requested_outputs_and_request_id(numpy_served):
    running, client = numpy_served
    values = np.array([[0.25, 1.5], [2.0, -3.0], [1e-3, 7.0]], np.float32)
    result = client.infer("m", [x_input(values)], model_version="1", request_id="r-1",
                          outputs=[grpcclient.InferRequestedOutput("y")])
    np.testing.assert_array_equal(result.as_numpy("y"), values.sum(axis=1))
    reply = result.get_response()
    assert (reply.model_name, reply.model_version, reply.id) == ("m", "1", "r-1")
    assert [(o.name, o.datatype, list(o.shape)) for o in reply.outputs] == [("y", "FP32", [3])]
    assert list(reply.raw_output_contents) == [values.sum(axis=1).tobytes()]  # outputs raw, as Triton answers
    rest = rest_json(running, "POST", "/v2/models/m/infer", {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [3, 2], "data": values.ravel().tolist()}]})
    assert result.as_numpy("y").tolist() == rest["outputs"][0]["data"]
    assert client.infer("m", [x_input(values)]).get_response().outputs[0].name == "y"  # no outputs named: all
    # gRPC's own compression (REST v2 refuses a compressed body: 415), headers and a client timeout.
    for algorithm in ("gzip", "deflate"):
        compressed = client.infer("m", [x_input(values)], compression_algorithm=algorithm, headers={"x-trace": "1"},
                                  client_timeout=30)
        np.testing.assert_array_equal(compressed.as_numpy("y"), values.sum(axis=1))


@pytest.mark.notf
@pytest.mark.once
def test_infer_typed_contents_as_the_json_data_of_rest_v2(numpy_served):
    """``InferTensorContents`` (the JSON-equivalent typed values), sent with tritonclient's generated stub: the
    datatype's own field, one value per element; other fields, a short count or both ways at once are refused."""
    running, _ = numpy_served
    import grpc

    channel = grpc.insecure_channel(f"127.0.0.1:{running.grpc_port}")
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)

    def request(**contents):
        message = service_pb2.ModelInferRequest(model_name="m")
        message.inputs.add(name="x", datatype="FP32", shape=[2, 2], contents=contents)
        return message

    try:
        reply = stub.ModelInfer(request(fp32_contents=[1, 2, 3.5, 4]), timeout=30)
        assert np.frombuffer(reply.raw_output_contents[0], "<f4").tolist() == [3.0, 7.5]
        cases = [
            (request(int_contents=[1, 2, 3, 4]), "Input 'x' of FP32 takes its values in contents.fp32_contents; "
                                                 "got int_contents."),
            (request(fp32_contents=[1, 2, 3]), "Input 'x': shape [2, 2] holds 4 elements; contents.fp32_contents "
                                               "has 3."),
            (request(fp32_contents=[1, float("nan"), 3, 4]), "Input 'x' holds non-finite values (NaN or infinity); "
                                                             "send finite numbers."),
        ]
        both = request(fp32_contents=[1, 2, 3, 4])
        both.raw_input_contents.append(np.ones(4, "<f4").tobytes())
        cases.append((both, "Input 'x' has both contents and raw_input_contents: send its values one way."))
        short = request()
        short.raw_input_contents.extend([b"", b""])
        cases.append((short, "raw_input_contents holds 2 tensors for 1 inputs: send every input's values there, in "
                             "the inputs' order, or none."))
        for message, details in cases:
            with pytest.raises(grpc.RpcError) as raised:
                stub.ModelInfer(message, timeout=30)
            assert (raised.value.code(), raised.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, details)
    finally:
        channel.close()


@pytest.mark.notf
@pytest.mark.once
def test_errors_are_tritons_status_codes_with_rest_v2s_messages_and_the_server_stays_up(numpy_served):
    running, client = numpy_served
    values = np.ones((2, 2), np.float32)
    cases = [
        (lambda: client.infer("other", [x_input(values)]),
         ("NOT_FOUND", "Request for unknown model: 'other' is not found; serving model 'm'.")),
        (lambda: client.infer("m", [x_input(values)], model_version="7"),
         ("NOT_FOUND", "Request for unknown model: 'm' version 7 is not found; loaded version is 1.")),
        (lambda: client.infer("m", [x_input(np.ones((2, 3), np.float32))]),
         ("INVALID_ARGUMENT", "Input 'x' has shape [2, 3]; the signature expects [N, 2].")),
        (lambda: client.infer("m", [x_input(np.ones((17, 2), np.float32))]),
         ("INVALID_ARGUMENT", "Batch size 17 exceeds the limit of 16.")),
        (lambda: client.infer("m", [x_input(np.array([[np.nan, 1]], np.float32))]),
         ("INVALID_ARGUMENT", "Input 'x' holds non-finite values (NaN or infinity); send finite numbers.")),
        (lambda: client.infer("m", [x_input(values)], outputs=[grpcclient.InferRequestedOutput("z")]),
         ("INVALID_ARGUMENT", "Unknown outputs ['z']; the signature's outputs are ['y'].")),
        (lambda: client.infer("m", [x_input(values)], outputs=[grpcclient.InferRequestedOutput("y", class_count=2)]),
         ("INVALID_ARGUMENT", "Output 'y' is not class scores [N, classes] (it is FP32 [2]): classification "
                              "(class_count) applies to the probabilities output.")),
    ]
    for call, expected in cases:
        assert error_of(call) == expected
    code, message = error_of(lambda: client.infer("m", [x_input(values.astype(np.uint8), "UINT8")]))
    assert code == "INVALID_ARGUMENT" and message.startswith("No signature takes inputs {'x': 'UINT8'}"), message
    code, message = error_of(lambda: client.infer("m", [x_input(values)], parameters={"signature_name": "nope"}))
    assert code == "INVALID_ARGUMENT" and message.startswith("Serving signature name: 'nope' not found"), message
    # The same messages as REST v2 for the same requests (REST: 400 and 404).
    status, reply, _ = running.request("POST", "/v2/models/m/infer", {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 3], "data": [1] * 6}]})
    assert (status, json.loads(reply)["error"]) == (400, cases[2][1][1])
    # A message over --max-body-bytes is refused by gRPC before it is parsed.
    code, message = error_of(lambda: client.infer("m", [x_input(np.ones((1, 2), np.float32)),
                                                        x_input(np.zeros(300_000, np.float32), name="pad")]))
    assert code == "RESOURCE_EXHAUSTED" and "larger than max" in message, message
    # A client's long string (a 90 kB input name) is cut in the error, which would overflow gRPC's metadata limit.
    code, message = error_of(lambda: client.infer("m", [x_input(values, name="i" * 90_000)]))
    whole = f"No signature takes inputs {{'{'i' * 90_000}': 'FP32'}}; the signatures take {{'serving_default': " \
            "{'x': 'FP32'}}."
    assert (code, message) == ("INVALID_ARGUMENT", f"{whole[:2000]}... (90095 characters)"), message[-100:]
    np.testing.assert_array_equal(client.infer("m", [x_input(values)]).as_numpy("y"), [2.0, 2.0])


@pytest.mark.notf
@pytest.mark.once
def test_the_calls_it_does_not_serve_are_refused_with_tritons_codes(numpy_served):
    """No model control (load and unload: UNAVAILABLE, as Triton without explicit model control), no shared memory,
    trace or log settings and no streaming (UNIMPLEMENTED); each a status, never a hang."""
    running, client = numpy_served
    unavailable = "Model load and unload are not supported: the served model is fixed at start (no model control)."
    unimplemented = ("Not supported by this server: shared memory, trace and log settings (send tensors in the "
                     "request).")
    for call in (lambda: client.load_model("m"), lambda: client.unload_model("m")):
        assert error_of(call) == ("UNAVAILABLE", unavailable)
    for call in (client.get_system_shared_memory_status, client.get_cuda_shared_memory_status,
                 lambda: client.register_system_shared_memory("r", "/key", 16),
                 lambda: client.unregister_system_shared_memory("r"), client.get_trace_settings,
                 client.get_log_settings, lambda: client.update_log_settings({"log_info": True})):
        assert error_of(call) == ("UNIMPLEMENTED", unimplemented)
    errors = []
    done = threading.Event()

    def callback(result, error):
        errors.append(error)
        done.set()

    stream_client = grpcclient.InferenceServerClient(f"127.0.0.1:{running.grpc_port}")
    stream_client.start_stream(callback)  # the server ends the stream at once, before any request
    try:
        assert done.wait(30)
    finally:
        stream_client.stop_stream()
    assert errors[0].status() == "StatusCode.UNIMPLEMENTED" and "ModelStreamInfer is not supported" in str(errors[0])
    assert client.is_model_ready("m")


@pytest.mark.notf
@pytest.mark.once
def test_async_and_concurrent_clients_each_get_their_own_answer(numpy_served):
    """async_infer (eight in flight on one client) and eight clients in threads at once: each reply its own
    request's sums, batched together or not."""
    running, client = numpy_served
    requests = [np.full((1 + i % 3, 2), i, np.float32) for i in range(8)]
    results, done = [None] * 8, threading.Semaphore(0)

    def keep(i):
        def callback(result, error):
            results[i] = error if error is not None else result.as_numpy("y")
            done.release()
        return callback

    for i, values in enumerate(requests):
        client.async_infer("m", [x_input(values)], keep(i), request_id=str(i))
    for _ in requests:
        assert done.acquire(timeout=30)
    assert [r.tolist() for r in results] == [v.sum(axis=1).tolist() for v in requests]

    threaded = [None] * 8

    def one_client(i):
        own = grpcclient.InferenceServerClient(f"127.0.0.1:{running.grpc_port}")
        threaded[i] = [own.infer("m", [x_input(requests[i] + round_)]).as_numpy("y").tolist() for round_ in range(3)]
        own.close()

    threads = [threading.Thread(target=one_client, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert threaded == [[(v + r).sum(axis=1).tolist() for r in range(3)] for v in requests]


@pytest.mark.notf
@pytest.mark.once
def test_statistics_count_grpc_inferences_and_equal_rest_v2s(numpy_served):
    running, client = numpy_served

    def stats():
        (entry,) = client.get_inference_statistics("m").model_stats
        return entry

    before = stats()
    client.infer("m", [x_input(np.ones((3, 2), np.float32))])
    client.infer("m", [x_input(np.ones((1, 2), np.float32))], model_version="1")
    assert error_of(lambda: client.infer("m", [x_input(np.ones((17, 2), np.float32))]))[0] == "INVALID_ARGUMENT"
    after = stats()
    assert after.inference_count - before.inference_count == 4
    assert after.execution_count - before.execution_count == 2  # one at a time: a model call each
    assert after.inference_stats.success.count - before.inference_stats.success.count == 2
    assert after.inference_stats.fail.count - before.inference_stats.fail.count == 1
    for phase in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert getattr(after.inference_stats, phase).count - getattr(before.inference_stats, phase).count == 2
    rest = rest_json(running, "GET", "/v2/models/m/stats")
    assert client.get_inference_statistics("m", "1") == client.get_inference_statistics() == as_message(
        rest, service_pb2.ModelStatisticsResponse())
    assert error_of(lambda: client.get_inference_statistics("other"))[0] == "NOT_FOUND"
    total = "keras_preact_serving_requests_total"
    counted = {dict(labels)["code"]: value for (name, labels), value in running.metrics().items()
               if name == total and dict(labels)["api"] == "grpc:v2:infer"}
    assert counted["OK"] >= 2 and counted["INVALID_ARGUMENT"] >= 1, counted


@pytest.mark.notf
@pytest.mark.once
def test_bytes_tensors_carry_encoded_images_raw_and_as_bytes_contents():
    """BYTES elements (length-prefixed raw_input_contents, as tritonclient sends them, or bytes_contents) reach the
    model as the images' bytes, and come back as BYTES; raw elements that do not fit their bytes are refused."""
    running = serve(echo_model())
    try:
        client = running.grpc
        images = pngs((3, 2), (5, 5), (1, 1))
        result = client.infer("m", [x_input(images, "BYTES", name="s")])
        assert result.as_numpy("s_bytes").tolist() == images.tolist()
        assert result.as_numpy("n").tolist() == [len(i) for i in images]
        assert {o.name: o.datatype for o in result.get_response().outputs} == {"n": "INT64", "s_bytes": "BYTES"}
        import grpc

        channel = grpc.insecure_channel(f"127.0.0.1:{running.grpc_port}")
        message = service_pb2.ModelInferRequest(model_name="m")
        message.inputs.add(name="s", datatype="BYTES", shape=[3], contents={"bytes_contents": images.tolist()})
        message.outputs.add(name="n")
        reply = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(message, timeout=30)
        channel.close()
        assert np.frombuffer(reply.raw_output_contents[0], "<i8").tolist() == [len(i) for i in images]
        short = service_pb2.ModelInferRequest(model_name="m")  # an element's length runs past its bytes
        short.inputs.add(name="s", datatype="BYTES", shape=[1])
        short.raw_input_contents.append(b"\x09\x00\x00\x00abc")
        channel = grpc.insecure_channel(f"127.0.0.1:{running.grpc_port}")
        with pytest.raises(grpc.RpcError) as raised:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(short, timeout=30)
        channel.close()
        assert (raised.value.code(), raised.value.details()) == (
            grpc.StatusCode.INVALID_ARGUMENT, "Input 's': an element of 9 bytes runs past its binary data.")
    finally:
        running.close()


@pytest.mark.notf
@pytest.mark.once
def test_not_ready_until_warmed_up_then_served():
    model = Model(block_warm_up=True)
    running = serve(model, load_in_background=True)
    try:
        client = running.grpc
        assert model.warming.wait(30)
        assert client.is_server_live() and not client.is_server_ready() and not client.is_model_ready("m")
        assert error_of(lambda: client.infer("m", [x_input(np.ones((1, 2), np.float32))])) == (
            "UNAVAILABLE", "The model is not loaded yet; retry later.")
        assert client.get_server_metadata().name == "keras-preact"  # answered while loading
        model.warm_up_gate.set()
        assert running.state.ready.wait(30)
        assert client.is_server_ready() and client.is_model_ready("m")
    finally:
        model.warm_up_gate.set()
        running.close()


@pytest.mark.notf
@pytest.mark.once
def test_the_grpc_port_holds_tritons_service_and_tf_servings_where_tensorflow_is():
    """Triton's service needs no TensorFlow: without it the gRPC port serves Triton's alone (and says so at start);
    with TensorFlow and tensorflow-serving-api, TF Serving's beside it."""
    import importlib.util

    running = serve(Model())
    try:
        with_tf = all(importlib.util.find_spec(m) is not None for m in ("tensorflow", "tensorflow_serving"))
        assert running.server.grpc_services == (
            ["TF Serving's PredictionService and ModelService", "Triton's GRPCInferenceService"] if with_tf
            else ["Triton's GRPCInferenceService"])
        assert running.grpc.is_model_ready("m")
    finally:
        running.close()


# ----------------------------------------------------------------------------- a real export (TensorFlow)
@pytest.fixture(scope="module", params=[False, True], ids=["unbatched", "batched"])
def tf_served(exported, request):
    """The export served with gRPC (TF Serving's and Triton's on one port); (running, tritonclient.grpc client,
    tritonclient.http client)."""
    import tritonclient.http as httpclient

    served = server.make_server(exported.parent, port=0, grpc_port=0, max_request_instances=16,
                                enable_batching=request.param)
    running = Running(served.state, served)
    running.grpc_port = served.grpc_address[1]
    yield (running, grpcclient.InferenceServerClient(f"127.0.0.1:{running.grpc_port}"),
           httpclient.InferenceServerClient(f"127.0.0.1:{running.port}"))
    running.close()


def http_input(values, datatype, name):
    import tritonclient.http as httpclient

    return httpclient.InferInput(name, list(values.shape), datatype).set_data_from_numpy(values)


def test_tritonclient_grpc_gets_rest_v2s_answers_for_pixels_floats_and_jpeg_bytes(tf_served):
    """The same requests through tritonclient.grpc and tritonclient.http (the REST v2 path): the same
    probabilities, classes, class names and top-3 classification; metadata and config alike."""
    from test_serving_v2 import jpegs

    from support import images

    running, client, http = tf_served
    assert client.is_server_ready() and client.is_model_ready("cifar", "1")
    assert client.get_model_metadata("cifar") == as_message(http.get_model_metadata("cifar"),
                                                            service_pb2.ModelMetadataResponse())
    assert client.get_model_metadata("cifar").platform == "tensorflow_savedmodel"
    assert client.get_model_config("cifar") == as_message({"config": http.get_model_config("cifar")},
                                                          service_pb2.ModelConfigResponse())
    batch = images(3, seed=5)
    encoded = np.array(jpegs(batch), dtype=object)
    cases = [(batch, "UINT8", "images"), (batch.astype(np.float32), "FP32", "images"),
             (encoded, "BYTES", "image_bytes")]
    for values, datatype, name in cases:
        outputs = [grpcclient.InferRequestedOutput(n) for n in ("class_names", "classes", "probabilities")]
        result = client.infer("cifar", [x_input(values, datatype, name)], outputs=outputs)
        reference = http.infer("cifar", [http_input(values, datatype, name)])
        np.testing.assert_allclose(result.as_numpy("probabilities"), reference.as_numpy("probabilities"), rtol=0,
                                   atol=1e-6, err_msg=datatype)
        assert result.as_numpy("probabilities").dtype == np.float32
        assert result.as_numpy("classes").tolist() == reference.as_numpy("classes").tolist(), datatype
        assert result.as_numpy("class_names").tolist() == reference.as_numpy("class_names").tolist(), datatype
        assert [o.name for o in result.get_response().outputs] == ["class_names", "classes", "probabilities"]
        top = client.infer("cifar", [x_input(values, datatype, name)],
                           outputs=[grpcclient.InferRequestedOutput("probabilities", class_count=3)])
        import tritonclient.http as httpclient

        http_top = http.infer("cifar", [http_input(values, datatype, name)],
                              outputs=[httpclient.InferRequestedOutput("probabilities", class_count=3)])
        assert top.as_numpy("probabilities").tolist() == http_top.as_numpy("probabilities").tolist()
        assert top.as_numpy("probabilities").shape == (3, 3)
    # UINT8 pixels as typed contents (uint_contents), through tritonclient's generated stub.
    import grpc

    channel = grpc.insecure_channel(f"127.0.0.1:{running.grpc_port}")
    message = service_pb2.ModelInferRequest(model_name="cifar")
    message.inputs.add(name="images", datatype="UINT8", shape=batch.shape,
                       contents={"uint_contents": batch.ravel().tolist()})
    message.outputs.add(name="probabilities")
    reply = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(message, timeout=60)
    np.testing.assert_allclose(np.frombuffer(reply.raw_output_contents[0], "<f4").reshape(3, 10),
                               http.infer("cifar", [http_input(batch, "UINT8", "images")]).as_numpy("probabilities"),
                               rtol=0, atol=1e-6)
    message.inputs[0].contents.uint_contents[0] = 300
    with pytest.raises(grpc.RpcError) as raised:
        service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(message, timeout=60)
    channel.close()
    assert (raised.value.code(), raised.value.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT, "Input 'images' values must lie in [0, 255] (uint8).")
    from PIL import Image

    wide = io.BytesIO()
    Image.new("RGB", (90, 10)).save(wide, format="PNG")
    code, message = error_of(lambda: client.infer("cifar", [x_input(np.array([wide.getvalue()], dtype=object),
                                                                    "BYTES", "image_bytes")]))
    assert code == "INVALID_ARGUMENT" and message.endswith("aspect ratio above the limit of 8.0:1."), message
    code, message = error_of(lambda: client.infer("cifar", [x_input(np.array([b"corrupt image"], dtype=object),
                                                                    "BYTES", "image_bytes")]))
    assert code == "INVALID_ARGUMENT" and "is not a JPEG/PNG/GIF/BMP image" in message, message


def test_the_documented_grpc_client_runs_against_this_server(tf_served, tmp_path):
    """The ``tritonclient.grpc`` example of "docs/export-and-serving.md", as written, against this server: only its
    port, the model's name and the image file are this test's. It prints the HTTP v2 path's top-3."""
    from test_docs import run_serving_client

    running, _, http = tf_served
    printed, jpeg = run_serving_client(
        "tests/serving/test_serving_triton_grpc.py", ['InferenceServerClient("localhost:8500")', '"<name>"'],
        {"localhost:8500": f"127.0.0.1:{running.grpc_port}", '"<name>"': '"cifar"'}, tmp_path)
    import tritonclient.http as httpclient

    reference = http.infer("cifar", [http_input(np.array([jpeg], dtype=object), "BYTES", "image_bytes")],
                           outputs=[httpclient.InferRequestedOutput("probabilities", class_count=3)])
    names = http.infer("cifar", [http_input(np.array([jpeg], dtype=object), "BYTES", "image_bytes")])
    assert printed == (f"{names.as_numpy('class_names')}\n{reference.as_numpy('probabilities')}\n")


def test_concurrent_triton_and_tf_serving_grpc_clients_each_get_their_own_images_answer(tf_served):
    """Eight tritonclient.grpc clients and eight TF Serving stubs at once on the one gRPC port, three rounds each of
    its own image (through one batcher when batching): every reply is its image's answer computed alone."""
    import grpc
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    import support

    running, client, http = tf_served
    pool = support.images(16, seed=71)
    alone = [http.infer("cifar", [http_input(pool[i:i + 1], "UINT8", "images")]).as_numpy("probabilities")[0]
             for i in range(16)]
    replies = [[] for _ in range(16)]
    start = threading.Barrier(16)

    def triton_client(i):
        own = grpcclient.InferenceServerClient(f"127.0.0.1:{running.grpc_port}")
        start.wait(30)
        for _ in range(3):
            replies[i].append(own.infer("cifar", [x_input(pool[i:i + 1], "UINT8", "images")]).as_numpy(
                "probabilities")[0])
        own.close()

    def tf_serving_client(i):
        import tensorflow as tf

        channel = grpc.insecure_channel(f"127.0.0.1:{running.grpc_port}")
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "cifar"
        request.inputs["images"].CopyFrom(tf.make_tensor_proto(pool[i:i + 1]))
        start.wait(30)
        for _ in range(3):
            replies[i].append(tf.make_ndarray(stub.Predict(request, 60).outputs["probabilities"])[0])
        channel.close()

    threads = [threading.Thread(target=triton_client if i < 8 else tf_serving_client, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    for i in range(16):
        assert len(replies[i]) == 3, i
        for reply in replies[i]:
            np.testing.assert_allclose(reply, alone[i], rtol=0, atol=1e-5, err_msg=str(i))


@pytest.mark.notf
@pytest.mark.once
def test_a_model_that_failed_to_load_is_not_live():
    """ServerLive is false once loading the model failed (REST's /v2/health/live: 503); ServerReady too."""
    def load():
        raise RuntimeError("broken export")

    state = app.ServingState(load, app.RequestLimits(), load_in_background=True)
    running = Running(state, server.Server(state, "127.0.0.1", 0, grpc_port=0))
    try:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{running.server.grpc_address[1]}")
        import asyncio

        assert asyncio.run(state.loaded(30)) is False and isinstance(state.load_error, RuntimeError)
        assert not client.is_server_live() and not client.is_server_ready() and not client.is_model_ready("m")
        assert running.request("GET", "/v2/health/live")[0] == 503
    finally:
        running.close()


RUNTIMES = {"saved_model": None, "onnx": "onnxruntime", "openvino": "openvino", "litert": "ai_edge_litert"}


@pytest.mark.parametrize("runtime", list(RUNTIMES))
def test_concurrent_triton_clients_on_every_runtime_each_get_their_own_answer(tmp_path_factory, export_copy, runtime):
    """Eight tritonclient.grpc clients at once through the batcher, three rounds each of its own image, on each
    runtime's export (the SavedModel's: four send UINT8 pixels and four JPEG bytes; the others' serve pixels alone):
    every reply equals its request answered alone."""
    from test_serving_v2 import jpegs

    import support

    pytest.importorskip("tensorflow", reason="the export is written with TensorFlow")
    if RUNTIMES[runtime]:
        pytest.importorskip(RUNTIMES[runtime], reason=f"needs {runtime}")
    version = export_copy(tmp_path_factory.mktemp("saved_models"), runtime, formats=(runtime,))
    served = server.make_server(version.parent, port=0, grpc_port=0, runtime=runtime, enable_batching=True,
                                batching_threads=4)
    running = Running(served.state, served)
    pool = support.images(8, seed=31)
    encoded = jpegs(pool)
    with_bytes = "serving_bytes" in served.state.model.signatures  # the SavedModel's; the others take pixels alone
    inputs = [(pool[i:i + 1], "UINT8", "images") if i < 4 or not with_bytes else
              (np.array(encoded[i:i + 1], dtype=object), "BYTES", "image_bytes") for i in range(8)]
    address = f"127.0.0.1:{served.grpc_address[1]}"
    try:
        alone = [grpcclient.InferenceServerClient(address).infer(runtime, [x_input(*args)]).as_numpy(
            "probabilities") for args in inputs]
        replies, start = [[] for _ in inputs], threading.Barrier(len(inputs))

        def client(i):
            own = grpcclient.InferenceServerClient(address)
            start.wait(30)
            for _ in range(3):
                replies[i].append(own.infer(runtime, [x_input(*inputs[i])]).as_numpy("probabilities"))
            own.close()

        threads = [threading.Thread(target=client, args=(i,)) for i in range(len(inputs))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    finally:
        running.close()
    assert [len(r) for r in replies] == [3] * len(inputs)
    wrong = [i for i, got in enumerate(replies) for reply in got
             if not np.allclose(reply, alone[i], rtol=0, atol=1e-5)]
    assert wrong == [], wrong
    assert len({tuple(np.round(a[0], 4)) for a in alone}) == len(inputs)  # eight different answers to tell apart


@pytest.mark.notf
@pytest.mark.once
def test_batched_infers_say_their_model_call_and_are_counted_in_the_batch_sizes(numpy_served):
    """With batching, a ModelInfer runs through the batcher REST shares: its trailing metadata names the model call
    (x-batch-id, x-batch-size), and every model call is in the batch-size histogram."""
    import grpc

    running, _ = numpy_served
    channel = grpc.insecure_channel(f"127.0.0.1:{running.grpc_port}")
    message = service_pb2.ModelInferRequest(model_name="m")
    message.inputs.add(name="x", datatype="FP32", shape=[3, 2])
    message.raw_input_contents.append(np.ones((3, 2), "<f4").tobytes())
    calls = len(running.state.model.calls)
    try:
        _, call = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer.with_call(message, timeout=30)
    finally:
        channel.close()
    trailing = {key: value for key, value in call.trailing_metadata() if key.startswith("x-batch")}
    batched = running.state.batching is not None
    assert (sorted(trailing), trailing.get("x-batch-size")) == ((["x-batch-id", "x-batch-size"], "3") if batched
                                                                else ([], None))
    assert running.state.model.calls[calls:] == [3]


@pytest.mark.notf
@pytest.mark.once
def test_a_model_infer_whose_message_never_arrives_ends_at_the_request_timeout():
    """A ModelInfer whose client sends headers and never its message holds no slot past --request-timeout:
    DEADLINE_EXCEEDED from the server (no client deadline), as for TF Serving's Predict."""
    import grpc

    from support import never_sent_call

    state = app.ServingState(Model, app.RequestLimits(request_timeout=1.0))
    state.start()
    running = Running(state, server.Server(state, "127.0.0.1", 0, grpc_port=0))
    channel = grpc.insecure_channel(f"127.0.0.1:{running.server.grpc_address[1]}")
    open_stuck, release = never_sent_call(channel, "/inference.GRPCInferenceService/ModelInfer",
                                          service_pb2.ModelInferRequest, service_pb2.ModelInferResponse)
    try:
        stuck = open_stuck()
        assert stuck.exception(10) is not None, "the stuck call was not ended by the server"
        assert (stuck.code(), stuck.details()) == (grpc.StatusCode.DEADLINE_EXCEEDED,
                                                   "The request did not arrive within 1 s.")
    finally:
        release.set()
        channel.close()
        running.close()
