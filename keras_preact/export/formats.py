"""The export formats: what each writes into a version directory, from which backend, and how.

``export_model(model, "saved_models", formats=("saved_model", "onnx"))`` (``keras_preact.export.exporting``) writes
``saved_models/<name>/<version>/`` (staged in a temporary directory and renamed, never overwritten)::

    saved_model.pb, variables/     saved_model  TF Serving's SavedModel (keras_preact.export.saved_model)
    model.onnx                     onnx         ONNX, checked with onnxruntime
    model.tflite                   litert       LiteRT (TFLite), checked with ai_edge_litert
    openvino/model.xml, .bin       openvino     OpenVINO IR, checked with the OpenVINO runtime
    assets/class_names.txt         always: one class name per line, line number = label
    assets/preprocessing.json      always: the InputConfig (input size, mean/std, evaluation crop)

ONNX, LiteRT and OpenVINO hold one function, the SavedModel's ``serving_default``: the serving contract
(``keras_preact.export.contract``) on uint8 ``images``. It is a small Keras functional model around the
classifier (``serving_model``) written by Keras' own ``model.export(path, format=...)``. Which backend can
write which format, and what each needs installed, is the table ``FORMATS``; ``check_formats`` refuses
the rest before any work. ``export_saved_model`` is ``export_model`` with the SavedModel alone.
"""

import dataclasses
import importlib.util
import os
import shutil

import keras


def write_saved_model(*args, **kwargs):
    """``keras_preact.export.saved_model.write_saved_model``, imported when a SavedModel is written: that module
    imports TensorFlow, which importing this package does not (``check_formats`` refuses the format first where
    TensorFlow is missing)."""
    from keras_preact.export.saved_model import write_saved_model as write

    return write(*args, **kwargs)


TENSORFLOW = "pip install tensorflow"
_DISPLAY = {"tensorflow": "TensorFlow"}


def serving_model(model, serving, structure="dict"):
    """The serving contract ``serving`` (a ``ServingContract``) as a Keras model on uint8 images, over
    ``keras.ops``; ``structure="tuple"``: the outputs in ``serving.output_names`` order, for exporters
    that cannot return a dict.

    Examples:
        >>> import numpy as np
        >>> from keras_preact.export import ServingContract, serving_model
        >>> from keras_preact.models import create_model
        >>> model = create_model("cifar_resnet20")
        >>> contract = ServingContract(model.input_config, top_k=3)
        >>> outputs = serving_model(model, contract)(np.zeros((2, 32, 32, 3), "uint8"))  # normalised inside
        >>> [(name, tuple(outputs[name].shape)) for name in contract.output_names]
        [('probabilities', (2, 10)), ('scores', (2, 3)), ('classes', (2, 3))]
    """
    images = keras.Input((*serving.image_size, 3), dtype="uint8", name=serving.input_name)
    outputs = serving.serve(model, images, keras.ops)
    if structure == "tuple":
        outputs = tuple(outputs.values())
    return keras.Model(images, outputs, name=f"{model.name}_serving")


# ------------------------------------------------------------------------------------- writers
def _write_keras_export(staging, model, serving, class_names, scratch, entry):
    """``model.export(..., format=entry.keras_format)`` of the serving model into ``scratch``, then
    ``entry.finish`` puts it at ``staging/entry.files[0]`` with the contract's names."""
    wrapper = serving_model(model, serving, entry.structure)
    spec = keras.InputSpec(shape=(None, *serving.image_size, 3), dtype="uint8", name=serving.input_name)
    exported = os.path.join(scratch, entry.keras_format, os.path.basename(entry.files[0]))
    os.makedirs(os.path.dirname(exported))
    wrapper.export(exported, format=entry.keras_format, input_signature=[spec], verbose=False)
    target = os.path.join(staging, entry.files[0])
    os.makedirs(os.path.dirname(target), exist_ok=True)
    entry.finish(exported, target, serving)


def _finish_onnx(exported, target, serving):
    """Name the graph's outputs ``serving.output_names`` (tf2onnx and torch.onnx number them) with
    Identity nodes."""
    import onnx

    proto = onnx.load(exported)
    graph, names = proto.graph, serving.output_names
    if [i.name for i in graph.input] != [serving.input_name] or len(graph.output) != len(names):
        raise RuntimeError(f"Unexpected ONNX signature from Keras' exporter: inputs {[i.name for i in graph.input]}, "
                           f"{len(graph.output)} outputs; expected [{serving.input_name!r}] and {len(names)}.")
    for output, name in zip(graph.output, names):
        if output.name != name:
            graph.node.append(onnx.helper.make_node("Identity", [output.name], [name]))
            output.name = name
    onnx.checker.check_model(proto)
    onnx.save(proto, target)


def _is_scalar(shape):
    return shape.rank.is_static and shape.rank.get_length() == 0


def _finish_openvino(exported, target, serving):
    """Name the input ``serving.input_name`` ``[?, H, W, 3]`` and the outputs ``serving.output_names``
    (the torch tracer leaves them unnamed and the input fully dynamic); saved uncompressed (float32
    weights)."""
    import openvino as ov

    model, names = ov.Core().read_model(exported), serving.output_names
    if len(model.outputs) > len(names):  # TensorFlow's frontend can keep a layer's shape arithmetic (Keras'
        # GroupNormalization slices tf.shape) as extra scalar results: the model's own outputs are the others
        kept = [result for result in model.get_results() if not _is_scalar(result.get_output_partial_shape(0))]
        if len(kept) == len(names):
            model = ov.Model(kept, model.get_parameters(), model.get_friendly_name())
    if len(model.inputs) != 1 or len(model.outputs) != len(names):
        raise RuntimeError(f"Unexpected OpenVINO signature from Keras' exporter: {len(model.inputs)} inputs, "
                           f"{len(model.outputs)} outputs; expected 1 and {len(names)}.")
    model.inputs[0].get_tensor().set_names({serving.input_name})
    model.inputs[0].get_node().set_friendly_name(serving.input_name)
    model.reshape({model.inputs[0]: ov.PartialShape([-1, *serving.image_size, 3])})
    for output, name in zip(model.outputs, names):
        output.get_tensor().set_names({name})
    ov.save_model(model, target, compress_to_fp16=False)


def _finish_litert(exported, target, serving):
    shutil.move(exported, target)  # its signature already names the input and the outputs (a dict)


@dataclasses.dataclass(frozen=True)
class Format:
    """One export format: what it writes and how, from which backends, and what checks it."""

    files: tuple  # what it adds to the version directory (the first is the path model.export writes)
    keras_format: str  # model.export(format=...); "" where keras-preact writes its own archive
    exporters: dict  # backend -> modules the export needs there (a backend absent here is refused)
    refused: dict  # backend -> why that backend cannot write it
    runtime: str  # what loads it (keras_preact.export.runtimes)
    runtime_modules: tuple
    install: str  # the pip command that installs everything it needs
    top_k: str  # where the top-k outputs are
    write: callable  # (staging, model, serving contract, class names, scratch, this entry)
    structure: str = "dict"  # the serving model's outputs given to model.export
    finish: callable = None  # (exported, target, serving contract): the artifact in place, named


# The int8 model of a format, beside its float one (keras_preact.export.quantize writes them).
INT8_FILES = {"onnx": ("model-int8.onnx",), "openvino": ("openvino/model-int8.xml", "openvino/model-int8.bin")}

_NO_JAX_ONNX = ("jax2onnx (Keras' JAX exporter) turns max pooling (MaxPooling2D: the ImageNet stem) into an ONNX "
                "MaxPool over four axes, which onnxruntime cannot run; export ONNX with KERAS_BACKEND=tensorflow or "
                "torch")
FORMATS = {
    "saved_model": Format(
        files=("saved_model.pb", "variables/"), keras_format="",
        exporters={"tensorflow": ("tensorflow",), "jax": ("tensorflow",)},
        refused={"torch": "a SavedModel is written from the tensorflow or jax backend (Keras' torch SavedModel "
                          f"export needs torch_xla) and needs TensorFlow: {TENSORFLOW}"},
        runtime="tf.saved_model.load (TF Serving)", runtime_modules=("tensorflow",), install=TENSORFLOW,
        top_k="yes (and class_names)", write=write_saved_model,
    ),
    "onnx": Format(
        files=("model.onnx",), keras_format="onnx",
        exporters={"tensorflow": ("tf2onnx", "onnx"), "torch": ("onnx", "onnxscript")},
        refused={"jax": _NO_JAX_ONNX},
        runtime="onnxruntime.InferenceSession", runtime_modules=("onnxruntime",),
        install='pip install "keras-preact[onnx]"', top_k="yes", write=_write_keras_export,
        structure="tuple", finish=_finish_onnx,
    ),
    "litert": Format(
        files=("model.tflite",), keras_format="litert",
        exporters={"tensorflow": ("tensorflow",)},
        refused={"jax": "Keras writes LiteRT from the tensorflow and torch backends only; use KERAS_BACKEND=tensorflow",
                 "torch": "Keras' torch LiteRT export (litert-torch) has a fixed batch size, not the dynamic N of the "
                          "contract; use KERAS_BACKEND=tensorflow"},
        runtime="ai_edge_litert Interpreter (else tf.lite.Interpreter)", runtime_modules=("ai_edge_litert",),
        install='pip install "keras-preact[litert]"', top_k="yes", write=_write_keras_export,
        finish=_finish_litert,
    ),
    "openvino": Format(
        files=("openvino/model.xml", "openvino/model.bin"), keras_format="openvino",
        exporters={"tensorflow": ("openvino",), "torch": ("openvino",)},
        refused={"jax": "Keras converts JAX through jax2tf, whose XlaCallModule op OpenVINO cannot read; "
                        "export OpenVINO with KERAS_BACKEND=tensorflow or torch"},
        runtime="openvino Core().compile_model (CPU, f32)", runtime_modules=("openvino",),
        install='pip install "keras-preact[openvino]"', top_k="yes", write=_write_keras_export,
        structure="tuple", finish=_finish_openvino,
    ),
}


def _installed(module):
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a module set to None in sys.modules
        return False


def check_formats(formats, backend=None):
    """The requested format names in ``FORMATS`` order, after checking each is known, writable from
    ``backend`` (default: Keras' backend) and installed. ValueError or ImportError, one line, otherwise.

    Examples:
        >>> from keras_preact.export import check_formats
        >>> check_formats(["saved_model", "webp"])
        Traceback (most recent call last):
        ...
        ValueError: Invalid formats=['saved_model', 'webp']: unknown 'webp';
        the formats are saved_model, onnx, litert, openvino.
        >>> check_formats(["onnx"], backend="jax")
        Traceback (most recent call last):
        ...
        ValueError: Invalid formats: onnx cannot be written from the jax backend: jax2onnx ...
    """
    names = [formats] if isinstance(formats, str) else formats
    allowed = ", ".join(FORMATS)
    if not isinstance(names, (list, tuple)) or not names or not all(isinstance(n, str) for n in names):
        raise ValueError(f"Invalid formats={formats!r}: expected a list of format names out of {allowed}.")
    unknown = [n for n in names if n not in FORMATS]
    if unknown or len(set(names)) != len(names):
        what = f"unknown {', '.join(map(repr, unknown))}" if unknown else "a format listed twice"
        raise ValueError(f"Invalid formats={list(names)!r}: {what}; the formats are {allowed}.")
    backend = keras.backend.backend() if backend is None else backend
    for name in names:
        entry = FORMATS[name]
        if backend not in entry.exporters:
            reason = entry.refused.get(backend, f"it is written from the {' or '.join(entry.exporters)} backend")
            raise ValueError(f"Invalid formats: {name} cannot be written from the {backend} backend: {reason}")
        missing = [m for m in (*entry.exporters[backend], *entry.runtime_modules) if not _installed(m)]
        if missing:
            modules = " and ".join(dict.fromkeys(_DISPLAY.get(m, m) for m in missing))
            raise ImportError(f"{name} export from the {backend} backend needs {modules}: {entry.install}")
    return tuple(n for n in FORMATS if n in names)
