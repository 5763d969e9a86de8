"""Every served answer is its own request's: concurrent clients of keras-preact-serve, over REST and gRPC at once,
each sending its own images to every runtime (SavedModel, ONNX, OpenVINO, LiteRT, and the int8 ONNX and OpenVINO
models), batching off and on (four batch threads), each reply compared with its image's answer computed alone in the
test process."""

import http.client
import importlib.util
import json
import threading
import time

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow", reason="the SavedModel runtime and the gRPC client need TensorFlow")
grpc = pytest.importorskip("grpc", reason="needs the grpc extra")
pytest.importorskip("tensorflow_serving", reason="needs the grpc extra")

from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc  # noqa: E402

import support  # noqa: E402
from keras_preact.export import FORMATS, load  # noqa: E402
from keras_preact_serving.server import make_server  # noqa: E402

RUNTIMES = ("saved_model", "onnx", "openvino", "litert", "onnx-int8", "openvino-int8")
MODULES = {"onnx": "onnxruntime", "openvino": "openvino", "litert": "ai_edge_litert", "onnx-int8": "onnxruntime",
           "openvino-int8": "nncf"}
CLIENTS = 8  # per API: 8 REST and 8 gRPC clients at once
ROUNDS = 6  # requests per client


# One distinct image per client and API (uint8 [2 * CLIENTS, 32, 32, 3]).
IMAGES = support.images(2 * CLIENTS, seed=7)


@pytest.fixture(scope="module")
def exported(tmp_path_factory, export_copy):
    """One model per runtime holding that runtime's export alone (copies of conftest's export); an int8 runtime's
    holds the format's float and int8 models (made by ``keras_preact.export.quantize``'s tools, as --quantize int8
    makes them)."""
    from keras_preact.export import quantize

    base = tmp_path_factory.mktemp("saved_models")
    versions = {fmt: export_copy(base, fmt, formats=(fmt,)) for fmt in RUNTIMES if "-" not in fmt}
    for fmt in ("onnx", "openvino"):
        if importlib.util.find_spec(MODULES[f"{fmt}-int8"]) is not None:
            version = versions[f"{fmt}-int8"] = export_copy(base, f"{fmt}-int8", formats=(fmt,))
            float_file, int8_file = FORMATS[fmt].files[0], quantize.INT8_FILES[fmt][0]
            quantize.QUANTIZERS[fmt](str(version / float_file), str(version / int8_file), support.images(16, seed=5))
    return versions


def rest_predict(port, name, image):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("POST", f"/v1/models/{name}:predict", body=json.dumps({"instances": image[None].tolist()}))
    response = conn.getresponse()
    reply = json.loads(response.read())
    conn.close()
    if response.status != 200:
        return response.status, reply
    return 200, np.array(reply["predictions"][0]["probabilities"], np.float32)


def grpc_predict(stub, name, image):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = name
    request.inputs["images"].CopyFrom(tf.make_tensor_proto(image[None]))
    try:
        response = stub.Predict(request, 120)
    except grpc.RpcError as error:
        return error.code().name, error.details()
    return 200, tf.make_ndarray(response.outputs["probabilities"])[0]


@pytest.mark.parametrize("batching", [False, True], ids=["unbatched", "batched"])
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_concurrent_clients_each_get_their_own_images_answer(exported, runtime, batching):
    """8 REST and 8 gRPC clients at once, each sending its own image 6 times: all 96 replies are 200 with that
    image's probabilities (within 1e-5 of the runtime's answer for the image alone)."""
    if runtime in MODULES:
        pytest.importorskip(MODULES[runtime], reason=f"needs {runtime}")
    version = exported[runtime]
    fmt, _, precision = runtime.partition("-")
    runner = load(version, fmt, precision or "fp32")
    expected = [runner.predict(image[None])["probabilities"][0] for image in IMAGES]
    server = make_server(version.parent, port=0, grpc_port=0, runtime=runtime, enable_batching=batching,
                         batching_threads=4)
    assert server.model.signatures["serving_default"] == runtime  # the int8 model where asked for
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port, name = server.server_address[1], runtime
    channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_address[1]}")
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    replies = {index: [] for index in range(len(IMAGES))}
    start = threading.Barrier(2 * CLIENTS)

    def client(index):
        start.wait()
        for _ in range(ROUNDS):
            if index < CLIENTS:
                replies[index].append(rest_predict(port, name, IMAGES[index]))
            else:
                replies[index].append(grpc_predict(stub, name, IMAGES[index]))

    try:
        threads = [threading.Thread(target=client, args=(index,)) for index in range(len(IMAGES))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        channel.close()
        server.shutdown()
        server.server_close()
    failed = [
        (index, status, str(reply)[:200]) for index, got in replies.items() for status, reply in got if status != 200
    ]
    wrong = [index for index, got in replies.items() for status, reply in got
             if status == 200 and not np.allclose(reply, expected[index], rtol=0, atol=1e-5)]
    assert (failed, wrong) == ([], []), (
        f"{len(failed)} failed, {len(wrong)} wrong of {2 * CLIENTS * ROUNDS}: {failed[:3]}"
    )
    assert sum(map(len, replies.values())) == 2 * CLIENTS * ROUNDS


def test_bodies_in_flight_are_bounded_across_rest_and_grpc(exported):
    """A REST upload holding the whole --max-bodies-in-flight-bytes (its Content-Length, stalled) leaves none to another
    REST request (503) or a gRPC one (RESOURCE_EXHAUSTED); once it is gone both are answered."""
    import socket

    pytest.importorskip("onnxruntime", reason="needs ONNX Runtime")
    version = exported["onnx"]
    server = make_server(version.parent, port=0, grpc_port=0, runtime="onnx", max_body_bytes=100_000,
                         max_bodies_in_flight_bytes=100_000)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_address[1]}")
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    try:
        held = socket.create_connection(("127.0.0.1", port), timeout=30)
        held.sendall(b"POST /v1/models/onnx:predict HTTP/1.1\r\nHost: x\r\nContent-Length: 99000\r\n\r\n[")
        deadline = time.monotonic() + 30
        while server.state.bodies.held == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.state.bodies.held == 99_000
        status, reply = rest_predict(port, "onnx", IMAGES[0])
        assert status == 503 and "--max-bodies-in-flight-bytes" in reply["error"], reply
        assert grpc_predict(stub, "onnx", IMAGES[0])[0] == "RESOURCE_EXHAUSTED"
        held.close()
        while server.state.bodies.held and time.monotonic() < deadline:
            time.sleep(0.01)
        assert rest_predict(port, "onnx", IMAGES[0])[0] == 200 and grpc_predict(stub, "onnx", IMAGES[0])[0] == 200
        assert server.state.bodies.held == 0
    finally:
        channel.close()
        server.shutdown()
        server.server_close()


def test_inputs_the_model_turns_into_non_finite_outputs_are_refused(exported):
    """serving_float with finite pixels of 3e38 (the model's outputs overflow to NaN): a 400 on REST, INVALID_ARGUMENT
    on gRPC, never a 500 nor an OK holding NaN; finite pixels in range still answer."""
    version = exported["saved_model"]
    server = make_server(version.parent, port=0, grpc_port=0, runtime="saved_model")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_address[1]}")
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    huge = np.full((1, 32, 32, 3), 3e38, np.float32)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        conn.request("POST", "/v1/models/saved_model:predict",
                     body=json.dumps({"signature_name": "serving_float", "instances": huge.tolist()}))
        response = conn.getresponse()
        reply = json.loads(response.read())
        conn.close()
        assert response.status == 400 and "not finite" in reply["error"], reply
        request = predict_pb2.PredictRequest()
        request.model_spec.name, request.model_spec.signature_name = "saved_model", "serving_float"
        request.inputs["images"].CopyFrom(tf.make_tensor_proto(huge))
        with pytest.raises(grpc.RpcError) as error:
            stub.Predict(request, 120)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "not finite" in error.value.details()
        request.inputs["images"].CopyFrom(tf.make_tensor_proto(np.full((1, 32, 32, 3), 100.0, np.float32)))
        assert np.isfinite(tf.make_ndarray(stub.Predict(request, 120).outputs["probabilities"])).all()
    finally:
        channel.close()
        server.shutdown()
        server.server_close()
