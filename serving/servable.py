"""What the front ends serve: the newest version that loads, on the runtime ``runtime`` picks
(docs/export-and-serving.md, "Which runtime serves")."""

import importlib.util
import json
import logging
import pathlib
import traceback
import xml.etree.ElementTree as ElementTree

import numpy as np

from keras_preact.export.contract import ServingContract
from keras_preact.export.formats import FORMATS, INT8_FILES
from keras_preact.export.runtimes import model_file
from keras_preact.export.version_dir import ASSETS, CLASS_NAMES_ASSET, PREPROCESSING_ASSET
from keras_preact.preprocessing import InputConfig
from keras_preact_serving import rest
from keras_preact_serving.flags import RUNTIME_SPEED_ORDER, RUNTIMES  # fastest first on CPU; the --runtime choices
from keras_preact_serving.rest import RequestError

PIXELS_SIGNATURE = "serving_default"  # the one signature every format holds
# The file that marks each format in a version folder, and the modules that run it: the export's table.
ARTIFACTS = {name: FORMATS[name].files[0] for name in RUNTIME_SPEED_ORDER}
logger = logging.getLogger(__name__)


def _installed(fmt):
    modules = [*FORMATS[fmt].runtime_modules] + (["tensorflow"] if fmt == "litert" else [])  # tf.lite also runs LiteRT
    return any(importlib.util.find_spec(m) is not None for m in modules)


def formats_in(version_dir):
    """The export formats present in a version folder, in ``RUNTIME_SPEED_ORDER``."""
    return tuple(f for f in RUNTIME_SPEED_ORDER if (pathlib.Path(version_dir) / ARTIFACTS[f]).is_file())


MAX_VERSION = 2**63 - 1  # TF Serving's versions are int64


def version_number(name):
    """The version a folder's name is (ASCII digits 0-9, at most ``MAX_VERSION``), else None."""
    if not name.isascii() or not name.isdigit() or int(name) > MAX_VERSION:
        return None
    return int(name)


def version_dirs(model_base, skipped=None):
    """[(version, path), ...] of the version folders holding an export, newest first; else ValueError. Folders holding
    an export under another name are left out, each appended to ``skipped`` as (path, reason)."""
    base = pathlib.Path(model_base)
    if not base.is_dir():
        raise ValueError(f"Invalid model_base_path={str(base)!r}: not a directory.")
    versions = []
    for p in base.iterdir():
        if formats_in(p):
            if version_number(p.name) is not None:
                versions.append((version_number(p.name), p))
            elif skipped is not None:
                skipped.append(
                    (p, f"not a version: a version folder's name is ASCII digits 0-9, at most {MAX_VERSION}")
                )
    versions.sort(reverse=True)
    if not versions:
        hint = " It is itself a version folder: pass its parent." if formats_in(base) else ""
        raise ValueError(f"Invalid model_base_path={str(base)!r}: no numeric version folder with an export "
                         f"(<model_base_path>/<version>/ holding {', '.join(ARTIFACTS.values())}).{hint}")
    return versions


def latest_version_dir(model_base):
    """(version, path) of the highest numeric version folder holding an export under ``model_base``."""
    return version_dirs(model_base)[0]


def int8_in(version_dir):
    """The formats whose int8 model (``keras-preact-export --quantize int8``) a version folder holds, in
    ``RUNTIME_SPEED_ORDER``."""
    folder = pathlib.Path(version_dir)
    return tuple(f for f in RUNTIME_SPEED_ORDER if f in INT8_FILES and (folder / INT8_FILES[f][0]).is_file())


def split_runtime(runtime):
    """``(format, precision)`` of a ``--runtime`` choice: ``"onnx-int8"`` -> ``("onnx", "int8")``; a bare format or
    auto has precision None (the int8 model where the version holds one)."""
    fmt, _, precision = runtime.partition("-")
    return fmt, precision or None


def _holds(path, runtime):
    fmt, precision = split_runtime(runtime)
    return fmt in formats_in(path) and (precision != "int8" or fmt in int8_in(path))


def check_runtime(model_base, runtime="auto"):
    """``choose_runtimes`` for the newest version holding ``runtime`` (auto: the newest version): one line
    (ValueError, ImportError) unless some version can serve on it."""
    versions = version_dirs(model_base)
    holding = [path for _, path in versions if _holds(path, runtime)] or [versions[0][1]]
    return choose_runtimes(formats_in(holding[0]), runtime, int8_in(holding[0]))


def choose_runtimes(present, runtime="auto", int8=()):
    """``{"pixels": format, "precision": "fp32" or "int8", "saved_model": bool}``: what runs ``serving_default`` (the
    format's int8 model where ``int8`` holds it and ``runtime`` does not ask for fp32), and whether the SavedModel
    serves."""
    if runtime not in RUNTIMES:
        raise ValueError(f"Invalid runtime={runtime!r}: expected one of {', '.join(RUNTIMES)}.")
    has_tf = "saved_model" in present and _installed("saved_model")
    fmt, precision = split_runtime(runtime)
    if runtime == "auto":
        usable = [f for f in present if _installed(f)]
        if not usable:
            needs = " or ".join(f"{FORMATS[f].install} ({f})" for f in present)
            raise ImportError(
                f"serving this version ({', '.join(present)}) needs a runtime that is not installed: {needs}"
            )
        fmt = usable[0]
    elif fmt not in present:
        raise ValueError(
            f"Invalid runtime={runtime!r}: the version holds no {fmt} export (it holds {', '.join(present)})."
        )
    elif precision == "int8" and fmt not in int8:
        raise ValueError(f"Invalid runtime={runtime!r}: the version holds no int8 {fmt} model ({INT8_FILES[fmt][0]}, "
                         "written by keras-preact-export --quantize int8).")
    elif not _installed(fmt):
        raise ImportError(f"runtime {fmt} is not installed: {FORMATS[fmt].install}")
    precision = precision or ("int8" if fmt in int8 else "fp32")
    return {"pixels": fmt, "precision": precision, "saved_model": has_tf}


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
            for key, fn in self._functions.items()}
        saved_model = saved_model_pb2.SavedModel()
        saved_model.ParseFromString((pathlib.Path(path) / "saved_model.pb").read_bytes())
        self.signature_defs = {
            key: json_format.MessageToDict(value, preserving_proto_field_name=True)
            for key, value in saved_model.meta_graphs[0].signature_def.items() if not key.startswith("__")}

    def predict(self, signature_name, inputs):
        try:
            outputs = self._functions[signature_name](**{k: self._tf.constant(v) for k, v in inputs.items()})
        except (self._tf.errors.InvalidArgumentError, self._tf.errors.OutOfRangeError) as error:
            # E.g. bytes that are not a decodable image.
            raise RequestError(f"Invalid input: {_first_useful_line(error.message)}") from None
        return {k: v.numpy() for k, v in outputs.items()}


class ArtifactSignature:
    """``serving_default`` on an ONNX / LiteRT / OpenVINO runtime, with the SavedModel's outputs."""

    def __init__(self, path, fmt, precision="fp32"):
        from keras_preact.export.runtimes import load

        self._runtime = load(path, fmt, precision)
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
            "method_name": "tensorflow/serving/predict"}

    def predict(self, signature_name, inputs):
        outputs = self._runtime.predict(inputs[self._serving.input_name])
        return {**outputs, self._serving.class_names_output: self._names[outputs["classes"]]}


def _tensor_info(dtype, dims):
    return {"dtype": dtype, "tensor_shape": {"dim": [{"size": str(-1 if d is None else d)} for d in dims]}}


class VersionError(Exception):
    """A version folder that did not load, in one line: the ``file`` to blame, the ``reason``, TF Serving's ``code``."""

    def __init__(self, version, path, file, reason, code="UNKNOWN"):
        super().__init__(f"version {version} ({path}): {file}: {reason}")
        self.version, self.path, self.file, self.reason, self.code = version, path, file, reason, code


class NoVersionLoads(RuntimeError):
    """No version folder under a model's base path loads: one line listing each one's ``VersionError``."""

    def __init__(self, name, failures):
        super().__init__(f"no version of model '{name}' loads: " + "; ".join(map(str, failures)))
        self.failures = failures


# Lines of runtime error messages that say where, not what (TensorFlow's graph traces, OpenVINO's sources).
_NOISE = ("Graph execution error", "Detected at node", "<stack traces", "[[", "You may be trying", "Consider setting",
          "Exception from src", "Check '")


def _first_useful_line(message):
    """The first line of a message that says what went wrong ("" if it is empty)."""
    lines = [line.strip() for line in message.splitlines()]
    useful = [line for line in lines if line and not line.startswith(_NOISE)] or [line for line in lines if line]
    return useful[0] if useful else ""


def one_line(error, limit=300):
    """``Type: message`` of an exception in one line: its first line that says what went wrong."""
    line = _first_useful_line(str(error))
    text = f"{type(error).__name__}: {line}" if line else type(error).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _named_file(error, path, default):
    """The file under ``path`` that ``error``'s message names (relative), else ``default``."""
    root = str(path).rstrip("/") + "/"
    for token in str(error).replace("'", " ").replace('"', " ").replace(";", " ").split():
        if token.startswith(root):
            return token[len(root):].rstrip(".:,") or default
    return default


OPENVINO_WEIGHTS = "openvino/model.bin"
# The last 8 bytes of a whole checkpoint index (a LevelDB table): its magic number, little-endian.
TABLE_MAGIC = (0xdb4775248b80fb57).to_bytes(8, "little")
# Each format's entries in a version folder: any of them there means the format was (being) written.
ENTRIES = {"saved_model": ("saved_model.pb", "variables", "fingerprint.pb"), "onnx": ("model.onnx",),
           "litert": ("model.tflite",), "openvino": ("openvino",)}


def _footer(file):
    with open(file, "rb") as f:
        f.seek(max(f.seek(0, 2) - 8, 0))
        return f.read(8)


def started_formats(version_dir):
    """The formats a version folder holds any entry of (whole or not), in ``RUNTIME_SPEED_ORDER``."""
    return tuple(f for f in RUNTIME_SPEED_ORDER if any((pathlib.Path(version_dir) / e).exists() for e in ENTRIES[f]))


def started_int8(version_dir):
    """The formats a version folder holds any file of an int8 model of (whole or not)."""
    return tuple(f for f in INT8_FILES if any((pathlib.Path(version_dir) / file).exists() for file in INT8_FILES[f]))


def check_version_files(path, formats, int8=()):
    """``(file, reason, code)`` of the first file a copy cut short left missing, empty or damaged (of ``formats`` and
    of the int8 models of ``int8``); None when whole."""
    path = pathlib.Path(path)
    names, preprocessing = f"{ASSETS}/{CLASS_NAMES_ASSET}", f"{ASSETS}/{PREPROCESSING_ASSET}"
    required = [names, preprocessing] + (
        ["saved_model.pb", "variables/variables.index"] if "saved_model" in formats else []
    )
    required += [file for f in formats if f != "saved_model" for file in FORMATS[f].files]  # OpenVINO's .xml and .bin
    required += [file for f in int8 for file in INT8_FILES[f]]
    for file in required:
        if not (path / file).is_file():
            return file, "missing", "NOT_FOUND"
        if (path / file).stat().st_size == 0:
            return file, "empty", "DATA_LOSS"
    lines = (path / names).read_text(encoding="utf-8", errors="replace").splitlines()
    if not lines or not all(line.strip() for line in lines):
        return names, "an empty class name (one name per line, none blank)", "DATA_LOSS"
    try:
        config = InputConfig.from_dict(json.loads((path / preprocessing).read_text(encoding="utf-8")))
    except (ValueError, TypeError, KeyError) as error:
        return preprocessing, one_line(error), "DATA_LOSS"
    if "saved_model" in formats and not any((path / "variables").glob("variables.data-*")):
        return "variables/variables.data-*", "missing", "NOT_FOUND"
    if "saved_model" in formats and _footer(path / "variables/variables.index") != TABLE_MAGIC:
        return "variables/variables.index", "cut short (no table footer)", "DATA_LOSS"
    irs = ([FORMATS["openvino"].files] if "openvino" in formats else []) + (
        [INT8_FILES["openvino"]] if "openvino" in int8 else [])
    return next((found for ir in irs if (found := _check_openvino_files(path, config, *ir)) is not None), None)


def _check_openvino_files(path, config, model=ARTIFACTS["openvino"], weights=OPENVINO_WEIGHTS):
    """``(file, reason, code)`` of an OpenVINO IR (``model``, ``weights``) that does not parse, weights shorter than
    the IR reads, or a preprocessing input size other than the IR's images; None when they fit."""
    try:
        root = ElementTree.parse(path / model).getroot()
    except ElementTree.ParseError as error:
        return model, one_line(error), "DATA_LOSS"
    needed = max((int(d.get("offset")) + int(d.get("size")) for d in root.iter("data")
                  if (d.get("offset") or "").isdigit() and (d.get("size") or "").isdigit()), default=0)
    size = (path / weights).stat().st_size
    if size < needed:
        return weights, f"{size} bytes; the IR reads {needed}", "DATA_LOSS"
    shapes = [data.get("shape", "").split(",") for layer in root.iter("layer") if layer.get("type") == "Parameter"
              for data in layer.iter("data")]
    if shapes and len(shapes[0]) == 4 and all(d.isdigit() for d in shapes[0][1:3]):
        model_size, size = tuple(int(d) for d in shapes[0][1:3]), tuple(config.crop_size)
        if model_size != size:
            return (f"{ASSETS}/{PREPROCESSING_ASSET}", f"input size {size[0]}x{size[1]} but the model takes "
                    f"{model_size[0]}x{model_size[1]}", "DATA_LOSS")
    return None


def _blame_artifact(error, path, fmt, precision="fp32"):
    """The file of a ``fmt`` model at ``precision`` an error loading it comes from: the one it names; OpenVINO's
    weights when a node fails validation on a constant (the IR parsed, so the .bin's values are what is wrong); else
    the model."""
    if fmt == "openvino" and "While validating node" in str(error) and "Constant" in str(error):
        return OPENVINO_WEIGHTS if precision == "fp32" else INT8_FILES["openvino"][1]
    return _named_file(error, path, model_file(fmt, precision))


def _blame_saved_model(error, path):
    """The SavedModel file an error comes from: the one it names, the variables (the checkpoint's), else the graph."""
    if any("checkpoint" in frame.filename for frame in traceback.extract_tb(error.__traceback__)):
        shards = sorted(p.name for p in (pathlib.Path(path) / "variables").glob("variables.data-*"))
        return _named_file(error, path, f"variables/{shards[0] if len(shards) == 1 else 'variables.data-*'}")
    return _named_file(error, path, "saved_model.pb")


def _runtime_file(runtime):
    """The file a ``--runtime`` choice serves ("?" for auto)."""
    fmt, precision = split_runtime(runtime)
    return "?" if fmt == "auto" else model_file(fmt, "int8" if precision == "int8" else "fp32")


class Servable:
    """The newest version that loads whole, as TF Serving's policy; newer ones that fail are logged and kept in
    ``failed``."""

    def __init__(self, name, model_base, runtime="auto"):
        self.name = name
        skipped = []
        versions = version_dirs(model_base, skipped)
        for folder, reason in skipped:
            logger.warning("keras-preact-serve: skipped %s: %s", folder, reason)
        check_runtime(model_base, runtime)  # the flags fit some version (else one line)
        self.failed = []
        for version, path in versions:
            try:
                self._load(version, path, runtime)
            except VersionError as error:
                self.failed.append(error)
            except (ValueError, ImportError) as error:  # this older version lacks the runtime asked for
                self.failed.append(
                    VersionError(version, path, _runtime_file(runtime), one_line(error), "NOT_FOUND")
                )
            else:
                for failure in self.failed:  # logged once an older version serves (else NoVersionLoads says it)
                    logger.warning("keras-preact-serve: skipped %s", failure)
                return
        raise NoVersionLoads(name, self.failed)

    def _load(self, version, path, runtime):
        from keras_preact_serving.app import warm_up

        self.version, self.path = version, path
        choice = choose_runtimes(formats_in(path), runtime, int8_in(path))
        loaded = {choice["pixels"]} | ({"saved_model"} if choice["saved_model"] else set())
        int8 = set(started_int8(path)) | ({choice["pixels"]} if choice["precision"] == "int8" else set())
        # Every format begun is checked whole: a copy under way is skipped, not served with fewer signatures.
        if (damaged := check_version_files(path, loaded | set(started_formats(path)), sorted(int8))) is not None:
            raise VersionError(version, path, *damaged)
        self._runners, self.input_specs, signature_defs, self.signatures = {}, {}, {}, {}
        if choice["saved_model"]:
            try:
                saved = SavedModelSignatures(path)
            except Exception as error:  # noqa: BLE001 - whatever TensorFlow raises for a damaged SavedModel
                raise VersionError(version, path, _blame_saved_model(error, path), one_line(error)) from error
            for key in saved.input_specs:
                self._runners[key], self.signatures[key] = saved, "saved_model"
            self.input_specs.update(saved.input_specs)
            signature_defs.update(saved.signature_defs)
        if choice["pixels"] != "saved_model":
            try:
                artifact = ArtifactSignature(path, choice["pixels"], choice["precision"])  # loaded and warmed up
            except Exception as error:  # noqa: BLE001 - whatever the runtime raises for a damaged file
                file = _blame_artifact(error, path, choice["pixels"], choice["precision"])
                raise VersionError(version, path, file, one_line(error)) from error
            served = choice["pixels"] + ("-int8" if choice["precision"] == "int8" else "")
            self._runners[PIXELS_SIGNATURE], self.signatures[PIXELS_SIGNATURE] = artifact, served
            self.input_specs[PIXELS_SIGNATURE] = artifact.input_spec
            signature_defs.setdefault(PIXELS_SIGNATURE, artifact.signature_def)
        classes = signature_defs[PIXELS_SIGNATURE]["outputs"]["probabilities"]["tensor_shape"]["dim"][-1]["size"]
        names_file = path / ASSETS / CLASS_NAMES_ASSET
        names = len(names_file.read_text(encoding="utf-8", errors="replace").splitlines())
        if int(classes) > 0 and names != int(classes):
            raise VersionError(version, path, f"{ASSETS}/{CLASS_NAMES_ASSET}", f"{names} class names; the model has "
                               f"{classes} classes (one name per line, line number = label)", "DATA_LOSS")
        self.metadata = {
            "model_spec": {"name": self.name, "signature_name": "", "version": str(version)},
            "metadata": {"signature_def": {"signature_def": signature_defs}, "runtime": dict(self.signatures)}}
        try:
            warm_up(self)  # a version loads only if it answers (a table or variable read lazily may fail here)
        except Exception as error:  # noqa: BLE001
            raise VersionError(version, path, _blame_saved_model(error, path), one_line(error)) from error
        self.warmed_up = True

    def describe(self):
        """One line: which runtime runs which signature."""
        by_format = {}
        for signature, fmt in sorted(self.signatures.items(), key=lambda item: (item[0] != PIXELS_SIGNATURE, item[0])):
            by_format.setdefault(fmt, []).append(signature)
        return "; ".join(f"{', '.join(sigs)} on {fmt}" + (f" ({_runtime_file(fmt)})" if fmt.endswith("-int8") else "")
                         for fmt, sigs in by_format.items())

    def status(self, version=None):
        """TF Serving's ``GetModelStatus`` reply: the served version AVAILABLE, newer ones that failed END."""
        entries = [{"version": str(f.version), "state": "END",
                    "status": {"error_code": f.code, "error_message": str(f)}} for f in self.failed]
        entries.append(
            {"version": str(self.version), "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}
        )
        return {"model_version_status": [e for e in entries if version is None or e["version"] == str(version)]}

    def predict(self, signature_name, inputs):
        return self._runners[signature_name].predict(signature_name, inputs)
