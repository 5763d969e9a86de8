"""keras-preact-serve under idle and slowloris connections: the server's RSS, and a normal client's latency.

Exports one CIFAR ResNet-20 (32 x 32) SavedModel, serves it with ``python -m keras_preact_serving.server``
(its own process), then opens ``--idle`` idle TCP connections and ``--slow`` slowloris clients (request
headers at one byte per second) on loopback, and meanwhile sends single-image predicts from one normal
client, one connection each. Prints the server's RSS (``/proc/<pid>/status`` VmRSS) before and with the
connections open, the normal client's replies and latencies, and how many connections the server had
closed once ``--request-timeout`` had passed:

    KERAS_BACKEND=tensorflow PYTHONPATH=. python benchmarks/serving_connections.py --idle 1000 --slow 50
"""

import argparse
import json
import pathlib
import resource
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

from keras_preact.export import export_saved_model
from keras_preact.models import cifar_resnet


def rss_mib(pid):
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def predict(port, body, timeout):
    """(status line, seconds) of one predict on a new connection."""
    start = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(b"POST /v1/models/m:predict HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    return reply.split(b"\r\n", 1)[0].decode(), time.perf_counter() - start


def drip(sock, stop):
    """Request headers at one byte per second until closed or stopped."""
    header = b"GET /v1/models/m HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 1000
    for byte in header:
        if stop.wait(1.0):
            return
        try:
            sock.sendall(bytes([byte]))
        except OSError:
            return


def closed(sock):
    """Whether the server has closed the connection (after a 408 for a slow one)."""
    poll = select.poll()  # select.select cannot take descriptors above 1023
    poll.register(sock, select.POLLIN)
    if not poll.poll(0):
        return False
    try:
        data = sock.recv(4096)
    except OSError:
        return True
    return data == b"" or data.startswith(b"HTTP/1.1 408")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle", type=int, default=1000)
    parser.add_argument("--slow", type=int, default=50)
    parser.add_argument("--request-timeout", type=float, default=10.0, help="the server's --request-timeout")
    parser.add_argument("--predicts", type=int, default=20, help="normal client's predicts while the others are open")
    args = parser.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 2 * (args.idle + args.slow) + 100)), hard))
    with tempfile.TemporaryDirectory() as tmp:
        path = export_saved_model(cifar_resnet(20, 10, input_shape=(32, 32, 3)), tmp, name="m",
                                  mean=[127.5] * 3, std=[127.5] * 3)
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "keras_preact_serving.server",
                str(path.parent),
                "--port",
                "0",
                "--request-timeout",
                str(args.request_timeout),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        stop = threading.Event()
        socks, threads = [], []
        try:
            port = int(process.stdout.readline().split("http://127.0.0.1:", 1)[1].split("/")[0])
            body = json.dumps({"instances": np.zeros((1, 32, 32, 3), np.uint8).tolist()}).encode()
            for _ in range(3):
                predict(port, body, 60)
            before = rss_mib(process.pid)
            start = time.monotonic()
            socks = [socket.create_connection(("127.0.0.1", port), timeout=60) for _ in range(args.idle + args.slow)]
            threads = [threading.Thread(target=drip, args=(s, stop), daemon=True) for s in socks[args.idle:]]
            for thread in threads:
                thread.start()
            opened = time.monotonic() - start
            replies = [predict(port, body, 5) for _ in range(args.predicts)]
            during = rss_mib(process.pid)
            time.sleep(max(0.0, start + args.request_timeout + 2 - time.monotonic()))
            closed_idle = sum(closed(s) for s in socks[:args.idle])
            closed_slow = sum(closed(s) for s in socks[args.idle:])
        finally:
            stop.set()
            for sock in socks:
                sock.close()
            process.terminate()
            process.wait(60)
    latencies = np.array([seconds for _, seconds in replies]) * 1e3
    statuses = sorted({status for status, _ in replies})
    print(f"| idle | slowloris | RSS before MiB | RSS with them MiB | KiB per connection | normal predicts "
          f"| p50 ms | max ms | closed after {args.request_timeout:g} s (idle, slow) |")
    print("|---|---|---|---|---|---|---|---|---|")
    print(f"| {args.idle} | {args.slow} | {before:.1f} | {during:.1f} | "
          f"{(during - before) * 1024 / (args.idle + args.slow):.1f} | {len(replies)} x {', '.join(statuses)} | "
          f"{np.percentile(latencies, 50):.1f} | {latencies.max():.1f} | {closed_idle}/{args.idle}, "
          f"{closed_slow}/{args.slow} |")
    print(f"({args.idle + args.slow} connections opened in {opened:.2f} s)")


if __name__ == "__main__":
    main()
