"""Weight EMA in a run (``config.ema_momentum``): Keras optimizers' ``use_ema`` keeps the averages; a run
evaluates, saves and exports them.

Keras ends every ``model.fit`` with ``optimizer.finalize_variable_values``, which writes the averages into the
model. A run fits in several calls (the head and all-layers phases, a resumed epoch's rest, a last partial
epoch), so ``KeepTrainingWeights`` puts the trained (raw) weights back after each call, and the run writes the
averages in once at its end (``use_averages``): the weights do not depend on where the fits were cut, and a
resumed run ends as an uninterrupted one. ``EvaluateAverages`` evaluates the averages during fit (Keras'
``SwapEMAWeights`` refuses a ``MultiOptimizer`` whose stage optimizers are not built yet, as in the head phase
under layer-wise decay).
"""

import keras


class KeepTrainingWeights(keras.callbacks.Callback):
    """Keep the trainable weights of a fit's last epoch end; after the fit (and Keras' ``finalize_variable_values``)
    put them back."""

    def on_train_begin(self, logs=None):
        self.kept = None

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.params["epochs"] - 1:
            self.kept = [keras.ops.convert_to_numpy(v) for v in self.model.trainable_weights]

    def on_train_end(self, logs=None):
        if self.kept is not None:
            for variable, value in zip(self.model.trainable_weights, self.kept):
                variable.assign(value)


class EvaluateAverages(keras.callbacks.Callback):
    """Evaluate (fit's validation) with the averaged weights: written in at the test's start
    (``finalize_variable_values``), the trained ones put back at its end."""

    def on_test_begin(self, logs=None):
        self.kept = [keras.ops.convert_to_numpy(v) for v in self.model.trainable_weights]
        use_averages(self.model)

    def on_test_end(self, logs=None):
        for variable, value in zip(self.model.trainable_weights, self.kept):
            variable.assign(value)


def averaging_parts(model):
    """The optimizers of ``model`` (itself, or a ``MultiOptimizer``'s inner ones) that hold moving averages."""
    optimizer = model.optimizer
    parts = [optimizer, *getattr(optimizer, "optimizers", ())] if optimizer is not None else []
    return [p for p in parts if getattr(p, "use_ema", False) and getattr(p, "_model_variables_moving_average", None)]


def use_averages(model):
    """Write the optimizer's moving averages into ``model``'s trainable weights (when it keeps them), as Keras'
    ``finalize_variable_values``, but as copies: on JAX a weight sharing its average's buffer would take the
    average with it when a step donates the weights (Keras' own store of the averages, as ``SwapEMAWeights``)."""
    for part in averaging_parts(model):
        for variable, average in zip(part._trainable_variables, part._model_variables_moving_average):
            variable.assign(keras.ops.convert_to_numpy(average))


def start_averages(model):
    """A fresh optimizer in the middle of a run (the all-layers phase): built, its moving averages set to (copies
    of) the weights now. Keras starts them at zero and takes the first update whole only at iteration 0, which a
    phase that goes on along the schedule is not."""
    optimizer = model.optimizer
    if not any(getattr(p, "use_ema", False) for p in [optimizer, *getattr(optimizer, "optimizers", ())]):
        return
    if not optimizer.built:
        optimizer.build(model.trainable_variables)
    for part in averaging_parts(model):
        for variable, average in zip(part._trainable_variables, part._model_variables_moving_average):
            average.assign(keras.ops.convert_to_numpy(variable))
