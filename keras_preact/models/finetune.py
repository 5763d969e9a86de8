"""Fine-tuning: a trained backbone under a new head, and freezing the backbone up to a point.

``create_model(name, weights=W, num_classes=K)`` reads W (``keras_preact.pretrained.loader.get_loader``: a
registered weights name, a local ``.weights.h5``/``.keras`` file or training run directory, another library's
checkpoint) and, when K or the class names differ from W's, loads W's backbone under a freshly initialised
head (timm's ``reset_classifier``, keras-hub's ``from_preset(num_classes=K)``). ``set_trainable`` freezes the
backbone up to a stage: a frozen ``BatchNormalization`` runs in inference mode (Keras 3 semantics, as in Keras'
transfer-learning guide), so its moving statistics stay those of the source.

The two-phase recipe (Keras' "Transfer learning & fine-tuning" guide; Kornblith et al. 2019 for the
lower rate) with plain ``model.fit``::

    model = create_model("cifar_resnet20", weights="cifar10", num_classes=5, trainable_from="head")
    model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(images, labels, epochs=5)          # 1. the new head only: the backbone is frozen
    set_trainable(model, "stem")                  # 2. every layer (or "stage3": the last stages)
    model.compile(keras.optimizers.Adam(1e-5), "sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(images, labels, epochs=5)          # recompile after changing trainable, as Keras requires

Images go in as the model's ``input_config`` says (``keras_preact.applications.preprocess_input``).
"""

import keras

# Normalization layers whose parameters (and statistics) ``freeze_norm`` keeps fixed.
NORMALIZATIONS = (keras.layers.BatchNormalization, keras.layers.GroupNormalization, keras.layers.LayerNormalization)


def head_plan(source, overrides):
    """(the classes, whether the head is new): a new head when ``num_classes`` or ``class_names`` differ
    from the source's (a ``Loader``'s); ``num_classes`` defaults to the number of ``class_names``, else the source's."""
    class_names = overrides.get("class_names")
    num_classes = overrides.get("num_classes")
    if num_classes is None:
        num_classes = len(class_names) if isinstance(class_names, (list, tuple)) else source.num_classes
    names_differ = (class_names is not None and source.class_names is not None
                    and tuple(class_names) != tuple(source.class_names))
    return num_classes, num_classes != source.num_classes or names_differ


def trainable_points(backbone):
    """``{point: index in the backbone's layer chain}`` (its ``group_matcher`` groups, in order): ``"stem"`` (0),
    ``"stage<s>"`` and ``"stage<s>_unit<u>"`` (that unit), ``"final"`` (the ordering's final ops) and ``"head"``
    (the end)."""
    points, index = {}, 0
    for group, names in backbone.group_matcher().items():
        points[group] = index
        if group.startswith("stage"):
            points.update({name: index + i for i, name in enumerate(names)})
        index += len(names)
    points["head"] = index
    return points


def set_trainable(model, trainable_from="stem", *, freeze_norm=False):
    """Train ``model`` from ``trainable_from`` on: the backbone's layers before it are frozen
    (``trainable=False``; a frozen ``BatchNormalization`` runs in inference mode, keeping its moving
    statistics, as Keras' transfer-learning guide relies on); those from it on and the head train.

    Args:
        model: a keras-preact classifier (``create_model``, ``PreActResNetClassifier``) or backbone.
        trainable_from: ``"stem"`` (every layer), ``"stage<s>"`` (stage s and later, e.g. ``"stage3"``),
            ``"stage<s>_unit<u>"`` (from one unit), ``"final"`` (the final BN-ReLU and the head) or
            ``"head"`` (the head only: the whole backbone frozen).
        freeze_norm: also keep every normalization layer frozen (inference mode) where the rest trains,
            as detection fine-tuning does with small batches.

    Returns:
        ``model``. Compile it (again) after this call: Keras fixes what trains at ``compile``.

    Examples:
        >>> from keras_preact.models import create_model, set_trainable
        >>> model = create_model("cifar_resnet20", num_classes=5)
        >>> _ = set_trainable(model, "stage3")  # stage 3, the final BN-ReLU and the head train
        >>> model.backbone.get_layer("stage2_unit3").trainable, model.backbone.get_layer("stage3_unit1").trainable
        (False, True)
        >>> len(set_trainable(model, "head").trainable_weights)  # the dense kernel and bias
        2
    """
    backbone = getattr(model, "backbone", model)
    if not hasattr(backbone, "group_matcher"):
        raise ValueError(
            f"Invalid model={model!r:.100}: a keras-preact classifier or PreActResNetBackbone is required."
        )
    points = trainable_points(backbone)
    if trainable_from not in points:
        allowed = ", ".join(repr(p) for p in points if "_unit" not in p)
        raise ValueError(f"Invalid trainable_from={trainable_from!r}. Allowed values: {allowed}, or a unit "
                         "'stage<s>_unit<u>'.")
    # False, then True: on TensorFlow, setting an attribute to the value it holds is skipped (its tracking's
    # __setattr__), so ``trainable = True`` on a model already True would not reach the layers frozen inside.
    model.trainable = False
    model.trainable = True
    chain = [name for names in backbone.group_matcher().values() for name in names]
    for name in chain[:points[trainable_from]]:
        backbone.get_layer(name).trainable = False
    if trainable_from == "head":
        backbone.trainable = False
    if freeze_norm:
        for layer in backbone._flatten_layers(include_self=False):
            if isinstance(layer, NORMALIZATIONS):
                layer.trainable = False
    return model



# The all-layers phase keeps the batch-norm statistics of the trained weights below this batch or this many
# training images (``freeze_norm_rule``).
FREEZE_NORM_BELOW_BATCH = 64
FREEZE_NORM_BELOW_IMAGES = 20_000


def freeze_norm_rule(batch_size, num_images):
    """Whether the all-layers phase of fine-tuning keeps every normalization layer frozen (``set_trainable(...,
    freeze_norm=True)``): when the batch is under 64 or the training set under 20,000 images.

    A batch's statistics are noisy under about 64 images (Wu and He, "Group Normalization", ECCV 2018, Fig. 1)
    and a few thousand images re-estimate the moving statistics of a network trained on many more; then the
    features move under the head just trained. BiT fine-tunes without batch statistics (group normalization and
    weight standardisation; Kolesnikov et al., "Big Transfer", ECCV 2020) and its HyperRule calls a data set
    under 20,000 images small. Measured in docs/fine-tuning.md: at batch 32 on 900 images, unfreezing the
    statistics lowered accuracy in all 3 runs; frozen, the all-layers phase gained.

    Examples:
        >>> from keras_preact.models.finetune import freeze_norm_rule
        >>> freeze_norm_rule(batch_size=32, num_images=900), freeze_norm_rule(batch_size=256, num_images=50_000)
        (True, False)
    """
    for argument, value in (("batch_size", batch_size), ("num_images", num_images)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"Invalid {argument}={value!r}: a positive integer is required.")
    return batch_size < FREEZE_NORM_BELOW_BATCH or num_images < FREEZE_NORM_BELOW_IMAGES


# A linear probe that classifies this share of the training images or more leaves the all-layers phase little to
# learn; that phase then trains at half its rate (``rate_after_probe``).
SEPARABLE = 0.99


def rate_after_probe(rate, probe_accuracy):
    """The peak learning rate of the all-layers phase that starts from a linear-probe head (LP-FT: Kumar et al.,
    "Fine-Tuning can Distort Pretrained Features", ICLR 2022): ``rate``, halved when the probe already classifies
    99% or more of the training images right (``probe_accuracy``, on the training images themselves).

    Features that already separate the training images give the all-layers phase little to learn and much to
    overfit: on 3 CIFAR-10 classes of a network trained on CIFAR-10 (the probe right on 99.7% of 900 images), every
    layer at SGD 0.01 ended 0.07 points under to 0.13 over the probed head (3 seeds), at 0.005 0.13 to 0.27 over;
    on 5 classes the network never saw (the probe right on 80-83%), 0.005 cost 0.3 points at 500 images and 1.6 at
    2,500 (docs/fine-tuning.md, "The all-layers rate").

    Examples:
        >>> from keras_preact.models.finetune import rate_after_probe
        >>> rate_after_probe(0.01, probe_accuracy=0.997), rate_after_probe(0.01, probe_accuracy=0.83)
        (0.005, 0.01)
    """
    if not isinstance(rate, (int, float)) or isinstance(rate, bool) or not rate > 0:
        raise ValueError(f"Invalid rate={rate!r}: a learning rate > 0 is required.")
    if not isinstance(probe_accuracy, (int, float)) or isinstance(probe_accuracy, bool) or not 0 <= probe_accuracy <= 1:
        raise ValueError(f"Invalid probe_accuracy={probe_accuracy!r}: a share of the training images in [0, 1] "
                         "is required.")
    return rate / 2 if probe_accuracy >= SEPARABLE else rate
