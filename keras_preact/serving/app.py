"""TF Serving's REST API as one ASGI application (Starlette): served by ``keras-preact-serve`` on uvicorn
(``keras_preact.serving.server``) and mounted unchanged by every Ray Serve replica (``@serve.ingress``,
``keras_preact.serving.ray_serve``). Routing, request limits, errors and replies are written here alone.

On the paths TF Serving uses:

- ``GET /v1/models/<name>[/versions/<v>]``: model status,
- ``GET /v1/models/<name>[/versions/<v>]/metadata``: signature definitions,
- ``POST /v1/models/<name>[/versions/<v>]:predict``: ``instances`` or ``inputs`` requests.

Every resource a request can make the app use is bounded by one record, ``RequestLimits``: the body
(``Content-Length`` or chunked, counted as it arrives: 413), the time its body may take to arrive
(408), the batch, and the pixels an encoded image may decode to and its aspect ratio (read from the
header before anything is decoded); 413 beyond. The same record bounds connections in the local server
(``server.BoundedH11Protocol``). Every request's body is read before the reply, so a kept-alive
connection never desynchronises; a reply that leaves a body unread closes the connection. Every bad
request gets a 4xx with ``{"error": message}`` and never stops the server. With batching, predict
requests are merged by ``batching.Batcher`` (awaited, no thread held per request) and replies carry
``X-Batch-Id`` (the model call that ran them, numbered per process) and ``X-Batch-Size`` (its examples).
Decoding, predicting and encoding run in worker threads, so the event loop keeps reading connections.
"""

import asyncio
import contextlib
import dataclasses
import json
import pathlib
import re

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from keras_preact.serving import batching, rest
from keras_preact.serving.rest import RequestError

_PATH = re.compile(r"^/v1/models/(?P<name>[^/:]+)(?:/versions/(?P<version>[^/:]+))?(?P<rest>/metadata|:[A-Za-z]+)?$")


def _limit(default, help, *, server_only=False):  # noqa: A002 - argparse's word
    return dataclasses.field(default=default, metadata={"help": help, "server_only": server_only})


@dataclasses.dataclass(frozen=True)
class RequestLimits:
    """What one request (and, in the local server, one connection) may use. Each field is a flag
    (``--max-body-bytes`` for ``max_body_bytes``; ``add_arguments``) and an argument of ``make_server``;
    fields marked ``server_only`` bound the local server's connections (Ray Serve's proxy owns its own).
    Checked on creation: every value positive, integers but ``REAL`` fields, ``max_aspect_ratio`` >= 1."""

    max_body_bytes: int = _limit(64 * 1024 * 1024, "request body, Content-Length or chunked (413 above)")
    max_batch_size: int = _limit(256, "examples per request (413 above)")
    max_image_pixels: int = _limit(4096 * 4096, "pixels an encoded image may decode to, read from its header (413 above)")
    max_aspect_ratio: float = _limit(8.0, "longer/shorter side of an encoded image (413 above)")
    max_request_pixels: int = _limit(64 * 1024 * 1024, "pixels of all encoded images of one request (413 above)")
    request_timeout: float = _limit(
        30.0, "seconds a client may take to send a whole request (headers and body; 408 after), or stay idle")
    max_connections: int = _limit(4096, "open connections at once (503 beyond)", server_only=True)

    REAL = ("max_aspect_ratio", "request_timeout")

    def __post_init__(self):
        for field in dataclasses.fields(self):
            check_positive(field.name, getattr(self, field.name), real=field.name in self.REAL)
        if self.max_aspect_ratio < 1:
            raise ValueError(f"Invalid max_aspect_ratio={self.max_aspect_ratio!r}: expected a number >= 1.")

    @classmethod
    def add_arguments(cls, parser, *, server_only=True):
        """One flag per field (without the ``server_only`` ones unless asked), defaults as the record's."""
        for field in dataclasses.fields(cls):
            if server_only or not field.metadata["server_only"]:
                parser.add_argument("--" + field.name.replace("_", "-"), type=type(field.default), default=field.default,
                                    help=f"{field.metadata['help']} (default %(default)s)")

    @classmethod
    def from_args(cls, args):
        """The record of parsed flags (``add_arguments``); a field without its flag keeps its default."""
        return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)})

    def model_limits(self):
        """The limits ``decode_predict`` applies (keyword arguments)."""
        return {name: getattr(self, name) for name in
                ("max_batch_size", "max_image_pixels", "max_aspect_ratio", "max_request_pixels")}


def check_positive(argument, value, *, real=False):
    """ValueError naming ``argument`` unless ``value`` is a positive integer (a positive finite number if ``real``)."""
    if real:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
            raise ValueError(f"Invalid {argument}={value!r}: expected a positive number.")
    elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"Invalid {argument}={value!r}: expected a positive integer.")


def model_name_or_default(model_base, model_name=None):
    """``model_name``, or the base directory's name: the name in the URL (no '/', ':' or whitespace)."""
    model_name = model_name or pathlib.Path(model_base).resolve().name
    if not re.match(r"^[^/:\s]+$", model_name):
        raise ValueError(f"Invalid model_name={model_name!r}: no '/', ':' or whitespace.")
    return model_name


def route(model, method, path):
    """The reply body of a status or metadata request, or None for a predict request, to ``model``;
    a ``RequestError`` (404 for an unknown path, model or version) otherwise."""
    match = _PATH.match(path.split("?", 1)[0])
    if not match:
        raise RequestError(f"Unknown path {path!r}: expected /v1/models/<name>[/versions/<v>][/metadata|:predict].", 404)
    if match["name"] != model.name:
        raise RequestError(f"Servable not found for request: Latest({match['name']}); serving model '{model.name}'.", 404)
    if match["version"] is not None and match["version"] != str(model.version):
        raise RequestError(
            f"Servable not found for request: Specific({match['name']}, {match['version']}); "
            f"loaded version is {model.version}.",
            404,
        )
    verb = match["rest"]
    if method == "GET" and verb is None:
        return json.dumps(model.status()).encode()
    if method == "GET" and verb == "/metadata":
        return json.dumps(model.metadata).encode()
    if method == "POST" and verb == ":predict":
        return None
    if method == "POST" and verb in (":classify", ":regress"):
        raise RequestError(f"{verb[1:]} is not supported: the signatures are predict signatures; use :predict.")
    raise RequestError(f"{method} {path} is not a TF Serving REST route.", 404)


def decode_predict(model, body, *, max_batch_size, max_image_pixels, max_aspect_ratio, max_request_pixels):
    """(signature name, ``{input: array}``, "instances" or "inputs") of a predict body, within the limits."""
    request, signature_name, mode = rest.parse_body(body)
    if signature_name not in model.signatures:
        raise RequestError(
            f"Serving signature name: '{signature_name}' not found in signature def; "
            f"available: {sorted(model.signatures)}."
        )
    inputs = rest.decode_inputs(request, mode, model.input_specs[signature_name])
    batch = next(iter(inputs.values())).shape[0]
    if batch > max_batch_size:
        raise RequestError(f"Batch size {batch} exceeds the limit of {max_batch_size}.", 413)
    encoded = {n: a for n, a in inputs.items() if model.input_specs[signature_name][n].dtype == "string"}
    if encoded:
        rest.check_encoded_images(encoded, max_image_pixels=max_image_pixels, max_aspect_ratio=max_aspect_ratio,
                                  max_request_pixels=max_request_pixels)
    return signature_name, inputs, mode


class _CloseAfter(RequestError):
    """A RequestError whose reply must close the connection: the body was left (partly) unread."""


class ServingState:
    """What one process serves: the model (``load()``, e.g. a ``servable.Servable``), its limits, the
    ``batching.Batcher`` when ``batching`` (its keyword arguments) is given, and constant reply headers
    (``identify()``: e.g. the Ray Serve replica). ``start`` loads them (once); ``close`` drains the batcher."""

    def __init__(self, load, limits=None, batching=None, identify=None):
        self._load, self._identify = load, identify
        self.limits = limits or RequestLimits()
        self.batching = batching
        self.model = self.batcher = None
        self.headers = {}

    def start(self):
        if self.model is not None:
            return
        self.model = self._load()
        self.headers = dict(self._identify()) if self._identify else {}
        if self.batching is not None:
            self.batcher = batching.Batcher(self.model.predict, **self.batching)

    def close(self):
        if self.batcher is not None:
            self.batcher.close()


async def read_body(request, limits):
    """The request body (b"" when a GET has none), read whole before any reply; refused with the
    connection closed when missing on a POST, framed twice (Content-Length and chunked: request
    smuggling), over ``max_body_bytes`` (declared or counted), or not arrived within ``request_timeout``."""
    length = request.headers.get("content-length")
    chunked = "chunked" in request.headers.get("transfer-encoding", "").lower()
    if length is None and not chunked:
        if request.method == "POST":
            raise _CloseAfter("A Content-Length header or a chunked body is required.", 411)
        return b""
    if length is not None and chunked:  # which one frames the body? A proxy may pick the other: refused
        raise _CloseAfter("A request may not have both Content-Length and Transfer-Encoding: chunked.")
    if length is not None and not length.isdigit():
        raise _CloseAfter(f"Invalid Content-Length {length!r}: expected a number of bytes.")
    if length is not None and int(length) > limits.max_body_bytes:
        raise _CloseAfter(f"Request body of {length} bytes exceeds the limit of {limits.max_body_bytes} bytes.", 413)

    async def receive():
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limits.max_body_bytes:
                raise _CloseAfter(f"Request body of more than {limits.max_body_bytes} bytes exceeds the limit of "
                                  f"{limits.max_body_bytes} bytes.", 413)
        return bytes(body)

    try:
        return await asyncio.wait_for(receive(), limits.request_timeout)
    except asyncio.TimeoutError:
        raise _CloseAfter(f"The request body did not arrive within {limits.request_timeout} s.", 408) from None


def _predict_alone(state, body):
    """A predict request's reply body, in one worker thread (no batching)."""
    signature_name, inputs, mode = decode_predict(state.model, body, **state.limits.model_limits())
    return rest.encode_outputs(state.model.predict(signature_name, inputs), mode)


async def _predict(state, body):
    """(reply body, headers) of a predict request."""
    if state.batcher is None:
        return await run_in_threadpool(_predict_alone, state, body), {}
    signature_name, inputs, mode = await run_in_threadpool(decode_predict, state.model, body,
                                                           **state.limits.model_limits())
    result = await state.batcher.submit(signature_name, inputs)
    headers = {"X-Batch-Id": str(result.call), "X-Batch-Size": str(result.call_size)}
    return await run_in_threadpool(rest.encode_outputs, result.outputs, mode), headers


def _reply(state, status, body, headers=None, close=False):
    headers = {**state.headers, **(headers or {}), **({"Connection": "close"} if close else {})}
    return Response(body, status_code=status, media_type="application/json", headers=headers)


async def handle(request):
    """Every request: its body read first, then routed; each error a JSON reply."""
    state = request.app.state.serving
    try:
        body = await read_body(request, state.limits)
        reply = route(state.model, request.method, request.url.path)
        if reply is not None:
            return _reply(state, 200, reply)
        return _reply(state, 200, *await _predict(state, body))
    except ClientDisconnect:  # nobody to answer; the server may have closed it (server.BoundedH11Protocol)
        return Response(status_code=499)
    except RequestError as error:
        return _reply(state, error.status, rest.error_body(str(error)), close=isinstance(error, _CloseAfter))
    except RecursionError:
        return _reply(state, 400, rest.error_body("Invalid request: values nested too deeply."))
    except Exception as error:  # noqa: BLE001 - the server answers and stays up
        return _reply(state, 500, rest.error_body(f"Internal error: {type(error).__name__}: {error}"))


class _AnyMethod:
    """``handle`` as an ASGI app, so the route takes every method (``route`` answers each one)."""

    async def __call__(self, scope, receive, send):
        response = await handle(Request(scope, receive))
        await response(scope, receive, send)


def create_app(state):
    """The ASGI application serving ``state`` (a ``ServingState``): its lifespan starts the state (a
    no-op when the caller already did) and closes it, so a Ray Serve replica loads its own model."""

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await run_in_threadpool(state.start)
        try:
            yield
        finally:
            await run_in_threadpool(state.close)

    app = Starlette(routes=[Route("/{path:path}", _AnyMethod())], lifespan=lifespan)
    app.state.serving = state
    return app

