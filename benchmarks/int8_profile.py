"""Where an int8 model's time goes: per-operation profiles of the float and int8 models in ONNX Runtime and OpenVINO.

The question it answers is why int8 is not 2x its float model on some (model, batch) pairs of the export table
(BENCHMARKS.md, "int8 against float"). Exports the network once as ``export_runtimes.py --int8`` does (random
weights, calibrated on 32 random images), then, for each runtime model and batch, runs ``--calls`` inferences with
the runtime's own profiler on, as ``keras_preact.export.load`` configures the session:

- OpenVINO: ``compile_model(..., {"PERF_COUNT": True})`` and ``InferRequest.profiling_info`` (each executed node's
  time and its kernel, ``exec_type``, e.g. ``jit_avx512_amx_I8`` or ``brgconv_avx512_FP32``);
- ONNX Runtime: ``SessionOptions.enable_profiling`` (a Chrome-trace JSON, one event per node run).

Prints, per (runtime, batch): milliseconds per call measured around the call, the sum of the profiled node times,
and that sum split by kind (``KINDS``: convolutions, (de)quantization, layout transposes, the batch-norm affine
that a pre-activation network keeps before each ReLU, the rest) and by kernel, so the share of the time the integer
units can shorten is read off directly; then a markdown table, a row per (runtime, batch): ms per call, each kind,
and the time outside the profiled nodes:

    KERAS_BACKEND=torch PYTHONPATH=. python benchmarks/int8_profile.py --model cifar_resnet20:32 --batches 1 64
"""

import argparse
import collections
import json
import os
import tempfile
import time

import numpy as np

from benchmarks.export_runtimes import add_int8, cpu_line, parse_model
from keras_preact.export import FORMATS, export_model, quantize
from keras_preact.models import create_model, get_input_config
from tests.support import decline_usage_telemetry

# Node types by kind, as the runtimes name them (substrings of the lower-cased type; the first kind that matches).
KINDS = {
    "conv": ("conv", "matmul", "gemm", "fullyconnected"),
    "(de)quantize": ("quantize", "convert"),  # QuantizeLinear, DequantizeLinear, FakeQuantize, Convert
    "transpose": ("transpose", "reorder"),  # layout changes
    "BN affine": ("batchnormalization", "powerstatic", "multiply", "muladd"),  # the pre-activation BN's scale/shift
}


def kind_of(op_type):
    """The ``KINDS`` key of a node type, or ``"other"`` (additions, ReLU, pooling, slices, ...)."""
    name = op_type.lower()
    return next((kind for kind, words in KINDS.items() if any(word in name for word in words)), "other")


def profile_openvino(xml_path, images, calls):
    """(ms per call around the call, {(node type, kernel): ms per call} summed over the executed nodes)."""
    import openvino as ov

    compiled = ov.Core().compile_model(xml_path, "CPU", {"INFERENCE_PRECISION_HINT": "f32", "ENABLE_MMAP": False,
                                                         "PERF_COUNT": True})
    request = compiled.create_infer_request()
    request.infer({0: images})  # warm-up
    nodes = collections.Counter()
    start = time.perf_counter()
    for _ in range(calls):
        request.infer({0: images})
        for info in request.profiling_info:
            if info.status == info.Status.EXECUTED:
                nodes[info.node_type, info.exec_type] += info.real_time.total_seconds() * 1000 / calls
    return (time.perf_counter() - start) * 1000 / calls, nodes


def profile_onnx(onnx_path, images, calls):
    """As ``profile_openvino``, from ONNX Runtime's own profile (node events, keyed by op type and provider)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "ort")
    session = ort.InferenceSession(onnx_path, options, providers=["CPUExecutionProvider"])
    feed = {session.get_inputs()[0].name: images}
    session.run(None, feed)  # warm-up
    start = time.perf_counter()
    for _ in range(calls):
        session.run(None, feed)
    per_call = (time.perf_counter() - start) * 1000 / calls
    with open(session.end_profiling()) as f:
        events = json.load(f)
    nodes = collections.Counter()
    runs = sum(1 for e in events if e.get("name") == "model_run")
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            args = event.get("args", {})
            nodes[args.get("op_name", "?"), args.get("provider", "?")] += event["dur"] / 1000 / runs
    return per_call, nodes


def report(cells, per_call, nodes, top):
    """Prints the profile's kinds and its ``top`` kernels; returns its markdown row (``cells``, then the times)."""
    total = sum(nodes.values())
    kinds = collections.Counter()
    for (op_type, _), ms in nodes.items():
        kinds[kind_of(op_type)] += ms
    split = ", ".join(f"{kind} {ms:.3f} ms ({ms / total:.0%})" for kind, ms in kinds.most_common())
    print(f"\n## {', '.join(cells)}: {per_call:.3f} ms per call, profiled nodes {total:.3f} ms "
          f"({total / per_call:.0%}); {split}")
    for (op_type, kernel), ms in nodes.most_common(top):
        print(f"  {ms:8.3f} ms  {ms / total:5.1%}  {op_type} [{kernel}]")
    times = [per_call, *(kinds[k] for k in (*KINDS, "other")), per_call - total]
    return "| " + " | ".join([*cells, *(f"{t:.3f}" for t in times)]) + " |"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=parse_model, default=("cifar_resnet20", 32),
                        help="a registered model name with :SIZE (default cifar_resnet20:32)")
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 64])
    parser.add_argument("--calls", type=int, default=200,
                        help="profiled images per (runtime, batch): calls of a batch of B images take CALLS / B")
    parser.add_argument("--min-calls", type=int, default=10, help="and at least this many calls")
    parser.add_argument("--top", type=int, default=8, help="kernels listed per profile")
    args = parser.parse_args(argv)
    decline_usage_telemetry()
    quantize.check_quantization("int8", ("onnx", "openvino"), ".")
    print(cpu_line())
    name, size = args.model
    input_config = get_input_config(name)
    size = size or input_config.crop_size[0]
    with tempfile.TemporaryDirectory() as export_dir:
        model = create_model(name, input_shape=(size, size, 3))
        version_dir = export_model(model, export_dir, name=name.replace("_", "-"), formats=("onnx", "openvino"),
                                   input_config=input_config.replace(input_size=(size, size, 3)))
        add_int8(version_dir, ("onnx", "openvino"), size)
        paths = {"onnx": FORMATS["onnx"].files[0], "onnx-int8": quantize.INT8_FILES["onnx"][0],
                 "openvino": FORMATS["openvino"].files[0], "openvino-int8": quantize.INT8_FILES["openvino"][0]}
        rng = np.random.default_rng(0)
        rows = []
        for batch in args.batches:
            images = rng.integers(0, 256, (batch, size, size, 3), dtype=np.uint8)
            for runtime, path in paths.items():
                profile = profile_onnx if runtime.startswith("onnx") else profile_openvino
                per_call, nodes = profile(f"{version_dir}/{path}", images, max(args.min_calls, args.calls // batch))
                rows.append(report([f"{name} @{size}", str(batch), runtime], per_call, nodes, args.top))
    print("\n| model | batch | runtime | ms per call | " + " | ".join((*KINDS, "other")) + " | outside |")
    print("|---" * (len(KINDS) + 6) + "|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
