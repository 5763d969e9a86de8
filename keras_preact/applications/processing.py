"""keras.applications' ``preprocess_input`` and ``decode_predictions``, from the model's own input config
and class names (what export and evaluation use), not one scaling for every model.

``preprocess_input(x, model)`` is ``(x - mean) / std`` with the model's ``InputConfig`` statistics, in
0-255 pixel units: what the model saw in training and what its exported ``serving_bytes`` applies after
the evaluation crop. Keras' own ResNetV2 scaling to [-1, 1] is ``preprocess_input_resnet_v2``.

Examples:
    >>> import numpy as np
    >>> from keras_preact.applications import decode_predictions, preprocess_input
    >>> from keras_preact.models import create_model
    >>> model = create_model("cifar_resnet20", weights="cifar10")
    >>> images = np.random.default_rng(0).uniform(0, 255, (2, 32, 32, 3))
    >>> top = decode_predictions(model.predict(preprocess_input(images, model), verbose=0), top=3, model=model)
    >>> len(top), [(type(index), name in model.class_names) for index, name, _ in top[0]]
    (2, [(<class 'int'>, True), (<class 'int'>, True), (<class 'int'>, True)])
"""

import keras
import numpy as np

from keras_preact.models.registry import model_spec
from keras_preact.preprocessing import InputConfig

WHAT_MODEL = ("a model carrying an input_config (every keras_preact builder's classifier), a registered "
              "model name or a keras_preact.preprocessing.InputConfig")


def _input_config(model):
    """The ``InputConfig`` of ``model`` (a model, a registered name, an InputConfig or its dict)."""
    if isinstance(model, InputConfig):
        return model
    if isinstance(model, dict):
        try:
            return InputConfig.from_dict(model)
        except ValueError as e:
            raise ValueError(f"Invalid model={model!r:.200}: {e}") from None
    if isinstance(model, str):
        try:
            return model_spec(model).input_config
        except ValueError as e:
            raise ValueError(f"Invalid model={model!r}: {e}") from None
    if model is None:
        raise ValueError(f"Invalid model=None: preprocess_input needs {WHAT_MODEL}, whose pixel statistics it "
                         "applies. For Keras' ResNetV2 [-1, 1] scaling use preprocess_input_resnet_v2.")
    config = getattr(model, "input_config", None)
    if not isinstance(config, InputConfig):
        raise ValueError(f"Invalid model={getattr(model, 'name', model)!r:.200}: it carries no input_config; pass "
                         f"{WHAT_MODEL} (or set model.input_config).")
    return config


def _data_format(model, data_format):
    if data_format is None:
        backbone = getattr(model, "backbone", None)
        data_format = getattr(backbone, "data_format", None) or keras.config.image_data_format()
    if data_format not in ("channels_last", "channels_first"):
        raise ValueError(f"Invalid data_format={data_format!r}. Allowed values: 'channels_last', 'channels_first'.")
    return data_format


def preprocess_input(x, model=None, data_format=None):
    """Images in 0-255 pixels to what ``model`` takes: ``(x - mean) / std`` with its input config's
    statistics (per channel, or a per-pixel mean image), in float32.

    Args:
        x: images, ``[..., H, W, C]`` (channels_last) or ``[..., C, H, W]``: a NumPy array (a NumPy
            array comes back, bit for bit what export and evaluation compute) or a backend tensor (a
            tensor comes back); already at the model's input size (resize and crop them with
            ``keras_preact.preprocessing.eval_view``).
        model: a model carrying an ``input_config`` (every builder's classifier does), a registered
            model name (``"cifar_resnet20"``) or an ``InputConfig``. Required: models differ (CIFAR's
            statistics, ImageNet's, Keras' ResNetV2 weights' [-1, 1]).
        data_format: of ``x``; default the model's, else Keras' setting.

    Examples:
        >>> from keras_preact.applications import preprocess_input
        >>> preprocess_input([[[[125.3, 123.0, 113.9]]]], "cifar_resnet20").tolist()  # CIFAR's mean pixel
        [[[[0.0, 0.0, 0.0]]]]
        >>> preprocess_input([[[[0.0, 0.0, 0.0]]]])
        Traceback (most recent call last):
        ...
        ValueError: Invalid model=None: preprocess_input needs a model carrying an input_config ...
    """
    config = _input_config(model)
    data_format = _data_format(model, data_format)
    mean, std = np.asarray(config.mean, "float32"), np.asarray(config.std, "float32")
    if data_format == "channels_first":
        mean = mean.reshape(-1, 1, 1) if mean.ndim == 1 else np.moveaxis(mean, -1, 0)
        std = std.reshape(-1, 1, 1)
    if isinstance(x, (np.ndarray, list, tuple, int, float)):
        return (np.asarray(x).astype("float32") - mean) / std
    return (keras.ops.cast(x, "float32") - mean) / std


def preprocess_input_resnet_v2(x, data_format=None):
    """Keras' ResNetV2 preprocessing: pixels in [0, 255] to [-1, 1] (``keras.applications.resnet_v2``),
    the input of Keras' ImageNet weights. ``preprocess_input(x, model)`` applies the same to a model
    built with ``weights="imagenet"`` (its input config says so).

    Examples:
        >>> import numpy as np
        >>> from keras_preact.applications import preprocess_input_resnet_v2
        >>> preprocess_input_resnet_v2(np.array([[[[0.0, 127.5, 255.0]]]])).tolist()
        [[[[-1.0, 0.0, 1.0]]]]
    """
    return keras.applications.resnet_v2.preprocess_input(x, data_format=data_format)


def _class_names(model, class_names):
    if class_names is not None and model is not None:
        raise ValueError("Invalid model and class_names: pass one of them (class_names overrides nothing).")
    if class_names is not None:
        return tuple(class_names)
    if isinstance(model, str):
        try:
            trained = model_spec(model).weights
        except ValueError as e:
            raise ValueError(f"Invalid model={model!r}: {e}") from None
        names = {tuple(spec.class_names) for spec in trained.values() if spec.class_names}
        if len(names) != 1:
            why = ("it has no registered trained weights" if not trained else
                   "its registered trained weights carry no class names" if not names else
                   "its trained weights name different classes")
            raise ValueError(f"Invalid model={model!r}: {why}; pass the model built with its weights, or "
                             "class_names.")
        return names.pop()
    if model is None:
        raise ValueError("Invalid model=None: decode_predictions needs a model carrying class_names (built with "
                         "trained weights, or class_names=...), a registered model name with trained weights, or "
                         "class_names.")
    names = getattr(model, "class_names", None)
    if names is None:
        raise ValueError(f"Invalid model={getattr(model, 'name', model)!r:.200}: it carries no class_names (no "
                         "trained weights); set model.class_names or pass class_names.")
    return tuple(names)


def decode_predictions(preds, top=5, model=None, class_names=None):
    """The ``top`` classes of each prediction, best first, as keras.applications' ``decode_predictions``:
    one list per image of ``(class_index, class_name, score)``.

    Args:
        preds: ``[N, num_classes]`` scores (probabilities or logits).
        top: how many classes per image (1 to num_classes).
        model: a model carrying ``class_names`` (built with trained weights, e.g.
            ``create_model("cifar_resnet20", weights="cifar10")``), or a registered model name with trained
            weights; or give ``class_names`` instead.
        class_names: one name per class, index = label.

    Examples:
        >>> import numpy as np
        >>> from keras_preact.applications import decode_predictions
        >>> decode_predictions(np.array([[0.1, 0.7, 0.2]]), top=2, class_names=["ant", "bee", "cat"])
        [[(1, 'bee', 0.7), (2, 'cat', 0.2)]]
        >>> decode_predictions(np.eye(10)[[3]], top=1, model="cifar_resnet20")  # the shipped weights' classes
        [[(3, 'cat', 1.0)]]
    """
    names = _class_names(model, class_names)
    preds = np.asarray(keras.ops.convert_to_numpy(preds))
    if preds.ndim != 2 or preds.shape[1] != len(names):
        raise ValueError(f"Invalid preds of shape {preds.shape}: expected [N, {len(names)}], one score per class "
                         f"of the {len(names)} class names.")
    if not isinstance(top, int) or isinstance(top, bool) or not 1 <= top <= len(names):
        raise ValueError(f"Invalid top={top!r}: an integer from 1 to {len(names)} is required.")
    order = np.argsort(-preds, axis=1, kind="stable")[:, :top]
    return [[(int(i), names[i], float(row[i])) for i in best] for row, best in zip(preds, order)]
