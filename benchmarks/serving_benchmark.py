"""Inference throughput and latency: SavedModel in-process, through the REST server, model.predict.

Prints one table, ours (pre-activation ResNet) next to keras.applications ResNet50V2 (weights=None)
exported the same way, at batch 1 and 64:

    KERAS_BACKEND=tensorflow PYTHONPATH=. python benchmarks/serving_benchmark.py \
        --models cifar_resnet20 resnet50v2 --image-size 32 --batches 1 64 --requests 20

``--image-size 224 --models imagenet_resnet50 resnet50v2`` gives the ImageNet-size comparison.
"""

import argparse
import http.client
import json
import tempfile
import threading
import time

import keras
import numpy as np
import tensorflow as tf

from keras_preact.export import export_saved_model
from keras_preact.models import cifar_resnet, imagenet_resnet
from keras_preact_serving.server import make_server

MODELS = {
    "cifar_resnet20": lambda size: cifar_resnet(20, 10, input_shape=(size, size, 3)),
    "imagenet_resnet50": lambda size: imagenet_resnet(50, 1000, input_shape=(size, size, 3)),
    "resnet50v2": lambda size: keras.applications.ResNet50V2(weights=None, input_shape=(size, size, 3)),
}


def measure(fn, batch, repeats):
    fn()  # warm-up (tracing, first allocation)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    times = np.array(times)
    p50, p99 = np.percentile(times * 1e3, [50, 99])
    return batch * repeats / times.sum(), p50, p99


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["cifar_resnet20", "resnet50v2"], choices=sorted(MODELS))
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--requests", type=int, default=20, help="timed calls per cell")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            model = MODELS[name](args.image_size)
            path = export_saved_model(model, tmp, name=name, mean=[127.5] * 3, std=[127.5] * 3)
            serve = tf.saved_model.load(str(path)).signatures["serving_default"]
            server = make_server(path.parent, port=0, max_request_instances=max(args.batches))
            threading.Thread(target=server.serve_forever, daemon=True).start()
            conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=600)
            for batch in args.batches:
                images = np.random.default_rng(0).integers(
                    0, 256, (batch, args.image_size, args.image_size, 3), np.uint8
                )
                body = json.dumps({"instances": images.tolist()}).encode()
                normalized = images.astype(np.float32) / 127.5 - 1.0

                def rest(conn=conn, name=name, body=body):
                    conn.request("POST", f"/v1/models/{name}:predict", body=body)
                    response = conn.getresponse()
                    assert response.status == 200, response.read()
                    response.read()

                cells = {
                    "SavedModel in-process": lambda serve=serve, images=images: serve(images=tf.constant(images)),
                    "REST server (JSON uint8)": rest,
                    "model.predict": lambda model=model, x=normalized, b=batch: model.predict(
                        x, batch_size=b, verbose=0
                    ),
                }
                for mode, fn in cells.items():
                    rows.append((name, mode, batch, *measure(fn, batch, args.requests)))
            conn.close()
            server.shutdown()
            server.server_close()
    print(f"\nimage size {args.image_size}, {args.requests} timed calls per cell, backend {keras.backend.backend()}")
    print("| model | path | batch | images/s | p50 ms | p99 ms |\n|---|---|---|---|---|---|")
    for name, mode, batch, ips, p50, p99 in rows:
        print(f"| {name} | {mode} | {batch} | {ips:.1f} | {p50:.1f} | {p99:.1f} |")


if __name__ == "__main__":
    main()
