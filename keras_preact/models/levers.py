"""Fine-tuning levers: layer-wise learning-rate decay, a linear probe (the new head's start in LP-FT, Kumar et al.
2022) and flip test-time augmentation.

- ``layerwise_decay(model, optimizer, decay)``: discriminative learning rates per stage (Howard & Ruder 2018,
  ULMFiT; BEiT's layer decay): the head trains at the optimizer's rate, the stage below at ``decay`` times it,
  ..., the stem at ``decay ** depth``. Built from Keras' public ``keras.optimizers.MultiOptimizer``: one copy of
  the optimizer per stage, its learning rate (a number or a schedule) scaled, so every optimizer (SGD, Adam,
  AdamW, ...) scales its *update* (scaling gradients would leave Adam's unchanged), under plain
  ``model.fit`` on TensorFlow, JAX and PyTorch.
- ``linear_probe(model, images, labels)``: the head fitted in closed form on frozen features (ridge regression
  to the one-hot labels, as big_vision's few-shot evaluator): one forward pass of the backbone, no
  backpropagation through it.
- ``flip_tta(model)``: test-time augmentation, the mean of the predictions on an image and its mirror image.

Weight EMA and gradient accumulation are Keras optimizers' own (``use_ema=True, ema_momentum=0.999``;
``gradient_accumulation_steps=K``); mixup, cutmix and RandAugment are Keras' layers (``keras.layers.MixUp``,
``CutMix``, ``RandAugment``). docs/fine-tuning.md, "Levers", says when to use which.
"""

import keras
import numpy as np

STEM, HEAD = "stem", "head"


def stage_groups(model):
    """``[(group, [layers])]`` from the input to the output: ``"stem"``, ``"stage1"``, ..., ``"stage<S>"``, then
    ``"head"`` (the final BN-ReLU of the pre-activation network, pooling and the dense layer)."""
    backbone = getattr(model, "backbone", model)
    if not hasattr(backbone, "_chain_names"):
        raise ValueError(f"Invalid model={model!r:.100}: a keras-preact classifier or PreActResNetBackbone "
                         "is required.")
    chain = list(backbone._chain_names)
    starts = [chain.index(names[0]) for names in backbone.stage_unit_names]
    ends = [chain.index(names[-1]) + 1 for names in backbone.stage_unit_names]
    groups = [(STEM, chain[:starts[0]])]
    groups += [(f"stage{s + 1}", chain[start:end]) for s, (start, end) in enumerate(zip(starts, ends))]
    groups.append((HEAD, chain[ends[-1]:]))
    layers = [(name, [backbone.get_layer(n) for n in names]) for name, names in groups]
    if backbone is not model:  # the classifier's own layers (pooling, dense) are the head's
        layers[-1][1].extend(layer for layer in model.layers if layer is not backbone and layer.weights)
    return layers


def stage_factors(model, decay):
    """``{group: decay ** (depth - k)}`` for the ``stage_groups`` k = 0 (stem) ... depth (head).

    Examples:
        >>> from keras_preact.models import cifar_resnet
        >>> stage_factors(cifar_resnet(20, num_classes=3), 0.5)
        {'stem': 0.0625, 'stage1': 0.125, 'stage2': 0.25, 'stage3': 0.5, 'head': 1.0}
    """
    if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0 < decay <= 1:
        raise ValueError(f"Invalid decay={decay!r}: a number in (0, 1] is required (1: no decay).")
    groups = [name for name, _ in stage_groups(model)]
    depth = len(groups) - 1
    return {name: float(decay) ** (depth - k) for k, name in enumerate(groups)}


@keras.saving.register_keras_serializable(package="keras_preact")
class ScaledSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """``schedule(step) * factor``: a stage's learning rate under ``layerwise_decay``."""

    def __init__(self, schedule, factor):
        self.schedule, self.factor = schedule, float(factor)

    def __call__(self, step):
        return keras.ops.multiply(self.schedule(step), self.factor)

    def get_config(self):
        return {"schedule": keras.optimizers.schedules.serialize(self.schedule), "factor": self.factor}

    @classmethod
    def from_config(cls, config):
        return cls(keras.optimizers.schedules.deserialize(config["schedule"]), config["factor"])


def scaled_copy(optimizer, factor, name):
    """A fresh optimizer of ``optimizer``'s class and config, its learning rate times ``factor``."""
    config = optimizer.get_config()
    rate = config["learning_rate"]
    if isinstance(rate, dict):  # a serialized schedule
        rate = ScaledSchedule(keras.optimizers.schedules.deserialize(rate), factor)
    else:
        rate = float(rate) * factor
    return type(optimizer).from_config({**config, "learning_rate": rate, "name": name})


def layerwise_decay(model, optimizer, decay):
    """Layer-wise learning-rate decay per stage: ``optimizer`` for the head, copies of it at ``decay ** (depth -
    k)`` times its learning rate for stage k (``stage_factors``), as one ``keras.optimizers.MultiOptimizer``.

    Args:
        model: a keras-preact classifier (``create_model``) or backbone.
        optimizer: a Keras optimizer, not yet built, its learning rate a number or a schedule. Its other
            arguments (``use_ema``, ``gradient_accumulation_steps``, weight decay, ...) go to every copy;
            AdamW's decoupled weight decay follows each copy's own rate.
        decay: in (0, 1]; 1 gives every stage the optimizer's rate.

    Returns:
        the optimizer to ``model.compile`` with. Each stage's optimizer is in ``.optimizers`` (the head's last).

    Examples:
        >>> import keras
        >>> from keras_preact.models import cifar_resnet
        >>> model = cifar_resnet(8, num_classes=3)
        >>> optimizer = layerwise_decay(model, keras.optimizers.SGD(0.1), 0.5)
        >>> [round(float(o.learning_rate), 5) for o in optimizer.optimizers]  # stem, stage 1, 2, 3, head
        [0.00625, 0.0125, 0.025, 0.05, 0.1]
    """
    multi = getattr(keras.optimizers, "MultiOptimizer", None)
    if multi is None:
        raise ImportError(f"layerwise_decay needs keras.optimizers.MultiOptimizer, which Keras {keras.__version__} "
                          "lacks (3.15 has it): pip install -U keras")
    if not isinstance(optimizer, keras.optimizers.Optimizer) or isinstance(optimizer, multi):
        raise ValueError(f"Invalid optimizer={optimizer!r:.100}: a Keras optimizer (not a MultiOptimizer) is "
                         "required.")
    factors = stage_factors(model, decay)
    by_group = {group: scaled_copy(optimizer, factors[group], f"{optimizer.name}_{group}") for group in factors}
    paths = {variable.path: by_group[group] for group, layers in stage_groups(model) for layer in layers
             for variable in layer.weights}
    head = by_group[HEAD]
    return multi(keras.optimizers.OptimizerMap(head, {path: opt for path, opt in paths.items()
                                                      if opt is not head}), name=f"{optimizer.name}_layerwise")


def features(model, images, batch_size=256):
    """The pooled backbone features of ``images`` (preprocessed as the model expects: an array, or batches as
    ``model.predict`` takes them, e.g. a ``keras.utils.PyDataset``), one forward pass in inference mode:
    ``[N, channels]`` float32."""
    backbone = getattr(model, "backbone", None)
    if backbone is None or not getattr(model, "head_layers", None):
        raise ValueError(f"Invalid model={model!r:.100}: a keras-preact classifier (create_model) is required.")
    pool = model.head_layers[0]
    inputs = keras.Input(backbone.image_shape)
    extractor = keras.Model(inputs, pool(backbone(inputs, training=False)))
    sized = {"batch_size": batch_size} if isinstance(images, np.ndarray) else {}
    return np.asarray(extractor.predict(images, verbose=0, **sized), np.float32)


def ridge_head(features_, labels, num_classes, l2=1e-3):
    """(kernel ``[C, K]``, bias ``[K]``) of ridge regression from ``features_`` to the one-hot ``labels``:
    ``(F'F + l2 n I) W = F'Y`` on centred features, in float64 (big_vision's few-shot linear evaluator)."""
    x = np.asarray(features_, np.float64)
    labels = np.asarray(labels).reshape(-1).astype(np.int64)
    if len(x) != len(labels) or not len(x):
        raise ValueError(f"Invalid labels: {len(labels)} for {len(x)} images; one per image is required.")
    if labels.min() < 0 or labels.max() >= num_classes:
        raise ValueError(f"Invalid labels: in [{labels.min()}, {labels.max()}]; allowed [0, {num_classes - 1}].")
    if isinstance(l2, bool) or not isinstance(l2, (int, float)) or not l2 >= 0:
        raise ValueError(f"Invalid l2={l2!r}: a number >= 0 is required.")
    targets = np.eye(num_classes)[labels]
    mean_x, mean_y = x.mean(0), targets.mean(0)
    centred = x - mean_x
    gram = centred.T @ centred + l2 * len(x) * np.eye(x.shape[1])
    kernel = np.linalg.lstsq(gram, centred.T @ (targets - mean_y), rcond=None)[0]
    return kernel.astype(np.float32), (mean_y - mean_x @ kernel).astype(np.float32)


def linear_probe(model, images, labels, *, l2=1e-3, batch_size=256):
    """Fit ``model``'s dense head in closed form on its frozen features (``ridge_head``): the backbone runs
    once over ``images`` (``features``), nothing is backpropagated, the backbone's weights and statistics stay.

    Args:
        model: a keras-preact classifier with a dense head (``create_model(..., num_classes=K)``).
        images: the training images, preprocessed as the model expects (``applications.preprocess_input``): an
            array, or batches in order (``features``).
        labels: integer class labels, one per image.
        l2: the ridge penalty per image (0: least squares).
        batch_size: images per forward pass.

    Returns:
        ``model``, its head set; its predictions' argmax is the ridge regression's.

    Examples:
        >>> import numpy as np
        >>> from keras_preact.models import cifar_resnet
        >>> model = cifar_resnet(8, num_classes=2, input_shape=(8, 8, 3))
        >>> x = np.random.default_rng(0).normal(size=(32, 8, 8, 3)).astype("float32")
        >>> _ = linear_probe(model, x, np.arange(32) % 2)
        >>> tuple(model.get_layer("logits").kernel.shape)
        (64, 2)
    """
    fit_head(model, features(model, images, batch_size), labels, l2=l2)
    return model


def fit_head(model, features_, labels, *, l2=1e-3):
    """``linear_probe`` on features already computed (``features``): ``model``'s dense head set to ``ridge_head``'s;
    returns the share of ``labels`` the fitted head gets right on those features (the probe's training accuracy,
    ``keras_preact.models.finetune.rate_after_probe``'s input).

    Examples:
        >>> import numpy as np
        >>> from keras_preact.models import cifar_resnet
        >>> model = cifar_resnet(8, num_classes=2, input_shape=(8, 8, 3))
        >>> x = np.random.default_rng(0).normal(size=(32, 8, 8, 3)).astype("float32")
        >>> fit_head(model, features(model, x), np.arange(32) % 2)  # 64 features separate 32 images
        1.0
    """
    dense = model.get_layer("logits") if any(layer.name == "logits" for layer in model.layers) else None
    if dense is None:
        raise ValueError(f"Invalid model={model.name!r}: no dense head ('logits'); build it with num_classes.")
    kernel, bias = ridge_head(features_, labels, dense.units, l2)
    dense.kernel.assign(kernel)
    dense.bias.assign(bias)
    predicted = np.argmax(np.asarray(features_, np.float64) @ kernel + bias, axis=-1)
    return float(np.mean(predicted == np.asarray(labels).reshape(-1)))


def flip_tta(model):
    """``model`` under flip test-time augmentation: a model whose output is the mean of ``model``'s outputs on
    the images and on their left-right mirror images (NHWC). The variables are ``model``'s own.

    Examples:
        >>> import numpy as np
        >>> from keras_preact.models import cifar_resnet
        >>> model = cifar_resnet(8, num_classes=3, input_shape=(8, 8, 3))
        >>> x = np.random.default_rng(0).normal(size=(2, 8, 8, 3)).astype("float32")
        >>> both = (model.predict(x, verbose=0) + model.predict(x[:, :, ::-1], verbose=0)) / 2
        >>> bool(np.allclose(flip_tta(model).predict(x, verbose=0), both, atol=1e-6))
        True
    """
    inputs = keras.Input(model.input_shape[1:], name="images")
    mirrored = keras.ops.flip(inputs, axis=2)
    average = keras.layers.Average(name="flip_average")([model(inputs), model(mirrored)])
    return keras.Model(inputs, average, name=f"{model.name}_flip_tta")
