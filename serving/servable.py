"""What the REST front ends serve: the latest version of an export, each signature run by one runtime.

``load_servable(model_base, name, runtime="auto")`` loads the highest numeric version folder under
``model_base`` that holds an export of ``keras_preact.export`` (a SavedModel, ``model.onnx``,
``model.tflite``, ``openvino/model.xml``). The SavedModel's signatures (``serving_default`` on uint8
pixels, ``serving_float``, ``serving_bytes``) run on TensorFlow. ONNX, LiteRT and OpenVINO artifacts hold
``serving_default``'s contract alone (``keras_preact.export.formats``), so ``runtime`` chooses what runs
``serving_default``: a format's name, or ``"auto"``, the fastest runtime installed for a format present,
in the order ``RUNTIME_SPEED_ORDER`` (measured: BENCHMARKS.md, "Export runtimes"). With a SavedModel
and ``model.onnx`` side by side, uint8 requests then run on ONNX Runtime and encoded images on
TensorFlow. Without TensorFlow, a version with ``model.onnx`` serves ``serving_default`` alone; a
SavedModel alone says in one line what to install.
"""

import importlib.util
import pathlib

import numpy as np

from keras_preact.export.contract import ServingContract
from keras_preact.export.formats import FORMATS
from serving import rest
from serving.rest import RequestError

# Fastest first on CPU (BENCHMARKS.md, "Export runtimes": CIFAR ResNet-20 and ResNet-50, batch 1 and 64):
# OpenVINO f32 fastest in 3 of 4 cells, ONNX Runtime in the 4th; LiteRT beat the SavedModel only on the
# small network, and ran at 0.65-0.94x of it on ResNet-50.
RUNTIME_SPEED_ORDER = ("openvino", "onnx", "saved_model", "litert")
RUNTIMES = ("auto", *RUNTIME_SPEED_ORDER)
PIXELS_SIGNATURE = "serving_default"  # the one signature every format holds
# The file that marks each format in a version folder, and the modules that run it: the export's table.
ARTIFACTS = {name: FORMATS[name].files[0] for name in RUNTIME_SPEED_ORDER}
RUNTIME_MODULES = {name: FORMATS[name].runtime_modules for name in RUNTIME_SPEED_ORDER}


def _installed(fmt):
    modules = [*RUNTIME_MODULES[fmt]] + (["tensorflow"] if fmt == "litert" else [])  # tf.lite also runs LiteRT
    return any(importlib.util.find_spec(m) is not None for m in modules)


def formats_in(version_dir):
    """The export formats present in a version folder, in ``RUNTIME_SPEED_ORDER``."""
    return tuple(f for f in RUNTIME_SPEED_ORDER if (pathlib.Path(version_dir) / ARTIFACTS[f]).is_file())


def latest_version_dir(model_base):
    """(version, path) of the highest numeric version folder holding an export under ``model_base``."""
    base = pathlib.Path(model_base)
    if not base.is_dir():
        raise ValueError(f"Invalid model_base_path={str(base)!r}: not a directory.")
    versions = sorted((int(p.name), p) for p in base.iterdir() if p.name.isdigit() and formats_in(p))
    if not versions:
        hint = " It is itself a version folder: pass its parent." if formats_in(base) else ""
        raise ValueError(
            f"Invalid model_base_path={str(base)!r}: no numeric version folder with an export "
            f"(<model_base_path>/<version>/ holding {', '.join(ARTIFACTS.values())}).{hint}"
        )
    return versions[-1]


def choose_runtimes(present, runtime="auto"):
    """``{"pixels": format, "saved_model": bool}``: what runs ``serving_default`` and whether the
    SavedModel's other signatures are served; ValueError/ImportError in one line otherwise."""
    if runtime not in RUNTIMES:
        raise ValueError(f"Invalid runtime={runtime!r}: expected one of {', '.join(RUNTIMES)}.")
    has_tf = "saved_model" in present and _installed("saved_model")
    if runtime == "auto":
        usable = [f for f in present if _installed(f)]
        if not usable:
            needs = " or ".join(f"{FORMATS[f].install} ({f})" for f in present)
            raise ImportError(f"serving this version ({', '.join(present)}) needs a runtime that is not installed: {needs}")
        return {"pixels": usable[0], "saved_model": has_tf}
    if runtime not in present:
        raise ValueError(f"Invalid runtime={runtime!r}: the version holds no {runtime} export (it holds "
                         f"{', '.join(present)}).")
    if not _installed(runtime):
        raise ImportError(f"runtime {runtime} is not installed: {FORMATS[runtime].install}")
    return {"pixels": runtime, "saved_model": has_tf}


def _op_error_message(error):
    """The op's own message out of a TensorFlow runtime error (without the graph-trace lines)."""
    lines = [line.strip() for line in error.message.splitlines()]
    noise = ("Graph execution error", "Detected at node", "<stack traces", "[[")
    useful = [line for line in lines if line and not line.startswith(noise)]
    return useful[0] if useful else error.message


class SavedModelSignatures:
    """The SavedModel's signatures on TensorFlow: input specs, signature defs (TF Serving's metadata)."""

    def __init__(self, path):
        import tensorflow as tf
        from google.protobuf import json_format
        from tensorflow.core.protobuf import saved_model_pb2

        self._tf = tf
        self._functions = dict(tf.saved_model.load(str(path)).signatures)
        self.input_specs = {
            key: {arg: rest.TensorSpec(arg, spec.dtype.name, tuple(spec.shape.as_list()))
                  for arg, spec in fn.structured_input_signature[1].items()}
            for key, fn in self._functions.items()
        }
        saved_model = saved_model_pb2.SavedModel()
        saved_model.ParseFromString((pathlib.Path(path) / "saved_model.pb").read_bytes())
        self.signature_defs = {
            key: json_format.MessageToDict(value, preserving_proto_field_name=True)
            for key, value in saved_model.meta_graphs[0].signature_def.items() if not key.startswith("__")
        }

    def predict(self, signature_name, inputs):
        tf = self._tf
        try:
            outputs = self._functions[signature_name](**{k: tf.constant(v) for k, v in inputs.items()})
        except (tf.errors.InvalidArgumentError, tf.errors.OutOfRangeError) as error:
            # E.g. bytes that are not a decodable image.
            raise RequestError(f"Invalid input: {_op_error_message(error)}") from None
        return {k: v.numpy() for k, v in outputs.items()}


class ArtifactSignature:
    """``serving_default`` run by an ONNX / LiteRT / OpenVINO runtime (``keras_preact.export.load``),
    with the SavedModel's outputs: the serving contract's, and the top-k ``class_names``."""

    def __init__(self, path, fmt):
        from keras_preact.export.runtimes import load

        self._runtime = load(path, fmt)
        height, width = self._runtime.input_size
        self._names = np.array([name.encode("utf-8") for name in self._runtime.class_names], dtype=object)
        scores = self._runtime.predict(np.zeros((1, height, width, 3), np.uint8))["scores"]  # and a warm-up
        self._serving = ServingContract(self._runtime.input_config, scores.shape[1])
        images = self._serving.input_name
        self.input_spec = {images: rest.TensorSpec(images, "uint8", (None, height, width, 3))}
        self.signature_def = {
            "inputs": {images: _tensor_info("DT_UINT8", [-1, height, width, 3])},
            "outputs": {name: _tensor_info(dtype, dims) for name, (dtype, dims) in
                        self._serving.output_dims(len(self._names)).items()},
            "method_name": "tensorflow/serving/predict",
        }

    def predict(self, signature_name, inputs):
        outputs = self._runtime.predict(inputs[self._serving.input_name])
        return {**outputs, self._serving.class_names_output: self._names[outputs["classes"]]}


def _tensor_info(dtype, dims):
    return {"dtype": dtype, "tensor_shape": {"dim": [{"size": str(-1 if d is None else d)} for d in dims]}}


class Servable:
    """One loaded version: ``signatures`` (name -> the format that runs it), ``input_specs``,
    ``metadata`` and ``status()`` as TF Serving answers them, and ``predict``, which raises a 400
    ``RequestError`` for an input the model cannot take."""

    def __init__(self, name, model_base, runtime="auto"):
        if runtime not in RUNTIMES:
            raise ValueError(f"Invalid runtime={runtime!r}: expected one of {', '.join(RUNTIMES)}.")
        self.name = name
        self.version, self.path = latest_version_dir(model_base)
        self.formats = formats_in(self.path)
        choice = choose_runtimes(self.formats, runtime)
        self._runners, self.input_specs, signature_defs, self.signatures = {}, {}, {}, {}
        if choice["saved_model"]:
            saved = SavedModelSignatures(self.path)
            for key in saved.input_specs:
                self._runners[key], self.signatures[key] = saved, "saved_model"
            self.input_specs.update(saved.input_specs)
            signature_defs.update(saved.signature_defs)
        if choice["pixels"] != "saved_model":
            artifact = ArtifactSignature(self.path, choice["pixels"])
            self._runners[PIXELS_SIGNATURE], self.signatures[PIXELS_SIGNATURE] = artifact, choice["pixels"]
            self.input_specs[PIXELS_SIGNATURE] = artifact.input_spec
            signature_defs.setdefault(PIXELS_SIGNATURE, artifact.signature_def)
        self.metadata = {
            "model_spec": {"name": name, "signature_name": "", "version": str(self.version)},
            "metadata": {"signature_def": {"signature_def": signature_defs}},
        }

    def describe(self):
        """One line: which runtime runs which signature."""
        by_format = {}
        for signature, fmt in sorted(self.signatures.items(), key=lambda item: (item[0] != PIXELS_SIGNATURE, item[0])):
            by_format.setdefault(fmt, []).append(signature)
        return "; ".join(f"{', '.join(sigs)} on {fmt}" for fmt, sigs in by_format.items())

    def status(self):
        return {
            "model_version_status": [
                {"version": str(self.version), "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}
            ]
        }

    def predict(self, signature_name, inputs):
        return self._runners[signature_name].predict(signature_name, inputs)
