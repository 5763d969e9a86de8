"""Issue 36, case 5: 60 MB JSON bodies that decode to tens of millions of values (v1 ``instances`` of
empty lists, 30M integers in v1 ``inputs`` and v2 ``data``, v2 BYTES as JSON strings or binary elements)
are refused with a one-line 413 before anything is decoded, and the server's memory comes back: they
cost main's server 9-31 s and +0.3-3.4 GB at the peak, most of which stayed (``rest.max_values``).

The server (``server.Server`` on a numpy model: an FP32 ``x`` of [N, 2] and a BYTES ``s`` of [N], at most
16 examples, so at most 1,064 JSON values) runs in a thread of this process, so its memory is this
process's (/proc/self/status)."""

import http.client
import json
import pathlib
import re
import struct
import time

import numpy as np
import pytest
from test_serving_metrics import PREDICT, Model, Running

from serving import app, rest

pytestmark = [pytest.mark.notf, pytest.mark.any_backend]

SIZE = 60_000_000
INFER = "/v2/models/m/infer"
MAX_VALUES = 16 * 4 + 1000  # 16 examples of x: a row object, a list and 2 numbers each; 1,000 for the rest
LIMIT = f"exceeds the limit of {MAX_VALUES} values (--max-batch-size examples of this model's inputs)."


@pytest.fixture(scope="module")
def running():
    model = Model()
    model.input_specs = {**Model.input_specs, "echo": {"s": rest.TensorSpec("s", "string", (None,))}}
    model.signatures = {**Model.signatures, "echo": "numpy"}
    predict = model.predict
    model.predict = lambda name, inputs: {"n": np.array([len(s) for s in inputs["s"]])} if name == "echo" else \
        predict(name, inputs)
    state = app.ServingState(lambda: model, app.RequestLimits(max_batch_size=16))  # 64 MB bodies
    state.start()
    served = Running(state)
    yield served
    served.close()


def v2_json(name, datatype, item, size):
    """A v2 infer body of one input whose JSON ``data`` repeats ``item`` to ``size`` bytes."""
    count = (size - 100) // (len(item) + 1)
    head = json.dumps({"inputs": [{"name": name, "datatype": datatype, "shape": [count], "data": []}]}).encode()
    return head[:-4] + item + (b"," + item) * (count - 1) + b"]}]}"


def bodies(kind):
    """(path, body, headers) of a hostile body of ``SIZE`` bytes."""
    if kind == "v1 instances of empty lists":  # 20M lists: main took 31 s, +3.4 GB, 2.8 GB stayed
        return PREDICT, b'{"instances": [' + b"[]," * (SIZE // 3 - 6) + b"[]]}", {}
    if kind == "v1 inputs of 30M integers":
        return PREDICT, b'{"inputs": [' + b"0," * (SIZE // 2 - 7) + b"0]}", {}
    if kind == "v2 data of 30M integers":
        return INFER, v2_json("x", "FP32", b"0", SIZE), {}
    if kind == "v2 BYTES data of 12M strings":
        return INFER, v2_json("s", "BYTES", b'"ab"', SIZE), {}
    count = SIZE // 5  # 12M binary BYTES elements of one byte each
    header = json.dumps({"inputs": [{"name": "s", "datatype": "BYTES", "shape": [count],
                                     "parameters": {"binary_data_size": 5 * count}}]}).encode()
    return INFER, header + (struct.pack("<I", 1) + b"a") * count, {"Inference-Header-Content-Length": str(len(header))}


def mib(field):
    status = dict(line.split(":", 1) for line in pathlib.Path("/proc/self/status").read_text().splitlines())
    return int(status[field].split()[0]) / 1024


@pytest.mark.parametrize("kind", ["v1 instances of empty lists", "v1 inputs of 30M integers", "v2 data of 30M integers",
                                  "v2 BYTES data of 12M strings", "v2 BYTES binary of 12M elements"])
def test_a_60_mb_body_of_millions_of_values_is_refused_at_once_and_its_memory_returned(running, kind):
    """A 413 naming the limit within 5 s (the body arrives, three byte counts, nothing decoded); the
    server's peak grows by less than 200 MiB (the body, read once and copied once: ~120 MiB) and less
    than 30 MiB stays; a normal request is answered after."""
    path, body, headers = bodies(kind)
    assert len(body) == pytest.approx(SIZE, abs=200)
    pathlib.Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM, the peak RSS, to the current RSS
    before, started = mib("VmRSS"), time.perf_counter()
    connection = http.client.HTTPConnection("127.0.0.1", running.port, timeout=30)
    connection.request("POST", path, body=body, headers=headers)
    response = connection.getresponse()
    status, reply = response.status, response.read()
    connection.close()
    took, peak = time.perf_counter() - started, mib("VmHWM") - before
    deadline = time.monotonic() + 2  # the worker thread that decoded may drop its arguments just after the reply
    while (after := mib("VmRSS") - before) >= 30 and time.monotonic() < deadline:
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
    assert peak < 200 and after < 30, f"{kind}: the server's memory grew by {peak:.0f} MiB at the peak, {after:.0f} MiB after"
    status, reply, _ = running.request("POST", PREDICT, {"instances": [[1.0, 2.0]]})
    assert (status, json.loads(reply)) == (200, {"predictions": [3.0]})
