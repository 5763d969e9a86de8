"""Dynamic batching, as TF Serving's ``--enable_batching`` (docs/export-and-serving.md, "Dynamic batching"), with the
options of ``keras_preact_serving.flags.BatchingOptions``."""

import asyncio
import collections
import concurrent.futures
import dataclasses
import threading
import time

import numpy as np

from keras_preact_serving.flags import BatchingOptions, FlagRecord, check_number, flag  # noqa: F401 - as before
from keras_preact_serving.rest import RequestError


@dataclasses.dataclass
class BatchingStats:
    """Counters since the batcher started. ``batch_sizes``: examples per model call -> calls."""

    requests: int = 0  # accepted by predict
    examples: int = 0
    model_calls: int = 0  # calls of the wrapped predict, reruns included
    merged_calls: int = 0  # calls holding more than one request
    reruns: int = 0  # merged calls that failed and were rerun request by request
    rejected: int = 0  # refused because the queue was full
    batch_sizes: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    calls_by_signature: collections.Counter = dataclasses.field(default_factory=collections.Counter)


@dataclasses.dataclass(frozen=True)
class BatchResult:
    """A request's outputs, the model call that ran it (numbered from 1), the examples that call held and its
    seconds."""

    outputs: dict
    call: int
    call_size: int
    seconds: float = 0.0


@dataclasses.dataclass(eq=False)
class _Pending:
    signature_name: str
    inputs: dict
    size: int
    arrival: float = dataclasses.field(default_factory=time.monotonic)
    future: concurrent.futures.Future = dataclasses.field(default_factory=concurrent.futures.Future)  # a BatchResult


def _batch_size(inputs):
    sizes = {np.shape(a)[0] if np.ndim(a) else None for a in inputs.values()}
    if not inputs or len(sizes) != 1 or None in sizes:
        raise ValueError(f"Batcher.predict needs arrays batched along axis 0 with one batch size; got shapes "
                         f"{ {name: np.shape(a) for name, a in inputs.items()} }.")
    return sizes.pop()


def merge_key(signature_name, inputs):
    """Requests with equal keys can be concatenated along axis 0."""
    return signature_name, tuple(sorted((name, a.dtype.str, a.shape[1:]) for name, a in inputs.items()))


class MergedCalls:
    """Runs lists of requests (``_Pending``) of one merge key as one call of the wrapped ``predict(signature_name,
    {name: array})``, each request getting its own rows; a merged call that fails is rerun request by request.
    Counts what it ran (``stats``). The batchers (``Batcher``, and each Ray Serve replica's) decide which requests."""

    def __init__(self, predict, options=None):
        self._predict = predict
        self.options = options or BatchingOptions()
        self._stats = BatchingStats()
        self._condition = threading.Condition()

    def pending(self, signature_name, inputs):
        """A request as the batchers hold it (``_Pending``): its arrays, its examples, and the future of its result."""
        inputs = {name: np.asarray(a) for name, a in inputs.items()}
        pending = _Pending(signature_name, inputs, _batch_size(inputs))
        pending.future.set_running_or_notify_cancel()  # never cancelled: a batch holding it runs it anyway
        return pending

    def stats(self):
        """A snapshot of the counters (``BatchingStats``)."""
        with self._condition:
            return dataclasses.replace(self._stats, batch_sizes=collections.Counter(self._stats.batch_sizes),
                                       calls_by_signature=collections.Counter(self._stats.calls_by_signature))

    def run(self, batch):
        """Run ``batch`` (requests of one merge key, oldest first): each request's future gets its ``BatchResult``
        or its error."""
        try:
            self._run(batch)
        except Exception as error:  # noqa: BLE001 - e.g. MemoryError concatenating: fail this batch only
            for pending in batch:
                if not pending.future.done():
                    pending.future.set_exception(error)

    def _call(self, signature_name, inputs, size):
        """(outputs, call number, seconds) of one call of the wrapped ``predict``."""
        with self._condition:
            self._stats.model_calls += 1
            self._stats.batch_sizes[size] += 1
            self._stats.calls_by_signature[signature_name] += 1
            number = self._stats.model_calls
        started = time.perf_counter()
        outputs = self._predict(signature_name, inputs)
        return outputs, number, time.perf_counter() - started

    def _run_alone(self, pending):
        try:
            outputs, number, seconds = self._call(pending.signature_name, pending.inputs, pending.size)
        except Exception as error:  # noqa: BLE001 - the caller's own error, raised in its thread
            pending.future.set_exception(error)
        else:
            pending.future.set_result(BatchResult(outputs, number, pending.size, seconds))

    def _run(self, batch):
        if len(batch) == 1:
            return self._run_alone(batch[0])
        total = sum(p.size for p in batch)
        try:
            merged = {name: np.concatenate([p.inputs[name] for p in batch]) for name in batch[0].inputs}
            with self._condition:
                self._stats.merged_calls += 1
            outputs, number, seconds = self._call(batch[0].signature_name, merged, total)
            outputs = {name: np.asarray(v) for name, v in outputs.items()}
            unbatched = [name for name, v in outputs.items() if v.ndim == 0 or v.shape[0] != total]
            if unbatched:
                raise ValueError(f"Outputs {unbatched} are not batched along axis 0.")
        except Exception:  # noqa: BLE001 - rerun each request alone: each gets its own result or error
            with self._condition:
                self._stats.reruns += 1
            for pending in batch:
                self._run_alone(pending)
            return
        start = 0
        for pending in batch:
            rows = {name: v[start:start + pending.size].copy() for name, v in outputs.items()}
            pending.future.set_result(BatchResult(rows, number, total, seconds))
            start += pending.size


class Batcher(MergedCalls):
    """Merges concurrent ``predict`` calls of one signature and per-example shapes into calls of the wrapped
    ``predict(signature_name, {name: array})``; a merged call that fails is rerun request by request.

    Examples:
        >>> with Batcher(lambda signature, inputs: {"y": inputs["x"] * 2}) as batcher:
        ...     batcher.predict("serving_default", {"x": np.ones((2, 3))})["y"].shape
        (2, 3)
    """

    def __init__(self, predict, options=None):
        super().__init__(predict, options)
        options = self.options
        self._timeout = options.batching_timeout_ms / 1000
        self._queues = {}  # merge key -> deque of _Pending, oldest first
        self._queued = 0
        self._closed = False
        self._flushing = False  # once the server is told to exit: no batch waits for its timeout
        self._threads = [threading.Thread(target=self._work, name=f"keras-preact-batcher-{i}", daemon=True)
                         for i in range(options.batching_threads)]
        for thread in self._threads:
            thread.start()

    def predict(self, signature_name, inputs):
        """The wrapped ``predict``'s outputs for these inputs alone, computed in a batch."""
        return self._enqueue(signature_name, inputs).future.result().outputs

    async def submit(self, signature_name, inputs):
        """``predict`` for a coroutine (``keras_preact_serving.app``): a ``BatchResult``, awaited without holding a
        thread."""
        return await asyncio.wrap_future(self._enqueue(signature_name, inputs).future)

    def _enqueue(self, signature_name, inputs):
        pending = self.pending(signature_name, inputs)
        key = merge_key(signature_name, pending.inputs)
        with self._condition:
            if self._closed:
                raise RequestError("The server is shutting down; retry later.", 503)
            if self._queued >= self.options.batching_max_queue:
                self._stats.rejected += 1
                raise RequestError(f"The batching queue is full ({self._queued} requests waiting, the limit is "
                                   f"{self.options.batching_max_queue}); retry later.", 503)
            self._queues.setdefault(key, collections.deque()).append(pending)
            self._queued += 1
            self._stats.requests += 1
            self._stats.examples += pending.size
            self._condition.notify_all()
        return pending

    def queued(self):
        """Requests waiting for a batch now."""
        with self._condition:
            return self._queued

    def flush(self):
        """From now on no batch waits for ``batching_timeout_ms``: what is queued runs at once, as do later calls
        (a server told to exit drains its requests in flight within its grace period, whatever the timeout)."""
        with self._condition:
            self._flushing = True
            self._condition.notify_all()

    def close(self):
        """Run what is queued, then stop and join every batch thread (idempotent); later calls get a 503."""
        with self._condition:
            self._closed = True
            self._condition.notify_all()
        for thread in self._threads:
            thread.join()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def _work(self):
        while True:
            with self._condition:
                batch = self._next_batch()
            if batch is None:
                return
            self.run(batch)

    def _next_batch(self):
        """The next batch to run, waiting until one is full or due; None once closed and drained."""
        while True:
            if not self._queues:
                if self._closed:
                    return None
                self._condition.wait()
                continue
            now = time.monotonic()
            ready = [key for key, queue in self._queues.items()
                     if self._closed or self._flushing or now >= queue[0].arrival + self._timeout
                     or sum(p.size for p in queue) >= self.options.batching_max_size]
            if ready:
                return self._take(min(ready, key=lambda key: self._queues[key][0].arrival))
            self._condition.wait(min(q[0].arrival for q in self._queues.values()) + self._timeout - now)

    def _take(self, key):
        queue = self._queues[key]
        batch = [queue.popleft()]  # the oldest, even when larger than batching_max_size: it runs alone
        total = batch[0].size
        while queue and total + queue[0].size <= self.options.batching_max_size:
            total += queue[0].size
            batch.append(queue.popleft())
        if not queue:
            del self._queues[key]
        self._queued -= len(batch)
        return batch
