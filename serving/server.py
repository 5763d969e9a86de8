"""``keras-preact-serve``: ``keras_preact_serving.app`` on uvicorn, and ``keras_preact_serving.grpc_server``
(Triton's and TF Serving's gRPC APIs) on its event loop, for the newest version that loads; it binds first and loads
in the background (docs/export-and-serving.md)."""

import asyncio
import dataclasses
import errno
import functools
import os
import signal
import socket
import sys
import threading

import uvicorn

from keras_preact_serving import batching, flags, missing_grpc
from keras_preact_serving.app import RequestLimits, ServingState, create_app, model_name_or_default
from keras_preact_serving.connections import MAX_INCOMPLETE_EVENT_SIZE, GuardedEventLoop
from keras_preact_serving.flags import DEFAULT_ENABLE_BATCHING
from keras_preact_serving.servable import NoVersionLoads, Servable, check_runtime, one_line

LISTEN_BACKLOG = 2048  # connections the kernel queues before accept (uvicorn's default)
DRAIN_TIMEOUT = 30  # seconds requests in flight may take to finish once SIGTERM arrives


class PortInUse(OSError):
    """A port another process holds (``--port`` or ``--grpc-port``): one line."""

    def __init__(self, host, port, flag, reason):
        super().__init__(
            f"port {port} is in use ({flag}, {host}:{port}: {reason}); stop what holds it or pick another port "
            "(0: any free one)"
        )
        self.errno = errno.EADDRINUSE


def port_in_use(host, port, family=socket.AF_INET):
    """Whether binding ``host:port`` fails with EADDRINUSE (gRPC's bind error does not say why, and logs)."""
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC binds: a port in TIME_WAIT is free
        try:
            probe.bind((host, port))
        except OSError as error:
            return error.errno == errno.EADDRINUSE
    return False


class Server:
    """A ``ServingState`` bound to its port(s), used as ``socketserver``'s servers; ``grpc_address`` given
    ``grpc_port``."""

    def __init__(self, state, host, port, verbose=False, grpc_port=None):
        self.state = state
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            self.socket = socket.create_server((host, port), family=family, backlog=LISTEN_BACKLOG)
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                raise PortInUse(host, port, "--port", error.strerror) from None
            reason = (error.strerror or str(error)).split(" (while attempting")[0]
            raise ValueError(f"Invalid --host={host!r}: cannot listen on {host}:{port} ({reason}); give "
                             "an address of this machine (127.0.0.1 for this machine only, 0.0.0.0 for every "
                             "interface).") from None
        self.server_address = self.socket.getsockname()
        limits = state.limits
        # uvicorn's documented settings; what they do not cover (a deadline on a whole request from the connection's
        # start, the connection cap at once, a JSON 400) is the event loop's (``connections.GuardedEventLoop``).
        config = uvicorn.Config(
            create_app(state),
            http="h11",
            h11_max_incomplete_event_size=MAX_INCOMPLETE_EVENT_SIZE,
            ws="none",
            lifespan="off",  # ``_serve`` starts and closes the state around REST and gRPC
            proxy_headers=False,
            server_header=False,
            backlog=LISTEN_BACKLOG,
            timeout_keep_alive=limits.request_timeout,
            timeout_graceful_shutdown=DRAIN_TIMEOUT,
            **({} if verbose else {"log_config": None}),  # uvicorn's own logging when verbose
            log_level="info" if verbose else "warning",
            access_log=verbose,
        )
        self._uvicorn = uvicorn.Server(config)
        self._stopped = threading.Event()
        self._loop = GuardedEventLoop(limits.max_connections, limits.request_timeout)
        self.grpc_address = self.grpc_server = None
        self.grpc_services = []
        if grpc_port is not None:
            from keras_preact_serving import grpc_server

            async def bind():  # a grpc.aio server belongs to the loop it is created in
                return grpc_server.create_server(state, host, grpc_port)

            try:
                if grpc_port and port_in_use(host, grpc_port, family):  # before gRPC's own bind logs a C++ line
                    raise PortInUse(host, grpc_port, "--grpc-port", os.strerror(errno.EADDRINUSE))
                self.grpc_server, bound = self._loop.run_until_complete(bind())
            except BaseException:
                self.socket.close()
                self._loop.close()
                raise
            self.grpc_address, self.grpc_services = (host, bound), grpc_server.services()

    @property
    def model(self):
        return self.state.model

    @property
    def batcher(self):
        return self.state.batcher

    def serve_forever(self):
        # uvicorn handles SIGINT and SIGTERM while it serves, then raises the signal again for the handler
        # before it: this one, so the command drains and exits 0 (in the main thread, where signals arrive).
        main = threading.current_thread() is threading.main_thread()
        previous = {
            sig: signal.signal(sig, self._uvicorn.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM) if main
        }
        try:
            run_until_closed(self._loop, self._serve())
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._stopped.set()

    async def _serve(self):
        """REST and gRPC on one loop, both drained once told to exit (a second Ctrl-C aborts), then the state closes."""
        async with self.state.running():
            if self.grpc_server is not None:
                await self.grpc_server.start()
            drained = asyncio.ensure_future(self._drain())
            try:
                await self._uvicorn.serve(sockets=[self.socket])  # until should_exit, then REST drained
            finally:
                self._uvicorn.should_exit = True
                while not drained.done() and not self._uvicorn.force_exit:
                    await asyncio.wait([drained], timeout=0.1)
                if not drained.done() and self.grpc_server is not None:  # a second Ctrl-C: abort the RPCs left
                    await self.grpc_server.stop(None)
                await drained

    async def _drain(self):
        """Once told to exit: the batcher runs what it holds now (a batching timeout longer than the grace period
        would otherwise outlast it), and gRPC refuses new RPCs (UNAVAILABLE) while those in flight finish."""
        while not self._uvicorn.should_exit:  # polled as uvicorn polls it
            await asyncio.sleep(0.1)
        if self.state.batcher is not None:
            self.state.batcher.flush()
        if self.grpc_server is not None:
            await self.grpc_server.stop(DRAIN_TIMEOUT)

    def shutdown(self):
        """Stop serving (as SIGTERM does) and wait until ``serve_forever`` has returned."""
        self._uvicorn.should_exit = True
        self._stopped.wait()

    def server_close(self):
        self.socket.close()
        if not self._loop.is_closed():  # never served: release the gRPC port
            if self.grpc_server is not None:
                self._loop.run_until_complete(self.grpc_server.stop(None))
            self._loop.close()
        self.state.close()


def run_until_closed(loop, main):
    """``asyncio.run(main)`` on ``loop`` (``asyncio.run``'s ``loop_factory`` needs Python 3.12): then the tasks
    left cancelled, asynchronous generators and the default executor shut down, and ``loop`` closed."""
    asyncio.set_event_loop(loop)
    try:
        return loop.run_until_complete(main)
    finally:
        try:
            left = asyncio.all_tasks(loop)
            for task in left:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            asyncio.set_event_loop(None)
            loop.close()


def make_server(model_base, *, model_name=None, host="127.0.0.1", port=8501, limits=None,
                enable_batching=DEFAULT_ENABLE_BATCHING, runtime="auto", verbose=False, grpc_port=None,
                load_in_background=False, **values):
    """A ``Server`` for the newest version under ``model_base``, bound, then loaded (unless ``load_in_background``);
    every argument is checked first. Fields of ``RequestLimits`` and ``batching.BatchingOptions`` may be given by name.

    Examples:
        >>> server = make_server("saved_models/cifar", port=0, enable_batching=True,
        ...                      batching_max_size=8)  # doctest: +SKIP
        >>> threading.Thread(target=server.serve_forever).start()  # doctest: +SKIP
    """
    limit_names = {field.name for field in dataclasses.fields(RequestLimits)}
    unknown = sorted(set(values) - limit_names - {field.name for field in dataclasses.fields(batching.BatchingOptions)})
    if unknown:
        raise TypeError(f"make_server() got unexpected keyword arguments {unknown}")
    limits = dataclasses.replace(limits or RequestLimits(), **{k: v for k, v in values.items() if k in limit_names})
    options = batching.BatchingOptions(**{k: v for k, v in values.items() if k not in limit_names})
    if not isinstance(enable_batching, bool):
        raise ValueError(f"Invalid enable_batching={enable_batching!r}: expected True or False.")
    for argument, value in (("port", port), ("grpc_port", 0 if grpc_port is None else grpc_port)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
            raise ValueError(f"Invalid {argument}={value!r}: expected a port 0-65535 (0: any free port).")
    if grpc_port is not None and missing_grpc():
        raise ImportError(missing_grpc())
    name = model_name_or_default(model_base, model_name)
    check_runtime(model_base, runtime)  # one line (Value/ImportError) unless some version fits
    state = ServingState(functools.partial(Servable, name, model_base, runtime=runtime), limits,
                         options if enable_batching else None, load_in_background=load_in_background)
    server = Server(state, host, port, verbose, grpc_port=grpc_port)  # a port in use: PortInUse before loading
    try:
        if not load_in_background:
            state.start()
    except BaseException:
        server.server_close()
        raise
    return server


build_parser = flags.serve_parser  # the parser, standard library only (keras_preact_serving.flags)


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        server = make_server(
            args.model_base_path, model_name=args.model_name, host=args.host, port=args.port,
            limits=RequestLimits.from_args(args), enable_batching=args.enable_batching, runtime=args.runtime,
            verbose=args.verbose, grpc_port=args.grpc_port, load_in_background=True,
            **{field.name: getattr(args, field.name) for field in dataclasses.fields(batching.BatchingOptions)})
    except ValueError as error:
        parser.error(str(error))
    except ImportError as error:  # no runtime installed for what the version holds
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    except PortInUse as error:
        parser.exit(1, f"{parser.prog}: error: {error}\n")
    threading.Thread(target=announce, args=(server, parser.prog), daemon=True).start()
    try:
        server.serve_forever()  # until SIGTERM or SIGINT, then drained; or until the model fails to load
    finally:
        server.server_close()
    return 0 if server.state.load_error is None else 1


def load_error_line(error):
    """What a console prints when the model failed to load: one line."""
    return str(error) if isinstance(error, NoVersionLoads) else one_line(error)


def announce(server, prog):
    """Once the model serves, what is served where; if it fails to load, one line, and the server stops."""
    while not server.state.ready.wait(0.1):
        if server.state.load_error is not None:
            print(f"{prog}: error: {load_error_line(server.state.load_error)}", file=sys.stderr, flush=True)
            server.shutdown()
            return
    host, port = server.server_address[:2]
    model = server.model
    print(
        f"Serving model '{model.name}' version {model.version} ({model.path}) "
        f"at http://{host}:{port}/v1/models/{model.name}"
        f" [{model.describe()}]",
        flush=True,
    )
    if server.grpc_address is not None:
        grpc_host, grpc_port = server.grpc_address
        print(f"gRPC ({', '.join(server.grpc_services)}) at {grpc_host}:{grpc_port}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
