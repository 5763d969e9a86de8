"""Inference speed of one exported model in each runtime: SavedModel, ONNX Runtime, OpenVINO, LiteRT.

Exports each network once with ``keras_preact.export.export_model`` (every format installed, one
version directory), loads each format with ``keras_preact.export.load`` and times ``predict`` on the
same uint8 batch, in rounds whose runtime order rotates, so drift of a shared machine hits every
runtime alike. Prints images/s (median over rounds) per runtime and batch size, the ratio to the
SavedModel, and the largest difference of each runtime's probabilities from the SavedModel's:

    KERAS_BACKEND=tensorflow PYTHONPATH=. python benchmarks/export_runtimes.py \
        --models cifar_resnet20:32 imagenet_resnet50:224 --batches 1 64 --rounds 3
"""

import argparse
import statistics
import tempfile
import time

import numpy as np

from keras_preact.export import FORMATS, check_formats, export_model, load
from keras_preact.models import create_model, get_input_config
from tests.support import decline_usage_telemetry


def parse_model(text):
    name, _, size = text.partition(":")
    return name, int(size) if size else None


def installed_formats():
    available = []
    for name in FORMATS:
        try:
            check_formats([name])
        except (ImportError, ValueError):
            continue
        available.append(name)
    return available


def images_per_second(runtime, images, min_seconds, min_calls):
    runtime.predict(images)  # warm-up: first allocation, kernel selection
    calls, start = 0, time.perf_counter()
    while calls < min_calls or time.perf_counter() - start < min_seconds:
        runtime.predict(images)
        calls += 1
    return calls * len(images) / (time.perf_counter() - start)


def bench_model(name, size, formats, batches, rounds, min_seconds, min_calls, export_dir):
    input_config = get_input_config(name)
    size = size or input_config.crop_size[0]
    model = create_model(name, input_shape=(size, size, 3))
    version_dir = export_model(model, export_dir, name=name.replace("_", "-"), formats=formats,
                               input_config=input_config.replace(input_size=(size, size, 3)))
    runtimes = {fmt: load(version_dir, fmt) for fmt in formats}
    rng = np.random.default_rng(0)
    batch_images = {b: rng.integers(0, 256, (b, size, size, 3), dtype=np.uint8) for b in batches}
    reference = runtimes[formats[0]].predict(batch_images[max(batches)])["probabilities"]
    max_diff = {fmt: float(np.max(np.abs(rt.predict(batch_images[max(batches)])["probabilities"] - reference)))
                for fmt, rt in runtimes.items()}
    speeds = {(fmt, b): [] for fmt in formats for b in batches}
    order = list(formats)
    for _ in range(rounds):
        for fmt in order:
            for b in batches:
                speeds[fmt, b].append(images_per_second(runtimes[fmt], batch_images[b], min_seconds, min_calls))
        order = order[1:] + order[:1]
    rows = []
    for b in batches:
        base = statistics.median(speeds[formats[0], b])
        for fmt in formats:
            med = statistics.median(speeds[fmt, b])
            rows.append((f"{name} @{size}", b, fmt, med, min(speeds[fmt, b]), max(speeds[fmt, b]), med / base,
                         max_diff[fmt]))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", type=parse_model, default=[("cifar_resnet20", 32)],
                        help="registered model names, each with :SIZE (default cifar_resnet20:32)")
    parser.add_argument("--formats", nargs="+", default=None,
                        help="formats to time (default: every one installed); the first is the ratio's base")
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 64])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--min-seconds", type=float, default=2.0, help="time at least this long per measurement")
    parser.add_argument("--min-calls", type=int, default=3, help="and at least this many calls")
    args = parser.parse_args(argv)
    decline_usage_telemetry()
    formats = args.formats or installed_formats()
    check_formats(formats)
    print("| model | batch | runtime | img/s (median) | min | max | vs SavedModel | max abs diff |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as export_dir:
        for name, size in args.models:
            for row in bench_model(name, size, formats, args.batches, args.rounds, args.min_seconds, args.min_calls,
                                   export_dir):
                model, batch, fmt, med, lo, hi, ratio, diff = row
                print(f"| {model} | {batch} | {fmt} | {med:,.0f} | {lo:,.0f} | {hi:,.0f} | {ratio:.2f}x | {diff:.1e} |",
                      flush=True)


if __name__ == "__main__":
    main()
