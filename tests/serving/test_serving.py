"""The TF-Serving-compatible REST server: routes, formats, b64, bad requests, concurrent load. Predictions
and concurrent load run with dynamic batching off and on; what is refused or answered before a model call
(status, metadata, bad requests, limits, image headers) runs once, unbatched; the batching tests are at the end."""

import base64
import http.client
import json
import os
import pathlib
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow", reason="needs TensorFlow")

from keras_preact_serving.server import main as server_main
from keras_preact_serving.server import make_server
from support import CLASS_NAMES, images

MAX_BATCH = 16
MAX_BODY = 1_000_000


@pytest.fixture(scope="module")
def exported(tmp_path_factory, export_copy):
    """Versions 1 and 2 (copies of conftest's SavedModel: export's numbering is test_export's); 2 is served."""
    base = tmp_path_factory.mktemp("saved_models")
    export_copy(base, "cifar", version=1)
    return export_copy(base, "cifar", version=2)


def start(exported, batching):
    """(server, port, signatures) of a make_server on ``exported``, serving in a thread."""
    server = make_server(exported.parent, port=0, max_request_instances=MAX_BATCH, max_body_bytes=MAX_BODY,
                         enable_batching=batching)
    assert (server.batcher is not None) == batching
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1], tf.saved_model.load(str(exported)).signatures


@pytest.fixture(scope="module")
def served(exported):
    """(port, signatures) of the unbatched server: everything refused or answered before a model call."""
    server, port, signatures = start(exported, False)
    yield port, signatures
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module", params=[False, True], ids=["unbatched", "batched"])
def served_both_ways(request, exported):
    """(port, signatures) of the unbatched server, then of the same server with dynamic batching: model calls."""
    if not request.param:
        yield request.getfixturevalue("served")
        return
    server, port, signatures = start(exported, True)
    yield port, signatures
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


def test_predict_row_and_columnar_formats(served_both_ways):
    port, signatures = served_both_ways
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
    (
        "POST",
        "/v1/models/cifar:predict",
        {"instances": np.zeros((1, 32, 32), int).tolist()},
        400,
        "expects [N, 32, 32, 3]",
    ),
    (
        "POST",
        "/v1/models/cifar:predict",
        {"instances": np.zeros((1, 16, 16, 3), int).tolist()},
        400,
        "has shape [1, 16, 16, 3]",
    ),
    ("POST", "/v1/models/cifar:predict", {"instances": [[[[1, 2, 3]]], [[1, 2]]]}, 400, "not a rectangular array"),
    ("POST", "/v1/models/cifar:predict", {"instances": np.full((1, 32, 32, 3), 0.5).tolist()}, 400, "uint8 values"),
    ("POST", "/v1/models/cifar:predict", {"instances": np.full((1, 32, 32, 3), 256).tolist()}, 400, "[0, 255]"),
    ("POST", "/v1/models/cifar:predict", {"instances": [["a"] * 3] * 1}, 400, "uint8 values"),
    (
        "POST",
        "/v1/models/cifar:predict",
        {"signature_name": "serving_bytes", "instances": [{"b64": "%%%"}]},
        400,
        "not valid base64",
    ),
    (
        "POST",
        "/v1/models/cifar:predict",
        {"signature_name": "serving_bytes", "instances": [{"b64": base64.b64encode(b"corrupt image").decode()}]},
        400,
        "is not a JPEG/PNG/GIF/BMP image",
    ),
    ("POST", "/v1/models/cifar:predict", {"signature_name": "serving_bytes", "instances": [[1, 2]]}, 400, "strings"),
    ("POST", "/v1/models/cifar:predict", {"instances": images(MAX_BATCH + 1).tolist()}, 413, "exceeds the limit"),
    # A nesting bomb (within the values 16 examples may hold), and numbers that are not finite (strict JSON
    # has no NaN; 1e999 parses to inf).
    ("POST", "/v1/models/cifar:predict", b"[" * 20_000 + b"]" * 20_000, 400, "nested too deeply"),
    ("POST", "/v1/models/cifar:predict", {"instances": [[[[0.0] * 3] * 32] * 32]}, 400, "uint8 values"),
    ("POST", "/v1/models/cifar:predict", b'{"instances": [' + b"1" * 5000 + b"]}", 400, "a number too long"),
    (
        "POST",
        "/v1/models/cifar:predict",
        b'{"signature_name": "serving_float", "instances": ['
        + json.dumps(np.zeros((32, 32, 3)).tolist()).replace("0.0", "NaN", 1).encode()
        + b"]}",
        400,
        "NaN is not a finite number",
    ),
    (
        "POST",
        "/v1/models/cifar:predict",
        b'{"signature_name": "serving_float", "instances": ['
        + json.dumps(np.zeros((32, 32, 3)).tolist()).replace("0.0", "1e999", 1).encode()
        + b"]}",
        400,
        "non-finite values",
    ),
    ("POST", "/v1/models/cifar:predict", {"signature_name": "nope", "instances": GOOD}, 400, "'nope' not found"),
    ("POST", "/v1/models/cifar:predict", {"instances": [{"wrong": GOOD[0]}]}, 400, "exactly the inputs"),
    ("POST", "/v1/models/cifar:classify", {"instances": GOOD}, 400, "not supported"),
    ("POST", "/v1/models/other:predict", {"instances": GOOD}, 404, "Servable not found"),
    ("POST", "/v1/models/cifar/versions/1:predict", {"instances": GOOD}, 404, "loaded version is 2"),
    ("GET", "/v1/models/other", None, 404, "Servable not found"),
    ("GET", "/v2/anything", None, 404, "Unknown path"),
    ("GET", "/v1/models/cifar:predict", None, 404, "not a TF Serving REST route"),
    (
        "POST",
        "/v1/models/cifar/labels/stable:predict",
        {"instances": GOOD},
        400,
        "Unrecognized servable version label: stable",
    ),  # TF Serving's 400 for a label it does not know
    ("GET", "/v1/models/cifar/labels/stable", None, 400, "Unrecognized servable version label: stable"),
    ("GET", "/v1/models/cifar/labels/stable/metadata", None, 400, "Unrecognized servable version label: stable"),
    ("POST", "/v1/models/other/labels/stable:predict", {"instances": GOOD}, 404, "Servable not found"),
]


@pytest.mark.parametrize("method, path, body, status, message", BAD_REQUESTS,
                         ids=[f"{status}-{message}" for _, _, _, status, message in BAD_REQUESTS])
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
    assert response.status == 413 and "exceeds the limit" in json.loads(response.read())["error"]
    conn.close()


def test_concurrent_load_loses_nothing(served_both_ways):
    """8 clients x 50 requests on keep-alive connections, all at once; every reply is checked."""
    port, signatures = served_both_ways
    pool = images(16, seed=5)
    reference = expected(signatures, pool)
    clients, per_client = 8, 50
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
                ok = (
                    code == 200
                    and reply["predictions"][0]["classes"] == reference["classes"][i].tolist()
                    and np.allclose(reply["predictions"][0]["probabilities"], reference["probabilities"][i], atol=1e-6)
                )
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


def test_console_entry_point_serves_and_rejects_a_bad_directory(exported, tmp_path, capsys):
    """Unbatched; the console with every batching flag is test_serving_grpc's SIGTERM test's (REST and gRPC).
    The bad directory is refused by the console's function in this process (no interpreter start for it)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    with pytest.raises(SystemExit) as bad:
        server_main([str(tmp_path), "--port", "0"])
    assert bad.value.code == 2 and "no numeric version folder" in capsys.readouterr().err
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "keras_preact_serving.server",
            str(exported.parent),
            "--port",
            "0",
            "--model-name",
            "resnet",
            "--no-enable-batching",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        line = process.stdout.readline()
        assert "Serving model 'resnet' version 2" in line, line
        port = int(line.rsplit(":", 1)[1].split("/")[0])
        code, reply = request(port, "POST", "/v1/models/resnet:predict", {"instances": images(1).tolist()})
        assert code == 200 and len(reply["predictions"][0]["classes"]) == 3  # the export's top_k
    finally:
        process.terminate()
        process.wait(timeout=30)


# SIGTERM with every batching flag: test_serving_grpc's console server drains REST and gRPC requests in flight.


# ------------------------------------------------------------------------------------- hardening
def test_unread_bodies_never_desynchronise_a_kept_alive_connection(served):
    """A body sent to an unknown model, version or verb is read before the 404, so a request line
    inside it is never answered as a request of its own."""
    port, signatures = served
    smuggled = b"GET /v2/smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    for path in ("/v1/models/other:predict", "/v1/models/cifar/versions/9:predict", "/v1/models/cifar:explode",
                 "/v2/nowhere"):
        code, reply = request(port, "POST", path, smuggled, connection=conn)
        assert code in (400, 404) and "smuggled" not in reply["error"]
        code, reply = request(port, "GET", "/v1/models/cifar", connection=conn)
        assert code == 200 and "model_version_status" in reply, reply
    conn.close()

    # Mixed load: 8 kept-alive clients, bad requests with bodies between good ones; nothing lost.
    pool = images(4, seed=9)
    reference = expected(signatures, pool)
    failures, finished = [], []  # a reset, a desync or an unreadable reply is a failure, not a silent thread death

    def client(index):
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            for k in range(12):
                code, reply = request(port, "POST", "/v1/models/other:predict", smuggled, connection=conn)
                if code != 404 or "smuggled" in reply["error"]:
                    failures.append((index, k, "bad request", code, reply))
                i = (index + k) % len(pool)
                code, reply = request(port, "POST", "/v1/models/cifar:predict",
                                      {"instances": pool[i:i + 1].tolist()}, connection=conn)
                if code != 200 or reply["predictions"][0]["classes"] != reference["classes"][i].tolist():
                    failures.append((index, k, "predict", code, reply))
            conn.close()
            finished.append(index)
        except Exception as error:  # noqa: BLE001 - recorded and asserted below
            failures.append((index, "raised", repr(error)))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert failures == [] and sorted(finished) == list(range(8)) and not any(t.is_alive() for t in threads)


def png_header_only(width, height):
    """A PNG whose header claims width x height (1-bit grey), with a tiny all-zero image stream."""
    import struct
    import zlib

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    row = b"\x00" + b"\x00" * ((width + 7) // 8)
    compressor = zlib.compressobj(9)
    stream = b"".join(compressor.compress(row) for _ in range(height)) + compressor.flush()
    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", stream) + chunk(b"IEND", b"")


def test_decompression_bombs_are_refused_from_their_header(served):
    """A 20000 x 20000 PNG (~50 KB, 1.2 GB decoded to RGB) and a 1 x 20000 sliver are refused with 413
    before anything is decoded: the process's peak memory does not move."""
    import resource

    port, _ = served
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for png, message in ((png_header_only(20_000, 20_000), "the limit is 16777216 pixels per image"),
                         (png_header_only(5_000, 5_000), "25000000 pixels; the limit is"),
                         (png_header_only(20_000, 1), "aspect ratio")):
        assert len(png) < 200_000
        body = {"signature_name": "serving_bytes", "instances": [{"b64": base64.b64encode(png).decode()}]}
        code, reply = request(port, "POST", "/v1/models/cifar:predict", body)
        assert code == 413 and message in reply["error"], reply
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak) / 1024
    assert grown_mib < 100, f"peak memory grew by {grown_mib:.0f} MiB"
    ok = tf.io.encode_png(images(1)[0]).numpy()
    code, _ = request(port, "POST", "/v1/models/cifar:predict",
                      {"signature_name": "serving_bytes", "instances": [{"b64": base64.b64encode(ok).decode()}]})
    assert code == 200


def gif_frames(*colours, side=32):
    """A GIF of one side x side frame per palette index in ``colours`` (each a distinct colour)."""
    import io

    from PIL import Image

    frames = [Image.new("P", (side, side), c) for c in colours]
    for frame in frames:
        frame.putpalette([v for c in range(256) for v in (c, 255 - c, (c * 37) % 256)])
    out = io.BytesIO()
    animation = dict(save_all=True, append_images=frames[1:], duration=40) if len(frames) > 1 else {}
    frames[0].save(out, format="GIF", **animation)
    return out.getvalue()


def gif_bomb(frames, side=1024):
    """``frames`` one-colour frames of side x side, ~2 kB of LZW data each: 1,500 at 1024 x 1024 are the
    2.8 MB file of issue 36 (case 3), which giflib decompressed whole: +1.5 GB, 15 s."""
    one = gif_frames(1, side=side)
    head = 13 + ((3 << ((one[10] & 7) + 1)) if one[10] & 0x80 else 0)  # header, screen, global palette
    assert one.endswith(b";")
    return one[:head] + one[head:-1] * frames + b";"


def test_an_animated_gif_is_served_from_its_first_frame_without_decoding_the_rest(served):
    """The graph keeps a GIF's first frame, but its decoder reads every frame first: the server cuts the
    GIF after its first frame before the model sees it (nothing decoded). 300 frames of 1024 x 1024 in
    0.6 MB (~300 MB and seconds when decoded whole) leave the peak memory where it was; an animation's
    reply is its first frame's; a first frame larger than its canvas counts against the pixel limit."""
    port, _ = served

    def predict(gif):
        body = {"signature_name": "serving_bytes", "instances": [{"b64": base64.b64encode(gif).decode()}]}
        return request(port, "POST", "/v1/models/cifar:predict", body)

    code, first = predict(gif_frames(40))
    assert code == 200, first
    assert predict(gif_frames(40, 200, 90)) == (200, first)

    bomb = gif_bomb(300)
    assert len(bomb) < 700_000
    def kib(field):  # this process's (the server's) memory, from /proc/self/status
        status = dict(line.split(":", 1) for line in pathlib.Path("/proc/self/status").read_text().splitlines())
        return int(status[field].split()[0])

    pathlib.Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM, the peak RSS, to the current RSS
    before, started = kib("VmRSS"), time.perf_counter()
    code, reply = predict(bomb)
    took, grown_mib = time.perf_counter() - started, (kib("VmHWM") - before) / 1024
    assert code == 200 and len(reply["predictions"]) == 1, reply
    assert grown_mib < 100, f"the peak memory grew by {grown_mib:.0f} MiB in {took:.1f} s"

    wide = bytearray(gif_frames(40, side=8))
    head = 13 + (3 << ((wide[10] & 7) + 1))
    assert wide[head] == 0x2C  # the first frame's descriptor: left, top, width, height
    wide[head + 5:head + 9] = (5000).to_bytes(2, "little") * 2
    code, reply = predict(bytes(wide))
    assert code == 413 and "(GIF 5000x5000) has 25000000 pixels" in reply["error"], reply


def test_idle_and_surplus_connections_are_bounded(exported):
    """(A body that never arrives gets its 408 in test_serving_connections, in every pass.)"""
    import socket

    server = make_server(exported.parent, port=0, request_timeout=2, max_connections=2)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    port = server.server_address[1]
    try:
        # Two idle connections hold both slots; a third is answered 503 at once, without a thread.
        # The loop admits connections in the order the kernel's accept queue holds them: the two idle ones first.
        idle = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(2)]
        extra = socket.create_connection(("127.0.0.1", port), timeout=10)
        assert extra.recv(4096).startswith(b"HTTP/1.1 503")
        extra.close()
        # Idle connections are closed after the timeout, which frees the slots.
        for sock in idle:
            assert sock.recv(4096) == b""
            sock.close()
        deadline = time.monotonic() + 30  # the server frees a slot once its side of the connection is lost
        while (status := request(port, "GET", "/v1/models/cifar")[0]) == 503 and time.monotonic() < deadline:
            pass
        assert status == 200
    finally:
        server.shutdown()
        server.server_close()


def test_server_limits_are_validated(exported, capsys):
    for argument, value in (
        ("request_timeout", 0),
        ("max_connections", 0),
        ("max_image_pixels", -1),
        ("max_aspect_ratio", 0.5),
        ("request_timeout", float("nan")),
        ("batching_max_size", 0),
        ("batching_timeout_ms", -1),
        ("batching_timeout_ms", float("inf")),
        ("batching_max_queue", 1.5),
        ("batching_threads", 0),
        ("enable_batching", "yes"),
    ):
        with pytest.raises(ValueError, match=f"Invalid {argument}="):
            make_server(exported.parent, port=0, **{"enable_batching": True, argument: value})
    # The flags go through the same checks, before the model is loaded.
    with pytest.raises(SystemExit) as exit_:
        server_main([str(exported.parent), "--port", "0", "--enable-batching", "--batching-timeout-ms", "-1"])
    assert exit_.value.code == 2
    assert "Invalid batching_timeout_ms=-1.0: expected a number >= 0." in capsys.readouterr().err


# ------------------------------------------------------------------------------ dynamic batching
MERGE = 8  # batching_max_size of the batched_server: every burst below sends a multiple of it


@pytest.fixture(scope="module")
def batched_server(exported):
    """Batches close only when full (a 60 s timeout), so each burst of MERGE requests is exactly one call."""
    before = set(threading.enumerate())
    server = make_server(exported.parent, port=0, enable_batching=True, batching_max_size=MERGE,
                         batching_timeout_ms=60_000)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    assert sum(t.name.startswith("keras-preact-batcher") for t in set(threading.enumerate()) - before) == 1
    yield server
    server.shutdown()
    server.server_close()  # joins the batcher's thread
    thread.join(30)
    assert not [t for t in set(threading.enumerate()) - before if t.name.startswith("keras-preact-batcher")]


def burst(port, bodies):
    """POST each body from its own client thread, all released together: [(status, reply)] in order."""
    replies = [None] * len(bodies)
    barrier = threading.Barrier(len(bodies))

    def client(i):
        barrier.wait()
        replies[i] = request(port, "POST", "/v1/models/cifar:predict", bodies[i])

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return replies


def png_b64(image):
    return {"b64": base64.b64encode(tf.io.encode_png(image).numpy()).decode()}


def test_batched_replies_equal_direct_calls_under_16_concurrent_clients(batched_server, exported):
    """16 clients, single images: 16 requests -> 2 model calls of 8; then 8 + 8 on two signatures -> one
    call each (never merged across signatures); then 8 encoded PNGs -> one call. Every reply equals the
    SavedModel called directly on that request's image alone."""
    port = batched_server.server_address[1]
    signatures = tf.saved_model.load(str(exported)).signatures
    pool = images(16, seed=11)
    bursts = [
        ([{"instances": pool[i : i + 1].tolist()} for i in range(16)], {"serving_default": 2}),
        (
            [{"signature_name": "serving_default", "instances": pool[i : i + 1].tolist()} for i in range(8)]
            + [
                {"signature_name": "serving_float", "instances": pool[i : i + 1].astype(float).tolist()}
                for i in range(8, 16)
            ],
            {"serving_default": 1, "serving_float": 1},
        ),
        (
            [{"signature_name": "serving_bytes", "instances": [png_b64(pool[i])]} for i in range(8)],
            {"serving_bytes": 1},
        ),
    ]
    worst = 0.0
    for bodies, calls in bursts:
        before = batched_server.batcher.stats()
        replies = burst(port, bodies)
        after = batched_server.batcher.stats()
        assert after.calls_by_signature - before.calls_by_signature == calls
        assert after.batch_sizes - before.batch_sizes == {MERGE: sum(calls.values())} and after.reruns == 0
        for i, (code, reply) in enumerate(replies):
            assert code == 200, reply
            name = bodies[i].get("signature_name", "serving_default")
            direct = signatures[name](**{"image_bytes" if name == "serving_bytes" else "images":
                                         tf.constant(rest_value(bodies[i], name))})
            row = reply["predictions"][0]
            assert row["classes"] == direct["classes"].numpy()[0].tolist()
            np.testing.assert_allclose(row["probabilities"], direct["probabilities"].numpy()[0], rtol=0, atol=1e-6)
            worst = max(worst, float(np.abs(np.array(row["probabilities"]) - direct["probabilities"].numpy()[0]).max()))
    print(f"\nlargest |batched - alone| probability difference: {worst:.2e}")


def rest_value(body, name):
    """The input array a request body carries (one image), as the signature takes it."""
    value = body["instances"]
    if name == "serving_bytes":
        return [base64.b64decode(v["b64"]) for v in value]
    return np.array(value, dtype=np.float32 if name == "serving_float" else np.uint8)


def test_an_undecodable_image_in_a_batch_fails_alone(batched_server):
    """A PNG whose header passes the header check but whose data is cut: the merged call fails, each
    request reruns alone, the bad one gets its own 400 and the 7 others their results."""
    port = batched_server.server_address[1]
    pool = images(MERGE, seed=12)
    truncated = tf.io.encode_png(pool[3]).numpy()
    bodies = [{"signature_name": "serving_bytes", "instances": [png_b64(image)]} for image in pool]
    bodies[3] = {
        "signature_name": "serving_bytes",
        "instances": [{"b64": base64.b64encode(truncated[: len(truncated) // 2]).decode()}],
    }
    before = batched_server.batcher.stats()
    replies = burst(port, bodies)
    after = batched_server.batcher.stats()
    assert replies[3][0] == 400 and replies[3][1]["error"].startswith("Invalid input: Invalid PNG data"), replies[3]
    reference = expected(tf.saved_model.load(str(batched_server.model.path)).signatures, pool)
    for i in set(range(MERGE)) - {3}:
        code, reply = replies[i]
        assert code == 200 and reply["predictions"][0]["classes"] == reference["classes"][i].tolist()
        np.testing.assert_allclose(reply["predictions"][0]["probabilities"], reference["probabilities"][i], atol=1e-6)
    assert after.reruns - before.reruns == 1
    assert after.batch_sizes - before.batch_sizes == {MERGE: 1, 1: MERGE}  # the merged call, then each alone


def test_a_full_batching_queue_is_answered_503(exported):
    server = make_server(exported.parent, port=0, enable_batching=True, batching_max_size=64,
                         batching_timeout_ms=60000, batching_max_queue=2)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    port = server.server_address[1]
    try:
        body = {"instances": images(1).tolist()}
        waiting = [
            threading.Thread(target=lambda: replies.append(request(port, "POST", "/v1/models/cifar:predict", body)))
            for _ in range(2)
        ]
        replies = []
        for t in waiting:
            t.start()
        deadline = time.monotonic() + 60
        while server.batcher.queued() < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        code, reply = request(port, "POST", "/v1/models/cifar:predict", body)
        assert code == 503 and "batching queue is full (2 requests waiting, the limit is 2)" in reply["error"]
        server.batcher.flush()  # what the drain does: the two queued run now (a minute's timeout outlasts the check)
        for t in waiting:
            t.join(60)
        assert [code for code, _ in replies] == [200, 200]  # as one call
        assert server.batcher.stats().batch_sizes == {2: 1} and server.batcher.stats().rejected == 1
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.slow
def test_batching_benchmark_runs_end_to_end(capsys):
    """benchmarks/serving_batching.py, tiny: both variants answer every request."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # benchmarks/ is not installed
    from benchmarks import serving_batching

    serving_batching.main(["--signatures", "bytes", "--clients", "2", "--duration", "1", "--warmup", "0.5",
                           "--rounds", "1"])
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines() if line.startswith("| cifar_resnet20")]
    assert [(r[1], r[2]) for r in rows] == [("serving_bytes", "off"), ("serving_bytes", "on")]
    assert all(float(r[4]) > 0 and r[7] == "0 |" for r in rows), rows
