"""A local server for an exported model's base directory that speaks TF Serving's REST API.

    keras-preact-serve saved_models/<name> [--port 8501] [--model-name NAME] [--host 127.0.0.1]
    python -m keras_preact.serving.server saved_models/<name> ...

It loads the latest numeric version folder (as TF Serving's default version policy does), with the
SavedModel's signatures on TensorFlow and ``serving_default`` on the fastest runtime installed for the
formats the version holds (``--runtime``; ``keras_preact.serving.servable``), and answers, on the paths
TF Serving uses:

- ``GET /v1/models/<name>[/versions/<v>]``: model status,
- ``GET /v1/models/<name>[/versions/<v>]/metadata``: signature definitions,
- ``POST /v1/models/<name>[/versions/<v>]:predict``: ``instances`` or ``inputs`` requests.

Every resource a request can make it use is bounded: the body (``--max-body-bytes``), the batch
(``--max-batch-size``), the pixels an encoded image may decode to and its aspect ratio (read from the
header before anything is decoded: ``--max-image-pixels``, ``--max-aspect-ratio``,
``--max-request-pixels``), the time a client may take to send a request or keep an idle connection
(``--request-timeout``), and the number of open connections (``--max-connections``; beyond it, 503).
With ``--enable-batching``, concurrent predict requests are merged into batched model calls
(``keras_preact.serving.batching``: ``--batching-max-size``, ``--batching-timeout-ms``,
``--batching-max-queue`` (503 beyond), ``--batching-threads``).
Every request's body is read before the reply, so a kept-alive connection never desynchronises. Every
bad request gets a 4xx with ``{"error": message}`` and never stops the server. Predictions run the
exported artifacts in their runtimes (Pillow reads image headers; the accepted formats are
``keras_preact.preprocessing.IMAGE_FORMATS``); no Keras model code is called.
"""

import argparse
import http.server
import json
import pathlib
import re
import sys
import threading

from keras_preact.serving import batching, rest
from keras_preact.serving.rest import RequestError
from keras_preact.serving.servable import RUNTIMES, Servable

DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_BATCH_SIZE = 256
DEFAULT_MAX_IMAGE_PIXELS = 4096 * 4096  # a decoded image: 48 MiB of uint8 RGB
DEFAULT_MAX_ASPECT_RATIO = 8  # the in-graph resize of the shorter side grows with it
DEFAULT_MAX_REQUEST_PIXELS = 64 * 1024 * 1024
DEFAULT_REQUEST_TIMEOUT = 30.0  # seconds to send a request, and to keep an idle connection
DEFAULT_MAX_CONNECTIONS = 64
DEFAULT_ENABLE_BATCHING = False  # decided from BENCHMARKS.md, "Dynamic batching"
LISTEN_BACKLOG = 128
REAL_LIMITS = ("max_aspect_ratio", "request_timeout")  # positive numbers; the other limits are integers
_PATH = re.compile(r"^/v1/models/(?P<name>[^/:]+)(?:/versions/(?P<version>[^/:]+))?(?P<rest>/metadata|:[A-Za-z]+)?$")


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


def check_limits(**limits):
    """Raise ``ValueError`` naming the first bad limit: each is a positive integer, but those in
    ``REAL_LIMITS`` (positive numbers; ``max_aspect_ratio`` >= 1)."""
    for argument, value in limits.items():
        if argument in REAL_LIMITS:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
                raise ValueError(f"Invalid {argument}={value!r}: expected a positive number.")
        elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"Invalid {argument}={value!r}: expected a positive integer.")
    if limits.get("max_aspect_ratio", 1) < 1:
        raise ValueError(f"Invalid max_aspect_ratio={limits['max_aspect_ratio']!r}: expected a number >= 1.")


def model_name_or_default(model_base, model_name=None):
    """``model_name``, or the base directory's name: the name in the URL (no '/', ':' or whitespace)."""
    model_name = model_name or pathlib.Path(model_base).resolve().name
    if not re.match(r"^[^/:\s]+$", model_name):
        raise ValueError(f"Invalid model_name={model_name!r}: no '/', ':' or whitespace.")
    return model_name


class Handler(http.server.BaseHTTPRequestHandler):
    """TF Serving REST routes for ``self.server.model``; limits from the server's attributes."""

    protocol_version = "HTTP/1.1"  # keep-alive: one connection per client
    # Headers and body go out in two writes; without TCP_NODELAY, Nagle's algorithm and the
    # client's delayed ACK add ~40 ms to every small reply.
    disable_nagle_algorithm = True
    server_version = "keras-preact-serve"

    def setup(self):
        self.timeout = self.server.request_timeout  # the socket's timeout: slow or idle clients
        super().setup()

    def log_message(self, format, *args):  # noqa: A002 - BaseHTTPRequestHandler's signature
        if self.server.verbose:
            super().log_message(format, *args)

    def _reply(self, status, body):
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _handle(self, method):
        try:
            # The body is read first, on every path: a reply to an unread body would leave it to be
            # parsed as the next request on this kept-alive connection.
            body = self._read_body(required=method == "POST")
        except RequestError as error:
            return self._reply(error.status, rest.error_body(str(error)))
        except TimeoutError:
            self.close_connection = True
            return self._reply(408, rest.error_body(
                f"The request body did not arrive within {self.server.request_timeout} s."))
        try:
            reply = route(self.server.model, method, self.path)
            return self._reply(200, self._predict(self.server.model, body) if reply is None else reply)
        except RequestError as error:
            return self._reply(error.status, rest.error_body(str(error)))
        except RecursionError:
            return self._reply(400, rest.error_body("Invalid request: values nested too deeply."))
        except Exception as error:  # noqa: BLE001 - the server answers and stays up
            return self._reply(500, rest.error_body(f"Internal error: {type(error).__name__}: {error}"))

    def _read_body(self, required):
        """The request body (b"" when a GET has none); refused, with the connection closed, when its
        length is missing, malformed or over the limit (it cannot then be skipped safely)."""
        length = self.headers.get("Content-Length")
        if length is None and not required and "chunked" not in self.headers.get("Transfer-Encoding", ""):
            return b""
        if length is None or not length.isdigit():
            self.close_connection = True
            raise RequestError("A Content-Length header is required (chunked bodies are not accepted).", 411 if length is None else 400)
        length = int(length)
        if length > self.server.max_body_bytes:
            self.close_connection = True
            raise RequestError(f"Request body of {length} bytes exceeds the limit of {self.server.max_body_bytes} bytes.", 413)
        body = self.rfile.read(length)
        if len(body) < length:  # the client closed its side early
            self.close_connection = True
            raise RequestError(f"The request body ended after {len(body)} of {length} bytes.")
        return body

    def _predict(self, model, body):
        signature_name, inputs, mode = decode_predict(
            model, body, max_batch_size=self.server.max_batch_size, max_image_pixels=self.server.max_image_pixels,
            max_aspect_ratio=self.server.max_aspect_ratio, max_request_pixels=self.server.max_request_pixels)
        return rest.encode_outputs(self.server.predict(signature_name, inputs), mode)

    def do_GET(self):  # noqa: N802
        self._handle("GET")

    def do_POST(self):  # noqa: N802
        self._handle("POST")


class BoundedThreadingHTTPServer(http.server.ThreadingHTTPServer):
    """A thread per connection, at most ``max_connections`` at once: the next ones get a 503 and are
    closed at once (no thread, no read)."""

    request_queue_size = LISTEN_BACKLOG
    daemon_threads = True
    batcher = None  # a batching.Batcher when batching is enabled; closed with the server

    def __init__(self, address, handler, max_connections):
        super().__init__(address, handler)
        self.max_connections = max_connections
        self._slots = threading.BoundedSemaphore(max_connections)

    def process_request(self, request, client_address):
        if not self._slots.acquire(blocking=False):
            body = rest.error_body(f"Too many connections (limit {self.max_connections}); retry later.")
            try:
                request.settimeout(1.0)
                request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                                b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def server_close(self):
        """Close the socket, then answer what the batcher holds and join its threads."""
        super().server_close()
        if self.batcher is not None:
            self.batcher.close()


def make_server(model_base, *, model_name=None, host="127.0.0.1", port=8501,
                max_body_bytes=DEFAULT_MAX_BODY_BYTES, max_batch_size=DEFAULT_MAX_BATCH_SIZE,
                max_image_pixels=DEFAULT_MAX_IMAGE_PIXELS, max_aspect_ratio=DEFAULT_MAX_ASPECT_RATIO,
                max_request_pixels=DEFAULT_MAX_REQUEST_PIXELS, request_timeout=DEFAULT_REQUEST_TIMEOUT,
                max_connections=DEFAULT_MAX_CONNECTIONS, enable_batching=DEFAULT_ENABLE_BATCHING,
                batching_max_size=batching.DEFAULT_MAX_BATCH_SIZE,
                batching_timeout_ms=batching.DEFAULT_TIMEOUT * 1000, batching_max_queue=batching.DEFAULT_MAX_QUEUE,
                batching_threads=batching.DEFAULT_NUM_THREADS, runtime="auto", verbose=False):
    """A server for the latest version under ``model_base`` (not yet started); limits as the module
    docstring says. ``port=0`` picks a free port: read it from ``server.server_address[1]``. With
    ``enable_batching``, ``server.batcher`` is the ``batching.Batcher`` (its ``stats()``).
    """
    check_limits(max_body_bytes=max_body_bytes, max_batch_size=max_batch_size, max_image_pixels=max_image_pixels,
                 max_request_pixels=max_request_pixels, max_connections=max_connections,
                 max_aspect_ratio=max_aspect_ratio, request_timeout=request_timeout,
                 batching_max_size=batching_max_size, batching_max_queue=batching_max_queue,
                 batching_threads=batching_threads)
    if (isinstance(batching_timeout_ms, bool) or not isinstance(batching_timeout_ms, (int, float))
            or not 0 <= batching_timeout_ms < float("inf")):
        raise ValueError(f"Invalid batching_timeout_ms={batching_timeout_ms!r}: expected a number >= 0.")
    if not isinstance(enable_batching, bool):
        raise ValueError(f"Invalid enable_batching={enable_batching!r}: expected True or False.")
    model = Servable(model_name_or_default(model_base, model_name), model_base, runtime=runtime)
    server = BoundedThreadingHTTPServer((host, port), Handler, max_connections)
    server.model = model
    server.max_body_bytes = max_body_bytes
    server.max_batch_size = max_batch_size
    server.max_image_pixels = max_image_pixels
    server.max_aspect_ratio = max_aspect_ratio
    server.max_request_pixels = max_request_pixels
    server.request_timeout = float(request_timeout)
    server.verbose = verbose
    server.predict = model.predict
    if enable_batching:
        server.batcher = batching.Batcher(model.predict, max_batch_size=batching_max_size,
                                          timeout=batching_timeout_ms / 1000, max_queue=batching_max_queue,
                                          num_threads=batching_threads)
        server.predict = server.batcher.predict
    return server


def add_request_limit_arguments(parser):
    """The flags bounding what one request may use (body, batch, encoded images); shared by every front end."""
    parser.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES, help="request body limit (413 above)")
    parser.add_argument("--max-batch-size", type=int, default=DEFAULT_MAX_BATCH_SIZE, help="examples per request (413 above)")
    parser.add_argument("--max-image-pixels", type=int, default=DEFAULT_MAX_IMAGE_PIXELS,
                        help="pixels an encoded image may decode to, read from its header (413 above)")
    parser.add_argument("--max-aspect-ratio", type=float, default=DEFAULT_MAX_ASPECT_RATIO,
                        help="longer/shorter side of an encoded image (413 above)")
    parser.add_argument("--max-request-pixels", type=int, default=DEFAULT_MAX_REQUEST_PIXELS,
                        help="pixels of all encoded images of one request (413 above)")


def build_parser():
    parser = argparse.ArgumentParser(
        prog="keras-preact-serve", description="Serve the latest version of an exported model with TF Serving's REST API."
    )
    parser.add_argument("model_base_path", help="model directory holding numeric version folders (saved_models/<name>)")
    parser.add_argument("--port", type=int, default=8501, help="port (default 8501, TF Serving's REST port; 0: any free port)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1, loopback only)")
    parser.add_argument("--model-name", default=None, help="name in the URL (default: the directory name)")
    add_request_limit_arguments(parser)
    parser.add_argument("--request-timeout", type=float, default=DEFAULT_REQUEST_TIMEOUT,
                        help="seconds a client may take to send a request or keep an idle connection")
    parser.add_argument("--max-connections", type=int, default=DEFAULT_MAX_CONNECTIONS,
                        help="open connections at once (503 beyond)")
    batching_flags = parser.add_argument_group(
        "dynamic batching", "merge concurrent predict requests of one signature into batched model calls")
    batching_flags.add_argument("--enable-batching", action=argparse.BooleanOptionalAction, default=DEFAULT_ENABLE_BATCHING,
                                help=f"batch concurrent requests (default {'on' if DEFAULT_ENABLE_BATCHING else 'off'})")
    batching_flags.add_argument("--batching-max-size", type=int, default=batching.DEFAULT_MAX_BATCH_SIZE,
                                help="examples in one model call; a larger request runs alone (default %(default)s)")
    batching_flags.add_argument("--batching-timeout-ms", type=float, default=batching.DEFAULT_TIMEOUT * 1000,
                                help="the longest the oldest request of a batch waits for more (default %(default)s: "
                                     "batch what is queued when the model is free)")
    batching_flags.add_argument("--batching-max-queue", type=int, default=batching.DEFAULT_MAX_QUEUE,
                                help="requests waiting for a batch (503 beyond; default %(default)s)")
    batching_flags.add_argument("--batching-threads", type=int, default=batching.DEFAULT_NUM_THREADS,
                                help="batches run at once (default %(default)s)")
    parser.add_argument("--runtime", choices=RUNTIMES, default="auto",
                        help="what runs serving_default (uint8 pixels): an export format's runtime, or auto (default): "
                             "the fastest installed for a format the version holds; the SavedModel's other "
                             "signatures run on TensorFlow")
    parser.add_argument("--verbose", action="store_true", help="log every request")
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        parser.error(f"argument --port: invalid port {args.port}: expected 0-65535")
    try:
        server = make_server(
            args.model_base_path, model_name=args.model_name, host=args.host, port=args.port,
            max_body_bytes=args.max_body_bytes, max_batch_size=args.max_batch_size,
            max_image_pixels=args.max_image_pixels, max_aspect_ratio=args.max_aspect_ratio,
            max_request_pixels=args.max_request_pixels, request_timeout=args.request_timeout,
            max_connections=args.max_connections, enable_batching=args.enable_batching,
            batching_max_size=args.batching_max_size, batching_timeout_ms=args.batching_timeout_ms,
            batching_max_queue=args.batching_max_queue, batching_threads=args.batching_threads,
            runtime=args.runtime, verbose=args.verbose,
        )
    except ValueError as error:
        parser.error(str(error))
    except ImportError as error:  # no runtime installed for what the version holds
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    host, port = server.server_address[:2]
    model = server.model
    print(f"Serving model '{model.name}' version {model.version} ({model.path}) at http://{host}:{port}/v1/models/{model.name}"
          f" [{model.describe()}]", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
