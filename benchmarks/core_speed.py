"""Core-library speed: keras_preact models next to plain hand-written Keras models.

Forward (``predict_on_batch``) and training-step (``train_on_batch``, SGD, sparse categorical
crossentropy) images/s of CIFAR and ImageNet pre-activation ResNets on the present device and the
backend named by ``KERAS_BACKEND``. Each of our models runs in the same process, on the same
in-memory random batch, interleaved (A B, B A, ...) with a plain functional Keras model of exactly
the same architecture (``benchmarks/reference_models.py``; checked: same trainable parameter count
and, with our weights copied in, the same predictions) and, for ImageNet ResNet-50/101/152,
``keras.applications`` ResNet50V2/101V2/152V2 next to our build of that same architecture
(``imagenet_resnet(depth, layout="tf_slim")``, checked: same trainable parameter count; it differs
from the paper's layout, so it is compared with that, not with ours). Warm-up calls are not timed;
the table gives median images/s over the timed repeats and the median of the per-repeat ratios
(min-max in brackets). Goal: ours >= 0.97x the plain model (the variant machinery must cost nothing).

    KERAS_BACKEND=jax python benchmarks/core_speed.py --models cifar20,cifar110 --cifar-batch-size 64
    KERAS_BACKEND=tensorflow python benchmarks/core_speed.py --tiny   # CI smoke size

TensorFlow is never imported here, so the script runs on a JAX-only machine.
"""

import argparse
import dataclasses
import gc
import importlib.metadata
import os
import re
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import reference_models  # noqa: E402
from keras_preact.models import cifar_resnet, imagenet_resnet  # noqa: E402
from tests.support import trainable_params  # noqa: E402

GOAL_RATIO = 0.97
SAME_FUNCTION_ATOL = 1e-3  # on softmax outputs; bitwise equal on CPU, GPU kernels may reorder sums
OURS, PLAIN = "ours", "plain Keras"
OURS_TF_SLIM, APPLICATIONS = "ours tf_slim", "keras.applications"


@dataclasses.dataclass(frozen=True)
class Family:
    """A model family: our builder, the plain reference, its data and keras.applications twins."""

    ours: object  # (depth, input_shape) -> keras.Model
    reference: object  # (depth, input_shape) -> keras.Model
    num_classes: int
    depths: str  # for error messages
    valid_depth: object  # depth -> bool
    applications: dict  # depth -> keras.applications builder name
    ours_like_applications: object = None  # (depth, input_shape) -> our build of that architecture


def _is_cifar_depth(depth):
    try:
        reference_models.cifar_block(depth)
    except ValueError:
        return False
    return True


FAMILIES = {
    "cifar": Family(
        ours=lambda depth, shape: cifar_resnet(depth, input_shape=shape),
        reference=lambda depth, shape: reference_models.cifar_preact_resnet(depth, input_shape=shape),
        num_classes=10,
        depths="6n+2 or 9n+2, e.g. 20, 110, 164",
        valid_depth=_is_cifar_depth,
        applications={},
    ),
    "imagenet": Family(
        ours=lambda depth, shape: imagenet_resnet(depth, input_shape=shape),
        reference=lambda depth, shape: reference_models.imagenet_preact_resnet(depth, input_shape=shape),
        num_classes=1000,
        depths=", ".join(map(str, reference_models.IMAGENET_STAGES)),
        valid_depth=lambda depth: depth in reference_models.IMAGENET_STAGES,
        applications={50: "ResNet50V2", 101: "ResNet101V2", 152: "ResNet152V2"},
        ours_like_applications=lambda depth, shape: imagenet_resnet(
            depth, layout="tf_slim", input_shape=shape
        ),
    ),
}


@dataclasses.dataclass(frozen=True)
class Preset:
    """Default sizes: ``full`` for the recorded CPU tables, ``tiny`` for the CI smoke test."""

    models: str
    cifar_batch_size: int
    cifar_size: int
    imagenet_batch_size: int
    imagenet_size: int
    repeats: int
    steps: int
    warmup: int


PRESETS = {
    "full": Preset("cifar20,cifar110,cifar164,imagenet50", 128, 32, 16, 224, 5, 3, 2),
    "tiny": Preset("cifar8,cifar11,imagenet18", 4, 16, 2, 32, 2, 1, 1),
}

# What one timed call does; each returns a host value, so the call has finished when it returns.
STEPS = {
    "forward": lambda model, images, labels: model.predict_on_batch(images),
    "train": lambda model, images, labels: model.train_on_batch(images, labels),
}
JIT_COMPILE = {"auto": "auto", "true": True, "false": False}
DTYPE_POLICIES = ("float32", "mixed_float16", "mixed_bfloat16")


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    name: str
    family: Family
    depth: int


def parse_models(text):
    specs = []
    for name in [n.strip() for n in text.split(",") if n.strip()]:
        match = re.fullmatch(r"(cifar|imagenet)(\d+)", name)
        family = FAMILIES[match.group(1)] if match else None
        if family is None or not family.valid_depth(int(match.group(2))):
            allowed = "; ".join(f"{k}<depth> with depth {f.depths}" for k, f in FAMILIES.items())
            raise argparse.ArgumentTypeError(f"invalid model {name!r}: use {allowed}")
        specs.append(ModelSpec(name, family, int(match.group(2))))
    if not specs:
        raise argparse.ArgumentTypeError("no model given")
    return specs


def positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="CI smoke sizes (preset 'tiny')")
    parser.add_argument("--models", help="comma-separated cifar<depth>/imagenet<depth> "
                        f"(default {PRESETS['full'].models})")
    parser.add_argument("--cifar-batch-size", type=positive_int)
    parser.add_argument("--cifar-size", type=positive_int, help="CIFAR input height = width")
    parser.add_argument("--imagenet-batch-size", type=positive_int)
    parser.add_argument("--imagenet-size", type=positive_int, help="ImageNet input height = width")
    parser.add_argument("--repeats", type=positive_int, help="timed samples per model and step")
    parser.add_argument("--steps", type=positive_int, help="calls per timed sample")
    parser.add_argument("--warmup", type=positive_int, help="untimed calls per model and step")
    parser.add_argument("--modes", default="forward,train",
                        help=f"comma-separated, from: {', '.join(STEPS)} (default: both)")
    parser.add_argument("--jit-compile", choices=JIT_COMPILE, default="auto",
                        help="model.compile(jit_compile=...) for every model")
    parser.add_argument("--dtype-policy", choices=DTYPE_POLICIES, default="float32")
    parser.add_argument("--no-applications", action="store_true",
                        help="skip the keras.applications ResNetV2 comparison")
    args = parser.parse_args(argv)
    preset = PRESETS["tiny" if args.tiny else "full"]
    for field in dataclasses.fields(Preset):
        if getattr(args, field.name) is None:
            setattr(args, field.name, getattr(preset, field.name))
    try:
        args.models = parse_models(args.models)
    except argparse.ArgumentTypeError as e:
        parser.error(f"argument --models: {e}")
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in args.modes if m not in STEPS] or ([] if args.modes else ["(none)"])
    if bad:
        parser.error(f"argument --modes: invalid {', '.join(bad)}; choose from {', '.join(STEPS)}")
    for spec in args.models:
        size, minimum = (
            (args.cifar_size, 4) if spec.family is FAMILIES["cifar"] else (args.imagenet_size, 32)
        )
        if size < minimum:
            parser.error(f"argument --{spec.name.rstrip('0123456789')}-size: {size} is below "
                         f"{minimum}, the total stride of {spec.name}")
    return args


def check_same_params(spec, ours, other, what):
    if trainable_params(ours) != trainable_params(other):
        raise RuntimeError(
            f"{spec.name}: {what} has {trainable_params(other):,} trainable parameters, ours "
            f"{trainable_params(ours):,}: not the same architecture, the comparison is void."
        )


def build_contenders(spec, input_shape, with_applications):
    """{label: model}: ours, the plain reference with our weights and, where keras.applications
    has the depth, our tf_slim-layout build next to keras.applications'."""
    ours = spec.family.ours(spec.depth, input_shape)
    plain = spec.family.reference(spec.depth, input_shape)
    check_same_params(spec, ours, plain, "the plain reference")
    reference_models.copy_weights_by_path(ours, plain)
    contenders = {OURS: ours, PLAIN: plain}
    app = spec.family.applications.get(spec.depth)
    if with_applications and app:
        ours_tf_slim = spec.family.ours_like_applications(spec.depth, input_shape)
        applications = getattr(keras.applications, app)(
            weights=None, input_shape=input_shape, classes=spec.family.num_classes
        )
        check_same_params(spec, ours_tf_slim, applications, f"keras.applications {app}")
        contenders.update({OURS_TF_SLIM: ours_tf_slim, APPLICATIONS: applications})
    return contenders


def compile_all(contenders, jit_compile):
    for model in contenders.values():
        model.compile(
            optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
            loss="sparse_categorical_crossentropy",
            jit_compile=jit_compile,
        )


def time_interleaved(contenders, step, images, labels, *, warmup, repeats, steps):
    """{label: [images/s per repeat]}; warm-up calls excluded. Models are interleaved and the
    order rotates every repeat (A B, B A, ...) so drift and position in the round cancel."""
    for model in contenders.values():
        for _ in range(warmup):
            step(model, images, labels)
    rates = {label: [] for label in contenders}
    order = list(contenders)
    for repeat in range(repeats):
        shift = repeat % len(order)
        for label in order[shift:] + order[:shift]:
            model = contenders[label]
            start = time.perf_counter()
            for _ in range(steps):
                step(model, images, labels)
            rates[label].append(len(images) * steps / (time.perf_counter() - start))
    return rates


def ratio_summary(ours, other):
    """Median of the per-repeat ratios (paired samples cancel drift), with min-max."""
    ratios = [a / b for a, b in zip(ours, other)]
    return f"{statistics.median(ratios):.3f} ({min(ratios):.2f}-{max(ratios):.2f})"


def benchmark_model(spec, args):
    """Table rows (one per step mode) and a facts row for one model."""
    cifar = spec.family is FAMILIES["cifar"]
    size = args.cifar_size if cifar else args.imagenet_size
    batch = args.cifar_batch_size if cifar else args.imagenet_batch_size
    input_shape = (size, size, 3)
    contenders = build_contenders(spec, input_shape, not args.no_applications)
    compile_all(contenders, JIT_COMPILE[args.jit_compile])

    rng = np.random.default_rng(0)
    images = rng.normal(size=(batch, *input_shape)).astype("float32")
    labels = rng.integers(0, spec.family.num_classes, size=(batch,)).astype("int32")
    # Same function check (also the first forward warm-up): our weights are in the reference.
    same = np.abs(contenders[OURS].predict_on_batch(images) - contenders[PLAIN].predict_on_batch(images)).max()
    if not same <= SAME_FUNCTION_ATOL:
        raise RuntimeError(f"{spec.name}: the plain reference's predictions differ from ours by {same}.")
    facts = {
        "model": spec.name,
        "params": {label: trainable_params(m) for label, m in contenders.items()},
        "max_diff": float(same),
        "jit_compile": contenders[OURS].jit_compile,
    }
    rows = []
    for mode in args.modes:
        rates = time_interleaved(
            contenders, STEPS[mode], images, labels,
            warmup=args.warmup, repeats=args.repeats, steps=args.steps,
        )
        rows.append({"model": spec.name, "input": f"{size}x{size}", "batch": batch, "step": mode,
                     "rates": rates})
        print(f"  {spec.name} {mode}: " + ", ".join(
            f"{label} {statistics.median(r):.1f} img/s" for label, r in rates.items()), file=sys.stderr)
    del contenders
    keras.utils.clear_session()
    gc.collect()
    return rows, facts


def environment_line(args):
    backend = keras.backend.backend()
    versions = [f"keras {keras.__version__}"]
    for package in {"tensorflow": ["tensorflow"], "jax": ["jax", "jaxlib"], "torch": ["torch"]}.get(backend, []):
        versions.append(f"{package} {importlib.metadata.version(package)}")
    devices = keras.distribution.list_devices()
    return (
        f"backend **{backend}** ({', '.join(versions)}); devices {', '.join(devices)}; "
        f"{os.cpu_count()} CPU cores visible; dtype policy {args.dtype_policy}; jit_compile={args.jit_compile}; "
        f"{args.warmup} warm-up call(s), then {args.repeats} interleaved repeats (order rotating) "
        f"x {args.steps} call(s); "
        "SGD(momentum 0.9), sparse categorical crossentropy, random in-memory data"
    )


# Table columns after model/input/batch/step: (header, cell for a row's {label: rates}).
def _median(label):
    return lambda rates: f"{statistics.median(rates[label]):.1f}" if label in rates else "-"


def _ratio(label, other):
    return lambda rates: ratio_summary(rates[label], rates[other]) if other in rates else "-"


COLUMNS = (
    ("ours img/s", _median(OURS)),
    ("plain Keras img/s", _median(PLAIN)),
    ("ours / plain", _ratio(OURS, PLAIN)),
    ("ours tf_slim layout img/s", _median(OURS_TF_SLIM)),
    ("keras.applications ResNetV2 img/s", _median(APPLICATIONS)),
    ("ours tf_slim / applications", _ratio(OURS_TF_SLIM, APPLICATIONS)),
)


def markdown(rows, facts):
    with_apps = any(APPLICATIONS in row["rates"] for row in rows)
    columns = COLUMNS if with_apps else COLUMNS[:3]
    header = ["model", "input", "batch", "step"] + [title for title, _ in columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [row["model"], row["input"], str(row["batch"]), row["step"]]
        lines.append("| " + " | ".join(cells + [cell(row["rates"]) for _, cell in columns]) + " |")
    lines += ["", "| model | trainable params: ours / plain (/ ours tf_slim / keras.applications) | "
              "max abs diff of predictions, ours vs plain (same weights) | jit_compile |",
              "|---|---|---|---|"]
    for f in facts:
        params = " / ".join(f"{n:,}" for n in f["params"].values())
        lines.append(f"| {f['model']} | {params} | {f['max_diff']:.1e} | {f['jit_compile']} |")
    return "\n".join(lines)


def below_goal(rows):
    return [
        f"{row['model']} {row['step']}"
        for row in rows
        if statistics.median([a / b for a, b in zip(row["rates"][OURS], row["rates"][PLAIN])]) < GOAL_RATIO
    ]


def main(argv=None):
    args = parse_args(argv)
    keras.config.set_dtype_policy(args.dtype_policy)
    rows, facts = [], []
    for spec in args.models:
        model_rows, model_facts = benchmark_model(spec, args)
        rows += model_rows
        facts.append(model_facts)
    print(environment_line(args))
    print()
    print(markdown(rows, facts))
    slow = below_goal(rows)
    print()
    print(f"goal ours >= {GOAL_RATIO}x plain: " + ("met everywhere" if not slow else "MISSED for " + ", ".join(slow)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
