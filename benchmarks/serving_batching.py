"""keras-preact-serve with and without dynamic batching under concurrent single-image clients.

Exports each model once, then, in the same run, starts the server (the real entry point,
``python -m keras_preact_serving.server``, its own process) once per variant and round, and drives it
with ``--clients`` client *processes* (not threads: they hold no GIL of the server's, and each only sends
a prepared body and reads the reply status), each sending one image per request on a keep-alive
connection, back to back, for ``--warmup`` + ``--duration`` seconds. Requests started in the timed window
count: throughput (images/s) is those completed in it over its length, p50/p99 their latencies.

    KERAS_BACKEND=tensorflow PYTHONPATH=. python benchmarks/serving_batching.py \\
        --models cifar_resnet20 --signatures default bytes --clients 16 --duration 15 --rounds 2

``--variants`` names server flag sets from VARIANTS; ``--models imagenet_resnet50 --signatures bytes``
gives ResNet-50 at 224 (JPEG bodies: a JSON pixel body of 224x224x3 costs more to parse than the model).
"""

import argparse
import base64
import http.client
import io
import json
import multiprocessing
import subprocess
import sys
import tempfile
import time

import numpy as np

MODELS = {  # name: (builder arguments, image size)
    "cifar_resnet20": ("cifar", 32),
    "imagenet_resnet50": ("imagenet", 224),
}
VARIANTS = {
    "off": [],
    "on": ["--enable-batching"],
    "on-2ms": ["--enable-batching", "--batching-timeout-ms", "2"],
    "on-2threads": ["--enable-batching", "--batching-threads", "2"],
}


def export(name, directory):
    """The model's SavedModel base directory (TF imported here only: client processes import this module)."""
    from keras_preact.export import export_saved_model
    from keras_preact.models import cifar_resnet, imagenet_resnet

    family, size = MODELS[name]
    model = cifar_resnet(20, 10, input_shape=(size, size, 3)) if family == "cifar" else imagenet_resnet(50, 1000)
    return export_saved_model(model, directory, name=name, mean=[127.5] * 3, std=[127.5] * 3).parent


def images(size, count, seed):
    """``count`` random uint8 RGB images of ``size`` x ``size`` (the same ones for a given seed)."""
    return np.random.default_rng(seed).integers(0, 256, (count, size, size, 3), dtype=np.uint8)


def jpeg(pixels):
    """The JPEG bytes (quality 90) of one uint8 RGB image."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def rest_body(signature, pixels):
    """The single-image TF Serving REST body of one image: JSON uint8 pixels (default) or a base64 JPEG (bytes)."""
    if signature == "default":
        return json.dumps({"instances": [pixels.tolist()]}).encode()
    b64 = base64.b64encode(jpeg(pixels)).decode()
    return json.dumps({"signature_name": "serving_bytes", "instances": [{"b64": b64}]}).encode()


def bodies(signature, size, count, seed):
    """``count`` single-image request bodies: JSON uint8 pixels (default) or a base64 JPEG (bytes)."""
    return [rest_body(signature, pixels) for pixels in images(size, count, seed)]


def client(port, path, payloads, ready, go, stop_at, results):
    """One warm-up request, ``ready``, wait for ``go``, then send ``payloads`` in turn until ``stop_at.value``
    (time.time()); put [(start, end, status)] on ``results``."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("POST", path, body=payloads[0], headers={"Content-Type": "application/json"})
    conn.getresponse().read()
    ready.put(True)
    go.wait()
    records = []
    i = 0
    while time.time() < stop_at.value:
        start = time.time()
        conn.request("POST", path, body=payloads[i % len(payloads)], headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        records.append((start, time.time(), response.status))
        i += 1
    conn.close()
    results.put(records)


def launch_server(base, flags, module="keras_preact_serving.server", **popen):
    """The server process (``python -m keras_preact_serving.server``, or ``module``; any free port), not waited for."""
    return subprocess.Popen([sys.executable, "-m", module, str(base), "--port", "0", *flags],
                            stdout=subprocess.PIPE, text=True, **popen)


def server_port(process):
    """The REST port from the server's first line, once it has loaded the model."""
    line = process.stdout.readline()
    if "Serving model" not in line:
        process.kill()
        raise RuntimeError(f"the server did not start: {line!r}")
    return int(line.rsplit(":", 1)[1].split("/")[0])


def start_server(base, flags):
    process = launch_server(base, flags)
    return process, server_port(process)


def measure(base, name, signature, flags, args):
    process, port = start_server(base, flags)
    try:
        size = MODELS[name][1]
        path = f"/v1/models/{name}:predict"
        context = multiprocessing.get_context("spawn")
        results, ready, go, stop_at = context.Queue(), context.Queue(), context.Event(), context.Value("d", 0.0)
        payloads = [bodies(signature, size, 4, seed=c) for c in range(args.clients)]
        clients = [context.Process(target=client, args=(port, path, payloads[c], ready, go, stop_at, results))
                   for c in range(args.clients)]
        for c in clients:
            c.start()
        for _ in clients:
            ready.get(timeout=600)
        start_at = time.time() + args.warmup  # all clients load the server from now; timed from start_at
        stop_at.value = start_at + args.duration
        go.set()
        records = [r for _ in clients for r in results.get(timeout=args.duration + args.warmup + 300)]
        for c in clients:
            c.join()
    finally:
        process.terminate()
        process.wait(timeout=60)
    timed = [(s, e, status) for s, e, status in records if start_at <= s and e <= stop_at.value]
    errors = sum(status != 200 for *_, status in timed)
    latencies = np.array([e - s for s, e, _ in timed]) * 1e3
    p50, p99 = np.percentile(latencies, [50, 99])
    return len(timed) / args.duration, p50, p99, errors


def positive(kind):
    def parse(text):
        value = kind(text)
        if not 0 < value < float("inf"):
            raise argparse.ArgumentTypeError(f"{text} is not a positive {kind.__name__}")
        return value

    return parse


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["cifar_resnet20"], choices=sorted(MODELS))
    parser.add_argument("--signatures", nargs="+", default=["default", "bytes"], choices=["default", "bytes"])
    parser.add_argument("--variants", nargs="+", default=["off", "on"], choices=sorted(VARIANTS))
    parser.add_argument(
        "--clients", type=positive(int), default=16, help="client processes, one request in flight each"
    )
    parser.add_argument("--duration", type=positive(float), default=15.0, help="seconds timed per cell")
    parser.add_argument("--warmup", type=positive(float), default=3.0, help="seconds of load before the timed window")
    parser.add_argument("--rounds", type=positive(int), default=2, help="the variants in turn, this many times")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            base = export(name, tmp)
            for signature in args.signatures:
                for round_index in range(args.rounds):
                    for variant in args.variants:
                        figures = measure(base, name, signature, VARIANTS[variant], args)
                        rows.append((name, signature, variant, round_index + 1, *figures))
                        print(rows[-1], flush=True)
    print(f"\n{args.clients} client processes, one single-image request in flight each, {args.warmup:g} s warm-up, "
          f"{args.duration:g} s timed per cell; variants: " + "; ".join(f"{v} = {' '.join(VARIANTS[v]) or 'no flags'}"
                                                                         for v in args.variants))
    print(
        "| model | signature | batching | round | images/s | p50 ms | p99 ms | errors |\n"
        "|---|---|---|---|---|---|---|---|"
    )
    for name, signature, variant, round_index, ips, p50, p99, errors in rows:
        print(
            f"| {name} | serving_{signature} | {variant} | {round_index} | "
            f"{ips:.1f} | {p50:.1f} | {p99:.1f} | {errors} |"
        )


if __name__ == "__main__":
    main()
