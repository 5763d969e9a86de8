"""TF Serving's REST API and KServe's Open Inference Protocol as one ASGI application (Starlette), served by
``keras-preact-serve`` and by each Ray Serve replica: routes declared once (``ROUTES``), bounded by
``RequestLimits``."""

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
from starlette.convertors import StringConvertor, register_url_convertor
from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

import keras_preact
from keras_preact_serving import batching, metrics, openapi, rest, v2
from keras_preact_serving.flags import RequestLimits  # noqa: F401 - make_server's and the flags' record, here as before
from keras_preact_serving.metrics import ServingMetrics
from keras_preact_serving.rest import RequestError

JSON = "application/json"
LIVE_PATH, READY_PATH = "/v2/health/live", "/v2/health/ready"  # the Open Inference Protocol's
SERVICE_PATHS = (metrics.PATH, LIVE_PATH, READY_PATH, openapi.PATH)  # answered before the model is ready; not counted
LOAD_POLL_S = 0.05  # how often a request waiting for the model (``ServingState.wait_for_load``) looks


TRIM_BYTES = 1024 * 1024  # a body at least this large, once released, returns the heap's free memory to the system


@functools.cache
def _malloc_trim():
    """glibc's ``malloc_trim`` (None elsewhere)."""
    import ctypes
    import ctypes.util

    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def trim_heap():
    """Give the memory free in the C heap back to the system (glibc): a large body is read in many small chunks,
    which the heap otherwise keeps once freed."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


class BodyBytes:
    """The bytes of request bodies a server holds at once (``held``), at most ``limit``: each request takes its
    share (its Content-Length at once, a chunked body as it arrives) and gives it back once answered (``share``).

    Examples:
        >>> bodies = BodyBytes(limit=100)
        >>> with bodies.share() as share:
        ...     share.take(60)
        ...     bodies.held
        60
        >>> bodies.held
        0
    """

    def __init__(self, limit):
        self.limit, self.held = limit, 0
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def share(self):
        """One request's share (``take(n)`` more bytes: a 503 ``RequestError`` past the limit), given back at the
        end."""
        share = _Share(self)
        try:
            yield share
        finally:
            with self._lock:
                self.held -= share.bytes
            if share.bytes >= TRIM_BYTES:
                trim_heap()
            share.bytes = 0


class _Share:
    def __init__(self, bodies):
        self._bodies, self.bytes = bodies, 0

    def take(self, n, close=True):
        bodies = self._bodies
        with bodies._lock:
            if bodies.held + n > bodies.limit:
                held = bodies.held
            else:
                bodies.held += n
                self.bytes += n
                return
        error = _CloseAfter if close else RequestError
        raise error(f"The server holds {held} bytes of request bodies in flight; {n} more would pass the limit of "
                    f"{bodies.limit} bytes (--max-bodies-in-flight-bytes); retry later.", 503)


def model_name_or_default(model_base, model_name=None):
    """``model_name``, or the base directory's name: the name in the URL (no '/', ':' or whitespace)."""
    model_name = model_name or pathlib.Path(model_base).resolve().name
    if not re.match(r"^[^/:\s]+$", model_name):
        raise ValueError(f"Invalid model_name={model_name!r}: no '/', ':' or whitespace.")
    return model_name


@dataclasses.dataclass
class Call:
    """What a request was, for the metrics: its route (``metrics.API_NAMES``), model and signature once known."""

    api: str = ""
    model: str = ""
    signature: str = ""
    # Seconds of an inference request's phases, as Triton's statistics extension names them (``metrics.PHASES``):
    # compute_input (its tensors decoded and checked), queue (waiting for a thread or a batch), compute_infer (the
    # model call that ran it), compute_output (its reply encoded).
    phases: dict = dataclasses.field(default_factory=dict)


def timed(call, phase, function, *args, **kwargs):
    """``function(*args, **kwargs)``, its seconds added to ``call.phases[phase]`` (in the thread that runs it)."""
    started = time.perf_counter()
    try:
        return function(*args, **kwargs)
    finally:
        call.phases[phase] = call.phases.get(phase, 0.0) + time.perf_counter() - started


def decode_predict(model, body, call, **limits):
    """(signature name, ``{input: array}``, "instances" or "inputs") of a predict body, within ``limits``."""
    most = rest.max_values(model.input_specs, limits["max_request_instances"])
    request, signature_name, mode = rest.parse_body(body, most)
    if signature_name not in model.signatures:
        raise RequestError(f"Serving signature name: '{signature_name}' not found in signature def; "
                           f"available: {sorted(model.signatures)}.")
    call.signature = signature_name
    specs = model.input_specs[signature_name]
    inputs = rest.decode_inputs(request, mode, specs)
    rest.check_inputs(specs, inputs, **limits)
    return signature_name, inputs, mode


class _CloseAfter(RequestError):
    """A RequestError whose reply must close the connection: the body was left (partly) unread."""


def dummy_inputs(specs, image_size=(32, 32)):
    """One example of a signature's inputs: zeros, or a black PNG of ``image_size`` (height, width)."""
    import io

    from PIL import Image

    png = io.BytesIO()
    Image.new("RGB", tuple(reversed(image_size))).save(png, format="PNG")
    return {name: np.full([d or 1 for d in spec.shape], png.getvalue(), dtype=object) if spec.dtype == "string"
            else np.zeros([d or 1 for d in spec.shape], spec.dtype) for name, spec in specs.items()}


def warm_up(model):
    """One predict call per signature on ``dummy_inputs``, so the first client does not pay for tracing or lazy
    allocation."""
    sizes = [spec.shape[1:3] for specs in model.input_specs.values() for spec in specs.values()
             if spec.dtype != "string" and len(spec.shape) == 4 and None not in spec.shape[1:3]]
    for signature_name in sorted(model.input_specs):
        model.predict(signature_name, dummy_inputs(model.input_specs[signature_name], *sizes[:1]))


class ServingState:
    """What one process serves: the model (``load()``), its limits, batcher (``batcher(predict, batching)``, with
    ``batching`` options), reply headers (``identify()``) and metrics."""

    def __init__(self, load, limits=None, batching=None, identify=None, load_in_background=False, wait_for_load=False,
                 batcher=None):
        self._load, self._identify = load, identify
        self._batcher = batcher
        self.limits = limits or RequestLimits()
        self.batching = batching
        self.load_in_background = load_in_background
        self.wait_for_load = (
            wait_for_load  # model routes wait up to ``limits.request_timeout`` for it, not a 503 at once
        )
        self.model = self.batcher = self.load_error = self._loader = None
        self.headers = {}
        self.ready = threading.Event()
        self.metrics = ServingMetrics()
        self.bodies = BodyBytes(self.limits.max_bodies_in_flight_bytes)
        self._lock = threading.Lock()

    def __reduce__(self):  # a Ray Serve replica unpickles a new state of its own
        return ServingState, (self._load, self.limits, self.batching, self._identify, self.load_in_background,
                              self.wait_for_load, self._batcher)

    def start(self):
        """Load the model, warm it up (``warm_up``), start the batcher, then set ``ready`` (once)."""
        with self._lock:
            if self.ready.is_set():
                return
            model = self._load()
            if not getattr(model, "warmed_up", False):  # a Servable warms up as it loads
                warm_up(model)
            self.headers = dict(self._identify()) if self._identify else {}
            if self.batching is not None:
                make_batcher = self._batcher or batching.Batcher
                self.batcher = make_batcher(functools.partial(self.predict, model), self.batching)
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

    async def loaded(self, timeout=None):
        """Whether the model is ready, once it is, loading it has failed, or ``timeout`` seconds (None: no limit)
        passed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.ready.is_set() and self.load_error is None and (deadline is None or time.monotonic() < deadline):
            await asyncio.sleep(LOAD_POLL_S)
        return self.ready.is_set()

    def check_ready(self):
        """A 503 ``RequestError`` unless the model is loaded and warmed up."""
        if not self.ready.is_set():
            if self.load_error is not None:
                raise RequestError(
                    f"The model failed to load: {type(self.load_error).__name__}: {self.load_error}", 503
                )
            raise RequestError("The model is loading or warming up; retry later.", 503)

    def predict(self, model, signature_name, inputs):
        """``model.predict``, its batch size observed: every model call goes through here."""
        self.metrics.observe_batch(model.name, signature_name, next(iter(inputs.values())).shape[0])
        outputs = model.predict(signature_name, inputs)
        for name, value in outputs.items():
            value = np.asarray(value)
            if value.dtype.kind == "f" and not np.isfinite(value).all():  # e.g. float pixels of 1e38 overflowing
                raise RequestError(f"The model's output '{name}' is not finite (NaN or infinity) for these inputs: "
                                   f"send values in the range the signature takes (float pixels in 0-255).")
        return outputs

    @contextlib.asynccontextmanager
    async def running(self):
        """Started (``start``, in a thread with ``load_in_background``) for the block, then closed."""
        if self.load_in_background:
            self.start_in_background()
        else:
            await run_in_threadpool(self.start)
        try:
            yield
        finally:
            await run_in_threadpool(self.close)

    def close(self):
        if self._loader is not None:
            self._loader.join()
        if self.batcher is not None:
            self.batcher.close()


async def read_body(request, limits, share):
    """The body (b"" for a GET without one), read whole first, its bytes taken from ``share`` (``BodyBytes``) as they
    arrive; refused and closed if unframed, framed twice, too big, slow, or past the bound of bodies in flight."""
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
        chunks, size = [], 0  # joined once whole: a growing buffer's reallocations leave the heap fragmented
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > limits.max_body_bytes:
                    raise _CloseAfter(f"Request body of more than {limits.max_body_bytes} bytes exceeds the limit of "
                                      f"{limits.max_body_bytes} bytes.", 413)
                if length is None:  # chunked: taken as it arrives
                    share.take(len(chunk))
                chunks.append(chunk)
            return b"".join(chunks)
        finally:  # an error's traceback keeps this frame (in a reference cycle, until the garbage collector
            # runs): not its chunks
            chunks.clear()

    if length is not None:  # taken whole before any of it is read: admitted whole, or refused at once
        share.take(int(length))

    try:
        return await asyncio.wait_for(receive(), limits.request_timeout)
    except asyncio.TimeoutError:
        raise _CloseAfter(f"The request body did not arrive within {limits.request_timeout} s.", 408) from None


async def run_predict(state, signature_name, inputs, call=None):
    """(outputs, headers naming the model call when batching) of a decoded predict request; ``call``'s phases get
    the model call's seconds (compute_infer) and the rest of the wait for it (queue: a thread, or a batch)."""
    started = time.perf_counter()
    if state.batcher is None:
        infer = Call()
        outputs = await run_in_threadpool(
            timed, infer, "compute_infer", state.predict, state.model, signature_name, inputs
        )
        seconds, headers = infer.phases["compute_infer"], {}
    else:
        result = await state.batcher.submit(signature_name, inputs)
        outputs, seconds = result.outputs, result.seconds
        headers = {"X-Batch-Id": str(result.call), "X-Batch-Size": str(result.call_size)}
    if call is not None:
        call.phases["compute_infer"] = seconds
        call.phases["queue"] = max(time.perf_counter() - started - seconds, 0.0)
    return outputs, headers


def _decode_infer(model, body, header_length, call, limits):
    """(parsed request, signature name, ``{input: array}``) of an Open Inference Protocol infer body."""
    request, binary = v2.parse_request(
        body, header_length, rest.max_values(model.input_specs, limits["max_request_instances"])
    )
    signature_name = v2.choose_signature(model, request)
    call.signature = signature_name
    specs = model.input_specs[signature_name]
    inputs = v2.decode_inputs(request, binary, specs)
    rest.check_inputs(specs, inputs, **limits)
    return request, signature_name, inputs


def _json(value, status=200, headers=None):
    return Response(json.dumps(value).encode(), status, headers, media_type=JSON)


def _served(request, failed_too=False):
    """(state, model) of a model route's request: 503 until ready; 404 unless it names the served model and version."""
    state = request.app.state.serving
    state.check_ready()
    model, v1 = state.model, request.url.path.startswith("/v1/")
    name, version = request.path_params.get("model_name", model.name), request.path_params.get("version")
    if name != model.name:
        raise RequestError(f"Servable not found for request: Latest({name}); serving model '{model.name}'." if v1 else
                           f"Request for unknown model: '{name}' is not found; serving model '{model.name}'.", 404)
    request.state.call.model = name
    known = [str(model.version), *(str(f.version) for f in getattr(model, "failed", ()) if failed_too)]
    if version is not None and version not in known:
        raise RequestError(f"Servable not found for request: Specific({name}, {version}); loaded version is "
                           f"{model.version}." if v1 else f"Request for unknown model: '{name}' version {version} is "
                           f"not found; loaded version is {model.version}.", 404)
    return state, model


# Each endpoint's docstring is its OpenAPI operation: the summary, then after "---" the rest in YAML (``openapi``).
async def v1_status(request):
    """TF Serving model status (the served version, and newer ones that failed to load). ---
    responses: {'200': {description: OK,
                        content: {application/json: {schema: {$ref: '#/components/schemas/ModelStatus'}}}}}"""
    _, model = _served(request, failed_too=True)
    version = request.path_params.get("version")
    return _json(model.status(version) if version and getattr(model, "failed", ()) else model.status())


async def v1_metadata(request):
    """TF Serving model metadata (signature definitions). ---
    responses: {'200': {description: OK,
                        content: {application/json: {schema: {$ref: '#/components/schemas/ModelMetadata'}}}}}"""
    return _json(_served(request)[1].metadata)


async def v1_predict(request):
    """TF Serving predict. ---
    requestBody: {required: true, content: {application/json: {schema: {$ref: '#/components/schemas/PredictRequest'}}}}
    responses: {'200': {description: OK,
                        content: {application/json: {schema: {$ref: '#/components/schemas/PredictResponse'}}}}}"""
    state, model = _served(request)
    call = request.state.call
    signature_name, inputs, mode = await run_in_threadpool(timed, call, "compute_input", decode_predict, model,
                                                           await request.body(), call, **state.limits.model_limits())
    outputs, headers = await run_predict(state, signature_name, inputs, call)
    return Response(
        await run_in_threadpool(timed, call, "compute_output", rest.encode_outputs, outputs, mode),
        headers=headers,
        media_type=JSON,
    )


async def v1_unsupported(request):
    """TF Serving's classify and regress verbs, which need classify or regress signatures (a 400)."""
    _served(request)
    verb = request.url.path.rsplit(":", 1)[1]
    raise RequestError(f"{verb} is not supported: the signatures are predict signatures; use :predict.")


async def v1_label(request):
    """TF Serving's version labels (``/v1/models/NAME/labels/LABEL``): this server defines none, a 400 as TF
    Serving's for a label it does not know."""
    _served(request)
    label = request.path_params["label"]
    raise RequestError(f"Unrecognized servable version label: {label} (this server defines no labels).")


async def v2_server_metadata(request):
    """Open Inference Protocol server metadata. ---
    responses: {'200': {description: OK,
                        content: {application/json: {schema: {$ref: '#/components/schemas/ServerMetadata'}}}}}"""
    return _json(v2.server_metadata(keras_preact.__version__))


async def live(request):
    """Server live (unless loading the model failed). ---
    responses: {'200': {description: live, content: {application/json: {schema: {$ref: '#/components/schemas/Live'}}}},
                '503': {description: not live,
                        content: {application/json: {schema: {$ref: '#/components/schemas/Live'}}}}}"""
    is_live = request.app.state.serving.load_error is None
    return _json({"live": is_live}, 200 if is_live else 503)


async def ready(request):
    """Server ready (the model loaded and warmed up). ---
    responses: {'200': {description: ready,
                        content: {application/json: {schema: {$ref: '#/components/schemas/Ready'}}}},
                '503': {description: not ready,
                        content: {application/json: {schema: {$ref: '#/components/schemas/Ready'}}}}}"""
    is_ready = request.app.state.serving.ready.is_set()
    return _json({"ready": is_ready}, 200 if is_ready else 503)


async def v2_model_metadata(request):
    """Open Inference Protocol model metadata. ---
    responses: {'200': {description: OK,
                        content: {application/json: {schema: {$ref: '#/components/schemas/V2ModelMetadata'}}}}}"""
    return _json(v2.model_metadata(_served(request)[1]))


async def v2_model_ready(request):
    """Open Inference Protocol model readiness. ---
    responses: {'200': {description: OK,
                        content: {application/json: {schema: {$ref: '#/components/schemas/V2ModelReady'}}}}}"""
    return _json({"name": _served(request)[1].name, "ready": True})


async def v2_infer(request):
    """Open Inference Protocol infer (JSON tensors, or Triton's binary tensor data). ---
    requestBody: {required: true, content: {application/json: {schema: {$ref: '#/components/schemas/InferRequest'}}}}
    responses: {'200': {description: OK,
                        content: {application/json: {schema: {$ref: '#/components/schemas/InferResponse'}},
                                 application/octet-stream: {schema: {type: string, format: binary}}}}}"""
    state, model = _served(request)
    if request.headers.get("content-encoding", "identity").lower() != "identity":
        raise RequestError(f"Content-Encoding {request.headers['content-encoding']!r} is not supported; "
                           "send the body uncompressed.", 415)
    call = request.state.call
    infer, signature_name, inputs = await run_in_threadpool(
        timed,
        call,
        "compute_input",
        _decode_infer,
        model,
        await request.body(),
        request.headers.get(v2.HEADER_LENGTH),
        call,
        state.limits.model_limits(),
    )
    outputs, headers = await run_predict(state, signature_name, inputs, call)
    reply, more = await run_in_threadpool(timed, call, "compute_output", v2.encode_reply, model, infer, outputs)
    return Response(reply, headers={**headers, **more}, media_type="application/octet-stream" if more else JSON)


async def v2_model_config(request):
    """Triton's model configuration. ---
    responses: {'200': {description: OK,
                        content: {application/json: {schema: {$ref: '#/components/schemas/ModelConfig'}}}}}"""
    state, model = _served(request)
    return _json(v2.model_config(model, state.limits.max_request_instances, state.batching))


async def v2_model_stats(request):
    """Triton's model statistics (inference requests, their time, model calls). ---
    responses: {'200': {description: OK,
                        content: {application/json: {schema: {$ref: '#/components/schemas/ModelStatistics'}}}},
                4XX: {$ref: '#/components/responses/Error'}, '503': {$ref: '#/components/responses/Unavailable'}}"""
    state, model = _served(request)
    return _json(v2.model_statistics(model, state.metrics))


async def v2_repository_index(request):
    """Triton's model repository index (the served version, and newer ones that failed to load). ---
    responses: {'200': {description: OK,
                        content: {application/json: {schema: {$ref: '#/components/schemas/RepositoryIndex'}}}},
                4XX: {$ref: '#/components/responses/Error'}, '503': {$ref: '#/components/responses/Unavailable'}}"""
    return _json(v2.repository_index(_served(request)[1]))


async def prometheus_metrics(request):
    """Prometheus metrics. ---
    responses: {'200': {description: "Prometheus' text format", content: {text/plain: {schema: {type: string}}}}}"""
    return Response(request.app.state.serving.metrics.exposition(), media_type=metrics.CONTENT_TYPE)


async def openapi_document(request):
    """This OpenAPI document. ---
    responses: {'200': {description: OK, content: {application/json: {schema: {type: object}}}}}"""
    state = request.app.state.serving
    return _json(openapi.document(request.app.routes, state.model if state.ready.is_set() else None))


class _Name(StringConvertor):
    """A model name or version in a path: no '/' or ':' (``model_name_or_default``), so ``:predict`` ends it."""

    regex = "[^/:]+"


register_url_convertor("name", _Name())


def _model_routes(prefix, operations):
    """Each operation under ``prefix/{model_name}`` and ``.../versions/{version}``, named for the metrics."""
    return [Route(f"{prefix}/{{model_name:name}}{versions}{suffix}", endpoint, methods=[method], name=api)
            for suffix, endpoint, method, api in operations for versions in ("", "/versions/{version:name}")]


ROUTES = [  # in the order tried: the first that matches the path and the method answers
    *_model_routes(
        "/v1/models",
        [
            ("", v1_status, "GET", "v1:status"),
            ("/metadata", v1_metadata, "GET", "v1:metadata"),
            (":predict", v1_predict, "POST", "v1:predict"),
        ],
    ),
    *(
        Route(
            f"/v1/models/{{model_name:name}}{versions}:{verb}",
            v1_unsupported,
            methods=["POST"],
            include_in_schema=False,
        )
        for verb in ("classify", "regress")
        for versions in ("", "/versions/{version:name}")
    ),
    *(
        Route(
            f"/v1/models/{{model_name:name}}/labels/{{label:name}}{suffix}",
            v1_label,
            methods=[method],
            include_in_schema=False,
        )
        for suffix, method in (
            ("", "GET"),
            ("/metadata", "GET"),
            (":predict", "POST"),
            (":classify", "POST"),
            (":regress", "POST"),
        )
    ),
    Route("/v2", v2_server_metadata, name="v2:server_metadata"),
    Route(LIVE_PATH, live),
    Route(READY_PATH, ready),
    Route("/v2/models/stats", v2_model_stats, name="v2:model_stats"),  # Triton's: every model's
    Route("/v2/repository/index", v2_repository_index, methods=["POST"], name="v2:repository_index"),
    *_model_routes(
        "/v2/models",
        [
            ("", v2_model_metadata, "GET", "v2:model_metadata"),
            ("/ready", v2_model_ready, "GET", "v2:model_ready"),
            ("/infer", v2_infer, "POST", "v2:infer"),
            ("/config", v2_model_config, "GET", "v2:model_config"),
            ("/stats", v2_model_stats, "GET", "v2:model_stats"),
        ],
    ),
    Route(metrics.PATH, prometheus_metrics),
    Route(openapi.PATH, openapi_document),
]


def _error_reply(error, headers=None):
    """The JSON reply to an exception, its traceback dropped: its frames (the body, what it decoded to) would linger."""
    error.__traceback__ = None
    status, message = rest.error_status(error)
    if isinstance(error, _CloseAfter):
        headers = {**(headers or {}), "Connection": "close"}
    return Response(rest.error_body(message), status, headers, media_type=JSON)


async def _no_route(request, error):
    """Starlette's 404 (no route has the path) and 405 (not with this method) in JSON; on /v1, TF Serving's 404."""
    method, path = request.method, request.url.path
    if error.status_code == 405 and not path.startswith("/v1/"):
        allowed = ", ".join(sorted(error.headers["Allow"].split(", ")))
        return _error_reply(RequestError(f"{method} {path}: this route answers {allowed}.", 405), {"Allow": allowed})
    if path.startswith("/v1/"):
        return _error_reply(RequestError(f"{method} {path} is not a TF Serving REST route.", 404))
    return _error_reply(RequestError(f"Unknown path {path!r}: GET {openapi.PATH} lists the routes.", 404))


class _Served:
    """ASGI middleware: bodies read first, errors as JSON, ``state.headers`` on every reply, requests counted and
    timed."""

    def __init__(self, app, state):
        self.app, self.state = app, state

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        request, call, started, status = Request(scope, receive), Call(), time.perf_counter(), []
        request.state.call = call

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                status.append(message["status"])
                MutableHeaders(scope=message).update(self.state.headers)
            await send(message)

        with self.state.bodies.share() as share:  # the body's bytes held until the reply is sent
            try:
                body = await read_body(request, self.state.limits, share)
                if self.state.wait_for_load and scope["path"] not in SERVICE_PATHS:
                    await self.state.loaded(
                        self.state.limits.request_timeout
                    )  # then a 503 if still loading (``_served``)

                async def replay():  # the body read, then what the server sends next (a disconnect)
                    nonlocal body
                    if body is None:
                        return await receive()
                    message, body = {"type": "http.request", "body": body, "more_body": False}, None
                    return message

                await self.app(scope, replay, send_with_headers)
            except ClientDisconnect:  # nobody to answer; the server may have closed it (connections.BoundedH11Protocol)
                await Response(status_code=499)(scope, receive, send_with_headers)
            except Exception as error:  # noqa: BLE001 - the server answers and stays up
                if status:  # the reply has begun: nothing more can be said
                    raise
                await _error_reply(error)(scope, receive, send_with_headers)
        if scope["path"] not in SERVICE_PATHS:
            route = scope.get("route")
            if route is not None and scope["method"] in route.methods and route.name in metrics.API_NAMES:
                call.api = route.name
            self.state.metrics.observe_request(
                call.model, call.api, call.signature, status[0], time.perf_counter() - started, call.phases
            )


def create_app(state):
    """The ASGI application serving ``state``; its lifespan starts and closes it, so each replica loads its own."""
    app = Starlette(routes=ROUTES, middleware=[Middleware(_Served, state=state)],
                    exception_handlers={HTTPException: _no_route}, lifespan=lambda app: state.running())
    app.router.redirect_slashes = False  # a path with a slash more or less is unknown, not redirected
    app.state.serving = state
    return app
