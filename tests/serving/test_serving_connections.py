"""keras-preact-serve's connections, with raw sockets: idle and slowloris clients are timed out and never
lock out a normal client, pipelined requests are answered in order, a body shorter than its
Content-Length gets a 408, chunked bodies are bounded, SIGTERM drains the requests in flight, and the
server's memory per idle connection is bounded.

The server (``server.Server``, the one ``keras-preact-serve`` runs, with the ASGI app) runs in its own
process on a numpy model, so these run without TensorFlow and the server's file descriptors and RSS
are its own.
"""

import json
import pathlib
import resource
import signal
import socket
import sys
import threading
import time

import pytest

from support import start_numpy_server, stop_numpy_server, wait_for_entries

pytestmark = [pytest.mark.notf, pytest.mark.any_backend, pytest.mark.once]

TIMEOUT = 3.0  # the server's request_timeout: long enough for a loaded CI machine, short for the test
MAX_BODY = 1000
IDLE, SLOW = 1000, 50  # idle connections and slowloris clients (issue 25)

def start_server(batching="off", timeout=TIMEOUT, max_body=MAX_BODY, report_entries=False):
    """(process, port) of a server on a numpy model (support.NUMPY_SERVER) in its own process."""
    return start_numpy_server(batching, timeout, max_body, report_entries=report_entries)


stop_server = stop_numpy_server


def raise_open_file_limit(needed=2 * (IDLE + SLOW) + 200):
    """Raise this process's soft limit on open files (the servers started next inherit it): the idle
    connections' client and server ends."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert hard == resource.RLIM_INFINITY or hard >= needed, (
        f"the test needs {needed} open files; the hard limit is {hard}"
    )
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, needed) if soft != resource.RLIM_INFINITY else soft, hard))


@pytest.fixture(scope="module")
def served():
    """One unbatched server: nothing here reaches a model call that batching changes (the drain does: below)."""
    raise_open_file_limit()
    process, port = start_server()
    yield port
    stop_server(process)


def predict_request(values, connection="keep-alive"):
    body = json.dumps({"instances": values}).encode()
    return (b"POST /v1/models/m:predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Connection: %s\r\nContent-Length: %d\r\n\r\n%s" % (connection.encode(), len(body), body))


def read_reply(stream):
    """(status, headers, JSON body) of one reply read from a socket's file; None if it closed."""
    line = stream.readline()
    if not line:
        return None
    status = int(line.split()[1])
    headers = {}
    while (line := stream.readline()) not in (b"\r\n", b""):
        name, value = line.decode().split(":", 1)
        headers[name.strip().lower()] = value.strip()
    return status, headers, json.loads(stream.read(int(headers["content-length"])))


def exchange(port, data, timeout=30):
    """Send raw ``data`` on a new connection: (first reply, whether the server then closed it)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        stream = sock.makefile("rb")
        reply = read_reply(stream)
        return reply, stream.read(1) == b""


def test_idle_and_slowloris_connections_neither_lock_out_a_client_nor_stay_open(served):
    """1,000 idle connections and 50 clients sending their headers a byte every 0.5 s: a normal client's
    predict is answered within 1 s (its socket's timeout), and after the request timeout every idle
    connection is closed without a word and every slow one gets a 408."""
    port = served
    idle = [socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT + 30) for _ in range(IDLE)]
    slow = [socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT + 30) for _ in range(SLOW)]
    header = b"GET /v1/models/m HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 100
    stop = threading.Event()
    dripping = threading.Semaphore(0)  # released by each slow client once it has sent two bytes

    def drip(sock):
        for sent, byte in enumerate(header, 1):
            if stop.wait(0.5):
                return
            try:
                sock.sendall(bytes([byte]))
            except OSError:  # closed by the server
                return
            if sent == 2:
                dripping.release()

    drippers = [threading.Thread(target=drip, args=(sock,)) for sock in slow]
    for thread in drippers:
        thread.start()
    try:
        for _ in slow:  # every connection is open and the slow ones have sent two bytes each
            assert dripping.acquire(timeout=TIMEOUT), "a slow client could not send its first bytes"
        reply, _ = exchange(port, predict_request([[1.5, 0.0], [2.0, 0.0]], "close"), timeout=1.0)
        assert reply[0] == 200 and reply[2] == {"predictions": [1.5, 2.0]}
        for sock in slow:
            reply = read_reply(sock.makefile("rb"))
            assert reply is not None and reply[0] == 408, reply
            assert reply[2] == {"error": f"The request did not arrive within {TIMEOUT:g} s."}
        for sock in idle:
            assert sock.recv(1) == b""
    finally:
        stop.set()
        for thread in drippers:
            thread.join(30)
        for sock in idle + slow:
            sock.close()


def test_pipelined_requests_are_answered_in_order(served):
    """Four requests in one write on a kept-alive connection, the first predict slow: the replies come
    in the order the requests were sent, and the connection stays open for a fifth."""
    port = served
    requests = (b"GET /v1/models/m HTTP/1.1\r\nHost: x\r\n\r\n" + predict_request([[1.0, 0.25]])
                + b"GET /v1/models/m/metadata HTTP/1.1\r\nHost: x\r\n\r\n" + predict_request([[2.0, 0.0], [3.0, 0.0]]))
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(requests)
        stream = sock.makefile("rb")
        replies = [read_reply(stream) for _ in range(4)]
        assert [status for status, _, _ in replies] == [200] * 4
        assert "model_version_status" in replies[0][2]
        assert replies[1][2] == {"predictions": [1.25]}
        assert replies[2][2]["model_spec"]["name"] == "m"
        assert replies[3][2] == {"predictions": [2.0, 3.0]}
        sock.sendall(predict_request([[4.0, 0.0]]))
        assert read_reply(stream)[2] == {"predictions": [4.0]}


def test_a_whole_request_handled_longer_than_the_timeout_is_answered_not_timed_out(served):
    """Headers and body in separate writes (as http.client sends them), then 1.5 x TIMEOUT in the model: the
    request arrived whole, so its deadline is over: 200, not 408. The next request on the kept-alive connection gets
    its own deadline from its first byte, and its 200 too."""
    request = predict_request([[2.0, 1.5 * TIMEOUT]])
    head, body = request.split(b"\r\n\r\n", 1)
    with socket.create_connection(("127.0.0.1", served), timeout=30) as sock:
        stream = sock.makefile("rb")
        sock.sendall(head + b"\r\n\r\n")
        time.sleep(0.2)
        sock.sendall(body)
        assert read_reply(stream)[::2] == (200, {"predictions": [2.0 + 1.5 * TIMEOUT]})
        time.sleep(0.5 * TIMEOUT)  # idle between requests: the next one's deadline has not started
        sock.sendall(predict_request([[1.0, 0.0]], "close"))
        assert read_reply(stream)[::2] == (200, {"predictions": [1.0]})


def test_a_body_shorter_than_its_content_length_times_out_with_408(served):
    port = served
    start = time.perf_counter()
    reply, closed = exchange(port, b"POST /v1/models/m:predict HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"
                                   b'{"instances"', timeout=TIMEOUT + 30)
    assert reply[0] == 408 and closed and time.perf_counter() - start < TIMEOUT + 3
    assert reply[2] == {"error": f"The request did not arrive within {TIMEOUT:g} s."}


def test_the_app_itself_ends_a_body_that_does_not_arrive_with_408():
    """The app's own deadline on reading a body (--request-timeout), whatever server runs it: driven as ASGI, with
    no connection layer to answer first, a body that stops arriving gets the app's 408 (connection closed) at the
    request timeout, not a wait for ever."""
    import asyncio

    from keras_preact_serving import app

    state = app.ServingState(lambda: None, app.RequestLimits(request_timeout=0.5))
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/models/m:predict", "raw_path": b"/v1/models/m:predict", "query_string": b"",
             "root_path": "", "headers": [(b"host", b"x"), (b"content-length", b"100")], "client": ("127.0.0.1", 1),
             "server": ("127.0.0.1", 2)}
    arrived, sent = [], []

    async def receive():
        if not arrived:
            arrived.append(True)
            return {"type": "http.request", "body": b'{"instances"', "more_body": True}
        await asyncio.sleep(3600)  # the rest never comes

    async def send(message):
        sent.append(message)

    async def call():
        await asyncio.wait_for(app.create_app(state)(scope, receive, send), 5)

    start = time.perf_counter()
    asyncio.run(call())
    assert 0.5 <= time.perf_counter() - start < 3
    assert sent[0]["status"] == 408 and (b"connection", b"close") in sent[0]["headers"], sent[0]
    assert json.loads(b"".join(m.get("body", b"") for m in sent[1:])) == {
        "error": "The request body did not arrive within 0.5 s."}


def chunked(body, size):
    chunks = [body[i:i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for chunk in chunks) + b"0\r\n\r\n"


def test_chunked_bodies_are_read_and_bounded_by_max_body_bytes(served):
    """A chunked predict within --max-body-bytes is answered; one beyond it gets a 413 once the limit is
    crossed (sent at once or chunk by chunk), and its connection is closed; Content-Length and chunked together are
    refused (400)."""
    port = served
    head = b"POST /v1/models/m:predict HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
    small = json.dumps({"instances": [[1.0, 0.0], [2.5, 0.0]]}).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head + b"\r\n" + chunked(small, 7))
        stream = sock.makefile("rb")
        assert read_reply(stream)[2] == {"predictions": [1.0, 2.5]}
        sock.sendall(head + b"\r\n" + chunked(small, 100))  # the connection is still usable
        assert read_reply(stream)[2] == {"predictions": [1.0, 2.5]}
    large = json.dumps({"instances": [[1.0, 0.0]] * 200}).encode()
    assert len(large) > MAX_BODY
    reply, closed = exchange(port, head + b"\r\n" + chunked(large, 300))
    assert reply[0] == 413 and closed and reply[2] == {
        "error": f"Request body of more than {MAX_BODY} bytes exceeds the limit of {MAX_BODY} bytes."}
    # The limit is on the whole body, not on each chunk: four chunks of 300 bytes, each in a write of its own
    # (no Nagle delay, 50 ms apart, so the server reads them one at a time), cross it with the fourth: 413 then,
    # without waiting for the rest of the body.
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT + 30) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(head + b"\r\n")
        start = time.perf_counter()
        for i in range(4):
            time.sleep(0.05)
            sock.sendall(b"%x\r\n%s\r\n" % (300, large[300 * i:300 * (i + 1)]))
        stream = sock.makefile("rb")
        reply = read_reply(stream)
        assert reply[0] == 413 and stream.read(1) == b"" and time.perf_counter() - start < TIMEOUT, reply
        assert reply[2] == {
            "error": f"Request body of more than {MAX_BODY} bytes exceeds the limit of {MAX_BODY} bytes."
        }
    reply, closed = exchange(port, head + b"Content-Length: %d\r\n\r\n" % len(small) + chunked(small, 7))
    assert reply[0] == 400 and closed
    assert reply[2] == {"error": "A request may not have both Content-Length and Transfer-Encoding: chunked."}


@pytest.mark.parametrize("batching", ["off", "on"])
def test_sigterm_answers_the_requests_in_flight_then_exits_0(batching):
    """8 predicts in flight (each 1 s in the model, merged or not), then SIGTERM: all 8 are answered,
    a new connection is refused, and the process exits 0. SIGTERM is sent once the model has reported all 8
    requests entering it (the event, however slow the machine), while each is still in its 1 s."""
    process, port = start_server(batching, report_entries=True)
    replies = [None] * 8

    def client(i):
        replies[i] = exchange(port, predict_request([[i + 1.0, 1.0]], "close"), timeout=60)[0]

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    try:
        for thread in threads:
            thread.start()
        wait_for_entries(process, [i + 1.0 for i in range(8)])
        process.send_signal(signal.SIGTERM)
        for thread in threads:
            thread.join(60)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:  # failed before the drain: no server outlives the test
            process.kill()
            process.wait()
    assert process.stdout.read().strip() == "exited"
    assert [(r[0], r[2]) for r in replies] == [(200, {"predictions": [i + 2.0]}) for i in range(8)]
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5)


def rss_kib(pid):
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_memory_per_idle_connection_is_bounded():
    """1,000 idle connections grow the server's RSS by less than 50 KiB each (an event loop's socket and
    protocol objects, no thread; BENCHMARKS.md, "Idle and slowloris connections")."""
    raise_open_file_limit()
    process, port = start_server(timeout=60)
    try:
        exchange(port, predict_request([[1.0, 0.0]], "close"))  # everything a request touches is loaded
        before = rss_kib(process.pid)
        idle = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(IDLE)]
        reply, _ = exchange(port, predict_request([[1.0, 0.0]], "close"))  # every connection was accepted
        assert reply[0] == 200
        grown = rss_kib(process.pid) - before
        print(f"\nserver RSS: {before / 1024:.1f} MiB, +{grown / 1024:.1f} MiB with {IDLE} idle connections "
              f"({grown / IDLE:.1f} KiB each)")
        assert grown < IDLE * 50, grown
        for sock in idle:
            sock.close()
    finally:
        stop_server(process)



def test_expect_100_continue_over_the_limit_gets_413_and_no_continue(served):
    port = served
    reply, closed = exchange(port, b"POST /v1/models/m:predict HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                                   b"Content-Length: 1000000000\r\n\r\n")
    assert reply[0] == 413 and closed
    assert reply[2] == {"error": f"Request body of 1000000000 bytes exceeds the limit of {MAX_BODY} bytes."}


def test_request_limit_flags_are_the_records_fields(capsys):
    """keras-preact-serve's limit flags come from RequestLimits: the old names and defaults, parsed
    into the record, and a bad value refused naming the flag's argument before anything loads."""
    import dataclasses

    from keras_preact_serving.app import RequestLimits
    from keras_preact_serving.server import build_parser, main

    flags = {action.dest: action.default for action in build_parser()._actions}
    assert {f.name: flags[f.name] for f in dataclasses.fields(RequestLimits)} == dataclasses.asdict(RequestLimits())
    assert RequestLimits().max_body_bytes == 64 * 1024 * 1024 and RequestLimits().request_timeout == 30.0
    args = build_parser().parse_args(["x", "--max-body-bytes", "10", "--request-timeout", "2.5",
                                      "--max-connections", "7"])
    assert RequestLimits.from_args(args) == RequestLimits(max_body_bytes=10, request_timeout=2.5, max_connections=7)
    with pytest.raises(SystemExit) as exit_info:
        main(["does-not-exist", "--max-connections", "0"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith("Invalid max_connections=0: expected a positive integer.")


@pytest.mark.parametrize("host, reason", [("192.0.2.1", "Cannot assign requested address"),  # not this machine's
                                          ("300.1.2.3", None)])  # no address at all (the resolver's words vary)
def test_a_host_the_server_cannot_listen_on_is_named_in_one_line(tmp_path, capsys, host, reason):
    """--host that is no address of this machine, or no address: exit 2 with one line naming --host, before any
    model loads (a 25-line traceback before)."""
    from keras_preact_serving.server import main

    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "model.onnx").touch()  # the server binds before it loads: the file is never read
    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path), "--host", host, "--port", "0"])
    err = capsys.readouterr().err.strip().splitlines()
    head, tail = f"keras-preact-serve: error: Invalid --host={host!r}: cannot listen on {host}:0 (", (
        "); give an address of this machine (127.0.0.1 for this machine only, 0.0.0.0 for every interface).")
    assert exit_info.value.code == 2 and err[-1].startswith(head) and err[-1].endswith(tail), err
    assert reason is None or err[-1] == head + reason + tail, err


def test_without_uvicorn_the_entry_point_says_what_to_install_in_one_line(monkeypatch, capsys):
    import keras_preact_serving
    from keras_preact_serving import main

    monkeypatch.setitem(sys.modules, "uvicorn", None)  # as if uvicorn were not installed
    monkeypatch.delitem(sys.modules, "keras_preact_serving.server", raising=False)
    monkeypatch.delattr(keras_preact_serving, "server", raising=False)
    assert main(["saved_models/x"]) == 2
    assert capsys.readouterr().err == (
        'keras-preact-serve: error: serving needs Starlette and uvicorn: pip install "keras-preact[serve]"\n')


@pytest.mark.parametrize("header", [b"Content-Length: -1\r\n", b"Content-Length: +10\r\n", b"Content-Length: 1e3\r\n",
                                    "Content-Length: \u0661\r\n".encode(), b""],
                         ids=["negative", "plus", "exponent", "non-ascii", "no-host"])
def test_malformed_requests_get_a_json_400_and_are_closed(served, header):
    port = served
    host = b"Host: x\r\n" if header else b""
    reply, closed = exchange(port, b"POST /v1/models/m:predict HTTP/1.1\r\n" + host + header + b"\r\n{}")
    assert reply[0] == 400 and closed and reply[2] == {
        "error": "Invalid HTTP request: a malformed request line, header, Content-Length or chunk, or no Host header."}
