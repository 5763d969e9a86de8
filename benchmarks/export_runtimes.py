"""Inference speed of one exported model in each runtime: SavedModel, ONNX Runtime, OpenVINO, LiteRT.

Exports each network once with ``keras_preact.export.export_model`` (every format installed, one
version directory), loads each format with ``keras_preact.export.load`` and times ``predict`` on the
same uint8 batch, in rounds whose runtime order rotates, so drift of a shared machine hits every
runtime alike. Prints images/s (median over rounds) per runtime and batch size, the ratio to the
SavedModel, and the largest difference of each runtime's probabilities from the SavedModel's:

    KERAS_BACKEND=tensorflow PYTHONPATH=. python benchmarks/export_runtimes.py \
        --models cifar_resnet20:32 imagenet_resnet50:224 --batches 1 64 --rounds 3

``--int8`` adds, after each ONNX and OpenVINO runtime, its int8 model (``keras_preact.export.quantize``'s tools, as
``--quantize int8`` runs them, calibrated on 32 random images: speed, not accuracy), in the same rotating rounds; the
"vs float" column is its images/s over the float model's. The CPU's name and whether it has AVX-512 VNNI or AVX-VNNI
(int8 dot products) head the output:

    KERAS_BACKEND=torch PYTHONPATH=. python -m benchmarks run export_runtimes --out bench.jsonl -- \
        --models cifar_resnet20:32 imagenet_resnet50:224 --formats openvino onnx --int8 --batches 1 64 --rounds 5
"""

import argparse
import statistics
import tempfile
import time

import numpy as np

from benchmarks import rows
from keras_preact.export import FORMATS, check_formats, export_model, load, quantize
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


def cpu_line():
    """The CPU's model name and whether it has int8 dot products (``benchmarks.rows.machine``'s flags)."""
    found = rows.machine()
    return (f"CPU: {found['cpu']}; AVX-512 VNNI: {'yes' if 'avx512_vnni' in found['flags'] else 'no'}; "
            f"AVX-VNNI: {'yes' if 'avx_vnni' in found['flags'] else 'no'}")


def add_int8(version_dir, formats, size):
    """Each quantizable format's int8 model in ``version_dir``; the runtimes to time, each int8 after its float."""
    calibration = np.random.default_rng(1).integers(0, 256, (32, size, size, 3), dtype=np.uint8)
    runtimes = []
    for fmt in formats:
        runtimes.append(fmt)
        if fmt in quantize.QUANTIZED_FORMATS:
            quantize.QUANTIZERS[fmt](f"{version_dir}/{FORMATS[fmt].files[0]}",
                                     f"{version_dir}/{quantize.INT8_FILES[fmt][0]}", calibration)
            runtimes.append(f"{fmt}-int8")
    return runtimes


def load_runtime(version_dir, runtime):
    fmt, _, precision = runtime.partition("-")
    return load(version_dir, fmt, precision or "fp32")


def bench_model(name, size, formats, batches, rounds, min_seconds, min_calls, export_dir, int8=False):
    input_config = get_input_config(name)
    size = size or input_config.crop_size[0]
    model = create_model(name, input_shape=(size, size, 3))
    version_dir = export_model(model, export_dir, name=name.replace("_", "-"), formats=formats,
                               input_config=input_config.replace(input_size=(size, size, 3)))
    formats = add_int8(version_dir, formats, size) if int8 else formats
    runtimes = {fmt: load_runtime(version_dir, fmt) for fmt in formats}
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
            float_med = statistics.median(speeds[fmt.partition("-")[0], b])
            rows.append((f"{name} @{size}", b, fmt, med, min(speeds[fmt, b]), max(speeds[fmt, b]), med / base,
                         med / float_med, max_diff[fmt]))
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
    parser.add_argument("--int8", action="store_true", help="also time each ONNX and OpenVINO model's int8 model")
    args = parser.parse_args(argv)
    decline_usage_telemetry()
    formats = args.formats or installed_formats()
    check_formats(formats)
    if args.int8:
        quantize.check_quantization("int8", formats, ".")  # the tools installed (one line otherwise)
        print(cpu_line())
    print(f"| model | batch | runtime | img/s (median) | min | max | vs {formats[0]} | vs float | max abs diff |")
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as export_dir:
        for name, size in args.models:
            for row in bench_model(name, size, formats, args.batches, args.rounds, args.min_seconds, args.min_calls,
                                   export_dir, args.int8):
                model, batch, fmt, med, lo, hi, ratio, to_float, diff = row
                print(f"| {model} | {batch} | {fmt} | {med:,.0f} | {lo:,.0f} | {hi:,.0f} | {ratio:.2f}x | "
                      f"{to_float:.2f}x | {diff:.1e} |", flush=True)


if __name__ == "__main__":
    main()
