"""KServe's Open Inference Protocol (v2) over HTTP, spoken by ``tritonclient.http`` (Triton's official
client, binary tensor data by default) to keras-preact-serve: health, metadata, infer with binary and
JSON tensors, and the REST limits and errors as v2 ``{"error": ...}`` replies.

The notf tests run a ``server.Server`` in a thread on a numpy model; the TensorFlow tests serve a real
export (``make_server``) and check that uint8 pixels, float pixels and JPEG bytes get REST's
probabilities."""

import base64
import http.client
import io
import json
import re
import struct
import time

import numpy as np
import pytest

httpclient = pytest.importorskip("tritonclient.http")
from test_serving_metrics import Model, Running, labels, started
from tritonclient.utils import InferenceServerException

from keras_preact_serving import app, server
from keras_preact_serving.batching import BatchingOptions

BATCHING = [None, BatchingOptions(batching_max_size=8, batching_timeout_ms=10)]


@pytest.fixture(scope="module", params=BATCHING, ids=["unbatched", "batched"])
def numpy_served(request):
    model = Model()
    running = started(model, request.param)
    yield running, httpclient.InferenceServerClient(f"127.0.0.1:{running.port}")
    running.close()


def x_input(values, datatype="FP32", binary=True, name="x"):
    tensor = httpclient.InferInput(name, list(values.shape), datatype)
    return tensor.set_data_from_numpy(values, binary_data=binary)


def error_of(call):
    """(HTTP status, message) of the InferenceServerException ``call()`` raises."""
    with pytest.raises(InferenceServerException) as raised:
        call()
    return int(raised.value.status()), raised.value.message()


def raw(port, method, path, body=b"", headers=None):
    """(status, headers, body) of one request sent with http.client."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request(method, path, body=body, headers=headers or {})
    response = connection.getresponse()
    reply = response.status, dict(response.getheaders()), response.read()
    connection.close()
    return reply


@pytest.mark.notf
def test_health_and_metadata(numpy_served):
    running, client = numpy_served
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("m")
    assert client.is_model_ready("m", "1") and not client.is_model_ready("other")
    assert client.get_server_metadata() == {"name": "keras-preact", "version": "0.1.0",
                                            "extensions": ["binary_tensor_data", "classification",
                                                           "model_configuration", "statistics"]}
    assert client.get_model_metadata("m") == {"name": "m", "versions": ["1"], "platform": "keras_preact",
                                              "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 2]}],
                                              "outputs": []}
    assert error_of(lambda: client.get_model_metadata("m", "7")) == (
        404, "Request for unknown model: 'm' version 7 is not found; loaded version is 1.")


@pytest.mark.notf
@pytest.mark.parametrize("binary_in", [True, False], ids=["binary-in", "json-in"])
@pytest.mark.parametrize("binary_out", [True, False], ids=["binary-out", "json-out"])
def test_infer_binary_and_json_tensors(numpy_served, binary_in, binary_out):
    running, client = numpy_served
    values = np.array([[0.25, 1.5], [2.0, -3.0], [1e-3, 7.0]], np.float32)
    result = client.infer("m", [x_input(values, binary=binary_in)], model_version="1", request_id="r-1",
                          outputs=[httpclient.InferRequestedOutput("y", binary_data=binary_out)])
    np.testing.assert_array_equal(result.as_numpy("y"), values.sum(axis=1))
    reply = result.get_response()
    assert reply["id"] == "r-1" and (reply["model_name"], reply["model_version"]) == ("m", "1")
    assert reply["outputs"][0]["datatype"] == "FP32" and reply["outputs"][0]["shape"] == [3]
    assert ("parameters" in reply["outputs"][0]) == binary_out
    # No outputs named: all of them, as binary data (what tritonclient asks for).
    assert client.infer("m", [x_input(values, binary=binary_in)]).get_response()["outputs"] == [
        {"name": "y", "datatype": "FP32", "shape": [3], "parameters": {"binary_data_size": 12}}]


@pytest.mark.notf
def test_class_count_on_an_output_that_is_not_class_scores_is_refused(numpy_served):
    """Triton's classification (``class_count``) applies to class scores [N, classes]; elsewhere, or with a
    count that is not a positive integer, a 400 naming the output instead of the full tensor."""
    running, client = numpy_served
    values = np.ones((2, 2), np.float32)
    assert error_of(lambda: client.infer("m", [x_input(values)], outputs=[
        httpclient.InferRequestedOutput("y", class_count=2)])) == (
        400, "Output 'y' is not class scores [N, classes] (it is FP32 [2]): classification (class_count) applies to "
             "the probabilities output.")
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 2], "data": [1, 1, 1, 1]}],
                       "outputs": [{"name": "y", "parameters": {"classification": "two"}}]}).encode()
    status, _, reply = raw(running.port, "POST", "/v2/models/m/infer", body, {"Content-Type": "application/json"})
    assert (status, json.loads(reply)) == (400, {"error": "Output 'y': parameters.classification (class_count) must "
                                                          "be a positive integer; got 'two'."})


@pytest.mark.notf
def test_errors_are_v2_json_with_the_rest_status(numpy_served):
    running, client = numpy_served
    values = np.ones((2, 2), np.float32)
    assert error_of(lambda: client.infer("other", [x_input(values)])) == (
        404, "Request for unknown model: 'other' is not found; serving model 'm'.")
    status, message = error_of(lambda: client.infer("m", [x_input(values.astype(np.uint8), "UINT8")]))
    assert status == 400 and message.startswith("No signature takes inputs {'x': 'UINT8'}")
    status, message = error_of(lambda: client.infer("m", [x_input(np.ones((2, 3), np.float32))]))
    assert (status, message) == (400, "Input 'x' has shape [2, 3]; the signature expects [N, 2].")
    assert error_of(lambda: client.infer("m", [x_input(np.ones((17, 2), np.float32))])) == (
        413, "Batch size 17 exceeds the limit of 16.")
    assert error_of(lambda: client.infer("m", [x_input(np.array([[np.nan, 1]], np.float32))])) == (
        400, "Input 'x' holds non-finite values (NaN or infinity); send finite numbers.")
    assert error_of(lambda: client.infer("m", [x_input(values)], outputs=[httpclient.InferRequestedOutput("z")])) == (
        400, "Unknown outputs ['z']; the signature's outputs are ['y'].")
    assert error_of(lambda: client.infer("m", [x_input(values)], request_compression_algorithm="gzip")) == (
        415, "Content-Encoding 'gzip' is not supported; send the body uncompressed.")
    status, message = error_of(lambda: client.infer("m", [x_input(values)], parameters={"signature_name": "nope"}))
    assert status == 400 and message.startswith("Serving signature name: 'nope' not found")

    port = running.port
    header = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 2],
                                     "parameters": {"binary_data_size": 16}}]}).encode()
    bad = [
        (b"{not json", {}, 400, "Invalid JSON body"),
        (b"[]", {}, 400, "The inference request must be a JSON object."),
        (json.dumps({"inputs": []}).encode(), {}, 400, "must have 'inputs': a non-empty list"),
        (json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 2], "data": [1, 2, 3]}]}).encode(), {},
         400, "Input 'x': shape [2, 2] holds 4 elements; 'data' has 3."),
        (json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": ["a", 1]}]}).encode(), {},
         400, "Input 'x' must hold float32 values"),
        (json.dumps({"inputs": [{"name": "x", "datatype": "FLOAT", "shape": [1, 2], "data": [1, 2]}]}).encode(), {},
         400, "Input 'x' has datatype 'FLOAT'"),
        (json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, -2], "data": [1, 2]}]}).encode(), {},
         400, "Input 'x' has shape [1, -2]"),
        (header + b"\0" * 8, {"Inference-Header-Content-Length": str(len(header))}, 400,
         "Input 'x': binary_data_size 16 runs past the body's binary data (8 bytes left)."),
        (header + b"\0" * 20, {"Inference-Header-Content-Length": str(len(header))}, 400,
         "4 bytes of binary data after the inputs' binary_data_size."),
        (header, {"Inference-Header-Content-Length": "1e3"}, 400, "Invalid Inference-Header-Content-Length '1e3'"),
    ]
    for body, headers, status, message in bad:
        code, _, reply = raw(port, "POST", "/v2/models/m/infer", body, headers)
        assert code == status and message in json.loads(reply)["error"], (body[:60], reply)
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.putrequest("POST", "/v2/models/m/infer")
    connection.putheader("Content-Length", "1000001")
    connection.endheaders()  # no body sent: the reply comes from the header alone
    response = connection.getresponse()
    assert (response.status, json.loads(response.read())) == (
        413, {"error": "Request body of 1000001 bytes exceeds the limit of 1000000 bytes."})
    connection.close()
    assert raw(port, "GET", "/v2/models/m/infer")[0] == 405
    assert raw(port, "POST", "/v2/models/m/ready")[0] == 405
    assert raw(port, "GET", "/v2/nothing")[0] == 404
    code, _, reply = raw(port, "GET", "/v2/models/m/ready")
    assert (code, json.loads(reply)) == (200, {"name": "m", "ready": True})


@pytest.mark.notf
def test_a_batch_of_exactly_max_request_instances_is_served_on_every_route(numpy_served):
    """--max-request-instances 16: 16 examples are answered (v2 binary and JSON, v1 ``instances`` as rows or row objects
    and ``inputs``, whose JSON value count is at its bound), 17 refused with 413."""
    running, client = numpy_served
    values = np.arange(32, dtype=np.float32).reshape(16, 2)
    for binary in (True, False):
        np.testing.assert_array_equal(client.infer("m", [x_input(values, binary=binary)]).as_numpy("y"),
                                      values.sum(axis=1))
    for body, key in (({"instances": values.tolist()}, "predictions"), ({"inputs": values.tolist()}, "outputs"),
                      ({"instances": [{"x": row} for row in values.tolist()]}, "predictions")):
        status, reply, _ = running.request("POST", "/v1/models/m:predict", body)
        assert status == 200, reply
        np.testing.assert_array_equal(np.ravel(json.loads(reply)[key]), values.sum(axis=1))
        over = {name: value + [value[0]] for name, value in body.items()}
        status, reply, _ = running.request("POST", "/v1/models/m:predict", over)
        assert (status, json.loads(reply)) == (413, {"error": "Batch size 17 exceeds the limit of 16."}), reply


@pytest.mark.notf
def test_declared_routes_keep_tf_serving_colons_and_answer_every_other_path_in_json(numpy_served):
    """The routes are declared (``app.ROUTES``): TF Serving's ``:predict`` after a name or a version; any
    other path, a path with a slash more or a newline, and a route asked with another method each get a
    JSON error (405 naming the methods allowed; on /v1, TF Serving's 404)."""
    running, _ = numpy_served
    body = json.dumps({"instances": [[1, 2]]}).encode()
    for path in ("/v1/models/m:predict", "/v1/models/m/versions/1:predict"):
        assert raw(running.port, "POST", path, body)[::2] == (200, b'{"predictions": [3.0]}')
    code, headers, reply = raw(running.port, "POST", "/v1/models/m/versions/1:classify", body)
    assert (code, json.loads(reply)) == (400, {"error": "classify is not supported: the signatures are predict "
                                                        "signatures; use :predict."})
    for method, path, status, message in [
            ("GET", "/v1/models/m:predict", 404, "GET /v1/models/m:predict is not a TF Serving REST route."),
            ("GET", "/v2/health/live/", 404, "Unknown path '/v2/health/live/': GET /openapi.json lists the routes."),
            ("GET", "/v2/models/m%0A/ready", 404, "Request for unknown model: 'm\n' is not found; serving model 'm'."),
            ("DELETE", "/v2/models/m/config", 405, "DELETE /v2/models/m/config: this route answers GET, HEAD."),
            ("GET", "/v2/repository/index", 405, "GET /v2/repository/index: this route answers POST.")]:
        code, headers, reply = raw(running.port, method, path)
        assert (code, json.loads(reply)) == (status, {"error": message}), path
        assert headers["content-type"] == "application/json"


@pytest.mark.notf
def test_malformed_request_fields_are_400_naming_them_before_the_model_runs(numpy_served):
    """Issue 36, case 6: a datatype that is not a string (was a 500, TypeError), outputs' parameters that
    are not an object (was a 500 after the model ran), and an input with both JSON 'data' and binary data
    (was a 200 with 'data' silently ignored) are each a 400 naming the field, and the model never runs."""
    running, _ = numpy_served
    model = running.state.model
    x = {"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}
    cases = [
        ({"inputs": [{**x, "datatype": ["FP32"]}]}, b"", "Input 'x' has datatype ['FP32']: expected one of BOOL"),
        ({"inputs": [x], "outputs": [{"name": "y", "parameters": ["binary_data"]}]}, b"",
         "Output 'y''s 'parameters' must be a JSON object."),
        ({"inputs": [{**x, "parameters": {"binary_data_size": 8}}]}, struct.pack("<2f", 5, 6),
         "Input 'x' has both 'data' and parameters.binary_data_size"),
    ]
    for request, binary, message in cases:
        header = json.dumps(request).encode()
        calls = len(model.calls)
        code, _, reply = raw(running.port, "POST", "/v2/models/m/infer", header + binary,
                             {"Inference-Header-Content-Length": str(len(header))})
        assert (code, len(model.calls)) == (400, calls) and message in json.loads(reply)["error"], reply
    header = json.dumps({"inputs": [x], "outputs": [{"name": "y", "parameters": {"binary_data": False}}]}).encode()
    code, _, reply = raw(running.port, "POST", "/v2/models/m/infer", header)
    assert code == 200 and json.loads(reply)["outputs"][0]["data"] == [3.0], reply


@pytest.mark.notf
def test_triton_model_config_statistics_and_repository_index(numpy_served):
    """Issue 36, case 14 (each a 404 before): tritonclient's get_model_config (Triton's JSON model
    configuration), get_inference_statistics (its statistics extension, from the app's own counters: the
    metrics' requests and model calls) and get_model_repository_index."""
    running, client = numpy_served
    config = {"name": "m", "platform": "keras_preact", "version_policy": {"latest": {"num_versions": 1}},
              "max_batch_size": 16, "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [2]}], "output": []}
    if running.state.batching is not None:
        config["dynamic_batching"] = {"preferred_batch_size": [8], "max_queue_delay_microseconds": 10_000}
    assert client.get_model_config("m") == client.get_model_config("m", "1") == config
    assert error_of(lambda: client.get_model_config("other")) == (
        404, "Request for unknown model: 'other' is not found; serving model 'm'.")
    assert error_of(lambda: client.get_model_config("m", "7"))[0] == 404
    assert client.get_model_repository_index() == [{"name": "m", "version": "1", "state": "READY"}]

    def stats():
        (entry,) = client.get_inference_statistics("m")["model_stats"]
        return entry

    before, started_ms = stats(), time.time() * 1000
    client.infer("m", [x_input(np.ones((3, 2), np.float32))])
    client.infer("m", [x_input(np.ones((1, 2), np.float32))], model_version="1")
    assert error_of(lambda: client.infer("m", [x_input(np.ones((17, 2), np.float32))]))[0] == 413
    assert running.request("POST", "/v1/models/m:predict", {"instances": [[1, 2]]})[0] == 200  # REST's count too
    after = stats()
    assert (after["name"], after["version"]) == ("m", "1") and after["last_inference"] >= started_ms - 1
    assert after["inference_count"] - before["inference_count"] == 5  # examples run
    assert after["execution_count"] - before["execution_count"] == 3  # model calls
    success, fail = after["inference_stats"]["success"], after["inference_stats"]["fail"]
    assert success["count"] - before["inference_stats"]["success"]["count"] == 3
    assert fail["count"] - before["inference_stats"]["fail"]["count"] == 1
    assert (
        success["ns"] > before["inference_stats"]["success"]["ns"]
        and fail["ns"] > before["inference_stats"]["fail"]["ns"]
    )
    # The same counts as the metrics', every request since the server started.
    model, metrics = running.state.model, running.metrics()
    requests = [(dict(labels), value) for (name, labels), value in metrics.items()
                if name == "keras_preact_serving_requests_total" and dict(labels)["api"] in ("v1:predict", "v2:infer")]
    assert success["count"] == sum(value for labels, value in requests if labels["code"] == "200")
    assert fail["count"] == sum(
        value for labels, value in requests if labels["code"] != "200" and labels["model"] == "m"
    )
    assert (after["execution_count"], after["inference_count"]) == (len(model.calls) - 1, sum(model.calls[1:]))
    assert client.get_inference_statistics() == client.get_inference_statistics("m", "1") == {"model_stats": [after]}


MODEL_SECONDS = 0.02  # each call of SlowModel


class SlowModel(Model):
    """``Model`` whose every call takes MODEL_SECONDS more, with class scores too (``scores``: x itself, [N, 2])."""

    def predict(self, signature_name, inputs):
        time.sleep(MODEL_SECONDS)
        return {**super().predict(signature_name, inputs), "scores": np.asarray(inputs["x"], np.float32)}


@pytest.fixture(params=BATCHING, ids=["unbatched", "batched"])
def slow_served(request):
    running = started(SlowModel(), request.param)
    yield running, httpclient.InferenceServerClient(f"127.0.0.1:{running.port}")
    running.close()


PHASES = ("queue", "compute_input", "compute_infer", "compute_output")


@pytest.mark.notf
def test_statistics_time_every_phase_of_each_inference_request(slow_served):
    """Triton's statistics extension (extension_statistics.md): besides success and fail, each successful request's
    queue, compute_input, compute_infer and compute_output, a count and nanoseconds each, measured in the request
    path (issue 58, case 15: no phase was reported). Judged by tritonclient, on REST's both protocols; gRPC's in
    test_serving_grpc.py."""
    running, client = slow_served

    def stats():
        (entry,) = client.get_inference_statistics("m")["model_stats"]
        return entry["inference_stats"]

    before = stats()
    started_at = time.perf_counter()
    requests = 6
    for i in range(requests // 2):
        client.infer("m", [x_input(np.full((2, 2), i, np.float32))])
        assert running.request("POST", "/v1/models/m:predict", {"instances": [[i, 1.0]]})[0] == 200
    elapsed_ns = (time.perf_counter() - started_at) * 1e9
    assert error_of(lambda: client.infer("m", [x_input(np.ones((17, 2), np.float32))]))[0] == 413  # a fail: no phases
    after = stats()
    delta = {
        name: {key: after[name][key] - before.get(name, {}).get(key, 0) for key in ("count", "ns")} for name in after
    }
    assert set(after) == {"success", "fail", *PHASES}
    assert delta["success"]["count"] == requests and delta["fail"]["count"] == 1
    for phase in PHASES:
        assert delta[phase]["count"] == requests and delta[phase]["ns"] > 0, (phase, delta)
    # The phases lie within their requests, the requests within the client's time; the model's own sleep is in
    # compute_infer.
    assert sum(delta[phase]["ns"] for phase in PHASES) <= delta["success"]["ns"] <= elapsed_ns, delta
    assert delta["compute_infer"]["ns"] >= requests * MODEL_SECONDS * 1e9, delta
    if running.state.batching is not None:  # each request alone waits the batching timeout (10 ms) for others
        assert delta["queue"]["ns"] >= requests * 0.9 * running.state.batching.batching_timeout_ms * 1e6, delta


# Each extension of Triton's a client may find in the server metadata: the requests that must answer 200.
EXTENSION_REQUESTS = {
    "binary_tensor_data": [
        lambda client, running: (
            client.infer(
                "m",
                [x_input(np.ones((1, 2), np.float32), binary=True)],
                outputs=[httpclient.InferRequestedOutput("y", binary_data=True)],
            )
            .as_numpy("y")
            .tolist()
            == [2.0]
        )
    ],
    "classification": [
        lambda client, running: (
            client.infer(
                "m",
                [x_input(np.array([[1, 3]], np.float32))],
                outputs=[httpclient.InferRequestedOutput("scores", class_count=1)],
            )
            .as_numpy("scores")
            .tolist()
            == [[b"3.000000:1"]]
        )
    ],
    "model_configuration": [lambda client, running: running.request("GET", "/v2/models/m/config")[0] == 200],
    "statistics": [
        lambda client, running, path=path: running.request("GET", path)[0] == 200
        for path in ("/v2/models/stats", "/v2/models/m/stats", "/v2/models/m/versions/1/stats")
    ],
    "model_repository": [
        lambda client, running, path=path: running.request("POST", path)[0] == 200
        for path in ("/v2/repository/index", "/v2/repository/models/m/load", "/v2/repository/models/m/unload")
    ],
}


@pytest.mark.notf
def test_the_advertised_extensions_are_exactly_those_served(slow_served):
    """The server metadata's extensions name each extension all of whose requests are answered (issue 58, case 15:
    it listed model_repository, whose load and unload were 404s), and no other."""
    running, client = slow_served
    advertised = client.get_server_metadata()["extensions"]
    assert set(advertised) <= set(EXTENSION_REQUESTS), advertised
    served = [name for name, checks in EXTENSION_REQUESTS.items() if all(check(client, running) for check in checks)]
    assert sorted(advertised) == sorted(served)
    assert {"binary_tensor_data", "classification", "model_configuration", "statistics"} <= set(served)


def pngs(*sizes):
    from PIL import Image

    encoded = []
    for width, height in sizes:
        out = io.BytesIO()
        Image.new("RGB", (width, height), (width, 0, 0)).save(out, format="PNG")
        encoded.append(out.getvalue())
    return np.array(encoded, dtype=object)


def echo_model():
    """The numpy model with an "echo" signature: encoded images ``s`` back as ``s_bytes``, and their lengths."""
    model = Model()
    model.input_specs = {**Model.input_specs, "echo": {"s": app.rest.TensorSpec("s", "string", (None,))}}
    model.signatures = {**Model.signatures, "echo": "numpy"}
    predict = model.predict
    model.predict = lambda name, inputs: ({"s_bytes": inputs["s"], "n": np.array([len(s) for s in inputs["s"]])}
                                          if name == "echo" else predict(name, inputs))
    return model


@pytest.mark.notf
def test_bytes_elements_round_trip_and_v2_requests_are_counted():
    model = echo_model()
    running = started(model)
    try:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{running.port}")
        images = pngs((3, 2), (5, 5), (1, 1))
        result = client.infer("m", [x_input(images, "BYTES", name="s")])
        assert result.as_numpy("s_bytes").tolist() == images.tolist()
        assert result.as_numpy("n").tolist() == [len(i) for i in images]
        result = client.infer("m", [x_input(images, "BYTES", name="s")],
                              outputs=[httpclient.InferRequestedOutput("n", binary_data=False)])
        assert result.get_response()["outputs"] == [
            {"name": "n", "datatype": "INT64", "shape": [3], "data": [len(i) for i in images]}]
        status, message = error_of(lambda: client.infer(
            "m", [x_input(images, "BYTES", name="s")],
            outputs=[httpclient.InferRequestedOutput("s_bytes", binary_data=False)]))
        assert (status, message) == (400, "Output 's_bytes' is not UTF-8 text: ask for it as binary data "
                                          "(outputs[].parameters.binary_data).")
        status, message = error_of(lambda: client.infer(
            "m", [x_input(np.array(["text"], dtype=object), "BYTES", binary=False, name="s")]))
        assert (status, message) == (400, NOT_AN_IMAGE)
        header = json.dumps({"inputs": [{"name": "s", "datatype": "BYTES", "shape": [2],
                                         "parameters": {"binary_data_size": 9}}]}).encode()
        code, _, reply = raw(running.port, "POST", "/v2/models/m/infer",
                             header + struct.pack("<I", 1) + b"a" + struct.pack("<I", 9) + b"",
                             {"Inference-Header-Content-Length": str(len(header))})
        assert (code, json.loads(reply)) == (
            400,
            {"error": "Input 's': an element of 9 bytes runs past its binary data."},
        )
        header = json.dumps({"inputs": [{"name": "s", "datatype": "BYTES", "shape": [1000],
                                         "parameters": {"binary_data_size": 8}}]}).encode()
        code, _, reply = raw(running.port, "POST", "/v2/models/m/infer", header + b"\0" * 8,
                             {"Inference-Header-Content-Length": str(len(header))})
        assert (code, json.loads(reply)) == (
            400, {"error": "Input 's': 1000 elements cannot fit in 8 bytes of binary data."})
        total = "keras_preact_serving_requests_total"
        assert {k: v for k, v in running.metrics().items() if k[0] == total} == {
            (total, labels(model="m", api="v2:infer", signature="echo", code="200")): 2,
            (total, labels(model="m", api="v2:infer", signature="echo", code="400")): 4,
        }
    finally:
        running.close()


NOT_AN_IMAGE = ("Input 's'[0] is not a JPEG/PNG/GIF/BMP image: send the image's bytes as binary tensor data "
                "(parameters.binary_data_size) or as a base64 string in 'data'.")


@pytest.mark.notf
def test_v2_json_bytes_as_base64_strings_are_the_images_they_encode():
    """KServe's image examples send an encoded image in JSON as a base64 string (``"datatype": "BYTES"``,
    ``"data": ["<base64>"]``): the model gets the image's bytes, from curl's body and from ``tritonclient.http``'s
    JSON tensors alike; a string that is neither an image nor base64 of one is refused in one line naming both ways."""
    from PIL import Image

    from support import images

    encoded = []
    for image, fmt in zip(images(3, seed=71), ("PNG", "JPEG", "BMP"), strict=True):
        out = io.BytesIO()
        Image.fromarray(image).save(out, format=fmt)
        encoded.append(out.getvalue())
    strings = [base64.b64encode(e).decode("ascii") for e in encoded]
    running = started(echo_model())
    try:
        body = json.dumps({"inputs": [{"name": "s", "datatype": "BYTES", "shape": [3], "data": strings}],
                           "outputs": [{"name": "s_bytes", "parameters": {"binary_data": True}},
                                       {"name": "n"}]}).encode()
        code, headers, reply = raw(running.port, "POST", "/v2/models/m/infer", body,
                                   {"Content-Type": "application/json"})
        assert code == 200, reply
        result = httpclient.InferenceServerClient.parse_response_body(
            reply, header_length=int({k.lower(): v for k, v in headers.items()}["inference-header-content-length"]))
        assert result.as_numpy("s_bytes").tolist() == encoded
        assert result.as_numpy("n").tolist() == [len(e) for e in encoded]
        client = httpclient.InferenceServerClient(f"127.0.0.1:{running.port}")
        result = client.infer("m", [x_input(np.array(strings, dtype=object), "BYTES", binary=False, name="s")])
        assert result.as_numpy("s_bytes").tolist() == encoded
        for text in ("text", base64.b64encode(b"not an image").decode(), "%%%"):
            status, message = error_of(lambda text=text: client.infer(
                "m", [x_input(np.array([text], dtype=object), "BYTES", binary=False, name="s")]))
            assert (status, message) == (400, NOT_AN_IMAGE), text
    finally:
        running.close()


@pytest.mark.notf
def test_not_ready_until_warmed_up():
    model = Model(block_warm_up=True)
    running = started(model, load_in_background=True)
    try:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{running.port}")
        assert model.warming.wait(30)
        assert client.is_server_live() and not client.is_server_ready() and not client.is_model_ready("m")
        status, message = error_of(lambda: client.infer("m", [x_input(np.ones((1, 2), np.float32))]))
        assert (status, message) == (503, "The model is loading or warming up; retry later.")
        model.warm_up_gate.set()
        deadline = time.monotonic() + 30
        while not client.is_server_ready() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert client.is_model_ready("m")
    finally:
        model.warm_up_gate.set()
        running.close()


# ----------------------------------------------------------------------------- a real export (TensorFlow)
@pytest.fixture(scope="module", params=[False, True], ids=["unbatched", "batched"])
def tf_served(exported, request):
    served = server.make_server(exported.parent, port=0, max_request_instances=16, enable_batching=request.param)
    running = Running(served.state, served)
    yield running, httpclient.InferenceServerClient(f"127.0.0.1:{running.port}")
    running.close()


def jpegs(batch):
    from PIL import Image

    encoded = []
    for image in batch:
        out = io.BytesIO()
        Image.fromarray(image).save(out, format="JPEG", quality=90)
        encoded.append(out.getvalue())
    return encoded


def rest_predict(running, body):
    status, reply, _ = running.request("POST", "/v1/models/cifar:predict", body)
    assert status == 200, reply
    return json.loads(reply)["outputs"]


def test_tritonclients_class_count_gets_tritons_score_index_label_strings(tf_served):
    """Triton's classification extension (``InferRequestedOutput(..., class_count=k)``): the top k of each
    row of probabilities as BYTES "score:index:label", highest first, labels from the export's class names;
    a class_count over the classes is capped at them, as Triton does."""
    from support import CLASS_NAMES, images

    running, client = tf_served
    batch = images(2, seed=6)
    probabilities = np.asarray(rest_predict(running, {"inputs": batch.tolist()})["probabilities"], np.float32)
    for binary, class_count in ((True, 3), (False, 3), (True, 40)):
        result = client.infer("cifar", [x_input(batch, "UINT8", name="images")], outputs=[
            httpclient.InferRequestedOutput("probabilities", binary_data=binary, class_count=class_count)])
        top = result.as_numpy("probabilities")
        k = min(class_count, 10)
        assert top.shape == (2, k) and result.get_response()["outputs"][0]["datatype"] == "BYTES"
        for row, strings in zip(probabilities, top, strict=True):
            fields = [(s.decode() if isinstance(s, bytes) else s).split(":") for s in strings]
            indices = [int(index) for _, index, _ in fields]
            assert indices == np.argsort(-row, kind="stable")[:k].tolist()
            assert [label for _, _, label in fields] == [CLASS_NAMES[i] for i in indices]
            np.testing.assert_allclose([float(score) for score, _, _ in fields], row[indices], atol=1e-6)
    assert error_of(lambda: client.infer("cifar", [x_input(batch, "UINT8", name="images")], outputs=[
        httpclient.InferRequestedOutput("classes", class_count=2)])) == (
        400, "Output 'classes' is not class scores [N, classes] (it is INT32 [2, 3]): classification (class_count) "
             "applies to the probabilities output.")


def test_the_documented_v2_client_runs_against_this_server(tf_served, tmp_path):
    """The ``tritonclient.http`` example of "docs/export-and-serving.md", as written, against this module's server:
    only its port and the image file are this test's. It prints REST's top-3 class names and probabilities."""
    import contextlib

    from test_docs import blocks, working_directory

    from support import encode_image, photo_like

    running, _ = tf_served
    [block] = [b for b in blocks("docs/export-and-serving.md")
               if b.marker == "run by" and b.reason == "tests/serving/test_serving_v2.py"]
    assert 'InferenceServerClient("localhost:8501")' in block.code
    code = block.code.replace("localhost:8501", f"127.0.0.1:{running.port}")
    jpeg = encode_image(photo_like(32, 32))
    (tmp_path / "cat.jpg").write_bytes(jpeg)
    printed = io.StringIO()
    with working_directory(tmp_path), contextlib.redirect_stdout(printed):
        exec(compile(code, block.where, "exec"), {"__name__": "docs_v2_client"})  # the documentation's own code
    rest = rest_predict(running, {"signature_name": "serving_bytes",
                                  "inputs": [{"b64": base64.b64encode(jpeg).decode()}]})
    names, scores = printed.getvalue().split("]]", 1)  # numpy may wrap an array's line
    assert re.findall(r"b'(\w+)'", names) == rest["class_names"][0], printed.getvalue()
    top = [(float(score), int(index), label) for score, index, label in re.findall(r"b'([\d.]+):(\d+):(\w+)'", scores)]
    assert [(index, label) for _, index, label in top] == list(zip(rest["classes"][0], rest["class_names"][0]))
    np.testing.assert_allclose([score for score, _, _ in top],
                               np.asarray(rest["probabilities"][0])[rest["classes"][0]], atol=1e-6)


def test_tritonclient_gets_rest_probabilities_for_pixels_floats_and_jpeg_bytes(tf_served):
    running, client = tf_served
    assert client.is_server_ready() and client.is_model_ready("cifar", "1")
    metadata = client.get_model_metadata("cifar")
    assert metadata["platform"] == "tensorflow_savedmodel" and metadata["versions"] == ["1"]
    assert metadata["inputs"] == [{"name": "images", "datatype": "UINT8", "shape": [-1, 32, 32, 3]}]
    assert {o["name"]: o["datatype"] for o in metadata["outputs"]} == {
        "class_names": "BYTES", "classes": "INT32", "probabilities": "FP32", "scores": "FP32"}
    config = client.get_model_config("cifar")  # Triton's model configuration (issue 36, case 14)
    assert (config["platform"], config["max_batch_size"]) == ("tensorflow_savedmodel", 16)
    assert config["input"] == [{"name": "images", "data_type": "TYPE_UINT8", "dims": [32, 32, 3]}]
    assert {o["name"]: (o["data_type"], o["dims"]) for o in config["output"]} == {
        "class_names": ("TYPE_STRING", [3]), "classes": ("TYPE_INT32", [3]), "probabilities": ("TYPE_FP32", [10]),
        "scores": ("TYPE_FP32", [3])}

    from support import images

    batch = images(3, seed=5)
    encoded = jpegs(batch)
    cases = [
        ("serving_default", x_input(batch, "UINT8", name="images"), {"inputs": batch.tolist()}),
        ("serving_default", x_input(batch, "UINT8", binary=False, name="images"), {"inputs": batch.tolist()}),
        ("serving_float", x_input(batch.astype(np.float32), "FP32", name="images"),
         {"signature_name": "serving_float", "inputs": batch.astype(float).tolist()}),
        ("serving_bytes", x_input(np.array(encoded, dtype=object), "BYTES", name="image_bytes"),
         {"signature_name": "serving_bytes", "inputs": [{"b64": base64.b64encode(e).decode()} for e in encoded]}),
        # KServe's image examples: JSON "data" of base64 strings (the serving guide's example).
        ("serving_bytes", x_input(np.array([base64.b64encode(e).decode() for e in encoded], dtype=object), "BYTES",
                                  binary=False, name="image_bytes"),
         {"signature_name": "serving_bytes", "inputs": [{"b64": base64.b64encode(e).decode()} for e in encoded]}),
    ]
    for signature, tensor, rest_body in cases:
        result = client.infer("cifar", [tensor])
        reference = rest_predict(running, rest_body)
        np.testing.assert_allclose(result.as_numpy("probabilities"), reference["probabilities"], rtol=0, atol=1e-6,
                                   err_msg=signature)
        assert result.as_numpy("classes").tolist() == reference["classes"], signature
        assert [[n.decode() for n in row] for row in result.as_numpy("class_names")] == reference["class_names"]
        assert result.as_numpy("probabilities").dtype == np.float32
    # Outputs asked for in JSON: BYTES as strings, numbers as numbers.
    result = client.infer(
        "cifar",
        [cases[0][1]],
        outputs=[
            httpclient.InferRequestedOutput("class_names", binary_data=False),
            httpclient.InferRequestedOutput("classes", binary_data=False),
        ],
    )
    outputs = {o["name"]: o for o in result.get_response()["outputs"]}
    reference = rest_predict(running, cases[0][2])
    assert outputs["class_names"]["shape"] == [3, 3] and outputs["class_names"]["datatype"] == "BYTES"
    assert outputs["class_names"]["data"] == [n for row in reference["class_names"] for n in row]
    assert outputs["classes"]["data"] == [c for row in reference["classes"] for c in row]
    # The same limits as REST: an image over --max-aspect-ratio, read from its header.
    from PIL import Image

    wide = io.BytesIO()
    Image.new("RGB", (90, 10)).save(wide, format="PNG")
    status, message = error_of(lambda: client.infer(
        "cifar", [x_input(np.array([wide.getvalue()], dtype=object), "BYTES", name="image_bytes")]))
    assert status == 413 and message.endswith("aspect ratio above the limit of 8.0:1.")
    status, message = error_of(lambda: client.infer(
        "cifar", [x_input(np.array([b"corrupt image"], dtype=object), "BYTES", name="image_bytes")]))
    assert status == 400 and "is not a JPEG/PNG/GIF/BMP image" in message
