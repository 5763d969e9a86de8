"""Run configuration: the ``Config`` dataclass and ``PRESETS``, one entry per experiment of the paper.

``get_config(preset_name, **overrides)`` returns a validated ``Config``; every field can be overridden
(``epochs``, ``steps``, ``batch_size``, ``depth``, ``subset``, ``dataset``, ...) for scaled-down runs.

Schedule rule (paper "Training recipe"): a preset gives its schedule in iterations at
``reference_batch_size`` (128 for CIFAR: warm-up at 0.01 for 400 iterations, lr 0.1, /10 at 32k and
48k, stop at 64k). At another batch size B the number of iterations scales by
``reference_batch_size / B`` (same number of epochs; the learning rate stays, as in the paper's batch-64
run of Table 4, unless ``lr_scaling="linear"``, which multiplies it by B / reference_batch_size).
The warm-up and the decay boundaries are fixed fractions of the total, so ``--steps`` or ``--epochs``
shrink the whole schedule proportionally. The run stops at the exact iteration (the last epoch may be
partial), as the paper's 64k.

Optimizer (``training.optimizers.TorchSGD``): the official trainer's ``optim.sgd`` step for step:
momentum 0.9, Nesterov, dampening 0, coupled weight decay 1e-4 (gradient += wd * x, before momentum)
on every parameter (``weight_decay_scope="all"``, as ``model:getParameters()``; ``"kernels"`` limits it
to conv/dense kernels). Keras' ``SGD`` is not used: its velocity holds lr-scaled steps (it parts from
Torch's whenever the lr changes) and its ``weight_decay`` is decoupled. Each recipe choice and its
source: REPRODUCTION.md, "Recipe choices".
"""

import dataclasses
import math

from keras_preact.layers.options import check_choice

# Per-channel normalization in 0-255 pixel units: the model consumes (pixels - mean) / std.
TRAIN_SIZES = {"cifar10": 50000, "cifar100": 50000, "imagenet2012": 1281167}  # for --dry-run
NORMALIZATIONS = {
    # fb.resnet.torch (datasets/cifar10.lua) per-channel statistics.
    "cifar10": ((125.3, 123.0, 113.9), (63.0, 62.1, 66.7)),
    "cifar100": ((129.3, 124.1, 112.4), (68.2, 65.4, 70.4)),
    # fb.resnet.torch (datasets/imagenet.lua), 0-1 values times 255.
    "imagenet": ((123.675, 116.28, 103.53), (58.395, 57.12, 57.375)),
    # (x - 127.5) / 63.75: for synthetic data.
    "centered": ((127.5, 127.5, 127.5), (63.75, 63.75, 63.75)),
}
# The paper's "per-pixel mean subtracted": the mean training image, std 1 (training.pipelines.pixel_stats).
PIXEL_MEAN = "pixel_mean"
ARCHITECTURES = ("cifar", "imagenet")
AUGMENTATIONS = ("cifar", "imagenet", "imagenet_aspect", "none")
SCHEDULES = ("piecewise", "cosine")
LR_SCALINGS = ("none", "linear")
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
DISTRIBUTIONS = ("none", "mirrored", "multiworker", "data-parallel")
PIPELINES = ("auto", "tf_data", "device", "numpy")
WEIGHT_DECAY_SCOPES = ("all", "kernels")
INT32_MAX = 2**31 - 1


@dataclasses.dataclass(frozen=True)
class Config:
    """Everything needed to (re-)run one training run; ``dataclasses.asdict`` goes to config.json."""

    name: str
    paper: str = ""  # which table / figure of the paper this run reproduces
    # --- model (keras_preact.models)
    architecture: str = "cifar"
    depth: int = 20
    unit_options: dict = dataclasses.field(default_factory=dict)
    drop_path_rate: float = 0.0
    # --- data
    dataset: str = "synthetic"  # a TFDS name, "folder" or "synthetic"
    data_dir: str | None = None
    manual_dir: str | None = None
    cache_dir: str | None = None
    image_size: tuple = (32, 32)
    eval_image_size: tuple | None = None  # ImageNet: test crop (224 or 320); default image_size
    subset: int | None = None  # use the first N training examples
    synthetic_train_size: int = 4096
    synthetic_test_size: int = 1024
    synthetic_num_classes: int = 10
    augmentation: str = "cifar"
    normalization: str = "cifar10"
    pipeline: str = "auto"
    # --- optimization (paper "Training recipe")
    batch_size: int = 128
    reference_batch_size: int = 128
    total_steps: int = 64000  # iterations at reference_batch_size
    warmup_steps: int = 400
    boundaries: tuple = (32000, 48000)
    schedule: str = "piecewise"
    base_lr: float = 0.1
    warmup_lr: float = 0.01
    lr_decay: float = 0.1
    lr_scaling: str = "none"
    momentum: float = 0.9
    nesterov: bool = True  # fb.resnet.torch train.lua: nesterov = true, dampening = 0
    weight_decay: float = 1e-4  # coupled, as optim.sgd: gradient += wd * x (training.optimizers)
    weight_decay_scope: str = "all"  # "all" (every parameter: the official code's) or "kernels"
    # --- run length overrides (None: from the schedule)
    steps: int | None = None
    epochs: int | None = None
    steps_per_epoch: int | None = None
    # --- execution
    seed: int = 0
    deterministic: bool = True
    precision: str = "float32"
    jit_compile: str = "auto"  # "auto", "true", "false"
    steps_per_execution: int = 1  # training steps per compiled call (Keras compile argument)
    distribute: str = "none"
    checkpoint_every: int = 50  # steps between BackupAndRestore backups
    health_every: int = 0  # steps between TrainingHealthCallback measurements; 0: off
    run_dir: str | None = None
    runs_root: str = "runs"
    export: bool = False
    export_dir: str = "saved_models"
    skip_bad_images: bool = False  # folder data: skip unreadable image files (and report them) instead of failing
    verbose: str = "auto"  # Keras fit verbosity: "auto", 0, 1, 2

    def replace(self, **overrides):
        return dataclasses.replace(self, **overrides)


def _cifar(name, paper, depth, dataset="cifar10", **fields):
    # The paper's text: "per-pixel mean subtracted" (fb.resnet.torch: per-channel mean/std).
    fields.setdefault("normalization", PIXEL_MEAN)
    return Config(name=name, paper=paper, depth=depth, dataset=dataset, **fields)


def _imagenet(name, paper, depth, **fields):
    # ImageNet recipe: batch 256, lr 0.1 /10 at epochs 30 and 60, 90 epochs (fb.resnet.torch), no
    # warm-up; 1,281,167 training images -> 5004 full batches per epoch (fb.resnet.torch's loader also
    # runs the last, partial batch: 5005).
    per_epoch = TRAIN_SIZES["imagenet2012"] // 256
    defaults = dict(
        architecture="imagenet",
        dataset="imagenet2012",
        image_size=(224, 224),
        eval_image_size=(320, 320),
        augmentation="imagenet",
        normalization="imagenet",
        batch_size=256,
        reference_batch_size=256,
        total_steps=90 * per_epoch,
        warmup_steps=0,
        boundaries=(30 * per_epoch, 60 * per_epoch),
    )
    defaults.update(fields)
    return Config(name=name, paper=paper, depth=depth, **defaults)


def _build_presets():
    presets = {}

    def add(config):
        presets[config.name] = config

    # The default run: a ResNet-8 (6n+2, n=1) on the built-in synthetic set, a few minutes on CPU.
    add(
        Config(
            name="synthetic-resnet8",
            paper="demo (no paper experiment): the whole product on an offline CPU",
            depth=8,
            dataset="synthetic",
            normalization="centered",
            batch_size=64,
            reference_batch_size=64,
            total_steps=320,
            warmup_steps=10,
            boundaries=(200, 280),
            epochs=5,
            export=True,
        )
    )

    # Table 1: shortcut variants on the original ResNet-110 (f = ReLU after the addition).
    t1 = "Table 1, Fig. 2"
    table1 = {
        "original": {},
        "constant-scaling-0-1": dict(shortcut="constant_scaling", shortcut_scale=0.0, residual_scale=1.0),
        "constant-scaling-0.5-1": dict(shortcut="constant_scaling", shortcut_scale=0.5, residual_scale=1.0),
        "constant-scaling-0.5-0.5": dict(shortcut="constant_scaling", shortcut_scale=0.5, residual_scale=0.5),
        **{
            f"exclusive-gating-bg{b}": dict(shortcut="exclusive_gating", gate_bias_init=float(b))
            for b in (0, -1, -2, -3, -4, -5, -6, -7)
        },
        **{
            f"shortcut-only-gating-bg{b}": dict(shortcut="shortcut_only_gating", gate_bias_init=float(b))
            for b in (0, -6)
        },
        "conv1x1": dict(shortcut="conv1x1"),
        "dropout": dict(shortcut="dropout", shortcut_dropout_rate=0.5),
    }
    for variant, options in table1.items():
        add(_cifar(f"t1-resnet110-{variant}", t1, 110, unit_options={"ordering": "original", **options}))

    # Table 2: five activation placements x ResNet-110 / ResNet-164 on CIFAR-10.
    for ordering in ("original", "bn_after_addition", "relu_before_addition", "relu_only_preact", "full_preact"):
        for depth in (110, 164):
            add(
                _cifar(
                    f"t2-resnet{depth}-{ordering.replace('_', '-')}",
                    "Table 2, Fig. 4",
                    depth,
                    unit_options={"ordering": ordering},
                )
            )

    # Tables 3 and 4: original vs pre-activation, CIFAR-10/100, ResNet-110/164/1001, batch 128 and 64.
    for dataset in ("cifar10", "cifar100"):
        for depth in (110, 164, 1001):
            if dataset == "cifar100" and depth == 110:
                continue
            for ordering, label in (("original", "original"), ("full_preact", "preact")):
                add(
                    _cifar(
                        f"t3-{dataset}-resnet{depth}-{label}",
                        "Table 3",
                        depth,
                        dataset,
                        unit_options={"ordering": ordering},
                    )
                )
    # Table 3's "ResNet-110 (1-layer skip)": 108 units of a single 3x3 conv (model "cifar_resnet110_1layer").
    for ordering, label in (("original", "original"), ("full_preact", "preact")):
        add(_cifar(f"t3-cifar10-resnet110-1layer-{label}", "Table 3 (1-layer skip)", 110,
                   unit_options={"block": "one_layer", "ordering": ordering}))
    add(
        _cifar(
            "t4-cifar10-resnet1001-preact-batch64",
            "Table 4 (mini-batch 64)",
            1001,
            batch_size=64,
            unit_options={"ordering": "full_preact"},
        )
    )

    # Table 5: ImageNet, train crop 224, test crop 320 (and 224 for the first row).
    add(_imagenet("t5-resnet152-original-test224", "Table 5", 152, eval_image_size=(224, 224),
                  unit_options={"ordering": "original"}))
    for depth in (152, 200):
        for ordering, label in (("original", "original"), ("full_preact", "preact")):
            add(_imagenet(f"t5-resnet{depth}-{label}", "Table 5", depth, unit_options={"ordering": ordering}))
    add(_imagenet("t5-resnet200-preact-aspect-aug", "Table 5 (scale + aspect-ratio augmentation)", 200,
                  augmentation="imagenet_aspect", unit_options={"ordering": "full_preact"}))
    add(_imagenet("sec4.1-resnet101-bn-after-addition", "Sec. 4.1 (ImageNet, BN after addition)", 101,
                  eval_image_size=(224, 224), unit_options={"ordering": "bn_after_addition"}))
    add(_imagenet("sec4.1-resnet101-original", "Sec. 4.1 (ImageNet, original)", 101,
                  eval_image_size=(224, 224), unit_options={"ordering": "original"}))

    # Section 7 benchmark: pre-activation ResNet-20 on the CIFAR-10 JPEG folder, short cosine schedule.
    add(
        _cifar(
            "cifar10-folder-resnet20-short",
            "benchmark: short schedule (15 epochs, cosine) on the CIFAR-10 JPEG folder",
            20,
            dataset="folder",
            epochs=15,
            schedule="cosine",
            warmup_steps=400,
            total_steps=64000,
            unit_options={"ordering": "full_preact"},
            normalization="cifar10",
        )
    )
    return presets


PRESETS = _build_presets()
DEFAULT_PRESET = "synthetic-resnet8"


def _check_positive(argument, value, allow_none=True):
    if value is None and allow_none:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"Invalid {argument}={value!r}: a positive integer is required.")


def validate(config):
    """Raise ValueError naming the field and its allowed values; returns the config."""
    check_choice("architecture", config.architecture, ARCHITECTURES)
    check_choice("augmentation", config.augmentation, AUGMENTATIONS)
    check_choice("schedule", config.schedule, SCHEDULES)
    check_choice("lr_scaling", config.lr_scaling, LR_SCALINGS)
    check_choice("precision", config.precision, PRECISIONS)
    check_choice("distribute", config.distribute, DISTRIBUTIONS)
    check_choice("pipeline", config.pipeline, PIPELINES)
    check_choice("weight_decay_scope", config.weight_decay_scope, WEIGHT_DECAY_SCOPES)
    check_choice("jit_compile", str(config.jit_compile).lower(), ("auto", "true", "false"))
    check_choice("normalization", config.normalization, (*NORMALIZATIONS, PIXEL_MEAN))
    check_choice("verbose", str(config.verbose), ("auto", "0", "1", "2"))
    for field in ("depth", "batch_size", "reference_batch_size", "total_steps", "checkpoint_every",
                  "steps_per_execution",
                  "synthetic_train_size", "synthetic_test_size"):
        _check_positive(field, getattr(config, field), allow_none=False)
    for field in ("steps", "epochs", "steps_per_epoch", "subset"):
        _check_positive(field, getattr(config, field))
    if not isinstance(config.health_every, int) or config.health_every < 0:
        raise ValueError(f"Invalid health_every={config.health_every!r}: a whole number >= 0 (0: off).")
    if not isinstance(config.synthetic_num_classes, int) or config.synthetic_num_classes < 2:
        raise ValueError(
            f"Invalid synthetic_num_classes={config.synthetic_num_classes!r}: at least 2 are required."
        )
    for field in ("image_size", "eval_image_size"):
        size = getattr(config, field)
        if size is None and field == "eval_image_size":
            continue
        if len(tuple(size)) != 2 or any(not isinstance(s, int) or s < 8 for s in size):
            raise ValueError(f"Invalid {field}={size!r}: expected [height, width], each at least 8.")
    if not 0 <= config.warmup_steps < config.total_steps:
        raise ValueError(
            f"Invalid warmup_steps={config.warmup_steps}: must be in [0, total_steps={config.total_steps})."
        )
    if list(config.boundaries) != sorted(config.boundaries) or any(
        not config.warmup_steps <= b < config.total_steps for b in config.boundaries
    ):
        raise ValueError(
            f"Invalid boundaries={tuple(config.boundaries)}: increasing iteration counts in "
            f"[warmup_steps, total_steps={config.total_steps})."
        )
    for field in ("base_lr", "warmup_lr", "lr_decay", "momentum", "weight_decay", "drop_path_rate"):
        value = getattr(config, field)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ValueError(f"Invalid {field}={value!r}: a finite non-negative number is required.")
    for key, value in config.unit_options.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"Invalid unit_options[{key!r}]={value!r}: a finite number is required.")
    if config.batch_size > INT32_MAX:
        raise ValueError(f"Invalid batch_size={config.batch_size}: at most {INT32_MAX} (int32 indexing).")
    if config.steps_per_execution > 1:
        import keras

        if keras.backend.backend() == "torch":
            raise ValueError(f"Invalid steps_per_execution={config.steps_per_execution}: Keras' PyTorch backend "
                             "runs one step per call; use 1 (or the JAX or TensorFlow backend).")
    if config.nesterov and not config.momentum:
        raise ValueError("Invalid nesterov=True with momentum=0: Nesterov momentum needs momentum > 0 "
                         "(pass --no-nesterov).")
    from keras_preact.layers import options as unit_tables

    check_choice("ordering", config.unit_options.get("ordering", "full_preact"), unit_tables.ORDERINGS)
    if config.dataset == "folder" and not config.data_dir:
        raise ValueError(
            "dataset='folder' needs data_dir (--data-dir): a directory with train/ and test/ (or "
            "val/) sub-folders holding one folder of images per class."
        )
    return config


def get_config(preset_name=DEFAULT_PRESET, **overrides):
    """The preset ``preset_name`` with ``overrides`` applied (any ``Config`` field), validated."""
    if preset_name not in PRESETS:
        raise ValueError(
            f"Unknown preset={preset_name!r}. Allowed values: {', '.join(sorted(PRESETS))}."
        )
    fields = {f.name for f in dataclasses.fields(Config)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(f"Unknown config field(s) {', '.join(unknown)}. Allowed: {', '.join(sorted(fields))}.")
    for key in ("image_size", "eval_image_size", "boundaries"):
        if overrides.get(key) is not None:
            overrides[key] = tuple(overrides[key])
    return validate(PRESETS[preset_name].replace(**overrides))


def from_dict(values):
    """A ``Config`` from ``dataclasses.asdict`` output (config.json), validated."""
    fields = {f.name for f in dataclasses.fields(Config)}
    values = {k: v for k, v in values.items() if k in fields}
    for key in ("image_size", "eval_image_size", "boundaries"):
        if values.get(key) is not None:
            values[key] = tuple(values[key])
    return validate(Config(**values))
