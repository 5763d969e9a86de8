"""``export_model``: a classifier in each of several formats (``keras_preact.export.formats``), with int8 models
beside the ONNX and OpenVINO ones where asked (``keras_preact.export.quantize``), in one new version directory
(``keras_preact.export.version_dir``: checked, staged, renamed into place)."""

from keras_preact.export import quantize as quantization
from keras_preact.export import version_dir
from keras_preact.export.contract import ServingContract
from keras_preact.export.formats import FORMATS, check_formats


def export_model(model, export_dir="saved_models", *, formats=("saved_model",), name=None, version=None,
                 class_names=None, input_config=None, mean=None, std=None, top_k=None, image_size=None,
                 crop_fraction=None, interpolation=None, quantize=None, calibration_data=None,
                 calibration_images=quantization.DEFAULT_CALIBRATION_IMAGES,
                 max_accuracy_drop=quantization.DEFAULT_MAX_ACCURACY_DROP):
    """Write ``model`` in each of ``formats`` to one version directory ``export_dir/<name>/<version>/``.

    Args:
        model: a single-input image classifier ``[N, H, W, 3] -> [N, num_classes]`` whose output is
            probabilities (the package's models end in a softmax "predictions" layer).
        export_dir: the model base directory's parent (TF Serving's ``--model_base_path`` is
            ``export_dir/<name>``).
        name: the model name (a directory name); default ``model.name``.
        version: a positive integer; default: one more than the highest existing version. An existing
            version is never overwritten.
        class_names: one string per class (index = label); default the model's own ``class_names`` (a
            ``PreActResNetClassifier`` with trained weights), else ``"0"``, ``"1"``, ...
        mean, std: per-channel (R, G, B) normalization in 0-255 pixel units, applied in the graph as
            ``(pixels - mean) / std``; default 0 and 1 (the model consumes raw pixels). ``mean`` may
            also be an ``[H, W, 3]`` mean image (the paper's per-pixel mean subtraction).
        top_k: how many classes the ``classes``/``scores``/``class_names`` outputs hold
            (1 to num_classes); default ``min(5, num_classes)``.
        image_size: ``(height, width)``, needed only when the model's input size is dynamic.
        input_config: the model's ``keras_preact.preprocessing.InputConfig`` (or its ``to_dict()``),
            e.g. ``keras_preact.models.get_input_config(name)``: its ``input_size`` must match the model
            input; ``mean``/``std``/``crop_fraction``/``interpolation`` default to its values. Default:
            the model's own ``input_config`` (every classifier ``create_model`` builds carries its
            registry's), else none.
        crop_fraction: the ``serving_bytes`` evaluation view keeps the centre ``crop`` of the image
            whose shorter side is resized to ``ceil(crop / crop_fraction)`` (in the input config's
            ``crop_mode``: torchvision's arithmetic by default, Keras' for keras.applications and
            keras-hub weights, ``keras_preact.preprocessing.view_geometry``); in (0, 1]. Default: the
            input config's, else 1.0 (shorter side to the crop: CIFAR-style evaluation of the whole
            image). An ImageNet model evaluated at 224 of 256 needs 0.875 (its input config, carried by
            a ``create_model`` classifier), or its served view differs from the one its accuracy was
            measured on.
        interpolation: the resize method of that view (``keras_preact.preprocessing.INTERPOLATIONS``);
            default the input config's, else "bilinear".
        formats: names out of ``FORMATS`` (``saved_model``, ``onnx``, ``litert``, ``openvino``), or one name.
        quantize: "int8": beside the onnx and openvino models, an int8 model of each, calibrated on
            ``calibration_data`` and checked on its other images (``keras_preact.export.quantize``); default None.
        calibration_data: a folder of images, one sub-folder per class named as the model's classes.
        calibration_images: how many of its images calibrate (default 300, drawn with a fixed seed); every other
            one is held out to compare the float and the int8 model.
        max_accuracy_drop: the most top-1 points the int8 model may lose against the float one on the held-out
            images (default 0.5); past it ``AccuracyDropError`` is raised and nothing is written.

    Returns:
        The version directory written, a ``pathlib.Path``.

    Examples:
        A small classifier (it carries its input config: CIFAR's statistics at 16 x 16) as a SavedModel;
        ``formats=("saved_model", "onnx", "litert", "openvino")`` writes every format side by side.

        >>> import tempfile
        >>> import numpy as np
        >>> from keras_preact.export import export_model, load
        >>> from keras_preact.models import cifar_resnet
        >>> model = cifar_resnet(8, input_shape=(16, 16, 3))
        >>> with tempfile.TemporaryDirectory() as export_dir:
        ...     version_dir = export_model(model, export_dir, formats=("saved_model",), name="cifar", top_k=3)
        ...     (version_dir.relative_to(export_dir).as_posix(),
        ...      sorted(p.name for p in (version_dir / "assets").iterdir()))
        ...     outputs = load(version_dir, "saved_model").predict(np.zeros((2, 16, 16, 3), np.uint8))
        ('cifar/1', ['class_names.txt', 'preprocessing.json'])
        >>> {name: value.shape for name, value in outputs.items()}  # uint8 pixels in, normalised inside
        {'probabilities': (2, 10), 'scores': (2, 3), 'classes': (2, 3)}
    """
    formats = check_formats(formats)
    input_config, class_names, image_size = version_dir.carried(model, input_config, class_names, image_size)
    image_size, num_classes = version_dir.model_geometry(model, image_size)
    name = model.name if name is None else name
    version_dir.check_name("name", name)
    version_dir.check_version(version)
    top_k = version_dir.check_top_k(top_k, num_classes)
    class_names = version_dir.check_class_names(class_names, num_classes)
    input_config = version_dir.resolve_input_config(input_config, image_size, mean, std, crop_fraction, interpolation)
    quantized = quantization.check_quantization(quantize, formats, calibration_data, calibration_images,
                                                max_accuracy_drop)
    if quantized:
        quantization.calibration_split(calibration_data, class_names, calibration_images)  # the folder, checked
    serving = ServingContract(input_config, top_k)
    with version_dir.staged_version(export_dir, name, version, model, copies=len(formats) + len(quantized)) as (
        staging,
        scratch,
        target,
    ):
        for fmt in formats:  # the SavedModel first: it creates the (new) staging directory
            FORMATS[fmt].write(staging, model, serving, class_names, scratch, FORMATS[fmt])
        version_dir.write_assets(staging, class_names, input_config)
        if quantized:
            quantization.quantize_version(staging, quantized, calibration_data, class_names, input_config,
                                          calibration_images, max_accuracy_drop)
    return target


def export_saved_model(model, export_dir="saved_models", *, name=None, version=None, class_names=None,
                       input_config=None, mean=None, std=None, top_k=None, image_size=None, crop_fraction=None,
                       interpolation=None):
    """Write ``model`` to ``export_dir/<name>/<version>/`` as a SavedModel for TF Serving: ``export_model``
    with ``formats=("saved_model",)``; the other arguments are ``export_model``'s (documented there).

    Returns:
        The version directory written, a ``pathlib.Path``.

    Examples:
        ``export_model``'s example, with the SavedModel alone. Every argument is checked before any work:

        >>> from keras_preact.export import export_saved_model
        >>> from keras_preact.models import cifar_resnet
        >>> export_saved_model(cifar_resnet(8, input_shape=(16, 16, 3)), "saved_models", top_k=20)
        Traceback (most recent call last):
        ...
        ValueError: Invalid top_k=20: expected an integer in [1, 10] (num_classes).
    """
    return export_model(model, export_dir, formats=("saved_model",), name=name, version=version,
                        class_names=class_names, input_config=input_config, mean=mean, std=std, top_k=top_k,
                        image_size=image_size, crop_fraction=crop_fraction, interpolation=interpolation)
