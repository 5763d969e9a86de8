"""Run an exported artifact in its own runtime, behind one interface.

``load(version_dir, "onnx")`` returns a runtime whose ``predict(images)`` takes uint8 ``[N, H, W, 3]``
pixels (any N) and returns ``{"probabilities": [N, C] float32, "scores": [N, k] float32,
"classes": [N, k] int32}`` as numpy arrays; ``input_size`` is ``(H, W)``, ``class_names`` and
``input_config`` come from the version directory's assets. Each format has one entry in ``RUNTIMES``:
onnxruntime, LiteRT (``ai_edge_litert``, else TensorFlow's ``tf.lite``), OpenVINO (CPU, float32
inference: its CPU default may be bfloat16) and TensorFlow for the SavedModel. A runtime that is not
installed raises one ImportError naming the extra to install. LiteRT and OpenVINO read their files into
memory (by default both map them): a file overwritten or truncated while it is served changes no answer
and cannot kill the process (SIGBUS).
"""

import importlib
import os
import pathlib

import numpy as np

from keras_preact.export.contract import INPUT_NAME, OUTPUT_NAMES
from keras_preact.export.formats import FORMATS
from keras_preact.export.version_dir import read_assets


def _import(module, format_name):
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(f"running a {format_name} export needs {module}: {FORMATS[format_name].install}") from None


class Runtime:
    """An exported version directory loaded in one runtime: ``predict(uint8 images) -> dict``."""

    format_name = ""

    def __init__(self, version_dir):
        self.version_dir = str(version_dir)
        path = os.path.join(self.version_dir, FORMATS[self.format_name].files[0])
        if not os.path.exists(path):
            raise ValueError(f"Invalid version_dir={self.version_dir!r}: it holds no {self.format_name} export "
                             f"({FORMATS[self.format_name].files[0]} is missing).")
        self.class_names, self.input_config = read_assets(self.version_dir)
        self._load(path)

    @property
    def input_size(self):
        """``(height, width)`` of the images ``predict`` takes."""
        return self.input_config.crop_size

    def predict(self, images):
        images = np.asarray(images)
        if images.dtype != np.uint8 or images.shape[1:] != (*self.input_size, 3) or not len(images):
            raise ValueError(f"Invalid images: expected uint8 [N, {self.input_size[0]}, {self.input_size[1]}, 3] with "
                             f"N >= 1, got {images.dtype} {list(images.shape)}.")
        outputs = self._run(np.ascontiguousarray(images))
        return {name: np.asarray(outputs[name]) for name in OUTPUT_NAMES}


class OnnxRuntime(Runtime):
    format_name = "onnx"

    def _load(self, path):
        ort = _import("onnxruntime", self.format_name)
        self._session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])

    def _run(self, images):
        return dict(zip(OUTPUT_NAMES, self._session.run(list(OUTPUT_NAMES), {INPUT_NAME: images})))


class LiteRTRuntime(Runtime):
    format_name = "litert"

    def _load(self, path):
        try:
            from ai_edge_litert.interpreter import Interpreter
        except ImportError:
            try:
                from tensorflow.lite import Interpreter
            except ImportError:
                raise ImportError(f"running a litert export needs ai_edge_litert: {FORMATS['litert'].install}") from None
        self._runner = Interpreter(model_content=pathlib.Path(path).read_bytes()).get_signature_runner()

    def _run(self, images):
        return self._runner(**{INPUT_NAME: images})  # resizes the input to N


class OpenVINORuntime(Runtime):
    format_name = "openvino"

    def _load(self, path):
        ov = _import("openvino", self.format_name)
        self._compiled = ov.Core().compile_model(path, "CPU", {"INFERENCE_PRECISION_HINT": "f32", "ENABLE_MMAP": False})

    def _run(self, images):
        results = self._compiled(images)
        return {output.get_any_name(): results[output] for output in self._compiled.outputs}


class SavedModelRuntime(Runtime):
    format_name = "saved_model"

    def _load(self, path):
        self._tf = _import("tensorflow", self.format_name)
        self._serve = self._tf.saved_model.load(self.version_dir).signatures["serving_default"]

    def _run(self, images):
        return {k: v.numpy() for k, v in self._serve(**{INPUT_NAME: self._tf.constant(images)}).items()}


RUNTIMES = {runtime.format_name: runtime for runtime in (SavedModelRuntime, OnnxRuntime, LiteRTRuntime, OpenVINORuntime)}


def load(version_dir, format):  # noqa: A002 (the format's name, as in model.export)
    """``version_dir``'s ``format`` export loaded in its runtime (a ``Runtime``).

    Examples:
        ``export_model``'s example loads its SavedModel; the format is checked first:

        >>> from keras_preact.export import load
        >>> load("saved_models/cifar/1", "tflite")
        Traceback (most recent call last):
        ...
        ValueError: Invalid format='tflite': the formats are saved_model, onnx, litert, openvino.
    """
    if format not in RUNTIMES:
        raise ValueError(f"Invalid format={format!r}: the formats are {', '.join(RUNTIMES)}.")
    return RUNTIMES[format](version_dir)
