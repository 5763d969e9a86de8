"""Single-image request load: Ray Serve replicas (keras-preact-serve-ray) against the one-process server.

Exports one CIFAR ResNet-20 (32 x 32) SavedModel, then serves it in turn with ``keras-preact-serve``
(``server.make_server``, one process) and ``keras-preact-serve-ray`` (``--replicas`` Ray Serve replicas,
requests merged by each replica's ``batching.Batcher``), each in its own process group, and sends ``--clients``
concurrent keep-alive clients x ``--requests`` single-image requests to each; every reply is checked. Prints one table
(images/s, p50 and p99 latency, and for Ray the mean examples per SavedModel call):

    KERAS_BACKEND=tensorflow PYTHONPATH=. python benchmarks/serving_ray.py --clients 16 --requests 50
"""

import argparse
import http.client
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

from keras_preact.export import export_saved_model
from keras_preact.models import cifar_resnet


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(command, marker):
    """A server process started in its own session; returns once it printed ``marker``."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": os.getcwd()}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
                               start_new_session=True)
    ready, _, _ = select.select([process.stdout], [], [], 300)
    line = process.stdout.readline() if ready else ""
    if marker not in line:
        stop(process)
        raise RuntimeError(f"{command[2]} did not start: {line!r}")
    return process


def stop(process):
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def load(port, name, bodies, expected_classes, clients, requests):
    """(images/s, p50 ms, p99 ms, mean examples per model call or None) of ``clients`` x ``requests``."""
    latencies, batch_sizes, errors, lock = [], [], [], threading.Lock()

    def client(index, count):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        mine, sizes = [], []
        for k in range(count):
            i = (index + k) % len(bodies)
            start_time = time.perf_counter()
            conn.request("POST", f"/v1/models/{name}:predict", body=bodies[i])
            response = conn.getresponse()
            reply = json.loads(response.read())
            mine.append(time.perf_counter() - start_time)
            if response.status != 200 or reply["predictions"][0]["classes"] != expected_classes[i]:
                with lock:
                    errors.append(reply)
            if response.getheader("X-Batch-Size"):
                sizes.append(int(response.getheader("X-Batch-Size")))
        conn.close()
        with lock:
            latencies.extend(mine)
            batch_sizes.extend(sizes)

    def run(count):
        threads = [threading.Thread(target=client, args=(i, count)) for i in range(clients)]
        begin = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.perf_counter() - begin

    run(3)  # warm-up: connections, tracing, every replica
    latencies.clear()
    batch_sizes.clear()
    wall = run(requests)
    if errors:
        raise RuntimeError(f"{len(errors)} bad replies, e.g. {errors[0]}")
    p50, p99 = np.percentile(np.array(latencies) * 1e3, [50, 99])
    # Each merged call of n examples answers n requests: the mean over calls is n / (n per call).
    mean_batch = len(batch_sizes) / sum(1 / s for s in batch_sizes) if batch_sizes else None
    return clients * requests / wall, p50, p99, mean_batch


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=50, help="single-image requests per client")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--batching-max-size", type=int, default=16)
    parser.add_argument("--batching-timeout-ms", type=float, default=5.0)
    args = parser.parse_args(argv)
    import tensorflow as tf

    with tempfile.TemporaryDirectory() as tmp:
        path = export_saved_model(cifar_resnet(20, 10, input_shape=(32, 32, 3)), tmp, name="cifar_resnet20",
                                  mean=[127.5] * 3, std=[127.5] * 3)
        pool = np.random.default_rng(0).integers(0, 256, (32, 32, 32, 3), np.uint8)
        signature = tf.saved_model.load(str(path)).signatures["serving_default"]
        expected = signature(images=tf.constant(pool))["classes"].numpy().tolist()
        bodies = [json.dumps({"instances": pool[i:i + 1].tolist()}).encode() for i in range(len(pool))]
        servers = {
            "keras-preact-serve (1 process)": (
                ["-m", "keras_preact_serving.server", str(path.parent)],
                "Serving model",
            ),
            f"keras-preact-serve-ray ({args.replicas} replicas, batches <= {args.batching_max_size}, "
            f"wait {args.batching_timeout_ms:g} ms)": (
                [
                    "-m",
                    "keras_preact_serving.ray_serve",
                    str(path.parent),
                    "--replicas",
                    str(args.replicas),
                    "--batching-max-size",
                    str(args.batching_max_size),
                    "--batching-timeout-ms",
                    str(args.batching_timeout_ms),
                    "--object-store-memory",
                    str(200 * 2**20),
                ],
                "Serving model",
            ),
        }
        rows = []
        for label, (command, marker) in servers.items():
            port = free_port()
            process = start([sys.executable, *command, "--port", str(port)], marker)
            try:
                rows.append((label, *load(port, path.parent.name, bodies, expected, args.clients, args.requests)))
            finally:
                stop(process)
    print(f"\nCIFAR ResNet-20 SavedModel, 32x32 uint8 JSON, {args.clients} clients x {args.requests} single-image "
          f"requests, {os.cpu_count()} CPUs")
    print("| server | images/s | p50 ms | p99 ms | examples per model call |\n|---|---|---|---|---|")
    for label, ips, p50, p99, batch in rows:
        print(f"| {label} | {ips:.1f} | {p50:.1f} | {p99:.1f} | {'1' if batch is None else f'{batch:.1f}'} |")


if __name__ == "__main__":
    main()
