"""keras_preact_serving.batching.Batcher on a numpy predict: merging, splitting, bounds, errors, shutdown.

Runtime-agnostic, so these run without TensorFlow; the server with batching is tested in test_serving.py.
"""

import threading
import time

import numpy as np
import pytest

from keras_preact_serving.batching import Batcher, BatchingOptions
from keras_preact_serving.rest import RequestError

pytestmark = [pytest.mark.notf, pytest.mark.any_backend, pytest.mark.once]

WEIGHTS = np.random.default_rng(0).normal(size=(12, 5))


class Model:
    """A numpy predict with two signatures that records every call; ``gate`` (an Event) holds calls."""

    def __init__(self, gate=None):
        self.calls = []  # (signature_name, batch size)
        self.called = threading.Event()  # set by the first call
        self.gate = gate
        self.lock = threading.Lock()

    def predict(self, signature_name, inputs):
        with self.lock:
            self.calls.append((signature_name, len(next(iter(inputs.values())))))
        self.called.set()
        if self.gate is not None:
            assert self.gate.wait(30)
        if signature_name == "pixels":
            x = inputs["x"].reshape(len(inputs["x"]), -1)
            if np.any(x < 0):
                raise ValueError(f"negative pixels in {len(x)} examples")
            return {"logits": x @ WEIGHTS, "total": x.sum(axis=1)}
        if signature_name == "bytes":  # encoded strings: the length of each
            return {"lengths": np.array([len(b) for b in inputs["data"]])}
        raise KeyError(signature_name)


def pixels(n, seed):
    return np.random.default_rng(seed).random((n, 2, 2, 3))


def concurrently(fn, args):
    """fn(*a) for each a in args, each in its own thread started together: results (or errors) in order."""
    results = [None] * len(args)
    barrier = threading.Barrier(len(args))

    def run(i):
        barrier.wait()
        try:
            results[i] = fn(*args[i])
        except Exception as error:  # noqa: BLE001 - returned to the test
            results[i] = error

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(args))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive()
    return results


def test_concurrent_requests_are_merged_and_each_gets_its_own_slice():
    model = Model()
    requests = [("pixels", {"x": pixels((1, 2, 3, 2)[i % 4], seed=i)}) for i in range(16)]  # 32 examples
    with Batcher(model.predict, BatchingOptions(batching_max_size=8, batching_timeout_ms=2000)) as batcher:
        results = concurrently(batcher.predict, requests)
        stats = batcher.stats()
    for (name, inputs), result in zip(requests, results):
        direct = model.predict(name, inputs)
        assert sorted(result) == ["logits", "total"]
        np.testing.assert_allclose(result["logits"], direct["logits"], rtol=1e-12)
        np.testing.assert_allclose(result["total"], direct["total"], rtol=1e-12)
    # 32 examples in requests of 1-3: no call holds more than 8, and every call but the smallest holds at
    # least 6 (a batch closes only when the next request, of at most 3, would overflow it; the last may be
    # partial, after the timeout). Which calls reach exactly 8 depends on the threads' arrival order.
    assert stats.requests == 16 and stats.examples == 32 and stats.reruns == 0
    assert sum(size * n for size, n in stats.batch_sizes.items()) == 32
    sizes = sorted(stats.batch_sizes.elements())
    assert sizes[-1] <= 8 and all(6 <= size for size in sizes[1:]) and stats.model_calls == len(sizes) <= 6


def test_a_full_batch_runs_at_once_and_the_first_request_waits_at_most_the_timeout():
    model = Model()
    with Batcher(model.predict, BatchingOptions(batching_max_size=4, batching_timeout_ms=60000)) as batcher:
        start = time.monotonic()
        concurrently(batcher.predict, [("pixels", {"x": pixels(1, i)}) for i in range(4)])
        assert time.monotonic() - start < 30  # full: did not wait for the 60 s timeout
    assert model.calls == [("pixels", 4)]
    model = Model()
    with Batcher(model.predict, BatchingOptions(batching_max_size=4, batching_timeout_ms=300)) as batcher:
        start = time.monotonic()
        batcher.predict("pixels", {"x": pixels(1, 0)})
        waited = time.monotonic() - start
    assert 0.3 <= waited < 0.3 + 5  # alone: waits out the timeout, then runs
    assert model.calls == [("pixels", 1)]


def test_flush_runs_what_is_queued_at_once_and_later_calls_without_waiting():
    """A server told to exit flushes its batcher: a request queued for a 60 s timeout (longer than the server's
    30 s drain) runs at once, and so does a request arriving after the flush."""
    model = Model()
    with Batcher(model.predict, BatchingOptions(batching_max_size=4, batching_timeout_ms=60000)) as batcher:
        result = {}
        waiting = threading.Thread(target=lambda: result.update(batcher.predict("pixels", {"x": pixels(1, 0)})))
        waiting.start()
        while batcher.queued() < 1:
            time.sleep(0.01)
        started = time.perf_counter()
        batcher.flush()
        waiting.join(30)
        batcher.predict("pixels", {"x": pixels(1, 1)})
        waited = time.perf_counter() - started
    assert waited < 10 and model.calls == [("pixels", 1), ("pixels", 1)], (waited, model.calls)
    np.testing.assert_array_equal(result["total"], pixels(1, 0).reshape(1, -1).sum(axis=1))


def test_signatures_and_shapes_are_never_merged():
    model = Model()
    requests = (
        [("pixels", {"x": pixels(1, i)}) for i in range(4)]
        + [("pixels", {"x": np.random.default_rng(i).random((1, 4, 1, 3))}) for i in range(4)]  # same size, other shape
        + [("bytes", {"data": np.array([b"ab" * (i + 1)], dtype=object)}) for i in range(4)]
    )
    with Batcher(model.predict, BatchingOptions(batching_max_size=4, batching_timeout_ms=30000)) as batcher:
        results = concurrently(batcher.predict, requests)
    assert sorted(model.calls) == [("bytes", 4), ("pixels", 4), ("pixels", 4)]
    for (name, inputs), result in zip(requests, results):
        expected = model.predict(name, inputs)
        assert result.keys() == expected.keys()
        for key in result:
            np.testing.assert_allclose(result[key], expected[key], rtol=1e-12)
    assert [r["lengths"].tolist() for r in results[8:]] == [[2], [4], [6], [8]]


def test_a_request_larger_than_the_batch_runs_alone_unsplit():
    model = Model()
    with Batcher(model.predict, BatchingOptions(batching_max_size=4, batching_timeout_ms=0)) as batcher:
        result = batcher.predict("pixels", {"x": pixels(10, 0)})
    assert model.calls == [("pixels", 10)]
    np.testing.assert_array_equal(result["total"], pixels(10, 0).reshape(10, -1).sum(axis=1))


def test_a_failing_request_in_a_merged_batch_gets_its_own_error_and_the_others_their_results():
    model = Model()
    requests = [("pixels", {"x": pixels(1, i) * (-1 if i == 2 else 1)}) for i in range(4)]
    with Batcher(model.predict, BatchingOptions(batching_max_size=4, batching_timeout_ms=30000)) as batcher:
        results = concurrently(batcher.predict, requests)
        stats = batcher.stats()
    assert isinstance(results[2], ValueError) and str(results[2]) == "negative pixels in 1 examples"
    for i in (0, 1, 3):
        np.testing.assert_allclose(results[i]["logits"], requests[i][1]["x"].reshape(1, -1) @ WEIGHTS, rtol=1e-12)
    assert model.calls == [("pixels", 4)] + [("pixels", 1)] * 4  # the merged call, then each alone
    assert stats.reruns == 1 and stats.model_calls == 5 and stats.merged_calls == 1


def test_outputs_not_batched_along_axis_0_are_rerun_alone():
    calls = []

    def predict(signature_name, inputs):
        calls.append(len(inputs["x"]))
        return {"mean": inputs["x"].mean()}  # a scalar: cannot be split

    with Batcher(predict, BatchingOptions(batching_max_size=3, batching_timeout_ms=30000)) as batcher:
        results = concurrently(batcher.predict, [("s", {"x": np.full((1, 2), float(i))}) for i in range(3)])
    assert calls == [3, 1, 1, 1] and [float(r["mean"]) for r in results] == [0.0, 1.0, 2.0]


def test_a_full_queue_is_refused_with_503_naming_the_limit():
    gate = threading.Event()
    model = Model(gate)
    batcher = Batcher(model.predict, BatchingOptions(batching_max_size=1, batching_timeout_ms=0, batching_max_queue=2))
    threads = [threading.Thread(target=batcher.predict, args=("pixels", {"x": pixels(1, i)})) for i in range(3)]
    try:
        threads[0].start()
        assert model.called.wait(30)  # the first runs (held by the gate) ...
        for t in threads[1:]:  # ... two more wait in the queue
            t.start()
        while batcher.queued() < 2:
            time.sleep(0.01)
        with pytest.raises(RequestError, match=r"queue is full \(2 requests waiting, the limit is 2\)") as error:
            batcher.predict("pixels", {"x": pixels(1, 9)})
        assert error.value.status == 503 and batcher.stats().rejected == 1
    finally:
        gate.set()
        for t in threads:
            t.join(30)
        batcher.close()
    assert len(model.calls) == 3


def test_close_answers_what_is_queued_and_leaves_no_thread():
    model = Model()
    batcher = Batcher(
        model.predict, BatchingOptions(batching_max_size=64, batching_timeout_ms=60000, batching_threads=3)
    )
    assert sum(t.name.startswith("keras-preact-batcher") for t in threading.enumerate()) == 3
    results = []
    waiting = [threading.Thread(target=lambda i=i: results.append(batcher.predict("pixels", {"x": pixels(1, i)})))
               for i in range(5)]
    for t in waiting:
        t.start()
    while batcher.queued() < 5:
        time.sleep(0.01)
    start = time.monotonic()
    batcher.close()  # the 60 s timeout is cut short: queued requests run now
    assert time.monotonic() - start < 30
    for t in waiting:
        t.join(30)
    assert len(results) == 5 and model.calls == [("pixels", 5)]
    assert not [t for t in threading.enumerate() if t.name.startswith("keras-preact-batcher")]
    with pytest.raises(RequestError, match="shutting down") as error:
        batcher.predict("pixels", {"x": pixels(1, 0)})
    assert error.value.status == 503
    batcher.close()  # idempotent


@pytest.mark.parametrize("argument, value", [
    ("batching_max_size", 0), ("batching_max_queue", -1), ("batching_threads", 1.5), ("batching_max_size", True),
    ("batching_timeout_ms", -0.1), ("batching_timeout_ms", float("inf"))])
def test_options_are_validated_before_any_thread_starts(argument, value):
    before = threading.active_count()
    with pytest.raises(ValueError, match=f"Invalid {argument}={value!r}"):
        Batcher(Model().predict, BatchingOptions(**{argument: value}))
    assert threading.active_count() == before


def test_inputs_must_be_batched_along_axis_0():
    with Batcher(Model().predict) as batcher:
        with pytest.raises(ValueError, match="batched along axis 0"):
            batcher.predict("pixels", {"x": np.zeros((2, 3)), "y": np.zeros((3, 3))})
        with pytest.raises(ValueError, match="batched along axis 0"):
            batcher.predict("pixels", {"x": np.float32(1)})


def test_submit_awaits_in_an_event_loop_and_names_the_call_that_ran_it():
    """Four coroutines submit at once (no thread each): one merged call (number 1, 4 examples) gives each
    its own slice; then a failing request alone (call 2) raises its own error in its coroutine."""
    import asyncio

    model = Model()
    requests = [("pixels", {"x": pixels(1, i)}) for i in range(4)]

    async def main(batcher):
        results = await asyncio.gather(*(batcher.submit(name, inputs) for name, inputs in requests))
        with pytest.raises(ValueError, match="negative pixels in 1 examples"):
            await batcher.submit("pixels", {"x": -pixels(1, 9)})
        return results

    # The four arrive in one tick of the loop (a full batch runs at once); the lone failing one waits out the timeout.
    with Batcher(model.predict, BatchingOptions(batching_max_size=4, batching_timeout_ms=2000)) as batcher:
        results = asyncio.run(main(batcher))
    assert [(r.call, r.call_size) for r in results] == [(1, 4)] * 4
    assert model.calls == [("pixels", 4), ("pixels", 1)]
    for (_, inputs), result in zip(requests, results):
        np.testing.assert_allclose(result.outputs["logits"], inputs["x"].reshape(1, -1) @ WEIGHTS, rtol=1e-12)
