"""Distribution: one entry per ``--distribute`` choice (paper: 2 GPUs x 64 = batch 128).

Global-batch semantics everywhere: ``batch_size`` is the global batch, split evenly over replicas
(it must be divisible by their number); the learning rate is the one of the global batch (no implicit
scaling; ``lr_scaling="linear"`` scales it with batch_size / reference_batch_size).

- ``none``: the default device.
- ``mirrored``: ``tf.distribute.MirroredStrategy`` over the local devices (TensorFlow backend); BN
  statistics are per replica (as in the paper's 2-GPU Torch runs).
- ``multiworker``: ``tf.distribute.MultiWorkerMirroredStrategy`` from ``TF_CONFIG`` (TensorFlow
  backend), one process per worker; Keras 3 ``fit`` needs ``keras_preact_training.machine.compat``'s fix for it
  (keras-team/keras#20585), applied here.
- ``data-parallel``: ``keras.distribution.DataParallel`` over all devices (JAX backend), multi-process
  when ``KERAS_DISTRIBUTION_JOB_ADDRESSES`` / ``_NUM_PROCESSES`` / ``_PROCESS_ID`` are set (or given
  as arguments): ``keras.distribution.initialize`` joins the processes; each process feeds its shard
  (global batch / processes) of every global batch. Synchronised BN: the batch statistics are
  computed over the global (sharded) batch by XLA's SPMD partitioner.
"""

import contextlib
import dataclasses
import os

import keras
import numpy as np

from . import compat


@dataclasses.dataclass
class Distribution:
    """What the training loop needs from a strategy."""

    name: str
    scope: object  # a context manager factory: model and optimizer are created inside it
    num_replicas: int
    process_index: int = 0
    process_count: int = 0

    @property
    def is_chief(self):
        return self.process_index == 0


def _require_backend(name, backend):
    if keras.backend.backend() != backend:
        raise ValueError(
            f"distribute={name!r} needs KERAS_BACKEND={backend}; the backend is "
            f"{keras.backend.backend()!r}. Allowed with this backend: "
            f"{', '.join(repr(n) for n, b in BACKENDS.items() if b in (None, keras.backend.backend()))}."
        )


def _none(config):
    return Distribution("none", contextlib.nullcontext, 1, 0, 1)


def _mirrored(config):
    import tensorflow as tf

    # All local GPUs, or else every logical CPU device (tests split one CPU into two).
    devices = tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("CPU")
    strategy = tf.distribute.MirroredStrategy([d.name for d in devices])
    return Distribution("mirrored", strategy.scope, strategy.num_replicas_in_sync, 0, 1)


def _multiworker(config):
    import json

    import tensorflow as tf

    if "TF_CONFIG" not in os.environ:
        raise ValueError(
            "distribute='multiworker' needs TF_CONFIG, e.g. "
            '{"cluster": {"worker": ["localhost:12345", "localhost:12346"]}, '
            '"task": {"type": "worker", "index": 0}}.'
        )
    compat.apply_multiworker_fix()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    task = json.loads(os.environ["TF_CONFIG"]).get("task", {})
    workers = len(json.loads(os.environ["TF_CONFIG"])["cluster"].get("worker", [1]))
    return Distribution("multiworker", strategy.scope, strategy.num_replicas_in_sync,
                        int(task.get("index", 0)), workers)


def _data_parallel(config):
    if os.environ.get("KERAS_DISTRIBUTION_NUM_PROCESSES"):
        keras.distribution.initialize()
    import jax

    devices = keras.distribution.list_devices()
    # Each process feeds its own shard of every global batch (train.py), so Keras must not re-shard.
    distribution = keras.distribution.DataParallel(devices=devices, auto_shard_dataset=False)
    keras.distribution.set_distribution(distribution)
    return Distribution("data-parallel", contextlib.nullcontext, len(devices),
                        jax.process_index(), jax.process_count())


DISTRIBUTIONS = {
    "none": _none,
    "mirrored": _mirrored,
    "multiworker": _multiworker,
    "data-parallel": _data_parallel,
}
BACKENDS = {"none": None, "mirrored": "tensorflow", "multiworker": "tensorflow", "data-parallel": "jax"}


def make(config):
    """The ``Distribution`` for ``config.distribute``, after checking backend and batch size."""
    name = config.distribute
    if BACKENDS[name]:
        _require_backend(name, BACKENDS[name])
    distribution = DISTRIBUTIONS[name](config)
    check_batch(config.batch_size, distribution)
    return distribution


def check_pipeline(pipeline, distribution):
    """tf.distribute strategies take the tf.data pipeline (their replicas split a tf.data stream)."""
    if pipeline != "tf_data" and distribution.name in ("mirrored", "multiworker"):
        raise ValueError(
            f"Invalid pipeline={pipeline!r} with distribute={distribution.name!r}: tf.distribute "
            "strategies take pipeline='tf_data' (or 'auto')."
        )


def check_batch(batch_size, distribution):
    if batch_size % distribution.num_replicas:
        raise ValueError(
            f"Invalid batch_size={batch_size}: the global batch must be divisible by the "
            f"{distribution.num_replicas} replicas of distribute={distribution.name!r}."
        )


# ------------------------------------------------------------------ multi-process data sharding
def shard_eval_index(n, batch_size, index, count):
    """The test-set positions process ``index`` of ``count`` evaluates: its slice of every full global batch of
    ``batch_size`` (multi-process data-parallel; a short last global batch is left out on every process)."""
    per = batch_size // count
    full = (n // batch_size) * batch_size
    return np.concatenate([np.arange(k + index * per, k + (index + 1) * per) for k in range(0, full, batch_size)])


def shard_eval(images, labels, batch_size, index, count):
    """This process's slices of the test set in global batches (multi-process data-parallel)."""
    pick = shard_eval_index(len(labels), batch_size, index, count)
    return images[pick], labels[pick]


class ShardedTrain:
    """Wrap a global-batch stream so this process keeps its slice of every global batch."""

    def __init__(self, index, count):
        self.index, self.count = index, count

    def numpy(self, stream):
        for x, y in stream:
            per = len(y) // self.count
            sl = slice(self.index * per, (self.index + 1) * per)
            yield x[sl], y[sl]

    def tf_data(self, ds, global_batch):
        import tensorflow as tf

        n = global_batch // self.count  # static, so Keras sees the per-process batch size

        def cut(x, y):
            x, y = x[self.index * n:(self.index + 1) * n], y[self.index * n:(self.index + 1) * n]
            return tf.ensure_shape(x, [n, *x.shape[1:]]), tf.ensure_shape(y, [n])

        return ds.map(cut)
