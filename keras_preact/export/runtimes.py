"""Run an exported artifact in its own runtime, behind one interface.

``load(version_dir, "onnx")`` returns a runtime whose ``predict(images)`` takes uint8 ``[N, H, W, 3]``
pixels (any N) and returns ``{"probabilities": [N, C] float32, "scores": [N, k] float32,
"classes": [N, k] int32}`` as numpy arrays; ``input_size`` is ``(H, W)``, ``class_names`` and
``input_config`` come from the version directory's assets. Each format has one entry in ``RUNTIMES``:
onnxruntime, LiteRT (``ai_edge_litert``, else TensorFlow's ``tf.lite``), OpenVINO (CPU, float32
inference: its CPU default may be bfloat16) and TensorFlow for the SavedModel. A runtime that is not
installed raises one ImportError naming the extra to install. LiteRT and OpenVINO read their files into
memory (by default both map them): a file overwritten or truncated while it is served changes no answer
and cannot kill the process (SIGBUS). ``predict`` may be called from several threads at once: ONNX Runtime's
session and TensorFlow's functions are thread-safe; OpenVINO's infer requests and LiteRT's interpreters are not,
so each call takes one of a small pool (``RunnerPool``), never one another thread is running.
"""

import contextlib
import importlib
import os
import pathlib
import queue
import threading

import numpy as np

from keras_preact.export.contract import INPUT_NAME, OUTPUT_NAMES
from keras_preact.export.formats import FORMATS, INT8_FILES
from keras_preact.export.version_dir import read_assets

# LiteRT interpreters per model: one per core (each runs a call on one thread). OpenVINO's infer requests: as many as
# the compiled model reports optimal (1 on CPU under its default LATENCY hint: one stream on every core; 16 requests
# ran 16 threads' calls no faster, loaded 2-core AMD EPYC).
LITERT_RUNNERS = os.cpu_count() or 1


def _import(module, format_name):
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(f"running a {format_name} export needs {module}: {FORMATS[format_name].install}") from None


class RunnerPool:
    """Runners of one model that each run one call at a time: a call takes a free one, made as needed up to ``size``
    (else it waits for one), and gives it back.

    Examples:
        >>> pool = RunnerPool(list, size=2)
        >>> with pool.runner() as first, pool.runner() as second:
        ...     first is second
        False
    """

    def __init__(self, make, size):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"Invalid size={size!r}: expected a positive integer.")
        self._make, self.size = make, size
        self._free = queue.LifoQueue()  # the most recently used first: its buffers are sized and warm
        self._made = 0
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def runner(self):
        try:
            runner = self._free.get_nowait()
        except queue.Empty:
            with self._lock:
                make = self._made < self.size
                self._made += make
            if make:
                try:
                    runner = self._make()
                except BaseException:
                    with self._lock:
                        self._made -= 1
                    raise
            else:
                runner = self._free.get()
        try:
            yield runner
        finally:
            self._free.put(runner)


PRECISIONS = ("fp32", "int8")  # the float model of a format, or its int8 model (keras_preact.export.quantize)


def model_file(format, precision="fp32"):  # noqa: A002 (the format's name, as in model.export)
    """The file under a version directory that holds ``format``'s model at ``precision``, or None.

    Examples:
        >>> from keras_preact.export.runtimes import model_file
        >>> model_file("onnx"), model_file("openvino", "int8"), model_file("litert", "int8")
        ('model.onnx', 'openvino/model-int8.xml', None)
    """
    if precision == "fp32":
        return FORMATS[format].files[0]
    return INT8_FILES[format][0] if format in INT8_FILES else None


class Runtime:
    """An exported version directory loaded in one runtime: ``predict(uint8 images) -> dict``; ``precision`` "int8":
    the format's int8 model."""

    format_name = ""

    def __init__(self, version_dir, precision="fp32"):
        self.version_dir, self.precision = str(version_dir), precision
        file = model_file(self.format_name, precision)
        if file is None:
            raise ValueError(f"Invalid precision={precision!r}: a {self.format_name} export has no int8 model (int8 "
                             "models are written for onnx and openvino).")
        path = os.path.join(self.version_dir, file)
        if not os.path.exists(path):
            what = "export" if precision == "fp32" else "int8 model"
            raise ValueError(f"Invalid version_dir={self.version_dir!r}: it holds no {self.format_name} {what} "
                             f"({file} is missing).")
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
                raise ImportError(
                    f"running a litert export needs ai_edge_litert: {FORMATS['litert'].install}"
                ) from None
        content = pathlib.Path(path).read_bytes()
        self._runners = RunnerPool(lambda: Interpreter(model_content=content).get_signature_runner(), LITERT_RUNNERS)

    def _run(self, images):
        with self._runners.runner() as run:
            return run(**{INPUT_NAME: images})  # resizes the input to N; the outputs are copies


class OpenVINORuntime(Runtime):
    format_name = "openvino"

    def _load(self, path):
        ov = _import("openvino", self.format_name)
        self._compiled = ov.Core().compile_model(path, "CPU", {"INFERENCE_PRECISION_HINT": "f32", "ENABLE_MMAP": False})
        self._requests = RunnerPool(self._compiled.create_infer_request,
                                    self._compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS"))

    def _run(self, images):
        with self._requests.runner() as request:
            results = request.infer({0: images})  # the outputs copied out of the request
        return {output.get_any_name(): results[output] for output in self._compiled.outputs}


class SavedModelRuntime(Runtime):
    format_name = "saved_model"

    def _load(self, path):
        self._tf = _import("tensorflow", self.format_name)
        self._serve = self._tf.saved_model.load(self.version_dir).signatures["serving_default"]

    def _run(self, images):
        return {k: v.numpy() for k, v in self._serve(**{INPUT_NAME: self._tf.constant(images)}).items()}


RUNTIMES = {
    runtime.format_name: runtime for runtime in (SavedModelRuntime, OnnxRuntime, LiteRTRuntime, OpenVINORuntime)
}


def load(version_dir, format, precision="fp32"):  # noqa: A002 (the format's name, as in model.export)
    """``version_dir``'s ``format`` export loaded in its runtime (a ``Runtime``); ``precision="int8"``: its int8 model
    (``export_model(..., quantize="int8")``, onnx and openvino).

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
    if precision not in PRECISIONS:
        raise ValueError(f"Invalid precision={precision!r}: expected one of {', '.join(PRECISIONS)}.")
    return RUNTIMES[format](version_dir, precision)
