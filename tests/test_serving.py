"""The TF-Serving-compatible REST server: routes, formats, b64, bad requests, concurrent load."""

import base64
import http.client
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
tf = pytest.importorskip("tensorflow", reason="needs TensorFlow")

from keras_preact.export import export_saved_model
from keras_preact.serving.server import make_server
from test_export import CLASS_NAMES, MEAN, STD, make_model

MAX_BATCH = 16
MAX_BODY = 1_000_000


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    base = tmp_path_factory.mktemp("saved_models")
    model = make_model()
    export_saved_model(model, base, name="cifar", class_names=CLASS_NAMES, mean=MEAN, std=STD, top_k=3)
    path = export_saved_model(model, base, name="cifar", class_names=CLASS_NAMES, mean=MEAN, std=STD, top_k=3)
    assert path.name == "2"
    server = make_server(base / "cifar", port=0, max_batch_size=MAX_BATCH, max_body_bytes=MAX_BODY)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    signatures = tf.saved_model.load(str(path)).signatures
    yield server.server_address[1], signatures
    server.shutdown()
    server.server_close()


def request(port, method, path, body=None, connection=None):
    """(status, decoded JSON) of one request; ``body`` is a JSON-able value or raw bytes."""
    conn = connection or http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    reply = json.loads(response.read())
    if connection is None:
        conn.close()
    return response.status, reply


def images(n, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)


def expected(signatures, batch):
    out = signatures["serving_default"](images=tf.constant(batch))
    return {k: v.numpy() for k, v in out.items()}


def test_status_and_metadata_follow_tf_serving(served):
    port, _ = served
    status = {"model_version_status": [
        {"version": "2", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}]}
    assert request(port, "GET", "/v1/models/cifar") == (200, status)
    assert request(port, "GET", "/v1/models/cifar/versions/2") == (200, status)
    code, metadata = request(port, "GET", "/v1/models/cifar/metadata")
    assert code == 200 and metadata["model_spec"] == {"name": "cifar", "signature_name": "", "version": "2"}
    signatures = metadata["metadata"]["signature_def"]["signature_def"]
    assert sorted(signatures) == ["serving_bytes", "serving_default", "serving_float"]
    default = signatures["serving_default"]
    assert default["method_name"] == "tensorflow/serving/predict"
    assert default["inputs"]["images"]["dtype"] == "DT_UINT8"
    assert [d["size"] for d in default["inputs"]["images"]["tensor_shape"]["dim"]] == ["-1", "32", "32", "3"]
    assert sorted(default["outputs"]) == ["class_names", "classes", "probabilities", "scores"]
    assert signatures["serving_bytes"]["inputs"]["image_bytes"]["dtype"] == "DT_STRING"


def test_predict_row_and_columnar_formats(served):
    port, signatures = served
    batch = images(3)
    reference = expected(signatures, batch)
    code, reply = request(port, "POST", "/v1/models/cifar:predict", {"instances": batch.tolist()})
    assert code == 200 and len(reply["predictions"]) == 3
    for i, row in enumerate(reply["predictions"]):
        assert sorted(row) == ["class_names", "classes", "probabilities", "scores"]
        np.testing.assert_allclose(row["probabilities"], reference["probabilities"][i], atol=1e-6)
        assert row["classes"] == reference["classes"][i].tolist()
        assert row["class_names"] == [CLASS_NAMES[c] for c in row["classes"]]
    code, reply = request(port, "POST", "/v1/models/cifar/versions/2:predict",
                          {"signature_name": "serving_float", "inputs": {"images": batch.astype(float).tolist()}})
    assert code == 200
    np.testing.assert_allclose(reply["outputs"]["probabilities"], reference["probabilities"], atol=1e-6)
    assert reply["outputs"]["classes"] == reference["classes"].tolist()


def test_b64_encoded_images(served):
    port, signatures = served
    batch = images(2, seed=3)
    b64 = [{"b64": base64.b64encode(tf.io.encode_png(i).numpy()).decode()} for i in batch]
    reference = expected(signatures, batch)
    for body in ({"signature_name": "serving_bytes", "instances": b64},
                 {"signature_name": "serving_bytes", "instances": [{"image_bytes": v} for v in b64]},
                 {"signature_name": "serving_bytes", "inputs": {"image_bytes": b64}}):
        code, reply = request(port, "POST", "/v1/models/cifar:predict", body)
        assert code == 200, reply
        rows = reply["predictions"] if "predictions" in reply else [
            dict(zip(reply["outputs"], v)) for v in zip(*reply["outputs"].values())]
        np.testing.assert_allclose([r["probabilities"] for r in rows], reference["probabilities"], atol=1e-6)


GOOD = images(1).tolist()
BAD_REQUESTS = [
    ("POST", "/v1/models/cifar:predict", b"{not json", 400, "Invalid JSON"),
    ("POST", "/v1/models/cifar:predict", b"[1, 2]", 400, "JSON object"),
    ("POST", "/v1/models/cifar:predict", {"instances": GOOD, "inputs": GOOD}, 400, "not both"),
    ("POST", "/v1/models/cifar:predict", {"signature_name": "serving_default"}, 400, "exactly one of"),
    ("POST", "/v1/models/cifar:predict", {"instances": []}, 400, "empty batch"),
    ("POST", "/v1/models/cifar:predict", {"inputs": np.zeros((0, 32, 32, 3)).tolist()}, 400, "empty batch"),
    ("POST", "/v1/models/cifar:predict", {"instances": np.zeros((1, 32, 32), int).tolist()}, 400, "expects [N, 32, 32, 3]"),
    ("POST", "/v1/models/cifar:predict", {"instances": np.zeros((1, 16, 16, 3), int).tolist()}, 400, "has shape [1, 16, 16, 3]"),
    ("POST", "/v1/models/cifar:predict", {"instances": [[[[1, 2, 3]]], [[1, 2]]]}, 400, "not a rectangular array"),
    ("POST", "/v1/models/cifar:predict", {"instances": np.full((1, 32, 32, 3), 0.5).tolist()}, 400, "uint8 values"),
    ("POST", "/v1/models/cifar:predict", {"instances": np.full((1, 32, 32, 3), 256).tolist()}, 400, "[0, 255]"),
    ("POST", "/v1/models/cifar:predict", {"instances": [["a"] * 3] * 1}, 400, "uint8 values"),
    ("POST", "/v1/models/cifar:predict", {"signature_name": "serving_bytes", "instances": [{"b64": "%%%"}]}, 400, "not valid base64"),
    ("POST", "/v1/models/cifar:predict", {"signature_name": "serving_bytes",
     "instances": [{"b64": base64.b64encode(b"corrupt image").decode()}]}, 400, "Unknown image file format"),
    ("POST", "/v1/models/cifar:predict", {"signature_name": "serving_bytes", "instances": [[1, 2]]}, 400, "strings"),
    ("POST", "/v1/models/cifar:predict", {"instances": images(MAX_BATCH + 1).tolist()}, 400, "exceeds the limit"),
    ("POST", "/v1/models/cifar:predict", {"signature_name": "nope", "instances": GOOD}, 400, "'nope' not found"),
    ("POST", "/v1/models/cifar:predict", {"instances": [{"wrong": GOOD[0]}]}, 400, "exactly the inputs"),
    ("POST", "/v1/models/cifar:classify", {"instances": GOOD}, 400, "not supported"),
    ("POST", "/v1/models/other:predict", {"instances": GOOD}, 404, "Servable not found"),
    ("POST", "/v1/models/cifar/versions/1:predict", {"instances": GOOD}, 404, "loaded version is 2"),
    ("GET", "/v1/models/other", None, 404, "Servable not found"),
    ("GET", "/v2/anything", None, 404, "Unknown path"),
    ("GET", "/v1/models/cifar:predict", None, 404, "not a TF Serving REST route"),
]


@pytest.mark.parametrize("method, path, body, status, message", BAD_REQUESTS)
def test_bad_requests_get_an_error_reply_and_the_server_stays_up(served, method, path, body, status, message):
    port, _ = served
    code, reply = request(port, method, path, body)
    assert code == status and list(reply) == ["error"] and message in reply["error"], reply
    assert request(port, "GET", "/v1/models/cifar")[0] == 200


def test_body_over_the_limit_is_refused_without_reading_it(served):
    port, _ = served
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.putrequest("POST", "/v1/models/cifar:predict")
    conn.putheader("Content-Length", str(MAX_BODY + 1))
    conn.endheaders()  # no body sent: the reply must come from the header alone
    response = conn.getresponse()
    assert response.status == 400 and "exceeds the limit" in json.loads(response.read())["error"]
    conn.close()


def test_concurrent_load_loses_nothing(served):
    """8 clients x 200 requests on keep-alive connections; every reply is checked."""
    port, signatures = served
    pool = images(16, seed=5)
    reference = expected(signatures, pool)
    clients, per_client = 8, 200
    latencies, failures = [], []
    lock = threading.Lock()

    def client(index):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        rng = np.random.default_rng(index)
        mine = []
        for _ in range(per_client):
            i = int(rng.integers(len(pool)))
            start = time.perf_counter()
            try:
                code, reply = request(port, "POST", "/v1/models/cifar:predict",
                                      {"instances": pool[i : i + 1].tolist()}, connection=conn)
                ok = (code == 200 and reply["predictions"][0]["classes"] == reference["classes"][i].tolist()
                      and np.allclose(reply["predictions"][0]["probabilities"], reference["probabilities"][i], atol=1e-6))
            except Exception as error:  # noqa: BLE001 - counted as a failure
                ok, reply = False, repr(error)
            mine.append(time.perf_counter() - start)
            if not ok:
                with lock:
                    failures.append(reply)
        conn.close()
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    assert failures == []
    assert len(latencies) == clients * per_client
    p50, p99 = np.percentile(np.array(latencies) * 1e3, [50, 99])
    print(f"\n{clients} clients x {per_client} requests: {len(latencies) / wall:.0f} req/s, "
          f"p50 {p50:.1f} ms, p99 {p99:.1f} ms")


def test_console_entry_point_serves_and_rejects_a_bad_directory(served, tmp_path):
    _, signatures = served
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    bad = subprocess.run([sys.executable, "-m", "keras_preact.serving.server", str(tmp_path), "--port", "0"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert bad.returncode == 2 and "no numeric version folder" in bad.stderr
    model = make_model(seed=1)
    export_saved_model(model, tmp_path / "models", name="m", class_names=CLASS_NAMES, mean=MEAN, std=STD)
    process = subprocess.Popen(
        [sys.executable, "-m", "keras_preact.serving.server", str(tmp_path / "models" / "m"), "--port", "0",
         "--model-name", "resnet"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        line = process.stdout.readline()
        assert "Serving model 'resnet' version 1" in line, line
        port = int(line.rsplit(":", 1)[1].split("/")[0])
        code, reply = request(port, "POST", "/v1/models/resnet:predict", {"instances": images(1).tolist()})
        assert code == 200 and len(reply["predictions"][0]["classes"]) == 5
    finally:
        process.terminate()
        process.wait(timeout=30)
