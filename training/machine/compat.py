"""Where ``training`` relies on Keras internals: each use is here, with the Keras version it was checked
against (``CHECKED_AGAINST``) and a test that fails when Keras changes it.

1. ``variable_index(optimizer, variable)``: the position of a variable among an optimizer's variables,
   for per-variable state in ``TorchSGD.update_step`` (Keras' own optimizers call the private
   ``Optimizer._get_variable_index``, which also maps a backend variable to its Keras variable; there is
   no public equivalent). Tested by ``tests/test_training_recipe.py::test_compat_variable_index``.

2. ``model.fit`` under ``tf.distribute.MultiWorkerMirroredStrategy``:

Keras 3's TensorFlow trainer fails under MultiWorkerMirroredStrategy (keras-team/keras#20585) in two
functions of ``keras/src/backend/tensorflow/trainer.py``; ``apply_multiworker_fix()`` replaces them:

- ``TensorFlowTrainer._maybe_symbolic_build`` reduces the first distributed batch across workers with
  ``strategy.reduce("MEAN", PerReplica batch)``, which raises "Attempt to convert a value
  (PerReplica...)". The build only needs shapes and dtypes: the fixed version takes the first local
  replica's batch.
- ``reduce_per_replica`` reduces the scalar per-replica losses and metrics of a multi-worker step with
  ``strategy.reduce("MEAN", v, axis=0)``, invalid for a scalar. The fixed version reduces scalars
  across replicas with ``axis=None``.

The fix is applied only while distribute="multiworker" is in use, and only to Keras versions from
``BROKEN_SINCE`` up to (not including) ``FIXED_IN`` (None: no fixed release yet; checked against
Keras 3.15.1). ``tests/test_training_distribute.py`` runs fit unpatched and fails loudly once the
installed Keras no longer needs this module.
"""

import functools

import keras

CHECKED_AGAINST = "3.15.1"
UPSTREAM_ISSUE = "keras-team/keras#20585"
BROKEN_SINCE = (3, 0)
FIXED_IN = None
PATCHED_FUNCTIONS = ("TensorFlowTrainer._maybe_symbolic_build", "reduce_per_replica")
_applied = False


def variable_index(optimizer, variable):
    """The index of ``variable`` (a Keras or backend variable) among ``optimizer``'s built variables."""
    return optimizer._get_variable_index(variable)


def keras_version():
    return tuple(int(part) for part in keras.version().split(".")[:2])


def needs_multiworker_fix(version=None):
    """Whether this Keras version is in the known-broken range."""
    version = version or keras_version()
    return version >= BROKEN_SINCE and (FIXED_IN is None or version < FIXED_IN)


def apply_multiworker_fix():
    """Patch the two trainer functions (idempotent); returns whether a patch is in place."""
    global _applied
    if _applied or not needs_multiworker_fix():
        return _applied
    import tensorflow as tf
    from keras import tree
    from keras.src.backend.tensorflow import trainer as tf_trainer

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        if self._distribute_strategy is None:
            return
        if iterator is not None:
            for _, _, it in iterator:
                batch = next(it)
                data_batch = tree.map_structure(
                    lambda v: self.distribute_strategy.experimental_local_results(v)[0]
                    if isinstance(v, tf.distribute.DistributedValues) else v,
                    batch,
                )
                break
        with self.distribute_strategy.scope():
            self._symbolic_build(data_batch=data_batch)

    original_reduce = tf_trainer.reduce_per_replica

    @functools.wraps(original_reduce)
    def reduce_per_replica(values, strategy, reduction):
        if reduction in ("auto", "mean") and tf_trainer._collective_all_reduce_multi_worker(strategy):

            def _reduce(v):
                if v.shape.rank == 0:
                    return strategy.reduce("MEAN", v, axis=None)
                return original_reduce(v, strategy, reduction)

            return tree.map_structure(_reduce, values)
        return original_reduce(values, strategy, reduction)

    tf_trainer.TensorFlowTrainer._maybe_symbolic_build = _maybe_symbolic_build
    tf_trainer.reduce_per_replica = reduce_per_replica
    _applied = True
    return True
