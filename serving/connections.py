"""The one protection uvicorn's settings do not give, for ``keras-preact-serve`` and Ray Serve's proxy
(``ray_proxy_setup_hook``): uvicorn 0.54 times out a connection idle after a reply (``timeout_keep_alive``),
not one that never sends a request nor a slowloris sending a byte at a time, and its ``limit_concurrency``
answers a surplus connection only once it sends a request. ``BoundedH11Protocol`` subclasses uvicorn's
h11 protocol, hence the ``uvicorn<0.55`` pin."""

import http
import json

from uvicorn import config
from uvicorn.protocols.http.h11_impl import H11Protocol


def raw_reply(status, message):
    """A whole HTTP/1.1 JSON error reply that closes the connection (h11 sends none before a request)."""
    body = json.dumps({"error": message}).encode()  # as every error of the app (``rest.error_body``)
    return (f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\nContent-Type: application/json\r\n"
            f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n").encode("ascii") + body


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 connection with ``max_connections`` (503 beyond) and the keep-alive timeout as a deadline from the
    connection's start or last reply until a request's body has arrived (then 408), not restarted by bytes arriving."""

    def __init__(self, *args, max_connections=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.max_connections = max_connections
        self._deadline = None  # the TimerHandle while a request is awaited
        self._received = False  # some bytes of the awaited request arrived
        self._rejected = False

    def connection_made(self, transport):
        if self.max_connections is not None and len(self.connections) >= self.max_connections:
            self._rejected = True
            transport.write(raw_reply(503, f"Too many connections (limit {self.max_connections}); retry later."))
            transport.close()
            return
        super().connection_made(transport)
        self._watch()

    def connection_lost(self, exc):
        if not self._rejected:
            self._cancel()
            super().connection_lost(exc)

    def data_received(self, data):
        if self._rejected:
            return
        self._received = True
        super().data_received(data)
        self._watch()

    def on_response_complete(self):
        super().on_response_complete()  # may start a pipelined request already received
        self._watch()

    def send_400_response(self, msg):
        """A request h11 cannot parse: a JSON 400 like every other error, then closed."""
        self.transport.write(raw_reply(400, "Invalid HTTP request: a malformed request line, header, Content-Length "
                                            "or chunk, or no Host header."))
        self.transport.close()

    def _cancel(self):
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _watch(self):
        """Arm the deadline when a request is awaited (and it is not armed yet); cancel it otherwise."""
        cycle = self.cycle
        awaited = cycle is None or cycle.more_body or cycle.response_complete
        if self.transport.is_closing() or not awaited:
            self._cancel()
        elif self._deadline is None:
            self._received = bool(self.conn.trailing_data[0])  # a pipelined request's first bytes
            self._deadline = self.loop.call_later(self.timeout_keep_alive, self._expire)

    def _expire(self):
        self._deadline = None
        if self.transport.is_closing():
            return
        cycle = self.cycle
        replying = cycle is not None and cycle.response_started and not cycle.response_complete
        if self._received and not replying:
            self.transport.write(raw_reply(408, f"The request did not arrive within {self.timeout_keep_alive:g} s."))
        self.transport.close()  # the app, if it was reading the body, sees the client gone


def ray_proxy_setup_hook():
    """Ray's ``worker_process_setup_hook``: ``BoundedH11Protocol`` is uvicorn's default in every worker, Serve's proxy
    too."""
    config.HTTP_PROTOCOLS["auto"] = f"{__name__}:BoundedH11Protocol"
