"""TF Serving REST API codec: JSON request bodies to input arrays, output tensors to JSON replies.

Follows https://www.tensorflow.org/tfx/serving/api_rest: a predict body holds ``instances`` (row
format: one entry per example; a dict per example when a signature has several inputs) or ``inputs``
(columnar format: the batch tensor, or a dict of them); binary strings travel as ``{"b64": "..."}``.
Replies are ``{"predictions": [...]}`` (row: a dict of outputs per example, or the bare value when
there is one output) or ``{"outputs": ...}`` (columnar). String outputs whose name ends in
``_bytes`` are base64-encoded, as TF Serving does. Every problem is a ``RequestError`` carrying the
HTTP status (400 bad request, 404 not found) and a message for ``{"error": ...}``.
"""

import base64
import binascii
import dataclasses
import json
import math

import numpy as np

from keras_preact.preprocessing import IMAGE_FORMATS, gif_first_frame, image_format


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


# numpy kinds a JSON value may decode to, per input dtype, and the value range where one applies.
_NUMERIC_KINDS = {
    "uint8": ("iu", (0, 255)),
    "int32": ("iu", (-(2**31), 2**31 - 1)),
    "int64": ("iu", (-(2**63), 2**63 - 1)),
    "float32": ("iuf", None),
    "float64": ("iuf", None),
}


def _reject_constant(name):
    raise RequestError(f"Invalid JSON body: {name} is not a finite number (strict JSON has no NaN or Infinity).")


def max_values(input_specs, max_batch_size):
    """The most JSON values (numbers, strings, lists, objects) ``max_batch_size`` examples of a signature's
    inputs hold (``input_specs``: ``{signature: {input: TensorSpec}}``), plus 1,000 for the rest of a
    request; None when a dimension past the batch is unknown (then the body's size alone bounds it).

    Examples:
        >>> max_values({"s": {"x": TensorSpec("x", "float32", (None, 2))}}, 16)
        1064
    """
    def example(spec):  # its nested lists and numbers, a row object, a {"b64": ...} object per string
        dims = spec.shape[1:]
        return sum(math.prod(dims[:k]) for k in range(len(dims) + 1)) + 1 + (spec.dtype == "string") * math.prod(dims)

    if any(None in spec.shape[1:] for specs in input_specs.values() for spec in specs.values()):
        return None
    return max_batch_size * max(sum(map(example, specs.values())) for specs in input_specs.values()) + 1000


def load_json(body, max_values):
    """The strict JSON value of a body (bytes); a 400 ``RequestError`` saying what is wrong otherwise, and
    a 413 before anything is decoded when it may hold more than ``max_values`` values (None: no bound),
    counted as one more than its ``,`` plus its ``[`` and ``{`` (milliseconds per 60 MB; nesting is
    bounded by ``json``'s recursion limit)."""
    count = 1 + body.count(b",") + body.count(b"[") + body.count(b"{")
    if max_values is not None and count > max_values:
        raise RequestError(f"The JSON body of up to {count} values (counting ',', '[' and '{{') exceeds the limit of "
                           f"{max_values} values (--max-batch-size examples of this model's inputs).", 413)
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
            "The request must contain exactly one of 'instances' (row format) or 'inputs' "
            "(columnar format)" + (", not both." if has_instances else ".")
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
        kinds, value_range = _NUMERIC_KINDS[spec.dtype]
        if array.dtype.kind not in kinds or array.dtype == object:
            raise RequestError(
                f"Input '{spec.name}' must hold {spec.dtype} values; got {array.dtype.name if array.dtype != object else 'mixed'} values."
            )
        if array.dtype.kind == "f" and not np.all(np.isfinite(array)):
            raise RequestError(f"Input '{spec.name}' holds non-finite values (e.g. 1e999); send finite numbers.")
        if value_range and array.size and (array.min() < value_range[0] or array.max() > value_range[1]):
            raise RequestError(f"Input '{spec.name}' values must lie in [{value_range[0]}, {value_range[1]}] ({spec.dtype}).")
        array = array.astype(spec.dtype)
    check_shape(array, spec)
    return array


def check_shape(array, spec):
    expected = "[" + ", ".join("N" if d is None else str(d) for d in spec.shape) + "]"
    if array.ndim != len(spec.shape) or any(d is not None and d != a for d, a in zip(spec.shape, array.shape)):
        raise RequestError(
            f"Input '{spec.name}' has shape {list(array.shape)}; the signature expects {expected}."
        )
    if array.shape[0] == 0:
        raise RequestError(f"Input '{spec.name}' is an empty batch; send at least one example.")


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
            columns = {}
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
    arrays = {n: to_array(columns[n], specs[n]) for n in names}
    sizes = {a.shape[0] for a in arrays.values()}
    if len(sizes) != 1:
        raise RequestError(f"All inputs must have the same batch size; got {sorted(sizes)}.")
    return arrays


def _jsonable(name, array):
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
    return json.dumps({"error": message}).encode("utf-8")


def check_encoded_images(arrays, *, max_image_pixels, max_aspect_ratio, max_request_pixels):
    """Bound what decoding the encoded images of a request would allocate, from their headers only
    (nothing is decoded): the format from the leading bytes (``keras_preact.preprocessing``'s magic
    bytes, the formats the exported graph decodes), then Pillow reads the header for each image's pixel
    count and aspect ratio (the in-graph resize of the shorter side scales with it), and the request's
    total pixel count. A GIF is replaced in its array by its first frame alone
    (``keras_preact.preprocessing.gif_first_frame``, read from its block structure, nothing decoded), the
    frame the model keeps anyway: the graph's decoder reads every frame of an animation before keeping
    one, so a small file of many large frames would cost seconds and gigabytes. That frame's own size
    counts against the pixel limit too (a frame may declare more than the GIF's canvas)."""
    import io

    from PIL import Image, UnidentifiedImageError

    total = 0
    for name, array in arrays.items():
        for index, data in enumerate(array.reshape(-1)):
            fmt = image_format(data)
            if fmt is None:
                raise RequestError(f"Input '{name}'[{index}] is not a {'/'.join(IMAGE_FORMATS)} image.")
            try:
                with Image.open(io.BytesIO(data)) as image:
                    width, height = image.size
            except Image.DecompressionBombError:  # Pillow's own header check, far above ours
                raise RequestError(f"Input '{name}'[{index}] declares more than {Image.MAX_IMAGE_PIXELS} pixels; "
                                   f"the limit is {max_image_pixels} pixels per image.", 413) from None
            except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
                raise RequestError(f"Input '{name}'[{index}] is not a {'/'.join(IMAGE_FORMATS)} image.") from None
            if fmt == "GIF":
                try:
                    first, frame = gif_first_frame(data)
                except ValueError as error:
                    raise RequestError(f"Input '{name}'[{index}] is not a GIF image: {error}") from None
                if first is not data:
                    array.flat[index] = first
                if frame[0] * frame[1] > width * height:
                    width, height = frame
            where = f"Input '{name}'[{index}] ({fmt} {width}x{height})"
            if width < 1 or height < 1 or width * height > max_image_pixels:
                raise RequestError(f"{where} has {width * height} pixels; the limit is {max_image_pixels} per image.",
                                   413)
            if max(width, height) > max_aspect_ratio * min(width, height):
                raise RequestError(f"{where}: aspect ratio above the limit of {max_aspect_ratio}:1.", 413)
            total += width * height
            if total > max_request_pixels:
                raise RequestError(f"The request's images hold more than {max_request_pixels} pixels in all.", 413)
