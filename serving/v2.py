"""KServe's Open Inference Protocol (https://kserve.github.io/website/latest/modelserving/data_plane/v2_protocol/) with
Triton's binary tensor data (``tritonclient.http``'s default), model configuration, statistics and repository index."""

import base64
import binascii
import json
import math
import pathlib
import struct

import numpy as np

from keras_preact.preprocessing import IMAGE_FORMATS, image_format
from keras_preact_serving import rest
from keras_preact_serving.metrics import PHASES
from keras_preact_serving.rest import RequestError

HEADER_LENGTH = "inference-header-content-length"  # Triton's binary tensor data extension
DATATYPES = {"BOOL": "bool", "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32", "UINT64": "uint64",
             "INT8": "int8", "INT16": "int16", "INT32": "int32", "INT64": "int64", "FP16": "float16",
             "FP32": "float32", "FP64": "float64", "BYTES": "object"}
_NUMPY_DATATYPES = {np.dtype(v).name: k for k, v in DATATYPES.items() if v != "object"}
_TF_DATATYPES = {"DT_BOOL": "BOOL", "DT_UINT8": "UINT8", "DT_INT8": "INT8", "DT_INT16": "INT16", "DT_INT32": "INT32",
                 "DT_INT64": "INT64", "DT_HALF": "FP16", "DT_FLOAT": "FP32", "DT_DOUBLE": "FP64", "DT_STRING": "BYTES"}
PLATFORMS = {
    "saved_model": "tensorflow_savedmodel",
    "onnx": "onnxruntime_onnx",
    "openvino": "openvino",
    "litert": "tensorflow_lite",
    "onnx-int8": "onnxruntime_onnx",  # the int8 models (keras-preact-export --quantize int8) on the same runtimes
    "openvino-int8": "openvino",
}
MAX_DIMS = 8


def datatype_of(dtype):
    """The v2 datatype of a numpy dtype, or of a ``rest.TensorSpec``'s dtype name ("string": BYTES)."""
    dtype = np.dtype(object if dtype == "string" else dtype)
    return "BYTES" if dtype.kind in "OSU" else _NUMPY_DATATYPES[dtype.name]


# Triton's names of the protocol extensions this server serves whole: binary tensor data, the classification
# output parameter, GET /v2/models/NAME/config and GET /v2/models[/NAME[/versions/V]]/stats. Not model_repository:
# of its routes only POST /v2/repository/index is served (one model, loaded at start: no load or unload).
EXTENSIONS = ("binary_tensor_data", "classification", "model_configuration", "statistics")


def server_metadata(version):
    return {"name": "keras-preact", "version": version, "extensions": list(EXTENSIONS)}


def model_metadata(model, signature_name="serving_default"):
    """The v2 model metadata: ``signature_name``'s inputs and outputs, the version, the platform that runs it."""
    specs = model.input_specs[signature_name]
    signature_defs = model.metadata.get("metadata", {}).get("signature_def", {}).get("signature_def", {})
    outputs = signature_defs.get(signature_name, {}).get("outputs", {})
    return {
        "name": model.name,
        "versions": [str(model.version)],
        "platform": PLATFORMS.get(model.signatures[signature_name], "keras_preact"),
        "inputs": [
            {"name": name, "datatype": datatype_of(spec.dtype), "shape": [-1 if d is None else d for d in spec.shape]}
            for name, spec in specs.items()
        ],
        "outputs": [
            {
                "name": name,
                "datatype": _TF_DATATYPES.get(info.get("dtype"), "BYTES"),
                "shape": [int(d.get("size", -1)) for d in info.get("tensor_shape", {}).get("dim", [])],
            }
            for name, info in sorted(outputs.items())
        ],
    }


def model_config(model, max_request_instances, batching=None):
    """Triton's model configuration of ``model_metadata``'s signature; ``dims`` leave the batch out."""
    metadata = model_metadata(model)

    def tensors(entries):
        return [{"name": t["name"], "data_type": "TYPE_" + ("STRING" if t["datatype"] == "BYTES" else t["datatype"]),
                 "dims": t["shape"][1:]} for t in entries]

    config = {
        "name": model.name,
        "platform": metadata["platform"],
        "version_policy": {"latest": {"num_versions": 1}},
        "max_batch_size": max_request_instances,
        "input": tensors(metadata["inputs"]),
        "output": tensors(metadata["outputs"]),
    }
    if batching is not None:
        config["dynamic_batching"] = {"preferred_batch_size": [batching.batching_max_size],
                                      "max_queue_delay_microseconds": round(batching.batching_timeout_ms * 1000)}
    return config


def model_statistics(model, metrics):
    """Triton's statistics of the served version, from the app's ``metrics.ServingMetrics``."""
    calls, examples = metrics.model_calls(model.name)
    tally = metrics.inferences.get(model.name, {})
    return {"model_stats": [{
        "name": model.name, "version": str(model.version), "last_inference": round(tally.get("last", 0) * 1000),
        "inference_count": examples, "execution_count": calls,
        "inference_stats": {name: {"count": tally.get(name, (0, 0))[0], "ns": round(tally.get(name, (0, 0))[1] * 1e9)}
                            for name in ("success", "fail", *PHASES)}}]}


def repository_index(model):
    """Triton's model repository index: the served version READY, newer ones that failed to load UNAVAILABLE."""
    return [{"name": model.name, "version": str(model.version), "state": "READY"},
            *({"name": model.name, "version": str(f.version), "state": "UNAVAILABLE", "reason": str(f)}
              for f in getattr(model, "failed", ()))]


def _object(value, what):
    if not isinstance(value, dict):
        raise RequestError(f"{what} must be a JSON object.")
    return value


def parse_request(body, header_length, max_values):
    """(JSON header, binary data) of an infer body, its fields checked (400) and its values bounded (413) before
    decoding."""
    if header_length is None:
        header, binary = body, b""
    else:
        if not header_length.isdigit() or int(header_length) > len(body):
            raise RequestError(f"Invalid Inference-Header-Content-Length {header_length!r}: expected the number of "
                               f"bytes of the JSON header, at most the body's {len(body)}.")
        header, binary = body[:int(header_length)], body[int(header_length):]
    request = _object(rest.load_json(header, max_values), "The inference request")
    inputs = request.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise RequestError("The inference request must have 'inputs': a non-empty list of tensors.")
    names = []
    for entry in inputs:
        entry = _object(entry, "Each entry of 'inputs'")
        name, datatype, shape = entry.get("name"), entry.get("datatype"), entry.get("shape")
        if not isinstance(name, str):
            raise RequestError("Each input must have a 'name' string.")
        if not isinstance(datatype, str) or datatype not in DATATYPES:
            raise RequestError(f"Input '{name}' has datatype {datatype!r}: expected one of {', '.join(DATATYPES)}.")
        if (not isinstance(shape, list) or len(shape) > MAX_DIMS
                or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
            raise RequestError(
                f"Input '{name}' has shape {shape!r}: expected a list of at most {MAX_DIMS} non-negative integers."
            )
        if max_values is not None and math.prod(shape) > max_values:
            raise RequestError(f"Input '{name}' of shape {shape}: {math.prod(shape)} elements exceeds the limit of "
                               f"{max_values} values (--max-request-instances examples of this model's inputs).", 413)
        parameters = _object(entry.get("parameters", {}), f"Input '{name}''s 'parameters'")
        if "data" in entry and "binary_data_size" in parameters:
            raise RequestError(
                f"Input '{name}' has both 'data' and parameters.binary_data_size: send its values one way."
            )
        names.append(name)
    if len(set(names)) != len(names):
        raise RequestError(f"Input names must be distinct; got {names}.")
    _object(request.get("parameters", {}), "The request's 'parameters'")
    outputs = request.get("outputs", [])
    if not isinstance(outputs, list) or not all(
        isinstance(o, dict) and isinstance(o.get("name"), str) for o in outputs
    ):
        raise RequestError("'outputs' must be a list of objects with a 'name'.")
    for output in outputs:
        _object(output.get("parameters", {}), f"Output '{output['name']}''s 'parameters'")
    if "id" in request and not isinstance(request["id"], str):
        raise RequestError("'id' must be a string.")
    return request, binary


def choose_signature(model, request):
    """The request's ``parameters.signature_name``, else the signature taking its input names and datatypes."""
    given = {entry["name"]: entry["datatype"] for entry in request["inputs"]}
    wanted = {name: {n: datatype_of(s.dtype) for n, s in specs.items()} for name, specs in model.input_specs.items()}
    signature_name = request.get("parameters", {}).get("signature_name")
    if signature_name is not None:
        if not isinstance(signature_name, str) or signature_name not in model.signatures:
            raise RequestError(
                f"Serving signature name: {signature_name!r} not found; available: {sorted(model.signatures)}."
            )
        if given != wanted[signature_name]:
            raise RequestError(f"Signature {signature_name} takes inputs {wanted[signature_name]}; got {given}.")
        return signature_name
    matches = sorted((name for name, inputs in wanted.items() if inputs == given), key=lambda n: n != "serving_default")
    if not matches:
        raise RequestError(f"No signature takes inputs {given}; the signatures take "
                           f"{ {name: wanted[name] for name in sorted(wanted)} }.")
    return matches[0]


def _bytes_elements(data, count, name):
    """``count`` BYTES elements of a binary tensor (each a 4-byte little-endian length and its bytes)."""
    elements, offset = [], 0
    if count > len(data) // 4:  # each element takes at least its 4-byte length
        raise RequestError(f"Input '{name}': {count} elements cannot fit in {len(data)} bytes of binary data.")
    for _ in range(count):
        if offset + 4 > len(data):
            raise RequestError(f"Input '{name}': its binary data ends inside an element's length.")
        (length,) = struct.unpack_from("<I", data, offset)
        offset += 4
        if offset + length > len(data):
            raise RequestError(f"Input '{name}': an element of {length} bytes runs past its binary data.")
        elements.append(data[offset:offset + length])
        offset += length
    if offset != len(data):
        raise RequestError(f"Input '{name}': {len(data) - offset} bytes of binary data after its {count} elements.")
    return elements


def _flatten(value, name):
    if isinstance(value, list):
        flat = []
        for item in value:
            flat.extend(_flatten(item, name) if isinstance(item, list) else [item])
        return flat
    raise RequestError(f"Input '{name}': 'data' must be a list (flat or nested).")


def _json_bytes(text):
    """A JSON BYTES element's bytes: the image a base64 string encodes (what KServe's image examples send), else
    the string's UTF-8."""
    try:
        decoded = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):  # not base64 (ValueError: not ASCII)
        return text.encode("utf-8")
    return decoded if image_format(decoded) is not None else text.encode("utf-8")


def _check_json_images(array, spec):
    """A 400 naming the two ways to send an image, unless each JSON element of an encoded-image input is one."""
    if spec.dtype != "string":
        return
    for index, item in enumerate(array.reshape(-1)):
        if image_format(item) is None:
            raise RequestError(
                f"Input '{spec.name}'[{index}] is not a {'/'.join(IMAGE_FORMATS)} image: send the image's bytes as "
                "binary tensor data (parameters.binary_data_size) or as a base64 string in 'data'."
            )


def binary_array(name, datatype, shape, data, size_text):
    """An input's flat array from its binary tensor data ``data`` (BYTES: each element a 4-byte little-endian length
    and its bytes; else little-endian values filling ``shape``); ``size_text`` says how its size was given."""
    count = math.prod(shape)
    if datatype == "BYTES":  # the elements first: a shape's count alone allocates nothing
        return np.fromiter(_bytes_elements(data, count, name), object, count)
    dtype = np.dtype(DATATYPES[datatype]).newbyteorder("<")
    if count * dtype.itemsize != len(data):
        raise RequestError(f"Input '{name}': shape {shape} of {datatype} needs {count * dtype.itemsize} bytes; "
                           f"{size_text}.")
    return np.frombuffer(data, dtype).astype(dtype.newbyteorder("="))


def checked_input(array, shape, spec):
    """The flat ``array`` as ``shape``, checked: finite values, the shape ``spec`` takes."""
    array = array.reshape(shape)
    if array.dtype.kind == "f" and not np.all(np.isfinite(array)):
        raise RequestError(f"Input '{spec.name}' holds non-finite values (NaN or infinity); send finite numbers.")
    rest.check_shape(array.shape, spec)
    return array


def decode_inputs(request, binary, specs):
    """``{name: array}`` of a parsed request's inputs, each checked: element count, values, shape."""
    arrays, offset = {}, 0
    for entry in request["inputs"]:
        name, datatype, shape = entry["name"], entry["datatype"], entry["shape"]
        count = math.prod(shape)
        size = entry.get("parameters", {}).get("binary_data_size")
        if size is not None:
            if isinstance(size, bool) or not isinstance(size, int) or size < 0 or offset + size > len(binary):
                raise RequestError(f"Input '{name}': binary_data_size {size!r} runs past the body's binary data "
                                   f"({len(binary) - offset} bytes left).")
            data, offset = binary[offset:offset + size], offset + size
            array = binary_array(name, datatype, shape, data, f"binary_data_size is {size}")
        elif "data" in entry:
            flat = _flatten(entry.pop("data"), name)  # the JSON lists go before the model runs
            if len(flat) != count:
                raise RequestError(f"Input '{name}': shape {shape} holds {count} elements; 'data' has {len(flat)}.")
            if datatype == "BYTES":
                if not all(isinstance(item, str) for item in flat):
                    raise RequestError(f"Input '{name}': BYTES 'data' must be strings (send binary data for bytes).")
                array = np.fromiter((_json_bytes(item) for item in flat), object, count)
                _check_json_images(array, specs[name])
            else:
                array = rest.to_array(flat, rest.TensorSpec(name, DATATYPES[datatype], (count,))) if count else \
                    np.zeros(0, DATATYPES[datatype])
        else:
            raise RequestError(f"Input '{name}' has neither 'data' nor parameters.binary_data_size.")
        arrays[name] = checked_input(array, shape, specs[name])
    if offset != len(binary):
        raise RequestError(f"{len(binary) - offset} bytes of binary data after the inputs' binary_data_size.")
    return arrays


def raw_bytes(array):
    """An array as binary tensor data (BYTES: each element's 4-byte little-endian length, then its bytes)."""
    if datatype_of(array.dtype) == "BYTES":
        items = [item if isinstance(item, bytes) else str(item).encode("utf-8") for item in array.reshape(-1)]
        return b"".join(struct.pack("<I", len(item)) + item for item in items)
    return np.ascontiguousarray(array, array.dtype.newbyteorder("<")).tobytes()


def _json_data(name, array):
    if datatype_of(array.dtype) != "BYTES":
        return array.reshape(-1).tolist()
    try:
        return [item.decode("utf-8") if isinstance(item, bytes) else str(item) for item in array.reshape(-1)]
    except UnicodeDecodeError:
        raise RequestError(f"Output '{name}' is not UTF-8 text: ask for it as binary data "
                           "(outputs[].parameters.binary_data).") from None


def class_labels(model):
    """The served version's class names (``assets/class_names.txt``, one per line), or None."""
    path = getattr(model, "path", None)
    file = pathlib.Path(path) / "assets" / "class_names.txt" if path else None
    return file.read_text(encoding="utf-8").splitlines() if file is not None and file.is_file() else None


def classify(name, array, class_count, labels):
    """Triton's classification extension: the top ``class_count`` classes of each row of the class scores
    ``array`` ``[N, classes]`` as BYTES ``"score:index:label"`` (``"score:index"`` without labels), highest
    first; ``class_count`` is capped at the number of classes, as Triton does."""
    if isinstance(class_count, bool) or not isinstance(class_count, int) or class_count < 1:
        raise RequestError(f"Output '{name}': parameters.classification (class_count) must be a positive integer; "
                           f"got {class_count!r:.40}.")
    if array.ndim != 2 or datatype_of(array.dtype) not in ("FP16", "FP32", "FP64"):
        raise RequestError(f"Output '{name}' is not class scores [N, classes] (it is {datatype_of(array.dtype)} "
                           f"{list(array.shape)}): classification (class_count) applies to the probabilities output.")
    top = np.argsort(-array, axis=1, kind="stable")[:, :class_count]
    names = labels if labels is not None and len(labels) == array.shape[1] else None
    return np.array([[f"{row[i]:f}:{i}" + (f":{names[i]}" if names else "") for i in indices]
                     for row, indices in zip(array, top, strict=True)], dtype=object).reshape(top.shape)


def reply_tensors(model, asked, outputs):
    """[(output asked for, array)] of a reply: ``asked`` (``[{"name": ..., "parameters": {...}}]``; empty: every
    output, by name), each checked to be an output; one asked with ``parameters.classification`` as Triton's top
    classes (``classify``)."""
    asked = asked or [{"name": name} for name in sorted(outputs)]
    unknown = [o["name"] for o in asked if o["name"] not in outputs]
    if unknown:
        raise RequestError(f"Unknown outputs {unknown}; the signature's outputs are {sorted(outputs)}.")
    tensors = []
    for output in asked:
        array = np.asarray(outputs[output["name"]])
        if "classification" in output.get("parameters", {}):
            array = classify(output["name"], array, output["parameters"]["classification"], class_labels(model))
        tensors.append((output, array))
    return tensors


def encode_reply(model, request, outputs):
    """(body, headers) of the reply: the outputs asked for (all by default), in JSON or as binary data; an
    output asked for with ``parameters.classification`` (tritonclient's ``class_count``) as Triton's top classes."""
    binary_all = request.get("parameters", {}).get("binary_data_output", False) is True
    entries, data = [], []
    for output, array in reply_tensors(model, request.get("outputs"), outputs):
        name = output["name"]
        entry = {"name": name, "datatype": datatype_of(array.dtype), "shape": list(array.shape)}
        if output.get("parameters", {}).get("binary_data", binary_all) is True:
            raw = raw_bytes(array)
            entry["parameters"] = {"binary_data_size": len(raw)}
            data.append(raw)
        else:
            entry["data"] = _json_data(name, array)
        entries.append(entry)
    reply = {"model_name": model.name, "model_version": str(model.version), "outputs": entries}
    if "id" in request:
        reply["id"] = request["id"]
    header = json.dumps(reply, allow_nan=False).encode("utf-8")
    if not data:
        return header, {}
    return header + b"".join(data), {"Inference-Header-Content-Length": str(len(header))}
