"""Conv2D alone, forward + backward on Keras' PyTorch backend: Keras' layer against ``keras_preact``'s.

The measurement behind ``keras_preact.layers.Conv2D``'s PyTorch fast path (``FAST_CONV``). For
pre-act ResNet-20's convolutions at batch 128 (channels_last, 3x3, stride 1 "same" and stride 2
"valid" on the pre-padded input), milliseconds per forward + backward (gradients of the input, kernel
and bias) of:

- ``keras``: ``keras.layers.Conv2D`` (Keras' ``conv``: two layout copies each way);
- ``fast``: ``keras_preact.layers.Conv2D`` (permute views; the kernel made ``channels_last``, a small copy);
- ``fast_view_kernel``: the same with the kernel as a bare permuted view.

It also counts ``aten::copy_`` calls and their self CPU time per forward + backward (torch.profiler).
Rounds alternate the candidates in one process; it prints the median and min-max ms per shape.

    KERAS_BACKEND=torch python benchmarks/conv_kernels.py
"""

import argparse
import os
import pathlib
import statistics
import sys

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.kernel_timing import alternating_rounds  # noqa: E402

# (input shape, filters, stride, padding): the convs of cifar_resnet20 (strided ones see a padded input).
CASES = (
    ((128, 32, 32, 16), 16, 1, "same"),
    ((128, 34, 34, 16), 32, 2, "valid"),
    ((128, 16, 16, 32), 32, 1, "same"),
    ((128, 18, 18, 32), 64, 2, "valid"),
    ((128, 8, 8, 64), 64, 1, "same"),
)


def candidates(shape, filters, stride, padding):
    import torch

    from keras_preact.layers import convolution

    x = torch.tensor(np.random.default_rng(0).standard_normal(shape, dtype=np.float32), requires_grad=True)
    out = {}
    for name, cls in (("keras", keras.layers.Conv2D), ("fast", convolution.Conv2D)):
        layer = cls(filters, 3, strides=stride, padding=padding, use_bias=True)
        layer.build(shape)
        out[name] = (layer, None)
    layer = convolution.Conv2D(filters, 3, strides=stride, padding=padding, use_bias=True)
    layer.build(shape)
    out["fast_view_kernel"] = (layer, "view")

    def step(layer, mode):
        def run():
            if mode == "view":
                w = layer.kernel.value.permute(3, 2, 0, 1)
                y = torch.nn.functional.conv2d(x.permute(0, 3, 1, 2), w, stride=stride,
                                               padding=1 if padding == "same" else 0)
                y = y.permute(0, 2, 3, 1) + layer.bias.value
            else:
                y = layer(x)
            torch.autograd.grad(y, [x, layer.kernel.value, layer.bias.value], torch.ones_like(y))
        return run

    return {name: step(*value) for name, value in out.items()}


def copies(fn):
    from torch.profiler import ProfilerActivity, profile

    fn()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    for event in prof.key_averages():
        if event.key == "aten::copy_":
            return event.count, event.self_cpu_time_total / 1000
    return 0, 0.0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    import torch

    print(f"torch {torch.__version__}, keras {keras.__version__}, threads {torch.get_num_threads()}")
    total = {}
    for shape, filters, stride, padding in CASES:
        fns = candidates(shape, filters, stride, padding)
        times = alternating_rounds(fns, args.rounds, args.repeats)
        print(f"{shape} -> {filters}, stride {stride}, {padding}:")
        for name, fn in fns.items():
            count, ms = copies(fn)
            med = statistics.median(times[name])
            total[name] = total.get(name, 0.0) + med
            print(f"  {name:15s} {med:7.2f} ms (min {min(times[name]):.2f}, max {max(times[name]):.2f})"
                  f"   copy_: {count} calls, {ms:.2f} ms")
    print("sum of medians: " + ", ".join(f"{k} {v:.1f} ms" for k, v in total.items()))


if __name__ == "__main__":
    main()
