"""The network a run trains and how it is compiled: built by ``keras_preact.models``, wrapped for
``model.fit`` (on-device augmentation and normalization with ``pipeline="device"``), compiled with the
official trainer's optimizer and schedule."""

import keras

from keras_preact.models.registry import FAMILIES

from . import augment, optimizers, schedules


def build_classifier(config, num_classes):
    """The run's network, built by the registry's builder of its family (``config.architecture``).
    ImageNet nets take any input size, so the same weights test at 224 and at 320 (Table 5)."""
    size = (None, None) if config.architecture == "imagenet" else tuple(config.image_size)
    return FAMILIES[config.architecture](config.depth, num_classes, input_shape=(*size, 3),
                                         drop_path_rate=config.drop_path_rate, remat=config.remat,
                                         name=config.name.replace(".", "_"), **config.unit_options)


def build_model(config, num_classes, resolved, *, pipeline="tf_data", mean=None, std=None):
    """(classifier, fit_model). ``fit_model`` holds the classifier and is the one compiled: with
    ``pipeline="device"`` behind on-device augmentation and normalization (``augment``, uint8 pixels
    in, ``mean``/``std`` in 0-255 units). The classifier stays uncompiled, so the saved ``model.keras``
    loads with plain Keras (no ``TorchSGD`` to import); the backups hold the optimizer."""
    classifier = build_classifier(config, num_classes)
    if pipeline == "device":
        model = augment.device_training_model(classifier, augmentation=config.augmentation, mean=mean,
                                              std=std, seed=config.seed)
    else:
        images = keras.Input(classifier.input_shape[1:], name="images")
        model = keras.Model(images, classifier(images), name=f"{classifier.name}_training")
    compile_model(model, config, resolved, num_classes)
    return classifier, model


def compile_model(model, config, resolved, num_classes):
    """Compile for training as the recipe says: ``TorchSGD`` on the schedule, cross-entropy, accuracy."""
    optimizer = optimizers.from_config(config, schedules.make(config, resolved))
    metrics = ["accuracy"]
    if num_classes > 5:
        metrics.append(keras.metrics.SparseTopKCategoricalAccuracy(5, name="top5_accuracy"))
    jit = {"auto": "auto", "true": True, "false": False}[str(config.jit_compile).lower()]
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy", metrics=metrics,
                  jit_compile=jit, steps_per_execution=config.steps_per_execution)
    return model
