"""The network a run trains and how it is compiled: built by ``keras_preact.models``, wrapped for
``model.fit`` (on-device augmentation and normalization with ``pipeline="device"``), compiled with the
official trainer's optimizer and schedule."""

import keras

from keras_preact.models.registry import FAMILIES

from . import augment, configs, optimizers, schedules


def build_classifier(config, num_classes, class_names=None):
    """The run's network, built by the registry's builder of its family (``config.architecture``).
    ImageNet nets take any input size, so the same weights test at 224 and at 320 (Table 5). With
    ``init_weights``: the network (``configs.network_spec``) from those weights, their
    backbone under a new head when the classes (``class_names``, the data's) differ from theirs."""
    size = (None, None) if config.architecture == "imagenet" else tuple(config.image_size)
    arguments = dict(input_shape=(*size, 3), drop_path_rate=config.drop_path_rate, remat=config.remat,
                     name=config.name.replace(".", "_"), **config.unit_options)
    if config.init_weights:
        # create_model(network, weights=...), with the run's own model name (create_model's ``name`` is the network's)
        return configs.network_spec(config).build(
            weights=configs.init_loader(config), num_classes=num_classes, class_names=class_names, **arguments)
    return FAMILIES[config.architecture](config.depth, num_classes, **arguments)


def new_head(config, class_names):
    """Whether the run's network (``build_classifier``) has a new head: fine-tuning from ``init_weights`` whose
    classes differ from ``class_names`` (``keras_preact.models.finetune.head_plan``)."""
    if not config.init_weights:
        return False
    from keras_preact.models.finetune import head_plan

    loader = configs.init_loader(config)
    return head_plan(loader, dict(num_classes=len(class_names), class_names=list(class_names)))[1]


def init_input_config(config):
    """The input config the network was trained with (``normalization="model"``): the init weights' own
    (a run's or ``.keras`` file's; another library's checkpoint's or a registered checkpoint's preprocessing),
    else the registered network's."""
    loader = configs.init_loader(config)
    own = loader.input_config if loader is not None else None
    return own if own is not None else configs.network_spec(config).input_config


def head_steps(config, resolved):
    """The iterations that train only the new head (``head_fraction`` of the run)."""
    return round(config.head_fraction * resolved.total_steps)


def set_phase(classifier, config, resolved, step):
    """Freeze the backbone while ``step`` is in the head phase; every layer trains after it, the batch-norm
    statistics kept frozen while training when ``resolved.freeze_norm``; at ``total_steps`` (the saved model)
    every layer is trainable."""
    from keras_preact.models import set_trainable

    if config.head_fraction:
        head = step < head_steps(config, resolved)
        set_trainable(classifier, "head" if head else "stem",
                      freeze_norm=resolved.freeze_norm and not head and step < resolved.total_steps)
    elif resolved.freeze_norm:  # fine-tuning without a head phase: every layer, the statistics frozen
        set_trainable(classifier, "stem", freeze_norm=step < resolved.total_steps)


def build_model(config, num_classes, resolved, *, pipeline="tf_data", mean=None, std=None, class_names=None,
                steps_per_execution=None,
                start_step=0):
    """(classifier, fit_model). ``fit_model`` holds the classifier and is the one compiled: with
    ``pipeline="device"`` behind on-device augmentation and normalization (``augment``, uint8 pixels
    in, ``mean``/``std`` in 0-255 units). The classifier stays uncompiled, so the saved ``model.keras``
    loads with plain Keras (no ``TorchSGD`` to import); the backups hold the optimizer. At ``start_step``
    in the head phase (``head_fraction``) the backbone is frozen."""
    classifier = build_classifier(config, num_classes, class_names)
    set_phase(classifier, config, resolved, start_step)
    if pipeline == "device":
        model = augment.device_training_model(classifier, augmentation=config.augmentation, mean=mean,
                                              std=std, seed=config.seed, mixed=bool(config.mixup or config.cutmix),
                                              rand_augment=config.rand_augment)
    else:
        images = keras.Input(classifier.input_shape[1:], name="images")
        model = keras.Model(images, classifier(images), name=f"{classifier.name}_training")
    compile_model(model, config, resolved, num_classes, steps_per_execution=steps_per_execution)
    return classifier, model


def compile_model(model, config, resolved, num_classes, *, steps_per_execution=None):
    """Compile for training as the recipe says: ``TorchSGD`` on the schedule, cross-entropy, accuracy;
    ``steps_per_execution``: the app's choice (``keras_preact_training.machine.execution``), else the config's,
    else 1."""
    classifier = next((layer for layer in (model, *model.layers) if hasattr(layer, "backbone")), model)
    optimizer = optimizers.from_config(config, schedules.make(config, resolved), classifier)
    metrics = ["accuracy"]
    if num_classes > 5:
        metrics.append(keras.metrics.SparseTopKCategoricalAccuracy(5, name="top5_accuracy"))
    jit = {"auto": "auto", "true": True, "false": False}[str(config.jit_compile).lower()]
    loss = "sparse_categorical_crossentropy"
    if config.mixup or config.cutmix:  # mixed one-hot labels (keras_preact_training.data.mixing)
        loss = keras.losses.CategoricalCrossentropy(label_smoothing=config.label_smoothing)
        metrics = [keras.metrics.CategoricalAccuracy(name="accuracy")]
        if num_classes > 5:
            metrics.append(keras.metrics.TopKCategoricalAccuracy(5, name="top5_accuracy"))
    elif config.label_smoothing:
        loss = smoothed_cross_entropy(num_classes, config.label_smoothing)
    model.compile(optimizer=optimizer, loss=loss, metrics=metrics,
                  jit_compile=jit, steps_per_execution=steps_per_execution or config.steps_per_execution or 1)
    return model


def smoothed_cross_entropy(num_classes, smoothing):
    """Cross-entropy on integer labels smoothed by ``smoothing`` (Szegedy et al. 2016): Keras'
    ``categorical_crossentropy(..., label_smoothing=)`` on the one-hot labels."""

    def loss(labels, probabilities):
        labels = keras.ops.one_hot(keras.ops.reshape(keras.ops.cast(labels, "int32"), (-1,)), num_classes)
        return keras.losses.categorical_crossentropy(labels, probabilities, label_smoothing=smoothing)

    loss.__name__ = "smoothed_cross_entropy"
    return loss
