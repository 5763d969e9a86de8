"""Where one training step's time goes: pre-act ResNet-20, batch 128, the step ``keras-preact-train`` runs.

For every backend: milliseconds per compiled forward pass (``predict_on_batch``, inference mode), per
``train_on_batch`` step (forward in training mode, backward, TorchSGD update, metrics), and their
difference. On PyTorch also the ATen operator table of
``torch.profiler`` for our step and for the plain PyTorch reference's step
(``benchmarks/reference_torch_cifar.py``) side by side: both run the same oneDNN convolutions, so the
table shows what Keras adds (layout copies, unfused batch-norm arithmetic, per-op dispatch).

    KERAS_BACKEND=torch python benchmarks/profile_train_step.py --steps 5
    KERAS_BACKEND=torch python benchmarks/profile_train_step.py --steps 5 --normalization keras  # Keras' own layer
    KERAS_BACKEND=torch python benchmarks/profile_train_step.py --steps 5 --convolution keras  # Keras' Conv2D
"""

import argparse
import collections
import pathlib
import sys
import time

import keras
import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from keras_preact_training.recipe import configs, schedules  # noqa: E402
from keras_preact_training.recipe import model as model_lib  # noqa: E402

BATCH = 128
NORMALIZATIONS = ("fused", "keras")


def use_normalization(kind):
    """Models built from now on get, as ``normalization="batch"``, the library's ``BatchNormalization``
    (``"fused"``: the backend's fused training kernel, the default) or Keras' own (``"keras"``: the
    library before the fused layers)."""
    from keras_preact.layers import BatchNormalization, options

    layer = {"fused": BatchNormalization, "keras": keras.layers.BatchNormalization}[kind]
    options.NORMALIZATIONS["batch"] = lambda axis, epsilon, momentum, groups, **kw: layer(
        axis=axis, epsilon=epsilon, momentum=momentum, **kw)


def use_convolution(kind):
    """Models built from now on get the library's ``Conv2D`` (``"fast"``: no layout copies on PyTorch, the
    default) or Keras' own (``"keras"``: the library before it) wherever the builders make a conv."""
    from keras_preact.layers import convolution, residual_unit, unit_config
    from keras_preact.models import backbone

    layer = {"fast": convolution.Conv2D, "keras": keras.layers.Conv2D}[kind]
    for module in (residual_unit, unit_config, backbone):
        module.Conv2D = layer


def build_step_model(normalization="fused", convolution="fast"):
    """The compiled model of ``keras-preact-train``'s short CIFAR preset and one random batch."""
    use_normalization(normalization)
    use_convolution(convolution)
    config = configs.get_config("cifar10-folder-resnet20-short", data_dir="unused")
    resolved = schedules.resolve(config, 50000)
    _, model = model_lib.build_model(config, 10, resolved, pipeline="numpy")  # float input, as tf_data
    use_normalization("fused")
    use_convolution("fast")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH, 32, 32, 3)).astype("float32")
    y = rng.integers(0, 10, BATCH)
    return model, x, y


def keras_step(steps, normalization="fused", convolution="fast"):
    model, x, y = build_step_model(normalization, convolution)
    for _ in range(3):
        model.train_on_batch(x, y)
        model.predict_on_batch(x)
    timings = {}
    for name, fn in (("forward (predict_on_batch)", lambda: model.predict_on_batch(x)),
                     ("train step", lambda: model.train_on_batch(x, y))):
        start = time.perf_counter()
        for _ in range(steps):
            fn()
        timings[name] = 1000 * (time.perf_counter() - start) / steps
    return model, x, y, timings


def aten_table(run, steps):
    """{op: ms per step} of ``run()`` under torch.profiler (self CPU time)."""
    import torch

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            run()
    table = collections.Counter()
    for event in prof.key_averages():
        if event.key.startswith("aten::"):
            table[event.key] += event.self_cpu_time_total / 1000 / steps
    return table


def reference_step():
    import torch
    import torch.nn.functional as F

    from benchmarks import reference_torch_cifar as ref

    device = ref.resolve_device("auto")  # the GPU where PyTorch sees one, as Keras' PyTorch backend
    model = ref.PreActResNet(20, 10).to(device, memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4)
    rng = np.random.default_rng(0)
    x = ref.normalize(rng.integers(0, 256, (BATCH, 32, 32, 3), dtype=np.uint8), True).to(device)
    y = torch.from_numpy(rng.integers(0, 10, BATCH)).to(device)

    def step():
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.item()

    for _ in range(3):
        step()
    return step


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--rows", type=int, default=14, help="operators listed (PyTorch)")
    p.add_argument(
        "--normalization",
        choices=NORMALIZATIONS,
        default="fused",
        help="normalization='batch' as the library's BatchNormalization or Keras' own "
        "(the library before the fused layers)",
    )
    p.add_argument("--convolution", choices=("fast", "keras"), default="fast",
                   help="Conv2D as the library's (no layout copies on PyTorch) or Keras' own (before it)")
    args = p.parse_args(argv)
    backend = keras.backend.backend()
    model, x, y, timings = keras_step(args.steps, args.normalization, args.convolution)
    print(f"backend {backend}, keras {keras.__version__}, batch {BATCH}, {args.steps} steps after 3 warm-up steps, "
          f"{args.normalization} batch normalization, {args.convolution} Conv2D")
    for name, ms in timings.items():
        print(f"  {name:<28} {ms:8.1f} ms  ({BATCH / ms * 1000:7.1f} img/s)")
    print(f"  {'the rest of the step':<28} {timings['train step'] - timings['forward (predict_on_batch)']:8.1f} ms")
    if backend != "torch":
        return
    ours = aten_table(lambda: model.train_on_batch(x, y), args.steps)
    theirs = aten_table(reference_step(), args.steps)
    print("\nATen operators, self CPU ms per step (ours = Keras on PyTorch; reference = plain PyTorch):\n")
    print("| operator | ours | reference |")
    print("|---|---|---|")
    for op, ms in sorted(ours.items(), key=lambda kv: -max(kv[1], theirs.get(kv[0], 0)))[: args.rows]:
        print(f"| {op} | {ms:.1f} | {theirs.get(op, 0.0):.1f} |")
    for op in sorted(set(theirs) - set(ours), key=lambda k: -theirs[k])[:4]:
        print(f"| {op} | 0.0 | {theirs[op]:.1f} |")
    print(f"| all ATen operators | {sum(ours.values()):.1f} | {sum(theirs.values()):.1f} |")


if __name__ == "__main__":
    main()
