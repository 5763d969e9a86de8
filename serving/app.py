"""TF Serving's REST API as one ASGI application (Starlette): served by ``keras-preact-serve`` on uvicorn
(``serving.server``) and mounted unchanged by every Ray Serve replica (``@serve.ingress``,
``serving.ray_serve``). Routing, request limits, errors and replies are written here alone.

On the paths TF Serving uses:

- ``GET /v1/models/<name>[/versions/<v>]``: model status,
- ``GET /v1/models/<name>[/versions/<v>]/metadata``: signature definitions,
- ``POST /v1/models/<name>[/versions/<v>]:predict``: ``instances`` or ``inputs`` requests,
- ``GET /openapi.json``: this API as an OpenAPI document (``openapi.document``),
- ``GET /monitoring/prometheus/metrics``: Prometheus metrics (``metrics.ServingMetrics``: requests,
  latency, batch sizes, queue depth), from a registry of this application's own;

and KServe's Open Inference Protocol (v2, ``serving.v2``; Triton's binary tensor data
extension, so ``tritonclient.http`` works unchanged): ``GET /v2`` (server metadata), ``GET /v2/health/live``
(200 unless loading the model failed), ``GET /v2/health/ready`` (200 once the model is loaded and warmed
up, ``warm_up``; 503 before), ``GET /v2/models/<name>[/versions/<v>]`` (model metadata),
``GET .../ready`` and ``POST .../infer`` (UINT8 or FP32 ``images`` or BYTES ``image_bytes``: the signature
is chosen by the inputs' names and datatypes, or ``parameters.signature_name``). v2 requests get the same
limits and errors as REST, as ``{"error": message}`` with the same HTTP status.

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
import functools
import json
import pathlib
import re
import threading
import time

import numpy as np
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

import keras_preact
from serving import batching, metrics, openapi, rest, v2
from serving.metrics import ServingMetrics
from serving.rest import RequestError

LIVE_PATH, READY_PATH = "/v2/health/live", "/v2/health/ready"  # the Open Inference Protocol's
SERVICE_PATHS = (metrics.PATH, LIVE_PATH, READY_PATH, openapi.PATH)  # answered before the model is ready; not counted
_V2_PATH = re.compile(r"^/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?(?P<rest>/ready|/infer)?$")
_V2_APIS = {("GET", None): "v2:model_metadata", ("GET", "/ready"): "v2:model_ready", ("POST", "/infer"): "v2:infer"}
_V1_APIS = {("GET", None): "v1:status", ("GET", "/metadata"): "v1:metadata", ("POST", ":predict"): "v1:predict"}
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


@dataclasses.dataclass
class Call:
    """What a request was, for the metrics (``metrics.ServingMetrics.observe_request``): its route
    (``api``, one of ``metrics.API_NAMES``), the served model's name once the URL is known to name it,
    and the signature once known to be one of the model's; health and metrics requests are not counted."""

    api: str = ""
    model: str = ""
    signature: str = ""
    counted: bool = True


def route(state, method, path, call):
    """The reply body of a status or metadata request, or None for a predict request, to the model
    ``state`` serves; a ``RequestError`` (404 for an unknown path, model or version; 503 before the
    model is ready) otherwise. ``call`` (a ``Call``) learns what the request was."""
    match = _PATH.match(path.split("?", 1)[0])
    if not match:
        raise RequestError(f"Unknown path {path!r}: expected /v1/models/<name>[/versions/<v>][/metadata|:predict].", 404)
    verb = match["rest"]
    call.api = _V1_APIS.get((method, verb), "")
    state.check_ready()
    model = state.model
    if match["name"] != model.name:
        raise RequestError(f"Servable not found for request: Latest({match['name']}); serving model '{model.name}'.", 404)
    call.model = model.name
    failed = [str(f.version) for f in getattr(model, "failed", ())]  # newer versions that did not load
    if method == "GET" and verb is None and failed and match["version"] in (*failed, str(model.version)):
        return json.dumps(model.status(match["version"])).encode()
    if match["version"] is not None and match["version"] != str(model.version):
        raise RequestError(
            f"Servable not found for request: Specific({match['name']}, {match['version']}); "
            f"loaded version is {model.version}.",
            404,
        )
    if method == "GET" and verb is None:
        return json.dumps(model.status()).encode()
    if method == "GET" and verb == "/metadata":
        return json.dumps(model.metadata).encode()
    if method == "POST" and verb == ":predict":
        return None
    if method == "POST" and verb in (":classify", ":regress"):
        raise RequestError(f"{verb[1:]} is not supported: the signatures are predict signatures; use :predict.")
    raise RequestError(f"{method} {path} is not a TF Serving REST route.", 404)


def check_signature(model, signature_name, call=None):
    """A 400 ``RequestError`` unless the model has the signature; ``call`` learns it."""
    if signature_name not in model.signatures:
        raise RequestError(
            f"Serving signature name: '{signature_name}' not found in signature def; "
            f"available: {sorted(model.signatures)}."
        )
    if call is not None:
        call.signature = signature_name


def check_inputs(model, signature_name, inputs, *, max_batch_size, max_image_pixels, max_aspect_ratio,
                 max_request_pixels):
    """A ``RequestError`` (413) when decoded inputs of a signature exceed the limits: the batch, and the
    encoded images' pixels and aspect ratio, read from their headers (``rest.check_encoded_images``)."""
    batch = next(iter(inputs.values())).shape[0]
    if batch > max_batch_size:
        raise RequestError(f"Batch size {batch} exceeds the limit of {max_batch_size}.", 413)
    encoded = {n: a for n, a in inputs.items() if model.input_specs[signature_name][n].dtype == "string"}
    if encoded:
        rest.check_encoded_images(encoded, max_image_pixels=max_image_pixels, max_aspect_ratio=max_aspect_ratio,
                                  max_request_pixels=max_request_pixels)


def decode_predict(model, body, call=None, **limits):
    """(signature name, ``{input: array}``, "instances" or "inputs") of a predict body, within the limits
    (``RequestLimits.model_limits()``)."""
    request, signature_name, mode = rest.parse_body(body, rest.max_values(model.input_specs, limits["max_batch_size"]))
    check_signature(model, signature_name, call)
    inputs = rest.decode_inputs(request, mode, model.input_specs[signature_name])
    check_inputs(model, signature_name, inputs, **limits)
    return signature_name, inputs, mode


class _CloseAfter(RequestError):
    """A RequestError whose reply must close the connection: the body was left (partly) unread."""


def dummy_inputs(specs, image_size=(32, 32)):
    """One example for each input of a signature (``{name: TensorSpec}``): zeros, unknown dimensions 1,
    and for an encoded-image (string) input a black PNG of ``image_size`` (height, width)."""
    import io

    from PIL import Image

    inputs = {}
    for name, spec in specs.items():
        if spec.dtype == "string":
            png = io.BytesIO()
            Image.new("RGB", tuple(reversed(image_size))).save(png, format="PNG")
            inputs[name] = np.array([png.getvalue()] * int(np.prod([d or 1 for d in spec.shape])), dtype=object)
            inputs[name] = inputs[name].reshape([d or 1 for d in spec.shape])
        else:
            inputs[name] = np.zeros([d or 1 for d in spec.shape], spec.dtype)
    return inputs


def warm_up(model):
    """One predict call per signature on a dummy batch of one (``dummy_inputs``; encoded images at the
    size of the first image input of the model), so the first client does not pay for graph tracing,
    kernel selection or lazy allocation; raises what the model raises."""
    sizes = [spec.shape[1:3] for specs in model.input_specs.values() for spec in specs.values()
             if spec.dtype != "string" and len(spec.shape) == 4 and None not in spec.shape[1:3]]
    for signature_name in sorted(model.input_specs):
        model.predict(signature_name, dummy_inputs(model.input_specs[signature_name], *sizes[:1]))


class ServingState:
    """What one process serves: the model (``load()``, e.g. a ``servable.Servable``), its limits, the
    ``batching.Batcher`` when ``batching`` (its keyword arguments) is given, constant reply headers
    (``identify()``: e.g. the Ray Serve replica) and its ``metrics.ServingMetrics``. ``start`` loads the
    model, warms it up (``warm_up``), starts the batcher and then sets ``ready`` (once); with
    ``load_in_background`` the app's lifespan runs ``start`` in a thread and serves meanwhile: health and
    metrics answer, model routes get a 503 until ``ready``. ``close`` drains the batcher."""

    def __init__(self, load, limits=None, batching=None, identify=None, load_in_background=False):
        self._load, self._identify = load, identify
        self.limits = limits or RequestLimits()
        self.batching = batching
        self.load_in_background = load_in_background
        self._init_process_state()

    def _init_process_state(self):
        """What cannot cross a process boundary (a Ray Serve replica gets its own, unpickled)."""
        self.model = self.batcher = self.load_error = self._loader = None
        self.headers = {}
        self.ready = threading.Event()
        self.metrics = ServingMetrics()
        self._lock = threading.Lock()

    def __getstate__(self):
        return {"_load": self._load, "_identify": self._identify, "limits": self.limits, "batching": self.batching,
                "load_in_background": self.load_in_background}

    def __setstate__(self, values):
        self.__dict__.update(values)
        self._init_process_state()

    @property
    def model_name(self):
        """The served model's name once loaded ("" before: a metrics label)."""
        return self.model.name if self.model is not None else ""

    def start(self):
        with self._lock:
            if self.ready.is_set():
                return
            model = self._load()
            if not getattr(model, "warmed_up", False):  # a Servable warms up as it loads
                warm_up(model)
            self.headers = dict(self._identify()) if self._identify else {}
            if self.batching is not None:
                self.batcher = batching.Batcher(functools.partial(self.predict, model), **self.batching)
            self.model = model
            self.metrics.model_started(model.name, self.batcher.queued if self.batcher is not None else lambda: 0)
            self.ready.set()

    def start_in_background(self):
        """``start`` in a thread; a failure is kept in ``load_error`` (then liveness fails)."""

        def start():
            try:
                self.start()
            except BaseException as error:  # noqa: BLE001 - reported by /v2/health/live and every model route
                self.load_error = error

        self._loader = threading.Thread(target=start, name="keras-preact-loader", daemon=True)
        self._loader.start()

    def check_ready(self):
        """A 503 ``RequestError`` unless the model is loaded and warmed up."""
        if not self.ready.is_set():
            if self.load_error is not None:
                raise RequestError(f"The model failed to load: {type(self.load_error).__name__}: {self.load_error}",
                                   503)
            raise RequestError("The model is loading or warming up; retry later.", 503)

    def predict(self, model, signature_name, inputs):
        """``model.predict``, its batch size observed (``metrics``): every model call goes through here."""
        self.metrics.observe_batch(model.name, signature_name, next(iter(inputs.values())).shape[0])
        return model.predict(signature_name, inputs)

    def close(self):
        if self._loader is not None:
            self._loader.join()
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


async def run_predict(state, signature_name, inputs):
    """(outputs, headers) of a decoded predict request: through the batcher when batching (the reply
    headers name the model call), else in a worker thread."""
    if state.batcher is None:
        return await run_in_threadpool(state.predict, state.model, signature_name, inputs), {}
    result = await state.batcher.submit(signature_name, inputs)
    return result.outputs, {"X-Batch-Id": str(result.call), "X-Batch-Size": str(result.call_size)}


async def _predict(state, body, call):
    """(reply body, headers) of a TF Serving predict request."""
    signature_name, inputs, mode = await run_in_threadpool(decode_predict, state.model, body, call,
                                                           **state.limits.model_limits())
    outputs, headers = await run_predict(state, signature_name, inputs)
    return await run_in_threadpool(rest.encode_outputs, outputs, mode), headers


def _decode_infer(model, body, header_length, call, limits):
    """(parsed request, signature name, ``{input: array}``) of an Open Inference Protocol infer body."""
    request, binary = v2.parse_request(body, header_length, rest.max_values(model.input_specs, limits["max_batch_size"]))
    signature_name = v2.choose_signature(model, request)
    call.signature = signature_name
    inputs = v2.decode_inputs(request, binary, model.input_specs[signature_name])
    check_inputs(model, signature_name, inputs, **limits)
    return request, signature_name, inputs


async def _answer_v2(request, state, body, call):
    """The reply to an Open Inference Protocol request (``v2``) but health: server and model metadata,
    model readiness, infer."""
    method, path = request.method, request.url.path
    if path == "/v2":
        call.api = "v2:server_metadata"
        if method != "GET":
            raise RequestError("/v2 answers GET only.", 405)
        return _reply(state, 200, json.dumps(v2.server_metadata(keras_preact.__version__)).encode())
    match = _V2_PATH.match(path)
    if not match:
        raise RequestError(f"Unknown path {path!r}: expected /v2, /v2/health/live|ready or "
                           "/v2/models/<name>[/versions/<v>][/ready|/infer].", 404)
    verb = match["rest"]
    call.api = _V2_APIS.get((method, verb), "")
    state.check_ready()
    model = state.model
    if match["name"] != model.name:
        raise RequestError(f"Request for unknown model: '{match['name']}' is not found; serving model "
                           f"'{model.name}'.", 404)
    call.model = model.name
    if match["version"] is not None and match["version"] != str(model.version):
        raise RequestError(f"Request for unknown model: '{match['name']}' version {match['version']} is not found; "
                           f"loaded version is {model.version}.", 404)
    if not call.api:
        raise RequestError(f"{method} {path} is not an Open Inference Protocol route.", 405)
    if call.api == "v2:model_metadata":
        return _reply(state, 200, json.dumps(v2.model_metadata(model)).encode())
    if call.api == "v2:model_ready":
        return _reply(state, 200, json.dumps({"name": model.name, "ready": True}).encode())
    if request.headers.get("content-encoding", "identity").lower() != "identity":
        raise RequestError(f"Content-Encoding {request.headers['content-encoding']!r} is not supported; "
                           "send the body uncompressed.", 415)
    infer, signature_name, inputs = await run_in_threadpool(
        _decode_infer, model, body, request.headers.get(v2.HEADER_LENGTH), call, state.limits.model_limits())
    outputs, headers = await run_predict(state, signature_name, inputs)
    reply, more = await run_in_threadpool(v2.encode_reply, model, infer, outputs)
    return _reply(state, 200, reply, {**headers, **more},
                  media_type="application/octet-stream" if more else "application/json")


def _reply(state, status, body, headers=None, close=False, media_type="application/json"):
    headers = {**state.headers, **(headers or {}), **({"Connection": "close"} if close else {})}
    return Response(body, status_code=status, media_type=media_type, headers=headers)


def _service_reply(state, method, path):
    """The reply to a request for a ``SERVICE_PATHS`` path: metrics, the OpenAPI document, or health
    (liveness holds unless loading failed; readiness once the model is loaded and warmed up; 200 when
    true, 503 when false)."""
    if method != "GET":
        raise RequestError(f"{path} answers GET only.", 405)
    if path == metrics.PATH:
        return _reply(state, 200, state.metrics.exposition(), media_type=metrics.CONTENT_TYPE)
    if path == openapi.PATH:
        return _reply(state, 200, json.dumps(openapi.document(state.model if state.ready.is_set() else None)).encode())
    if path == LIVE_PATH:
        live = state.load_error is None
        return _reply(state, 200 if live else 503, json.dumps({"live": live}).encode())
    ready = state.ready.is_set()
    return _reply(state, 200 if ready else 503, json.dumps({"ready": ready}).encode())


async def _answer(request, state, call):
    """The reply to any request: its body read first, then routed; each error a JSON reply."""
    try:
        body = await read_body(request, state.limits)
        path = request.url.path
        if path in SERVICE_PATHS:
            call.counted = False
            return _service_reply(state, request.method, path)
        if path == "/v2" or path.startswith("/v2/"):
            return await _answer_v2(request, state, body, call)
        reply = route(state, request.method, path, call)
        if reply is not None:
            return _reply(state, 200, reply)
        return _reply(state, 200, *await _predict(state, body, call))
    except ClientDisconnect:  # nobody to answer; the server may have closed it (server.BoundedH11Protocol)
        return Response(status_code=499)
    except RequestError as error:
        error.__traceback__ = None  # its frames (the body, what it decoded to) in a cycle through the worker
        # thread's future would stay until a full garbage collection: hundreds of MB for a large body
        return _reply(state, error.status, rest.error_body(str(error)), close=isinstance(error, _CloseAfter))
    except RecursionError:
        return _reply(state, 400, rest.error_body("Invalid request: values nested too deeply."))
    except Exception as error:  # noqa: BLE001 - the server answers and stays up
        return _reply(state, 500, rest.error_body(f"Internal error: {type(error).__name__}: {error}"))


async def handle(request):
    """Every request (``_answer``), counted and timed in the metrics."""
    state = request.app.state.serving
    call = Call()
    started = time.perf_counter()
    response = await _answer(request, state, call)
    if call.counted:
        state.metrics.observe_request(call.model, call.api, call.signature, response.status_code,
                                      time.perf_counter() - started)
    return response


class _AnyMethod:
    """``handle`` as an ASGI app, the router's default for every method and path (``handle`` answers each one)."""

    async def __call__(self, scope, receive, send):
        response = await handle(Request(scope, receive))
        await response(scope, receive, send)


def create_app(state):
    """The ASGI application serving ``state`` (a ``ServingState``): its lifespan starts the state (a
    no-op when the caller already did) and closes it, so a Ray Serve replica loads its own model."""

    @contextlib.asynccontextmanager
    async def lifespan(app):
        if state.load_in_background:
            state.start_in_background()
        else:
            await run_in_threadpool(state.start)
        try:
            yield
        finally:
            await run_in_threadpool(state.close)

    app = Starlette(lifespan=lifespan)
    # Every request, whatever its method and path, is the router's default: ``handle`` routes it (a
    # Starlette route's pattern would miss paths holding a newline, answered with a text/plain 404).
    app.router.default = _AnyMethod()
    app.state.serving = state
    return app

