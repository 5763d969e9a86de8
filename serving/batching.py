"""Dynamic batching of concurrent predict requests, as TF Serving's ``--enable_batching`` (README,
"Dynamic batching"): ``Batcher`` merges the requests of one signature and per-example input shapes along
axis 0 into one call of the wrapped ``predict`` and gives each caller its rows; a merged call that fails
is rerun request by request, so each caller gets its own result or error, never another's. Also
``FlagRecord``, the checked records of flags (``BatchingOptions``, ``app.RequestLimits``).
"""

import asyncio
import collections
import dataclasses
import math
import threading
import time

import numpy as np

from serving.rest import RequestError


def check_number(argument, value, *, real=False, at_least=None):
    """ValueError naming ``argument`` unless ``value`` is a positive integer, or, ``real``, a positive finite
    number (one >= ``at_least`` if given)."""
    is_number = not isinstance(value, bool) and isinstance(value, (int, float) if real else int)
    if not real:
        valid, expected = is_number and value >= 1, "a positive integer"
    elif at_least is None:
        valid, expected = is_number and 0 < value < math.inf, "a positive number"
    else:
        valid, expected = is_number and at_least <= value < math.inf, f"a number >= {at_least:g}"
    if not valid:
        raise ValueError(f"Invalid {argument}={value!r}: expected {expected}.")


def flag(default, help, *, at_least=None, server_only=False):  # noqa: A002 - argparse's word
    """A ``FlagRecord`` field: its default, its flag's help, a float's lower bound, and whether only
    ``keras-preact-serve`` has the flag."""
    return dataclasses.field(default=default, metadata={"help": help, "at_least": at_least, "server_only": server_only})


class FlagRecord:
    """A frozen dataclass whose fields (``flag``) are flags (``--batching-max-size`` for
    ``batching_max_size``) and arguments of ``server.make_server``, each checked on creation (``check_number``)."""

    def __post_init__(self):
        for field in dataclasses.fields(self):
            check_number(field.name, getattr(self, field.name), real=field.type is float,
                         at_least=field.metadata["at_least"])

    @classmethod
    def add_arguments(cls, parser, *, server_only=True):
        """One flag per field (without the ``server_only`` ones unless asked), defaults as the record's."""
        for field in dataclasses.fields(cls):
            if server_only or not field.metadata["server_only"]:
                parser.add_argument("--" + field.name.replace("_", "-"), type=field.type, default=field.default,
                                    help=f"{field.metadata['help']} (default %(default)s)")

    @classmethod
    def from_args(cls, args):
        """The record of parsed flags (``add_arguments``); a field without its flag keeps its default."""
        return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)})


@dataclasses.dataclass(frozen=True)
class BatchingOptions(FlagRecord):
    """How a ``Batcher`` merges requests: a batch closes when it holds ``batching_max_size`` examples or
    its oldest request has waited ``batching_timeout_ms``, and runs on one of ``batching_threads``."""

    batching_max_size: int = flag(32, "examples in one model call; a larger request runs alone (TF Serving's "
                                      "max_batch_size)")
    batching_timeout_ms: float = flag(0.0, "the longest the oldest request of a batch waits for more (0: batch "
                                           "what is queued when the model is free)", at_least=0)
    batching_max_queue: int = flag(64, "requests waiting for a batch (503 beyond)")
    batching_threads: int = flag(1, "batches run at once")


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
    """A request's outputs, the model call that ran it (numbered from 1) and the examples that call held."""

    outputs: dict
    call: int
    call_size: int


@dataclasses.dataclass(eq=False)
class _Pending:
    signature_name: str
    inputs: dict
    size: int
    arrival: float
    notify: object = None  # notify(self), called from a batch thread once done is set
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    outputs: dict = None
    error: BaseException = None
    call: tuple = (0, 0)  # (call number, examples in the call)

    def finish(self):
        self.done.set()
        if self.notify is not None:
            self.notify(self)


def _settle(future, pending):
    if future.done():  # the awaiting task was cancelled
        return
    if pending.error is not None:
        future.set_exception(pending.error)
    else:
        future.set_result(BatchResult(pending.outputs, *pending.call))


def _batch_size(inputs):
    sizes = {np.shape(a)[0] if np.ndim(a) else None for a in inputs.values()}
    if not inputs or len(sizes) != 1 or None in sizes:
        raise ValueError(f"Batcher.predict needs arrays batched along axis 0 with one batch size; got shapes "
                         f"{ {name: np.shape(a) for name, a in inputs.items()} }.")
    return sizes.pop()


def _merge_key(signature_name, inputs):
    """Requests with equal keys can be concatenated along axis 0."""
    return signature_name, tuple(sorted((name, a.dtype.str, a.shape[1:]) for name, a in inputs.items()))


class Batcher:
    """Merges concurrent ``predict`` calls into batched calls of the wrapped ``predict(signature_name,
    {name: array})`` (module docstring); at most ``batching_max_queue`` requests wait (503 beyond).

    Examples:
        >>> with Batcher(lambda signature, inputs: {"y": inputs["x"] * 2}) as batcher:
        ...     batcher.predict("serving_default", {"x": np.ones((2, 3))})["y"].shape
        (2, 3)
    """

    def __init__(self, predict, options=None):
        self._predict = predict
        self.options = options = options or BatchingOptions()
        self._timeout = options.batching_timeout_ms / 1000
        self._queues = {}  # merge key -> deque of _Pending, oldest first
        self._queued = 0
        self._closed = False
        self._stats = BatchingStats()
        self._condition = threading.Condition()
        self._threads = [threading.Thread(target=self._work, name=f"keras-preact-batcher-{i}", daemon=True)
                         for i in range(options.batching_threads)]
        for thread in self._threads:
            thread.start()

    def predict(self, signature_name, inputs):
        """The wrapped ``predict``'s outputs for these inputs alone, computed in a batch."""
        pending = self._enqueue(signature_name, inputs)
        pending.done.wait()
        if pending.error is not None:
            raise pending.error
        return pending.outputs

    async def submit(self, signature_name, inputs):
        """``predict`` for a coroutine (``serving.app``): a ``BatchResult``, awaited without holding a thread."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()

        def notify(pending):
            try:
                loop.call_soon_threadsafe(_settle, future, pending)
            except RuntimeError:  # the loop has closed: nobody awaits the result
                pass

        self._enqueue(signature_name, inputs, notify)
        return await future

    def _enqueue(self, signature_name, inputs, notify=None):
        inputs = {name: np.asarray(a) for name, a in inputs.items()}
        pending = _Pending(signature_name, inputs, _batch_size(inputs), time.monotonic(), notify)
        key = _merge_key(signature_name, inputs)
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

    def stats(self):
        """A snapshot of the counters (``BatchingStats``)."""
        with self._condition:
            return dataclasses.replace(self._stats, batch_sizes=collections.Counter(self._stats.batch_sizes),
                                       calls_by_signature=collections.Counter(self._stats.calls_by_signature))

    def queued(self):
        """Requests waiting for a batch now."""
        with self._condition:
            return self._queued

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

    # ------------------------------------------------------------------------------- batch threads
    def _work(self):
        while True:
            with self._condition:
                batch = self._next_batch()
            if batch is None:
                return
            try:
                self._run(batch)
            except Exception as error:  # noqa: BLE001 - e.g. MemoryError concatenating: fail this batch only
                for pending in batch:
                    if not pending.done.is_set():
                        pending.error = error
                        pending.finish()

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
                     if self._closed or now >= queue[0].arrival + self._timeout
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

    def _call(self, batch, inputs, size):
        with self._condition:
            self._stats.model_calls += 1
            self._stats.batch_sizes[size] += 1
            self._stats.calls_by_signature[batch[0].signature_name] += 1
            for pending in batch:
                pending.call = (self._stats.model_calls, size)
        return self._predict(batch[0].signature_name, inputs)

    def _run_alone(self, pending):
        try:
            pending.outputs = self._call([pending], pending.inputs, pending.size)
        except Exception as error:  # noqa: BLE001 - the caller's own error, raised in its thread
            pending.error = error
        pending.finish()

    def _run(self, batch):
        if len(batch) == 1:
            return self._run_alone(batch[0])
        total = sum(p.size for p in batch)
        try:
            merged = {name: np.concatenate([p.inputs[name] for p in batch]) for name in batch[0].inputs}
            with self._condition:
                self._stats.merged_calls += 1
            outputs = {name: np.asarray(v) for name, v in self._call(batch, merged, total).items()}
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
            pending.outputs = {name: v[start:start + pending.size].copy() for name, v in outputs.items()}
            start += pending.size
            pending.finish()

