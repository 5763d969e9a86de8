"""Post-training int8 quantization of an export's ONNX and OpenVINO models, with its accuracy proven.

``export_model(..., quantize="int8", calibration_data=FOLDER)`` writes, beside each float model, an int8 model made
by the runtime's own tool from ``calibration_images`` of the folder's images (default 300, drawn with a fixed seed):

    model-int8.onnx                     onnx      onnxruntime.quantization.quantize_static: QDQ, int8 weights
                                                  (per channel), uint8 activations (U8S8: the VNNI path), MinMax
    openvino/model-int8.xml, .bin       openvino  nncf.quantize (NNCF's post-training quantization)
    quantization.json                   the calibration files and, per format, the float and int8 top-1 on the
                                        held-out images and the number of their predictions that differ

The preprocessing stays inside (uint8 pixels in, the contract's outputs out): an int8 model is served as its float
model is. Each image is the model's evaluation view (``keras_preact.layers.EvalView``: shorter side, centre crop, as
uint8 pixels, what a client sends); the images not drawn for calibration, never those, are the held-out set both
models are evaluated on. Where the int8 top-1 falls more than ``max_accuracy_drop`` points (default 0.5) below the
float model's, ``AccuracyDropError`` is raised and nothing is written (the version is staged until then).
"""

import contextlib
import json
import math
import os
import pathlib

import numpy as np

from keras_preact.export.formats import FORMATS, INT8_FILES

QUANTIZE_CHOICES = ("int8",)
QUANTIZED_FORMATS = tuple(INT8_FILES)  # the formats an int8 model is written for, in FORMATS order
REPORT = "quantization.json"
DEFAULT_CALIBRATION_IMAGES = 300  # NNCF's default subset size
DEFAULT_MAX_ACCURACY_DROP = 0.5  # top-1 points
SPLIT_SEED = 0
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif")
TOOLS = {"onnx": "onnxruntime.quantization.quantize_static (QDQ, per-channel int8 weights, uint8 activations, MinMax)",
         "openvino": "nncf.quantize (post-training quantization, performance preset)"}
TOOL_PACKAGES = {"onnx": ("onnxruntime",), "openvino": ("nncf", "openvino")}  # their versions go in the report
NEEDS = {"onnx": ("onnxruntime", 'pip install "keras-preact[onnx]"'),
         "openvino": ("nncf", 'pip install "keras-preact[quantize]"')}
EVALUATION_BATCH = 64
# ONNX operators quantized: the convolutions, the classifier, and the normalizations, activations and additions
# between them (the input's normalization, the softmax and the top-k of the contract stay float).
ONNX_OPS = ("Conv", "Gemm", "MatMul", "Add", "Mul", "Relu", "BatchNormalization", "MaxPool", "AveragePool",
            "GlobalAveragePool", "ReduceMean")


class AccuracyDropError(RuntimeError):
    """The int8 model's top-1 falls past the allowed drop: nothing was written."""


def _spelled(argument, flags):
    return "--" + argument.replace("_", "-") if flags else argument


def check_quantization(quantize, formats, calibration_data, calibration_images=DEFAULT_CALIBRATION_IMAGES,
                       max_accuracy_drop=DEFAULT_MAX_ACCURACY_DROP, flags=False):
    """The formats to quantize (a tuple, empty when ``quantize`` is None), after checking the arguments and the
    tools before any work: ValueError or ImportError in one line naming the argument (``flags``: the command-line
    flag, ``--calibration-data``).

    Examples:
        >>> from keras_preact.export.quantize import check_quantization
        >>> check_quantization(None, ("saved_model",), None)
        ()
        >>> check_quantization("int8", ("saved_model",), "photos")
        Traceback (most recent call last):
        ...
        ValueError: Invalid quantize='int8' with formats saved_model: int8 models are written for onnx and openvino;
        add one to formats.
    """
    name = lambda argument: _spelled(argument, flags)  # noqa: E731
    if quantize is None:
        if calibration_data is not None:
            raise ValueError(f"Invalid {name('calibration_data')}={str(calibration_data)!r}: it calibrates an int8 "
                             f"model; give {name('quantize')} int8 with it.")
        return ()
    if quantize not in QUANTIZE_CHOICES:
        raise ValueError(f"Invalid {name('quantize')}={quantize!r}: expected one of {', '.join(QUANTIZE_CHOICES)}.")
    quantized = tuple(f for f in QUANTIZED_FORMATS if f in formats)
    if not quantized:
        listed = "--format" if flags else "formats"
        raise ValueError(f"Invalid {name('quantize')}={quantize!r} with {listed} {','.join(formats)}: int8 models "
                         f"are written for onnx and openvino; add one to {listed}.")
    if calibration_data is None:
        raise ValueError(f"Invalid {name('quantize')}={quantize!r}: an int8 model needs {name('calibration_data')} "
                         "(a folder of images, one sub-folder per class) to calibrate and check it.")
    if not pathlib.Path(calibration_data).is_dir():
        raise ValueError(f"Invalid {name('calibration_data')}={str(calibration_data)!r}: not a directory (a folder of "
                         "images, one sub-folder per class named as the model's classes).")
    if isinstance(calibration_images, bool) or not isinstance(calibration_images, int) or calibration_images < 1:
        raise ValueError(f"Invalid {name('calibration_images')}={calibration_images!r}: expected a positive integer.")
    if isinstance(max_accuracy_drop, bool) or not isinstance(max_accuracy_drop, (int, float)) or not (
            0 <= max_accuracy_drop < math.inf):
        raise ValueError(f"Invalid {name('max_accuracy_drop')}={max_accuracy_drop!r}: expected a number of top-1 "
                         "points >= 0.")
    for fmt in quantized:
        module, install = NEEDS[fmt]
        if not _installed(module):
            raise ImportError(f"int8 {fmt} export needs {module}: {install}")
    return quantized


def _installed(module):
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def calibration_split(folder, class_names, calibration_images=DEFAULT_CALIBRATION_IMAGES, seed=SPLIT_SEED,
                      flags=False):
    """``((calibration files, labels), (held-out files, labels))`` of an image folder (one sub-folder per class,
    each named as one of ``class_names``; labels are indices into it): its files shuffled with ``seed``, the first
    ``calibration_images`` to calibrate, every other one held out. ValueError, one line, for a folder without
    such class folders, or too few images to hold any out.

    Examples:
        >>> import pathlib, tempfile
        >>> from keras_preact.export.quantize import calibration_split
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     for name in ("cat", "dog"):
        ...         (pathlib.Path(folder) / name).mkdir()
        ...         for i in range(3):
        ...             (pathlib.Path(folder) / name / f"{i}.png").touch()
        ...     (calibration, _), (held_out, _) = calibration_split(folder, ["cat", "dog"], calibration_images=4)
        >>> len(calibration), len(held_out), set(calibration) & set(held_out)
        (4, 2, set())
    """
    argument = _spelled("calibration_data", flags)
    root = pathlib.Path(folder)
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    foreign = [c for c in classes if c not in class_names]
    if not classes or foreign:
        shown = ", ".join(map(repr, list(class_names)[:5])) + (", ..." if len(class_names) > 5 else "")
        what = f"its class folders {', '.join(map(repr, foreign[:5]))} are not" if foreign else "no class folders"
        raise ValueError(f"Invalid {argument}={str(folder)!r}: {what} among the model's classes ({shown}); expected "
                         "one sub-folder of images per class, named as the model's classes.")
    files, labels = [], []
    for name in classes:
        found = sorted(p.relative_to(root).as_posix() for p in (root / name).iterdir()
                       if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file())
        files += found
        labels += [list(class_names).index(name)] * len(found)
    if len(files) <= calibration_images:
        raise ValueError(f"Invalid {argument}={str(folder)!r}: {len(files)} image{'s' * (len(files) != 1)}; "
                         f"{_spelled('calibration_images', flags)}={calibration_images} leaves none held out to check "
                         "the int8 model's accuracy on.")
    order = np.random.default_rng(seed).permutation(len(files))
    files, labels = [files[i] for i in order], np.asarray(labels, np.int64)[order]
    cut = calibration_images
    return (files[:cut], labels[:cut]), (files[cut:], labels[cut:])


def view_images(folder, files, input_config):
    """uint8 ``[N, H, W, 3]``: each file's evaluation view (``EvalView``, not normalized) at the model's input size,
    rounded to the pixels a client sends."""
    import keras

    from keras_preact.layers import EvalView
    from keras_preact.preprocessing import decode_image_array

    view = EvalView(input_config, normalize=False)
    height, width = input_config.crop_size
    out = np.empty((len(files), height, width, 3), np.uint8)
    for i, file in enumerate(files):
        try:
            decoded = decode_image_array(os.path.join(folder, file))
        except ValueError as error:
            raise ValueError(f"Invalid calibration_data={str(folder)!r}: {file}: {error}") from None
        pixels = keras.ops.convert_to_numpy(view(decoded))
        out[i] = np.clip(np.round(pixels), 0, 255).astype(np.uint8)
    return out


@contextlib.contextmanager
def _quiet_root_warnings():
    """ONNX Runtime's quantizer warns on the root logger for each normalization's scale, a vector, that it quantizes
    per tensor rather than per channel (what it should do): one line each, not the command's."""
    import logging

    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


def quantize_onnx(source, target, images):
    """``onnxruntime.quantization.quantize_static`` of the ONNX model ``source`` into ``target`` (QDQ), calibrated
    on ``images`` (uint8 ``[N, H, W, 3]``, one at a time), after ONNX Runtime's pre-processing (``quant_pre_process``:
    the graph optimized, batch normalizations folded into the convolutions before them)."""
    import tempfile

    from onnxruntime import quantization
    from onnxruntime.quantization.shape_inference import quant_pre_process

    from keras_preact.export.contract import INPUT_NAME

    class Reader(quantization.CalibrationDataReader):
        def __init__(self):
            self._items = iter([{INPUT_NAME: image[None]} for image in images])

        def get_next(self):
            return next(self._items, None)

    with tempfile.TemporaryDirectory() as scratch, _quiet_root_warnings():
        prepared = os.path.join(scratch, "prepared.onnx")
        quant_pre_process(source, prepared, skip_symbolic_shape=True)
        quantization.quantize_static(prepared, target, Reader(), quant_format=quantization.QuantFormat.QDQ,
                                     per_channel=True, activation_type=quantization.QuantType.QUInt8,
                                     weight_type=quantization.QuantType.QInt8, op_types_to_quantize=list(ONNX_OPS),
                                     calibrate_method=quantization.CalibrationMethod.MinMax)


def quantize_openvino(source, target, images):
    """``nncf.quantize`` of the OpenVINO IR ``source`` into ``target`` (an .xml beside its .bin), calibrated on
    ``images`` (uint8 ``[N, H, W, 3]``, one at a time)."""
    import nncf
    import openvino as ov

    model = ov.Core().read_model(source)
    dataset = nncf.Dataset([image[None] for image in images])
    with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):  # NNCF's progress bars (standard output
        # is an export command's answer, its standard error the lines it says)
        quantized = nncf.quantize(model, dataset, subset_size=len(images), preset=nncf.QuantizationPreset.PERFORMANCE)
    ov.save_model(quantized, target, compress_to_fp16=False)


QUANTIZERS = {"onnx": quantize_onnx, "openvino": quantize_openvino}


def _agreement(version_dir, formats, folder, files, labels, input_config):
    """Per format, the top-1 (percent) of its float and int8 models on ``files`` and how many predictions differ:
    each batch of images viewed once for every model."""
    from keras_preact.export.runtimes import load

    runtimes = {fmt: (load(version_dir, fmt), load(version_dir, fmt, precision="int8")) for fmt in formats}
    counts = {fmt: [0, 0, 0] for fmt in formats}  # float correct, int8 correct, differing
    for start in range(0, len(files), EVALUATION_BATCH):
        images = view_images(folder, files[start:start + EVALUATION_BATCH], input_config)
        truth = labels[start:start + EVALUATION_BATCH]
        for fmt, pair in runtimes.items():
            floats, int8s = (np.argmax(r.predict(images)["probabilities"], axis=-1) for r in pair)
            counts[fmt] = [c + int(np.sum(n)) for c, n in zip(counts[fmt], (floats == truth, int8s == truth,
                                                                             floats != int8s))]
    results = {}
    for fmt, (float_correct, int8_correct, differing) in counts.items():
        float_top1, int8_top1 = 100.0 * float_correct / len(files), 100.0 * int8_correct / len(files)
        results[fmt] = {"file": INT8_FILES[fmt][0], "tool": TOOLS[fmt], "float_top1": float_top1,
                        "int8_top1": int8_top1, "accuracy_drop": float_top1 - int8_top1, "differing": differing}
    return results


def _versions(formats):
    from importlib import metadata

    return {name: metadata.version(name) for fmt in formats for name in TOOL_PACKAGES[fmt]}


def quantize_version(version_dir, formats, folder, class_names, input_config, calibration_images,
                     max_accuracy_drop):
    """Write each format's int8 model and ``quantization.json`` into the (staged) ``version_dir``, which holds the
    float models and the assets; ``AccuracyDropError`` (one line) when a format's int8 top-1 on the held-out images
    falls more than ``max_accuracy_drop`` points below its float model's. Returns the report."""
    (calibration, _), (held_out, held_labels) = calibration_split(folder, class_names, calibration_images)
    images = view_images(folder, calibration, input_config)
    for fmt in formats:
        QUANTIZERS[fmt](os.path.join(version_dir, FORMATS[fmt].files[0]),
                        os.path.join(version_dir, INT8_FILES[fmt][0]), images)
    results = _agreement(version_dir, formats, folder, held_out, held_labels, input_config)
    for fmt, result in results.items():
        if result["accuracy_drop"] > max_accuracy_drop:
            raise AccuracyDropError(
                f"int8 {fmt} refused, nothing written: top-1 {result['int8_top1']:.2f}% against the float model's "
                f"{result['float_top1']:.2f}% on {len(held_out)} held-out images ({result['differing']} predictions "
                f"differ), a drop of {result['accuracy_drop']:.2f} points, more than the {max_accuracy_drop:g} allowed "
                "(the maximum accuracy drop).")
    report = {"quantize": "int8", "calibration_data": str(folder), "seed": SPLIT_SEED,
              "calibration_images": len(calibration), "held_out_images": len(held_out),
              "max_accuracy_drop": float(max_accuracy_drop), "formats": results, "versions": _versions(formats),
              "calibration_files": calibration}
    with open(os.path.join(version_dir, REPORT), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
        f.write("\n")
    return report
