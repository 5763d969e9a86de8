"""keras-preact-serve's metrics (``/monitoring/prometheus/metrics``, parsed by prometheus_client's own
parser) and health (``/v2/health/live``, ``/v2/health/ready``): counts, latency and batch-size
histograms equal what was sent and run, the queue depth is what waits, and readiness turns true only
once the model is loaded and warmed up.

The server (``server.Server`` on the ASGI app) runs in a thread of this process on a numpy model, so
these run without TensorFlow."""

import http.client
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families

from keras_preact_serving import app, rest, server
from keras_preact_serving.batching import BatchingOptions
from keras_preact_serving.metrics import ServingMetrics

pytestmark = [pytest.mark.notf, pytest.mark.any_backend, pytest.mark.once]

PREDICT = "/v1/models/m:predict"
HOLD = -1.0  # an example whose first value is HOLD makes the model wait for its gate


class Model:
    """y = sum(x) per example; a batch whose first value is HOLD waits for ``gate``; with
    ``block_warm_up`` the first call (the warm-up) waits for ``warm_up_gate``."""

    name, version, path = "m", 1, "numpy"
    signatures = {"serving_default": "numpy"}
    input_specs = {"serving_default": {"x": rest.TensorSpec("x", "float32", (None, 2))}}
    metadata = {"model_spec": {"name": "m", "signature_name": "", "version": "1"}}

    def __init__(self, block_warm_up=False):
        self.gate, self.warm_up_gate = threading.Event(), threading.Event()
        self.warming, self.holding = threading.Event(), threading.Event()  # set when a call starts to wait
        self.block_warm_up = block_warm_up
        self.calls = []

    def status(self):
        return {"model_version_status": [{"version": "1", "state": "AVAILABLE"}]}

    def predict(self, signature_name, inputs):
        if not self.calls and self.block_warm_up:
            self.warming.set()
            assert self.warm_up_gate.wait(30)
        self.calls.append(len(inputs["x"]))
        if inputs["x"][0][0] == HOLD:
            self.holding.set()
            assert self.gate.wait(30)
        return {"y": inputs["x"].sum(axis=1)}


class Running:
    """A Server on ``state`` (or ``served``, a Server made already) serving in a thread; ``request``
    sends one request."""

    def __init__(self, state, served=None):
        self.state = state
        self.server = served or server.Server(state, "127.0.0.1", 0)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def request(self, method, path, body=None):
        """(status, reply bytes, content type)."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        # The server listens from its construction: a request before serve_forever runs waits in the backlog.
        connection.request(method, path, body=None if body is None else json.dumps(body).encode())
        response = connection.getresponse()
        reply = response.status, response.read(), response.getheader("Content-Type")
        connection.close()
        return reply

    def metrics(self):
        """{(sample name, frozenset of labels): value} of the metrics endpoint, parsed by prometheus_client."""
        status, text, content_type = self.request("GET", "/monitoring/prometheus/metrics")
        assert status == 200 and content_type.startswith("text/plain")
        return {(sample.name, frozenset(sample.labels.items())): sample.value
                for family in text_string_to_metric_families(text.decode()) for sample in family.samples}

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def labels(**values):
    return frozenset(values.items())


def started(model, batching=None, **kwargs):
    state = app.ServingState(
        lambda: model, app.RequestLimits(max_request_instances=16, max_body_bytes=1_000_000), batching, **kwargs
    )
    if not kwargs.get("load_in_background"):
        state.start()
    return Running(state)


def xs(n, first=1.0):
    values = np.arange(2 * n, dtype=np.float32).reshape(n, 2)
    values[0, 0] = first
    return values.tolist()


@pytest.mark.parametrize("batching", [None, BatchingOptions(batching_max_size=8, batching_timeout_ms=20)],
                         ids=["unbatched", "batched"])
def test_request_counts_latency_and_batch_sizes_equal_what_was_sent_and_run(batching):
    model = Model()
    running = started(model, batching)
    try:
        assert model.calls == [1]  # the warm-up: one dummy example
        sizes = [1, 2, 3, 1, 1, 2, 1]
        with ThreadPoolExecutor(len(sizes)) as pool:
            replies = list(pool.map(lambda n: running.request("POST", PREDICT, {"instances": xs(n)}), sizes))
        assert [r[0] for r in replies] == [200] * len(sizes)
        bad = [{"instances": [[1, 2, 3]]}, {"instances": []}, {"signature_name": "nope", "instances": xs(1)}]
        assert [running.request("POST", PREDICT, body)[0] for body in bad] == [400, 400, 400]
        assert running.request("GET", "/v1/models/m")[0] == 200
        assert running.request("GET", "/v1/models/other")[0] == 404
        assert running.request("POST", PREDICT, {"instances": xs(17)})[0] == 413
        metrics = running.metrics()
        assert running.request("GET", "/v2/health/ready")[0] == 200  # health and metrics are not counted

        total = "keras_preact_serving_requests_total"
        counted = {key: value for key, value in metrics.items() if key[0] == total}
        assert counted == {
            (total, labels(model="m", api="v1:predict", signature="serving_default", code="200")): len(sizes),
            (total, labels(model="m", api="v1:predict", signature="serving_default", code="400")): 2,
            (total, labels(model="m", api="v1:predict", signature="", code="400")): 1,  # unknown signature
            (total, labels(model="m", api="v1:predict", signature="serving_default", code="413")): 1,
            (total, labels(model="m", api="v1:status", signature="", code="200")): 1,
            (total, labels(model="", api="v1:status", signature="", code="404")): 1,  # another model's name
        }
        latency = "keras_preact_serving_request_latency_seconds"
        for signature, count in (("serving_default", len(sizes) + 3), ("", 1)):
            key = labels(model="m", api="v1:predict", signature=signature)
            assert metrics[(latency + "_count", key)] == count
            assert metrics[(latency + "_bucket", key | {("le", "+Inf")})] == count
            assert 0 < metrics[(latency + "_sum", key)] < 30 * count

        # Every model call after the warm-up, merged or not, is one observation of its examples.
        calls = model.calls[1:]
        batch = "keras_preact_serving_batch_size"
        key = labels(model="m", signature="serving_default")
        assert metrics[(batch + "_count", key)] == len(calls)
        assert metrics[(batch + "_sum", key)] == sum(calls) == sum(sizes)
        for bound in (1, 2, 4, 8):
            assert metrics[(batch + "_bucket", key | {("le", f"{float(bound)}")})] == sum(c <= bound for c in calls)
        if batching:
            stats = running.server.batcher.stats()
            assert stats.model_calls == len(calls) and sorted(stats.batch_sizes.elements()) == sorted(calls)
        else:
            assert sorted(calls) == sorted(sizes)
        assert metrics[("keras_preact_serving_queue_depth", labels(model="m"))] == 0
        assert metrics[("keras_preact_serving_model_ready", labels(model="m"))] == 1
    finally:
        running.close()


def test_queue_depth_is_the_requests_waiting_for_a_batch():
    model = Model()
    running = started(model, BatchingOptions(batching_max_size=1, batching_timeout_ms=0))
    depth = ("keras_preact_serving_queue_depth", labels(model="m"))
    try:
        with ThreadPoolExecutor(4) as pool:
            held = pool.submit(running.request, "POST", PREDICT, {"instances": xs(1, first=HOLD)})
            assert model.holding.wait(30)  # the held request runs
            deadline = time.monotonic() + 30
            waiting = [pool.submit(running.request, "POST", PREDICT, {"instances": xs(1)}) for _ in range(3)]
            while running.metrics()[depth] != 3 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert running.metrics()[depth] == 3
            model.gate.set()
            assert [f.result()[0] for f in [held, *waiting]] == [200] * 4
        assert running.metrics()[depth] == 0
    finally:
        model.gate.set()
        running.close()


def test_ready_turns_true_only_once_the_model_is_loaded_and_warmed_up():
    model = Model(block_warm_up=True)
    running = started(model, load_in_background=True)
    try:
        assert model.warming.wait(30), "the warm-up did not start"
        assert running.request("GET", "/v2/health/live")[:2] == (200, b'{"live": true}')
        assert running.request("GET", "/v2/health/ready")[:2] == (503, b'{"ready": false}')
        status, reply, _ = running.request("GET", "/v1/models/m")
        assert status == 503 and "loading or warming up" in json.loads(reply)["error"]
        assert running.request("POST", PREDICT, {"instances": xs(1)})[0] == 503
        assert ("keras_preact_serving_model_ready", labels(model="m")) not in running.metrics()
        model.warm_up_gate.set()
        deadline = time.monotonic() + 30
        while running.request("GET", "/v2/health/ready")[0] != 200 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert running.request("GET", "/v2/health/ready")[:2] == (200, b'{"ready": true}')
        assert model.calls == [1]  # one warm-up call, on a dummy batch of one
        assert running.request("POST", PREDICT, {"instances": xs(2)})[:2] == (200, b'{"predictions": [2.0, 5.0]}')
        assert running.metrics()[("keras_preact_serving_model_ready", labels(model="m"))] == 1
        assert running.request("POST", "/v2/health/ready")[0] == 405
    finally:
        model.warm_up_gate.set()
        running.close()


def test_a_model_that_fails_to_load_is_neither_live_nor_ready():
    def load():
        raise OSError("model.onnx is truncated")

    running = Running(app.ServingState(load, load_in_background=True))
    try:
        deadline = time.monotonic() + 30
        while running.request("GET", "/v2/health/live")[0] != 503 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert running.request("GET", "/v2/health/live")[:2] == (503, b'{"live": false}')
        assert running.request("GET", "/v2/health/ready")[:2] == (503, b'{"ready": false}')
        status, reply, _ = running.request("GET", "/v1/models/m")
        assert (status, json.loads(reply)) == (
            503,
            {"error": "The model failed to load: OSError: model.onnx is truncated"},
        )
    finally:
        running.close()


def test_each_app_has_its_own_registry():
    first, second = ServingMetrics(), ServingMetrics()  # the same names twice: no "Duplicated timeseries"
    first.observe_request("m", "v1:predict", "serving_default", 200, 0.01)
    text = second.exposition().decode()
    assert "keras_preact_serving_requests_total{" not in text
    assert (
        'keras_preact_serving_requests_total{api="v1:predict",code="200",model="m",signature="serving_default"} 1.0'
        in first.exposition().decode()
    )
    assert "keras_preact_serving" not in prometheus_client.generate_latest().decode()  # not the global registry
    with pytest.raises(ValueError, match="Invalid api='v1:classify'"):
        first.observe_request("m", "v1:classify", "", 400, 0.01)
