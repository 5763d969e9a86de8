"""TF Serving's REST API codec (https://www.tensorflow.org/tfx/serving/api_rest) and the input checks every API
shares."""

import base64
import binascii
import dataclasses
import json
import math

import numpy as np

from keras_preact.preprocessing import IMAGE_FORMATS, image_format
from keras_preact_serving.gif import gif_first_frame


class RequestError(Exception):
    """A client error: ``status`` is the HTTP status code, ``str(error)`` the message."""

    def __init__(self, message, status=400):
        super().__init__(message)
        self.status = status


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """A signature input: dtype name as numpy knows it ("uint8", "float32", "string") and shape."""

    name: str
    dtype: str
    shape: tuple  # None for an unknown dimension


def error_status(error):
    """(HTTP status, message) of an exception: a ``RequestError``'s, 400 for values nested too deeply, else 500."""
    if isinstance(error, RequestError):
        return error.status, str(error)
    if isinstance(error, RecursionError):
        return 400, "Invalid request: values nested too deeply."
    return 500, f"Internal error: {type(error).__name__}: {error}"


def _reject_constant(name):
    raise RequestError(f"Invalid JSON body: {name} is not a finite number (strict JSON has no NaN or Infinity).")


def max_values(input_specs, max_request_instances):
    """The most JSON values ``max_request_instances`` examples of a signature's inputs hold, plus 1,000 (None: unbounded
    dims)."""
    def example(spec):  # its nested lists and numbers, a row object, a {"b64": ...} object per string
        dims = spec.shape[1:]
        return sum(math.prod(dims[:k]) for k in range(len(dims) + 1)) + 1 + (spec.dtype == "string") * math.prod(dims)

    if any(None in spec.shape[1:] for specs in input_specs.values() for spec in specs.values()):
        return None
    return max_request_instances * max(sum(map(example, specs.values())) for specs in input_specs.values()) + 1000


def load_json(body, max_values):
    """The strict JSON value of a body, else a 400; a 413, before decoding, if its ``,[{`` exceed ``max_values``."""
    count = 1 + body.count(b",") + body.count(b"[") + body.count(b"{")
    if max_values is not None and count > max_values:
        raise RequestError(f"The JSON body of up to {count} values (counting ',', '[' and '{{') exceeds the limit of "
                           f"{max_values} values (--max-request-instances examples of this model's inputs).", 413)
    try:
        return json.loads(body, parse_constant=_reject_constant)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise RequestError(f"Invalid JSON body: {error}") from None
    except ValueError as error:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        raise RequestError(f"Invalid JSON body: a number too long: {str(error).split(';')[0]}.") from None
    except RecursionError:
        raise RequestError("Invalid JSON body: nested too deeply.") from None


def parse_body(body, max_values):
    request = load_json(body, max_values)
    if not isinstance(request, dict):
        raise RequestError("The request body must be a JSON object with 'instances' or 'inputs'.")
    has_instances, has_inputs = "instances" in request, "inputs" in request
    if has_instances == has_inputs:
        raise RequestError(
            "The request must contain exactly one of 'instances' (row format) or 'inputs' (columnar format)"
            + (", not both." if has_instances else ".")
        )
    signature_name = request.get("signature_name", "serving_default")
    if not isinstance(signature_name, str):
        raise RequestError(f"Invalid signature_name={signature_name!r}: expected a string.")
    return request, signature_name, "instances" if has_instances else "inputs"


def _decode_b64(value):
    """Replace every ``{"b64": "..."}`` in a JSON value by the bytes it encodes."""
    if isinstance(value, dict):
        if set(value) == {"b64"}:
            if not isinstance(value["b64"], str):
                raise RequestError("A 'b64' value must be a base64 string.")
            try:
                return base64.b64decode(value["b64"], validate=True)
            except (binascii.Error, ValueError):
                raise RequestError("A 'b64' value is not valid base64.") from None
        raise RequestError(f"Unexpected JSON object {list(value)[:5]} inside a tensor value.")
    if isinstance(value, list):
        return [_decode_b64(v) for v in value]
    return value


def to_array(value, spec):
    """The JSON value for ``spec`` as a numpy array, checked against its dtype and shape."""
    value = _decode_b64(value)
    if spec.dtype == "string":
        array = np.asarray(value, dtype=object)
        flat = array.reshape(-1)
        for i, item in enumerate(flat):
            if isinstance(item, str):
                flat[i] = item.encode("utf-8")
            elif not isinstance(item, bytes):
                raise RequestError(
                    f"Input '{spec.name}' holds strings (base64 {{'b64': ...}} for binary data); got {item!r:.50}."
                )
    else:
        try:
            array = np.asarray(value)
        except ValueError:
            raise RequestError(f"Input '{spec.name}' is not a rectangular array (ragged nested lists).") from None
        if array.ndim and array.shape[0] == 0:
            raise RequestError(f"Input '{spec.name}' is an empty batch; send at least one example.")
        integer = np.dtype(spec.dtype).kind in "iu"
        if array.dtype.kind not in ("iu" if integer else "iuf") or array.dtype == object:
            raise RequestError(
                f"Input '{spec.name}' must hold {spec.dtype} values; "
                f"got {array.dtype.name if array.dtype != object else 'mixed'} values."
            )
        if array.dtype.kind == "f" and not np.all(np.isfinite(array)):
            raise RequestError(f"Input '{spec.name}' holds non-finite values (e.g. 1e999); send finite numbers.")
        if integer:
            check_range(array, spec)
        array = array.astype(spec.dtype)
    check_shape(array.shape, spec)
    return array


def check_range(values, spec):
    """A 400 unless the integers ``values`` (an array or a sequence) fit ``spec``'s integer dtype."""
    low, high = np.iinfo(spec.dtype).min, np.iinfo(spec.dtype).max
    if np.size(values) and (np.min(values) < low or np.max(values) > high):
        raise RequestError(f"Input '{spec.name}' values must lie in [{low}, {high}] ({spec.dtype}).")


def check_shape(shape, spec):
    """A 400 unless ``shape`` is ``spec``'s (None: any size) with at least one example."""
    if len(shape) != len(spec.shape) or any(d < 0 or (s is not None and d != s) for d, s in zip(shape, spec.shape)):
        expected = "[" + ", ".join("N" if d is None else str(d) for d in spec.shape) + "]"
        raise RequestError(f"Input '{spec.name}' has shape {list(shape)}; the signature expects {expected}.")
    if shape[0] == 0:
        raise RequestError(f"Input '{spec.name}' is an empty batch; send at least one example.")


def check_inputs(specs, inputs, *, max_request_instances, **image_limits):
    """A 400 unless ``inputs`` have one batch size; a 413 past the limits (the batch, ``check_encoded_images``)."""
    sizes = {a.shape[0] for a in inputs.values()}
    if len(sizes) != 1:
        raise RequestError(f"All inputs must have the same batch size; got {sorted(sizes)}.")
    if max(sizes) > max_request_instances:
        raise RequestError(f"Batch size {max(sizes)} exceeds the limit of {max_request_instances}.", 413)
    encoded = {n: a for n, a in inputs.items() if specs[n].dtype == "string"}
    if encoded:
        check_encoded_images(encoded, **image_limits)


def decode_inputs(request, mode, specs):
    """``{input name: array}`` from a parsed predict request (``mode``: "instances" or "inputs")."""
    names = list(specs)
    payload = request[mode]
    if mode == "instances":
        if not isinstance(payload, list):
            raise RequestError("'instances' must be a list with one entry per example.")
        if not payload:
            raise RequestError("'instances' is an empty batch; send at least one example.")
        if all(isinstance(p, dict) and "b64" not in p for p in payload):
            for p in payload:
                if set(p) != set(names):
                    raise RequestError(f"Every instance must have exactly the inputs {names}; got {sorted(p)}.")
            columns = {n: [p[n] for p in payload] for n in names}
        elif len(names) == 1:
            columns = {names[0]: payload}
        else:
            raise RequestError(f"This signature has several inputs {names}: each instance must be an object.")
    else:
        if isinstance(payload, dict) and "b64" not in payload:
            if set(payload) != set(names):
                raise RequestError(f"'inputs' must have exactly the inputs {names}; got {sorted(payload)}.")
            columns = payload
        elif len(names) == 1:
            columns = {names[0]: payload}
        else:
            raise RequestError(f"This signature has several inputs {names}: 'inputs' must be an object.")
    return {n: to_array(columns[n], specs[n]) for n in names}


def _jsonable(name, array):
    """The array as JSON: strings as text, or base64 when binary or the output's name ends in ``_bytes`` (TF Serving's
    rule)."""
    if array.dtype == object or array.dtype.kind == "S":
        def encode(item):
            if name.endswith("_bytes"):
                return {"b64": base64.b64encode(item).decode("ascii")}
            try:
                return item.decode("utf-8")
            except UnicodeDecodeError:
                return {"b64": base64.b64encode(item).decode("ascii")}

        return np.vectorize(encode, otypes=[object])(array).tolist() if array.size else array.tolist()
    return array.tolist()


def encode_outputs(outputs, mode):
    """The reply body for ``outputs`` (``{name: numpy array}``) in the request's format."""
    values = {name: _jsonable(name, array) for name, array in sorted(outputs.items())}
    if mode == "inputs":
        reply = {"outputs": values if len(values) > 1 else next(iter(values.values()))}
    elif len(values) == 1:
        reply = {"predictions": next(iter(values.values()))}
    else:
        batch = len(next(iter(values.values())))
        reply = {"predictions": [{name: v[i] for name, v in values.items()} for i in range(batch)]}
    return json.dumps(reply, allow_nan=False).encode("utf-8")


def error_body(message):
    return json.dumps({"error": message}).encode("utf-8")  # as ``connections.raw_reply``


def check_encoded_images(arrays, *, max_image_pixels, max_aspect_ratio, max_request_pixels):
    """Bound what decoding images would allocate, from their headers; a GIF is cut to its first frame, the one kept."""
    import io

    from PIL import Image, UnidentifiedImageError

    total = 0
    for name, array in arrays.items():
        for index, data in enumerate(array.reshape(-1)):
            fmt = image_format(data)
            if fmt is None:
                raise RequestError(f"Input '{name}'[{index}] is not a {'/'.join(IMAGE_FORMATS)} image.")
            if fmt == "GIF":  # cut to its first frame first, its blocks bounded: Pillow then reads no more
                try:
                    first, frame = gif_first_frame(data)
                except ValueError as error:
                    raise RequestError(f"Input '{name}'[{index}] is not a GIF image: {error}") from None
                if first is not data:
                    array.flat[index] = data = first
            try:
                with Image.open(io.BytesIO(data)) as image:
                    width, height = image.size
            except Image.DecompressionBombError:  # Pillow's own header check, far above ours
                raise RequestError(f"Input '{name}'[{index}] declares more than {Image.MAX_IMAGE_PIXELS} pixels; "
                                   f"the limit is {max_image_pixels} pixels per image.", 413) from None
            except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
                raise RequestError(f"Input '{name}'[{index}] is not a {'/'.join(IMAGE_FORMATS)} image.") from None
            if fmt == "GIF":
                if frame[0] * frame[1] > width * height:
                    width, height = frame
            where = f"Input '{name}'[{index}] ({fmt} {width}x{height})"
            if width < 1 or height < 1 or width * height > max_image_pixels:
                raise RequestError(
                    f"{where} has {width * height} pixels; the limit is {max_image_pixels} per image.", 413
                )
            if max(width, height) > max_aspect_ratio * min(width, height):
                raise RequestError(f"{where}: aspect ratio above the limit of {max_aspect_ratio}:1.", 413)
            total += width * height
            if total > max_request_pixels:
                raise RequestError(f"The request's images hold more than {max_request_pixels} pixels in all.", 413)
