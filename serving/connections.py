"""What uvicorn's settings do not give, kept on public APIs only (asyncio's event loop and protocols, h11's parser),
for ``keras-preact-serve`` and Ray Serve's proxy (``ray_proxy_setup_hook``).

uvicorn's ``timeout_keep_alive`` closes a connection idle after a reply, but not one that never sends a request nor a
slowloris sending its headers a byte at a time; its ``limit_concurrency`` answers a surplus connection only once it
sends a request; its 400 for a request it cannot parse is plain text. ``GuardedEventLoop`` is asyncio's event loop
whose servers (``create_server``, which uvicorn's ``Server.serve(sockets=...)`` calls) put a ``ConnectionGuard`` in
front of each connection's protocol: it reads the incoming bytes with its own h11 parser, and

- answers a connection beyond ``max_connections`` with a JSON 503 at once, and closes it;
- gives each request ``timeout`` seconds from the connection's start, or from its first byte on a kept-alive
  connection, to arrive whole, headers and body (then a JSON 408, or a silent close if no byte came);
- answers bytes h11 cannot parse as a request with a JSON 400, and closes the connection, before uvicorn sees them.

Examples:
    >>> loop = GuardedEventLoop(max_connections=4096, timeout=30.0)  # doctest: +SKIP
    >>> loop.run_until_complete(uvicorn.Server(config).serve(sockets=[sock]))  # doctest: +SKIP
"""

import asyncio
import functools
import http
import json
import os

import h11

TIMEOUT_ENV = "KERAS_PREACT_SERVE_REQUEST_TIMEOUT"  # the deadline in Ray Serve's proxy (``ray_proxy_setup_hook``)
MAX_INCOMPLETE_EVENT_SIZE = 16 * 1024  # h11's default, as uvicorn's ``h11_max_incomplete_event_size``
BAD_REQUEST = ("Invalid HTTP request: a malformed request line, header, Content-Length or chunk, or no Host "
               "header.")


def raw_reply(status, message):
    """A whole HTTP/1.1 JSON error reply that closes the connection (for a connection no request of which reached
    the app)."""
    body = json.dumps({"error": message}).encode()  # as every error of the app (``rest.error_body``)
    return (f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\nContent-Type: application/json\r\n"
            f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n").encode("ascii") + body


class ConnectionGuard(asyncio.Protocol):
    """One connection: ``protocol`` (the server's, e.g. uvicorn's HTTP protocol) behind the guard (module
    docstring). ``open`` is the set of the server's admitted connections."""

    def __init__(self, make_protocol, open, max_connections, timeout):  # noqa: A002 - the server's open set
        self._make_protocol, self._open = make_protocol, open
        self.max_connections, self.timeout = max_connections, timeout
        self.protocol = self.transport = self._deadline = None
        self._parser = self._new_parser()
        self._received = False  # some bytes of the awaited request arrived

    @staticmethod
    def _new_parser():
        return h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_INCOMPLETE_EVENT_SIZE)

    def connection_made(self, transport):
        self.transport = transport
        if self.max_connections is not None and len(self._open) >= self.max_connections:
            transport.write(raw_reply(503, f"Too many connections (limit {self.max_connections}); retry later."))
            transport.close()
            return
        self._open.add(self)
        self.protocol = self._make_protocol()
        self.protocol.connection_made(transport)
        self._arm()

    def data_received(self, data):
        if self.protocol is None:  # refused
            return
        if self._parser is not None and not self._watch(data):
            self._cancel()
            self._parser = None
            self.transport.write(raw_reply(400, BAD_REQUEST))
            self.transport.close()
            return
        self.protocol.data_received(data)

    def eof_received(self):
        return None if self.protocol is None else self.protocol.eof_received()

    def connection_lost(self, exc):
        if self.protocol is None:
            return
        self._cancel()
        self._open.discard(self)
        self.protocol.connection_lost(exc)

    def pause_writing(self):
        if self.protocol is not None:
            self.protocol.pause_writing()

    def resume_writing(self):
        if self.protocol is not None:
            self.protocol.resume_writing()

    def _watch(self, data):
        """Follow the requests in ``data``: the deadline is cancelled once one has arrived whole (h11's
        ``EndOfMessage``: it is being handled, or answered), and armed at the first byte of the next. False if
        ``data`` is not HTTP/1.1 h11 can parse."""
        if data and self._deadline is None:
            self._arm()
        self._received = self._received or bool(data)
        self._parser.receive_data(data)
        try:
            while True:
                event = self._parser.next_event()
                if event is h11.NEED_DATA or event is h11.PAUSED or isinstance(event, h11.ConnectionClosed):
                    return True
                if isinstance(event, h11.EndOfMessage) and not self._next_request():
                    return True
        except h11.RemoteProtocolError:
            return False

    def _next_request(self):
        """A request arrived whole: its deadline is cancelled, and a pipelined request's bytes start the next one's.
        Whether any arrived. A request switching protocols (``Upgrade``, ``CONNECT``) ends the watch."""
        self._cancel()
        if self._parser.their_state is not h11.DONE:
            self._parser = None
            return False
        trailing, closed = self._parser.trailing_data
        self._parser, self._received = self._new_parser(), bool(trailing)
        if trailing:
            self._arm()
            self._parser.receive_data(trailing)
        if closed:
            self._parser.receive_data(b"")
        return bool(trailing or closed)

    def _arm(self):
        if self.timeout is not None:
            self._cancel()
            self._deadline = asyncio.get_running_loop().call_later(self.timeout, self._expire)

    def _cancel(self):
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expire(self):
        self._deadline = None
        if self.transport.is_closing():
            return
        if self._received:
            self.transport.write(raw_reply(408, f"The request did not arrive within {self.timeout:g} s."))
        self.transport.close()  # the app, if it was reading the body, sees the client gone


class GuardedEventLoop(asyncio.SelectorEventLoop):
    """asyncio's event loop whose TCP servers guard each connection (``ConnectionGuard``): ``max_connections`` open
    at once (None: no limit) and ``timeout`` seconds for a request to arrive (None: no deadline)."""

    def __init__(self, max_connections=None, timeout=None):
        super().__init__()
        self.max_connections, self.timeout = max_connections, timeout

    async def create_server(self, protocol_factory, *args, **kwargs):
        open_connections = set()

        def guarded():
            return ConnectionGuard(protocol_factory, open_connections, self.max_connections, self.timeout)

        return await super().create_server(guarded, *args, **kwargs)


def ray_runtime_env(request_timeout):
    """The Ray job's ``runtime_env`` for ``ray_proxy_setup_hook``: Ray's asyncio loop (not uvloop), guarded."""
    return {"worker_process_setup_hook": f"{__name__}.ray_proxy_setup_hook",
            "env_vars": {"RAY_USE_UVLOOP": "0", TIMEOUT_ENV: repr(float(request_timeout))}}


def ray_proxy_setup_hook():
    """Ray's ``worker_process_setup_hook``: every worker's new event loops (Serve's proxy's too) are
    ``GuardedEventLoop``s with the request timeout of ``ray_runtime_env``. Ray's workers make their loops with
    ``asyncio.new_event_loop()`` (uvloop off), so the hook gives that name a loop factory of guarded loops, the
    factory ``asyncio.run(..., loop_factory=...)`` takes: asyncio's event loop policies, the other way to choose
    the loop class, are deprecated in Python 3.14 and removed in 3.16."""
    timeout = os.environ.get(TIMEOUT_ENV)
    if timeout:
        asyncio.new_event_loop = functools.partial(GuardedEventLoop, timeout=float(timeout))
