"""``TrainingHealthCallback``: gradient norms, update ratios and activation statistics during fit.

The signals the paper's argument is about (Sec. 3-4: does the gradient reach every stage, does the
signal stay in range), watched while training: at every ``every_n_steps``-th step and at the last
step of every epoch it measures, per group of weights (``stem``, ``stage1`` ... ``stageN``,
``head``), the gradient norm on a fixed probe batch, the update ratio ||w_after - w_before|| /
||w_before|| of that training step, and the mean/std of every stage's output. The latest values go
into the epoch's ``logs`` (so ``CSVLogger`` and ``History`` record them; put this callback before
``CSVLogger``) and, with ``log_dir``, to TensorBoard at every measurement.
"""

import keras
import numpy as np

from keras_preact.analysis.autodiff import get_autodiff
from keras_preact.analysis.signals import network_parts


def weight_groups(model):
    """Ordered ``{group: [variables]}``: ``stem`` (before the first unit), ``stage1`` ... ``stageN``
    (the backbone's stages), ``head`` (the final ops and the classifier head).

    Examples:
        >>> from keras_preact.analysis import weight_groups
        >>> from keras_preact.models import cifar_resnet
        >>> groups = weight_groups(cifar_resnet(8, input_shape=(8, 8, 3)))
        >>> list(groups), [len(variables) for variables in groups.values()]
        (['stem', 'stage1', 'stage2', 'stage3', 'head'], [1, 6, 6, 6, 4])
    """
    backbone, _ = network_parts(model)
    stages = backbone.residual_units
    first = backbone.layers.index(stages[0][0])
    groups = {"stem": [v for layer in backbone.layers[:first] for v in layer.trainable_variables]}
    for s, stage in enumerate(stages):
        groups[f"stage{s + 1}"] = [v for unit in stage for v in unit.trainable_variables]
    seen = {id(v) for vs in groups.values() for v in vs}
    groups["head"] = [v for v in model.trainable_variables if id(v) not in seen]
    return {name: variables for name, variables in groups.items() if variables}


def stage_outputs(model):
    """``{stage: output of its last unit}`` in stage order, as tensors of the backbone's graph."""
    backbone, _ = network_parts(model)
    return {info["stage"]: backbone.get_layer(info["layer"]).output for info in backbone.feature_info}


def make_probe_model(model):
    """``images -> [model output, *stage outputs]`` sharing ``model``'s variables."""
    backbone, head = network_parts(model)
    stages = stage_outputs(model)
    features = keras.Model(backbone.inputs[0], [backbone.output, *stages.values()])
    images = keras.Input(shape=tuple(backbone.inputs[0].shape[1:]), dtype=backbone.inputs[0].dtype)
    final, *acts = features(images)
    return list(stages), keras.Model(images, [head(final), *acts])


def _first_batch(data):
    if isinstance(data, (tuple, list)) and len(data) == 2:
        return np.asarray(data[0]), np.asarray(data[1])
    try:  # a tf.data.Dataset or any iterable of (images, labels) batches
        images, labels = next(iter(data))[:2]
    except (TypeError, ValueError, StopIteration):
        raise ValueError(
            "Invalid data: expected an (images, labels) pair of arrays or a dataset of such "
            "batches."
        ) from None
    return keras.ops.convert_to_numpy(images), keras.ops.convert_to_numpy(labels)


class TrainingHealthCallback(keras.callbacks.Callback):
    """Per-stage gradient norms, weight-update ratios and activation mean/std during ``fit``.

    Args:
        data: the probe batch, ``(images, labels)`` arrays or a dataset (its first batch is used).
            Gradients are taken of ``loss`` on it with normalization in training mode (as in the
            training step; moving statistics are not touched).
        every_n_steps: measurement frequency in training steps (default 100); the last step of
            every epoch is always measured, so every epoch's ``logs`` carry values.
        log_dir: where to write TensorBoard scalars (``tf.summary``) at every measurement, e.g.
            ``RUN_DIR/tensorboard/health``; ``None`` for logs only.
        loss: a Keras loss; default sparse categorical cross-entropy on the model's output.
        prefix: key prefix; keys are ``{prefix}/{group}/{grad_norm|update_ratio}`` and
            ``{prefix}/{stage}/{act_mean|act_std}``.
        model: the network to measure when ``fit`` runs a model that holds it (e.g. the classifier
            behind on-device preprocessing); default the model being fit.

    Works under ``tf.distribute`` strategies (variables are read in cross-replica context).

    Examples:
        >>> import numpy as np
        >>> from keras_preact.analysis import TrainingHealthCallback
        >>> from keras_preact.models import cifar_resnet
        >>> model = cifar_resnet(8, input_shape=(8, 8, 3))
        >>> model.compile("sgd", "sparse_categorical_crossentropy")
        >>> images, labels = np.ones((4, 8, 8, 3)), np.arange(4)
        >>> health = TrainingHealthCallback((images, labels), every_n_steps=1)
        >>> history = model.fit(images, labels, batch_size=2, epochs=1, verbose=0, callbacks=[health])
        >>> health.measured_steps, sorted(key for key in history.history if key.startswith("health/stage1/"))
        ([0, 1], ['health/stage1/act_mean', 'health/stage1/act_std', 'health/stage1/grad_norm',
                  'health/stage1/update_ratio'])
    """

    def __init__(self, data, every_n_steps=100, *, log_dir=None, loss=None, prefix="health", model=None):
        super().__init__()
        self._measured_model = model
        if not isinstance(every_n_steps, int) or isinstance(every_n_steps, bool) or every_n_steps < 1:
            raise ValueError(f"Invalid every_n_steps={every_n_steps!r}: a positive integer is required.")
        self.images, self.labels = _first_batch(data)
        if self.images.shape[:1] != self.labels.shape[:1] or self.images.ndim != 4:
            raise ValueError(
                f"Invalid data: images {self.images.shape} and labels {self.labels.shape} must be "
                "one (batch, height, width, channels) batch with one label per image."
            )
        self.every_n_steps = every_n_steps
        self.log_dir = None if log_dir is None else str(log_dir)
        self.loss = keras.losses.get(loss) if loss is not None else keras.losses.SparseCategoricalCrossentropy()
        self.prefix = prefix
        self.latest = {}
        self.measured_steps = []  # global training steps (from 0) at which values were measured
        self._step = 0
        self._before = None
        self._writer = None

    # ----------------------------------------------------------------------------- setup
    def _setup(self):
        model = self.model
        if self._measured_model is not None:
            model = self._measured_model
        self._groups = weight_groups(model)
        self._stage_names, self._probe_model = make_probe_model(model)
        trainable = self._probe_model.trainable_variables
        index = {id(v): i for i, v in enumerate(trainable)}
        group_indices = [[index[id(v)] for v in vs] for vs in self._groups.values()]
        probe_model, loss_fn = self._probe_model, self.loss
        autodiff = get_autodiff()

        def objective(trainable_values, non_trainable_values, images, labels):
            (outputs, *acts), _ = probe_model.stateless_call(
                trainable_values, non_trainable_values, images, training=True
            )
            stats = [(keras.ops.mean(a), keras.ops.std(a)) for a in acts]
            return keras.ops.cast(loss_fn(labels, outputs), "float32"), stats

        def measure(trainable_values, non_trainable_values, images, labels):
            _, stats, grads = autodiff.value_and_grad(
                lambda t: objective(t, non_trainable_values, images, labels), [list(trainable_values)]
            )
            grads = grads[0]
            norms = [
                keras.ops.sqrt(sum(keras.ops.sum(keras.ops.square(grads[i])) for i in idx))
                for idx in group_indices
            ]
            return norms, stats

        self._measure = autodiff.compile(measure)
        if self.log_dir is not None and self._writer is None:
            import tensorflow as tf

            self._writer = tf.summary.create_file_writer(self.log_dir)

    def on_train_begin(self, logs=None):
        self._setup()

    # ------------------------------------------------------------------------ measuring
    def _is_measured(self, batch):
        steps = self.params.get("steps") if self.params else None
        return self._step % self.every_n_steps == 0 or (steps is not None and batch == steps - 1)

    def _weights(self):
        _ = self.model  # the public property syncs the JAX trainer's state into the variables
        return {g: [keras.ops.convert_to_numpy(v.value) for v in vs] for g, vs in self._groups.items()}

    def on_train_batch_begin(self, batch, logs=None):
        self._before = self._weights() if self._is_measured(batch) else None

    def on_train_batch_end(self, batch, logs=None):
        if self._before is not None:
            after = self._weights()
            for group, old in self._before.items():
                delta = np.sqrt(sum(np.sum((a - o).astype(np.float64) ** 2) for a, o in zip(after[group], old)))
                size = np.sqrt(sum(np.sum(o.astype(np.float64) ** 2) for o in old))
                self.latest[f"{self.prefix}/{group}/update_ratio"] = float(delta / max(size, 1e-30))
            self._before = None
            self.measured_steps.append(self._step)
            self._record_probe()
            self._write_summaries()
        self._step += 1

    def _record_probe(self):
        _ = self.model  # JAX: sync the trainer's state into the variables
        model = self._probe_model
        trainable = [keras.ops.convert_to_tensor(v.value) for v in model.trainable_variables]
        non_trainable = [keras.ops.convert_to_tensor(v.value) for v in model.non_trainable_variables]
        norms, stats = self._measure(trainable, non_trainable, self.images, self.labels)
        for group, norm in zip(self._groups, norms):
            self.latest[f"{self.prefix}/{group}/grad_norm"] = float(keras.ops.convert_to_numpy(norm))
        for stage, (mean, std) in zip(self._stage_names, stats):
            self.latest[f"{self.prefix}/{stage}/act_mean"] = float(keras.ops.convert_to_numpy(mean))
            self.latest[f"{self.prefix}/{stage}/act_std"] = float(keras.ops.convert_to_numpy(std))

    def _write_summaries(self):
        if self._writer is None:
            return
        import tensorflow as tf
        from tensorflow.core.framework import summary_pb2

        # tf.summary.write with TensorBoard's scalar metadata: what tf.summary.scalar writes,
        # without needing the tensorboard package.
        metadata = summary_pb2.SummaryMetadata(
            plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars")
        )
        with self._writer.as_default(step=self._step):
            for key, value in self.latest.items():
                tf.summary.write(key, tf.constant(value, tf.float32), metadata=metadata)
        self._writer.flush()

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs.update(self.latest)

    def on_train_end(self, logs=None):
        if self._writer is not None:
            self._writer.close()
            self._writer = None
