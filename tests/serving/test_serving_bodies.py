"""Issue 36, case 5: 60 MB JSON bodies that decode to tens of millions of values (v1 ``instances`` of
empty lists, 30M integers in v1 ``inputs`` and v2 ``data``, v2 BYTES as JSON strings or binary elements)
are refused with a one-line 413 before anything is decoded, and the server's memory comes back: they
cost main's server 9-31 s and +0.3-3.4 GB at the peak, most of which stayed (``rest.max_values``).

The server (``server.Server`` on a numpy model: an FP32 ``x`` of [N, 2] and a BYTES ``s`` of [N], at most
16 examples, so at most 1,064 JSON values) runs in a process of its own, started fresh for this module and
warmed up by one request of each kind, so its memory (/proc/PID/status) is the server's alone: nothing
another test left in pytest's process (threads, garbage, allocator arenas) moves the figures."""

import http.client
import json
import multiprocessing
import pathlib
import re
import struct
import time

import numpy as np
import pytest
from test_serving_metrics import PREDICT, Model, Running

from keras_preact_serving import app, rest

pytestmark = [pytest.mark.notf, pytest.mark.any_backend, pytest.mark.once]

SIZE = 60_000_000
INFER = "/v2/models/m/infer"
MAX_VALUES = 16 * 4 + 1000  # 16 examples of x: a row object, a list and 2 numbers each; 1,000 for the rest
LIMIT = f"exceeds the limit of {MAX_VALUES} values (--max-request-instances examples of this model's inputs)."


def echo_model():
    """test_serving_metrics' Model (``x`` -> sum per example) with an ``echo`` signature: BYTES ``s`` -> lengths."""
    model = Model()
    model.input_specs = {**Model.input_specs, "echo": {"s": rest.TensorSpec("s", "string", (None,))}}
    model.signatures = {**Model.signatures, "echo": "numpy"}
    predict = model.predict
    model.predict = lambda name, inputs: {"n": np.array([len(s) for s in inputs["s"]])} if name == "echo" else \
        predict(name, inputs)
    return model


def serve(connection):
    """The server process: serves ``echo_model`` (at most 16 examples: 64 MB bodies), sends its port."""
    state = app.ServingState(echo_model, app.RequestLimits(max_request_instances=16))
    state.start()
    served = Running(state)
    connection.send(served.port)
    served.thread.join()


class Served:
    """The server process's pid and port; ``request`` sends one request, ``mib`` reads its memory."""

    def __init__(self, pid, port):
        self.pid, self.port = pid, port

    def request(self, method, path, body=b"", headers=None):
        """(status, reply bytes)."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        reply = response.status, response.read()
        connection.close()
        return reply

    def mib(self, field):
        status = dict(line.split(":", 1) for line in pathlib.Path(f"/proc/{self.pid}/status").read_text().splitlines())
        return int(status[field].split()[0]) / 1024


@pytest.fixture(scope="module")
def running():
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no threads or state of this one
    ours, theirs = context.Pipe()
    process = context.Process(target=serve, args=(theirs,), daemon=True)
    process.start()
    try:
        assert ours.poll(60), "the server process sent no port within 60 s"
        served = Served(process.pid, ours.recv())
        # one-time costs (threads, imports, the 413 path) paid before: a normal request on each route, then a
        # 20 kB body of each kind
        for path, body in [
            (PREDICT, b'{"instances": [[1.0, 2.0]]}'),
            (INFER, b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}'),
        ]:
            assert served.request("POST", path, body)[0] == 200
        for kind in KINDS:
            assert served.request("POST", *bodies(kind, 20_000))[0] == 413
        yield served
    finally:
        process.kill()
        process.join()


def v2_json(name, datatype, item, size):
    """A v2 infer body of one input whose JSON ``data`` repeats ``item`` to ``size`` bytes."""
    count = (size - 100) // (len(item) + 1)
    head = json.dumps({"inputs": [{"name": name, "datatype": datatype, "shape": [count], "data": []}]}).encode()
    return head[:-4] + item + (b"," + item) * (count - 1) + b"]}]}"


def bodies(kind, size=SIZE):
    """(path, body, headers) of a hostile body of ``size`` bytes."""
    if kind == "v1 instances of empty lists":  # 20M lists: main took 31 s, +3.4 GB, 2.8 GB stayed
        return PREDICT, b'{"instances": [' + b"[]," * (size // 3 - 6) + b"[]]}", {}
    if kind == "v1 inputs of 30M integers":
        return PREDICT, b'{"inputs": [' + b"0," * (size // 2 - 7) + b"0]}", {}
    if kind == "v2 data of 30M integers":
        return INFER, v2_json("x", "FP32", b"0", size), {}
    if kind == "v2 BYTES data of 12M strings":
        return INFER, v2_json("s", "BYTES", b'"ab"', size), {}
    count = size // 5  # 12M binary BYTES elements of one byte each
    header = json.dumps({"inputs": [{"name": "s", "datatype": "BYTES", "shape": [count],
                                     "parameters": {"binary_data_size": 5 * count}}]}).encode()
    return INFER, header + (struct.pack("<I", 1) + b"a") * count, {"Inference-Header-Content-Length": str(len(header))}


KINDS = ["v1 instances of empty lists", "v1 inputs of 30M integers", "v2 data of 30M integers",
         "v2 BYTES data of 12M strings", "v2 BYTES binary of 12M elements"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_60_mb_body_of_millions_of_values_is_refused_at_once_and_its_memory_returned(running, kind):
    """A 413 naming the limit within 5 s (the body arrives, three byte counts, nothing decoded); the
    server's peak grows by less than 200 MiB (the body, read once and copied once: ~120 MiB) and less
    than 30 MiB stays; a normal request is answered after."""
    path, body, headers = bodies(kind)
    assert len(body) == pytest.approx(SIZE, abs=200)
    pathlib.Path(f"/proc/{running.pid}/clear_refs").write_text("5")  # resets VmHWM, the peak RSS, to the current RSS
    before, started = running.mib("VmRSS"), time.perf_counter()
    status, reply = running.request("POST", path, body, headers)
    took, peak = time.perf_counter() - started, running.mib("VmHWM") - before
    deadline = time.monotonic() + 2  # the worker thread that decoded may drop its arguments just after the reply
    while (after := running.mib("VmRSS") - before) >= 30 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert status == 413 and b"\n" not in reply, reply
    error = json.loads(reply)["error"]
    counted = re.fullmatch(r"The JSON body of up to (\d+) values \(counting ',', '\[' and '\{'\) " + re.escape(LIMIT),
                           error)
    if kind.startswith("v2 BYTES binary"):
        assert error == f"Input 's' of shape [{SIZE // 5}]: {SIZE // 5} elements {LIMIT}"
    else:
        assert counted and int(counted[1]) > MAX_VALUES, error
    assert took < 5, f"{kind}: refused after {took:.1f} s"
    assert peak < 200 and after < 30, (
        f"{kind}: the server's memory grew by {peak:.0f} MiB at the peak, {after:.0f} MiB after"
    )
    status, reply = running.request("POST", PREDICT, json.dumps({"instances": [[1.0, 2.0]]}).encode())
    assert (status, json.loads(reply)) == (200, {"predictions": [3.0]})


def test_a_gif_of_millions_of_empty_blocks_is_refused_in_bounded_work():
    """Issue 56, case 9: 2M empty comment extensions (6 MB) before a GIF's frame: a 400 naming the bound, after reading
    at most ``MAX_GIF_BLOCKS`` blocks (main read them all, in Pillow and in its own parse, then served the image)."""
    import io

    from PIL import Image

    from keras_preact_serving.gif import MAX_GIF_BLOCKS

    frame = io.BytesIO()
    Image.new("RGB", (4, 4)).save(frame, "GIF")
    gif = frame.getvalue()
    start = gif.index(b"\x2c")  # the first image descriptor: the empty extensions go before it
    bomb = gif[:start] + b"\x21\xfe\x00" * (2 * MAX_GIF_BLOCKS) + gif[start:]
    limits = {"max_image_pixels": 4096 * 4096, "max_aspect_ratio": 8.0, "max_request_pixels": 64 * 1024 * 1024}
    started = time.perf_counter()
    with pytest.raises(rest.RequestError, match=f"more than {MAX_GIF_BLOCKS} blocks before the end of its first frame"):
        rest.check_encoded_images({"s": np.array([bomb], dtype=object)}, **limits)
    assert time.perf_counter() - started < 10  # about 0.3 s on a quiet core
    rest.check_encoded_images({"s": np.array([gif], dtype=object)}, **limits)  # a whole GIF still passes
