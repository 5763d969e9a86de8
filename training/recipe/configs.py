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

Optimizer (``keras_preact_training.recipe.optimizers.TorchSGD``): the official trainer's ``optim.sgd`` step for step:
momentum 0.9, Nesterov, dampening 0, coupled weight decay 1e-4 (gradient += wd * x, before momentum)
on every parameter (``weight_decay_scope="all"``, as ``model:getParameters()``; ``"kernels"`` limits it
to conv/dense kernels). Keras' ``SGD`` is not used: its velocity holds lr-scaled steps (it parts from
Torch's whenever the lr changes) and its ``weight_decay`` is decoupled. Each recipe choice and its
source: REPRODUCTION.md, "Recipe choices".
"""

import dataclasses
import difflib
import json
import math
import typing

from ..machine import memory_guard

# Standard library only (with ``machine``): the command lines' parsers are built from this module before Keras
# loads (``--help``, a bad flag). The library's values are imported where a config is checked or built.

# Per-channel normalization in 0-255 pixel units: the model consumes (pixels - mean) / std.
TRAIN_SIZES = {"cifar10": 50000, "cifar100": 50000, "imagenet2012": 1281167}  # for --dry-run
NORMALIZATIONS = {
    # fb.resnet.torch's datasets/cifar10.lua and imagenet.lua statistics: the registry's family inputs
    # (keras_preact.models.presets.FAMILY_INPUTS; tests/test_training_configs.py checks they agree).
    "cifar10": ((125.3, 123.0, 113.9), (63.0, 62.1, 66.7)),
    "cifar100": ((129.3, 124.1, 112.4), (68.2, 65.4, 70.4)),  # fb.resnet.torch datasets/cifar100.lua
    "imagenet": ((123.675, 116.28, 103.53), (58.395, 57.12, 57.375)),
    # (x - 127.5) / 63.75: for synthetic data.
    "centered": ((127.5, 127.5, 127.5), (63.75, 63.75, 63.75)),
}
# The paper's "per-pixel mean subtracted": the mean training image, std 1
# (keras_preact_training.data.pipelines.pixel_stats).
PIXEL_MEAN = "pixel_mean"
# The statistics the network was trained with: the init weights' input config (a run's or .keras file's own),
# else the registered network's (keras_preact.models.get_input_config).
MODEL_NORMALIZATION = "model"
# The registry's network families, those with a builder (a timm checkpoint's edge-pool stem is a layout of "imagenet"):
# keras_preact.models.registry.FAMILIES' keys (tests/test_training_configs.py checks they agree).
ARCHITECTURES = ("cifar", "imagenet")
AUGMENTATIONS = ("cifar", "imagenet", "imagenet_aspect", "none")
SCHEDULES = ("piecewise", "cosine")
LR_SCALINGS = ("none", "linear")
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
DISTRIBUTIONS = ("none", "mirrored", "multiworker", "data-parallel")
PIPELINES = ("auto", "tf_data", "device", "numpy")
WEIGHT_DECAY_SCOPES = ("all", "kernels")
RECIPES = ("fixed", "auto")  # auto: keras_preact_training.recipe.hyperrule
HEAD_INITS = ("random", "probe")  # fine-tuning: where a new head starts (probe: keras_preact.models.levers)
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
    # Rematerialisation of the residual units (keras_preact.models.remat): less memory, same math.
    remat: str | None = None
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
    weight_decay: float = 1e-4  # coupled, as optim.sgd: gradient += wd * x (keras_preact_training.recipe.optimizers)
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
    # training steps per compiled call (Keras compile argument); None: the app's choice
    # (keras_preact_training.machine.execution.choose_steps_per_execution: 1 on CPU, more on GPU/TPU)
    steps_per_execution: int | None = None
    distribute: str = "none"
    checkpoint_every: int = 50  # steps between BackupAndRestore backups
    health_every: int = 0  # steps between TrainingHealthCallback measurements; 0: off
    run_dir: str | None = None
    runs_root: str = "runs"
    export: bool = False
    export_dir: str = "saved_models"
    skip_bad_images: bool = False  # folder data: skip unreadable image files (and report them) instead of failing
    # folder data: every image decoded to the model's view at image_size (shorter side resized, centre crop)
    resize_images: bool = False
    validation_split: float = 0.0  # folder data without test/ or val/: the fraction of each class held out
    # resize_images folder data: the MiB its decoded images may take in memory, else they stream batch by batch
    # (None: a quarter of the memory free at the start; keras_preact_training.data.sources.choose_folder_decoding)
    decoded_budget_mib: float | None = None
    # folder data: the most pixels one image may declare in its header, checked before decoding (0: no bound;
    # keras_preact_training.data.sources.MAX_IMAGE_PIXELS, Pillow's own)
    max_image_pixels: int = 89_478_485
    # --- fine-tuning (keras_preact.models.finetune)
    init_weights: str | None = None  # registered weights name, .weights.h5/.keras file or run directory
    head_fraction: float = 0.0  # the first fraction of the iterations trains only the head (backbone frozen)
    # a new head's start: "random" (its initialiser) or "probe" (fitted in closed form on the frozen features
    # before any step, then trained on: LP-FT, Kumar et al. 2022)
    head_init: str = "random"
    # after a probed head: the all-layers rate halved when the probe is right on >= 99% of the training images
    # (keras_preact.models.finetune.rate_after_probe); --recipe auto's unless --lr is given
    probe_rate_rule: bool = False
    label_smoothing: float = 0.0
    # fine-tuning's all-layers phase keeps the batch-norm statistics frozen: "auto" (batch < 64 or < 20,000 images,
    # keras_preact.models.finetune.freeze_norm_rule), "true", "false"
    freeze_norm: str = "auto"
    # --- fine-tuning levers (keras_preact.models.levers; docs/fine-tuning.md, "Levers")
    recipe: str = "fixed"  # "auto": steps, warm-up, resolution, mixup and frozen BN from the folder (recipe.hyperrule)
    ema_momentum: float = 0.0  # weight EMA (Keras optimizers' use_ema); evaluated and saved from it; 0: off
    layer_decay: float = 1.0  # layer-wise learning-rate decay per stage (keras_preact.models.levers); 1: off
    gradient_accumulation: int = 1  # batches per optimizer update (Keras' gradient_accumulation_steps); 1: off
    mixup: float = 0.0  # mixup's Beta(alpha, alpha) (Zhang et al. 2018), labels mixed alike; 0: off
    cutmix: float = 0.0  # cutmix's Beta(alpha, alpha) (Yun et al. 2019); with mixup, one of the two per batch
    linear_probe: bool = False  # no training: the head in closed form on frozen features (keras_preact.models.levers)
    rand_augment: float = 0.0  # Keras' RandAugment (2 ops) at this magnitude in [0, 1], pipeline device; 0: off
    verbose: str = "auto"  # Keras fit verbosity: "auto", 0, 1, 2
    # Stop the run with one line when host memory in use reaches this fraction of the limit (0: off)
    memory_limit: float = memory_guard.DEFAULT_FRACTION  # 0.95

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


FAIL = "fail"  # the paper's "fail": test error above 20%


@dataclasses.dataclass(frozen=True)
class Experiment:
    """One run of the paper: its table and row label there, the paper's test error (a fraction in
    [0, 1] as every error here, ``FAIL`` or None where the table has none) and the ``Config`` that
    reproduces it (a preset). The tables below transcribe the paper's percentages as printed
    (``from_percent``)."""

    table: str
    label: str
    paper_error: object
    config: Config


def from_percent(error):
    """A test error the paper prints in percent (6.37), as a fraction (0.0637); ``FAIL`` and None as they are."""
    return error if error in (None, FAIL) else round(error / 100, 6)


def _table1(name, label, error, **shortcut):
    """A row of Table 1 (Fig. 2): a shortcut variant on the original ResNet-110 unit (f = ReLU after the addition)."""
    return Experiment("1", label, from_percent(error),
                      _cifar(name, "Table 1, Fig. 2", 110, unit_options={"ordering": "original", **shortcut}))


def _table2(name, label, error, depth, ordering):
    """A row of Table 2 (Fig. 4): an activation placement on ResNet-110 or ResNet-164, CIFAR-10."""
    return Experiment("2", label, from_percent(error),
                      _cifar(name, "Table 2, Fig. 4", depth, unit_options={"ordering": ordering}))


def _table3(name, label, error, dataset, depth, ordering, **options):
    """A row of Table 3 (Fig. 6): the original or the pre-activation unit on CIFAR-10/100."""
    return Experiment("3", label, from_percent(error),
                      _cifar(name, "Table 3", depth, dataset, unit_options={"ordering": ordering, **options}))


# Every experiment of the paper, in table order: one entry each, its preset name spelled out.
EXPERIMENTS = [
    # Table 1 (Fig. 2): shortcut variants on the original ResNet-110 unit; the paper's gate-bias inits.
    _table1("t1-resnet110-original", "original", 6.61),
    _table1("t1-resnet110-constant-scaling-0-1", "constant scaling 0 / 1", FAIL,
            shortcut="constant_scaling", shortcut_scale=0.0, residual_scale=1.0),
    _table1("t1-resnet110-constant-scaling-0.5-1", "constant scaling 0.5 / 1", FAIL,
            shortcut="constant_scaling", shortcut_scale=0.5, residual_scale=1.0),
    _table1("t1-resnet110-constant-scaling-0.5-0.5", "constant scaling 0.5 / 0.5", 12.35,
            shortcut="constant_scaling", shortcut_scale=0.5, residual_scale=0.5),
    _table1("t1-resnet110-exclusive-gating-bg0", "exclusive gating b_g=0", FAIL,
            shortcut="exclusive_gating", gate_bias_init=0.0),
    _table1("t1-resnet110-exclusive-gating-bg-1", "exclusive gating b_g=-1", FAIL,
            shortcut="exclusive_gating", gate_bias_init=-1.0),
    _table1("t1-resnet110-exclusive-gating-bg-2", "exclusive gating b_g=-2", FAIL,
            shortcut="exclusive_gating", gate_bias_init=-2.0),
    _table1("t1-resnet110-exclusive-gating-bg-3", "exclusive gating b_g=-3", FAIL,
            shortcut="exclusive_gating", gate_bias_init=-3.0),
    _table1("t1-resnet110-exclusive-gating-bg-4", "exclusive gating b_g=-4", FAIL,
            shortcut="exclusive_gating", gate_bias_init=-4.0),
    _table1("t1-resnet110-exclusive-gating-bg-5", "exclusive gating b_g=-5", FAIL,
            shortcut="exclusive_gating", gate_bias_init=-5.0),
    _table1("t1-resnet110-exclusive-gating-bg-6", "exclusive gating b_g=-6", 8.70,
            shortcut="exclusive_gating", gate_bias_init=-6.0),
    _table1("t1-resnet110-exclusive-gating-bg-7", "exclusive gating b_g=-7", 9.81,
            shortcut="exclusive_gating", gate_bias_init=-7.0),
    _table1("t1-resnet110-shortcut-only-gating-bg0", "shortcut-only gating b_g=0", 12.86,
            shortcut="shortcut_only_gating", gate_bias_init=0.0),
    _table1("t1-resnet110-shortcut-only-gating-bg-6", "shortcut-only gating b_g=-6", 6.91,
            shortcut="shortcut_only_gating", gate_bias_init=-6.0),
    _table1("t1-resnet110-conv1x1", "1x1 conv shortcut", 12.22, shortcut="conv1x1"),
    _table1("t1-resnet110-dropout", "dropout shortcut 0.5", FAIL, shortcut="dropout", shortcut_dropout_rate=0.5),
    # Table 2 (Fig. 4): five activation placements x ResNet-110 / ResNet-164 on CIFAR-10.
    _table2("t2-resnet110-original", "original (ResNet-110)", 6.61, 110, "original"),
    _table2("t2-resnet110-bn-after-addition", "bn_after_addition (ResNet-110)", 8.17, 110, "bn_after_addition"),
    _table2("t2-resnet110-relu-before-addition", "relu_before_addition (ResNet-110)", 7.84, 110,
            "relu_before_addition"),
    _table2("t2-resnet110-relu-only-preact", "relu_only_preact (ResNet-110)", 6.71, 110, "relu_only_preact"),
    _table2("t2-resnet110-full-preact", "full_preact (ResNet-110)", 6.37, 110, "full_preact"),
    _table2("t2-resnet164-original", "original (ResNet-164)", 5.93, 164, "original"),
    _table2("t2-resnet164-bn-after-addition", "bn_after_addition (ResNet-164)", 6.50, 164, "bn_after_addition"),
    _table2("t2-resnet164-relu-before-addition", "relu_before_addition (ResNet-164)", 6.14, 164,
            "relu_before_addition"),
    _table2("t2-resnet164-relu-only-preact", "relu_only_preact (ResNet-164)", 5.91, 164, "relu_only_preact"),
    _table2("t2-resnet164-full-preact", "full_preact (ResNet-164)", 5.46, 164, "full_preact"),
    # Table 3 (Fig. 6): original vs pre-activation unit, CIFAR-10/100. The 1-layer-skip ResNet-110 is 108 units
    # of one 3x3 conv (block="one_layer"), shortcut as the CIFAR builder's default.
    _table3("t3-cifar10-resnet110-1layer-original", "cifar10 ResNet-110 (1-layer skip) original", 9.90,
            "cifar10", 110, "original", block="one_layer"),
    _table3("t3-cifar10-resnet110-1layer-preact", "cifar10 ResNet-110 (1-layer skip) preact", 8.91,
            "cifar10", 110, "full_preact", block="one_layer"),
    _table3("t3-cifar10-resnet110-original", "cifar10 ResNet-110 original", 6.61, "cifar10", 110, "original"),
    _table3("t3-cifar10-resnet110-preact", "cifar10 ResNet-110 preact", 6.37, "cifar10", 110, "full_preact"),
    _table3("t3-cifar10-resnet164-original", "cifar10 ResNet-164 original", 5.93, "cifar10", 164, "original"),
    _table3("t3-cifar10-resnet164-preact", "cifar10 ResNet-164 preact", 5.46, "cifar10", 164, "full_preact"),
    _table3("t3-cifar10-resnet1001-original", "cifar10 ResNet-1001 original", 7.61, "cifar10", 1001, "original"),
    _table3("t3-cifar10-resnet1001-preact", "cifar10 ResNet-1001 preact", 4.92, "cifar10", 1001, "full_preact"),
    _table3("t3-cifar100-resnet164-original", "cifar100 ResNet-164 original", 25.16, "cifar100", 164, "original"),
    _table3("t3-cifar100-resnet164-preact", "cifar100 ResNet-164 preact", 24.33, "cifar100", 164, "full_preact"),
    _table3("t3-cifar100-resnet1001-original", "cifar100 ResNet-1001 original", 27.82, "cifar100", 1001, "original"),
    _table3("t3-cifar100-resnet1001-preact", "cifar100 ResNet-1001 preact", 22.71, "cifar100", 1001, "full_preact"),
    # Table 4: ResNet-1001 pre-activation at mini-batch 64.
    Experiment("4", "ResNet-1001 pre-activation, mini-batch 64", None, _cifar(
        "t4-cifar10-resnet1001-preact-batch64", "Table 4 (mini-batch 64)", 1001, batch_size=64,
        unit_options={"ordering": "full_preact"})),
    # Table 5: ImageNet, train crop 224, test crop 320 (and 224 for the first row); single-crop top-1.
    Experiment("5", "ResNet-152 original, test 224", None, _imagenet(
        "t5-resnet152-original-test224", "Table 5", 152, eval_image_size=(224, 224),
        unit_options={"ordering": "original"})),
    Experiment("5", "ResNet-152 original", None, _imagenet(
        "t5-resnet152-original", "Table 5", 152, unit_options={"ordering": "original"})),
    Experiment("5", "ResNet-152 preact", None, _imagenet(
        "t5-resnet152-preact", "Table 5", 152, unit_options={"ordering": "full_preact"})),
    Experiment("5", "ResNet-200 original", None, _imagenet(
        "t5-resnet200-original", "Table 5", 200, unit_options={"ordering": "original"})),
    Experiment("5", "ResNet-200 preact", None, _imagenet(
        "t5-resnet200-preact", "Table 5", 200, unit_options={"ordering": "full_preact"})),
    Experiment("5", "ResNet-200 pre-activation, scale + aspect-ratio augmentation", None, _imagenet(
        "t5-resnet200-preact-aspect-aug", "Table 5 (scale + aspect-ratio augmentation)", 200,
        augmentation="imagenet_aspect", unit_options={"ordering": "full_preact"})),
    # Sec. 4.1: ImageNet ResNet-101, BN after addition against the original unit.
    Experiment("4.1", "ResNet-101, BN after addition", None, _imagenet(
        "sec4.1-resnet101-bn-after-addition", "Sec. 4.1 (ImageNet, BN after addition)", 101,
        eval_image_size=(224, 224), unit_options={"ordering": "bn_after_addition"})),
    Experiment("4.1", "ResNet-101, original", None, _imagenet(
        "sec4.1-resnet101-original", "Sec. 4.1 (ImageNet, original)", 101, eval_image_size=(224, 224),
        unit_options={"ordering": "original"})),
]

# Runs that are no experiment of the paper.
EXTRA_PRESETS = [
    # The default run: a ResNet-8 (6n+2, n=1) on the built-in synthetic set, a few minutes on CPU.
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
    ),
    # Pre-activation ResNet-20 on the CIFAR-10 JPEG folder, short cosine schedule (BENCHMARKS.md).
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
    ),
    # The paper's recipe (piecewise: /10 at 50% and 75%) scaled to 50 epochs: about 2 hours of a 2-core CPU
    # (reproduction/cifar10-preact-resnet20-paper/).
    _cifar(
        "cifar10-folder-resnet20-converged",
        "Sec. 4 recipe scaled to 50 epochs (19,500 iterations) on the CIFAR-10 JPEG folder",
        20,
        dataset="folder",
        epochs=50,
        unit_options={"ordering": "full_preact"},
        normalization="cifar10",
    ),
    # The paper's recipe at its own length, 64,000 iterations (164 epochs of 390) on the CIFAR-10 JPEG folder:
    # several hours of a 2-core CPU, resumable on another machine (keras_preact_training.carry;
    # reproduction/cifar10-preact-resnet20-paper/).
    _cifar(
        "cifar10-folder-resnet20-paper",
        "Sec. 4 recipe at the paper's length (64,000 iterations) on the CIFAR-10 JPEG folder",
        20,
        dataset="folder",
        unit_options={"ordering": "full_preact"},
        normalization="cifar10",
        checkpoint_every=390,
    ),
]
EXTRA_PRESETS.append(
    # Fine-tuning trained weights on a folder of one's own images, of any size and count (docs/fine-tuning.md):
    # the network's input size and statistics, each image resized to its view, a validation split when the folder
    # has none, the new head alone for the first fifth, then every layer; a short cosine schedule.
    Config(
        name="finetune-folder",
        paper="fine-tuning (no paper experiment): trained weights on an image folder of one's own",
        depth=20,
        dataset="folder",
        init_weights="cifar10",
        resize_images=True,
        validation_split=0.1,
        augmentation="cifar",
        normalization=MODEL_NORMALIZATION,
        batch_size=64,
        reference_batch_size=64,
        epochs=10,
        total_steps=1000,
        warmup_steps=0,
        boundaries=(),
        schedule="cosine",
        base_lr=0.01,
        warmup_lr=0.01,
        head_fraction=0.2,
        label_smoothing=0.1,
        recipe="auto",
        export=True,
    )
)
PRESETS = {c.name: c for c in (EXTRA_PRESETS[0], *(e.config for e in EXPERIMENTS), *EXTRA_PRESETS[1:])}
DEFAULT_PRESET = "synthetic-resnet8"


def _check_positive(argument, value, allow_none=True):
    if value is None and allow_none:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"Invalid {argument}={value!r}: a positive integer is required.")


def _check_sizes_and_schedule(config):
    """Image sizes, the warm-up and the decay boundaries."""
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


def _check_unit_options(unit_options):
    """Finite numbers, and every option as ``UnitConfig`` (the unit's defaults and checks) allows."""
    from keras_preact.layers import UnitConfig

    for key, value in unit_options.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"Invalid unit_options[{key!r}]={value!r}: a finite number is required.")
    UnitConfig.from_options(unit_options)


def registered_network(config):
    """The registered network (``keras_preact.models.list_models``) of the config's family and depth."""
    return f"{config.architecture}_resnet{config.depth}"


def network_spec(config):
    """The ``keras_preact.models.ModelSpec`` of the config's network: the registered one, else one of its family
    builder at that depth (no registered weights), so a ``.weights.h5``/``.keras`` file or run of any depth loads."""
    from keras_preact.models import ModelSpec, list_models, model_spec
    from keras_preact.models.presets import FAMILY_INPUTS
    from keras_preact.models.registry import FAMILIES

    name = registered_network(config)
    if name in list_models():
        return model_spec(name)
    return ModelSpec(name, config.architecture, FAMILIES[config.architecture], {"depth": config.depth},
                     FAMILY_INPUTS[config.architecture])


def _check_init_weights(config):
    """``init_weights``, looked at once (``init_loader``) when the config is validated, before any data is read:
    a registered weights name of the config's network (fetched and converted), a keras-preact file or run
    directory, or another library's checkpoint; its errors name ``--init-weights``."""
    if config.init_weights is not None:
        init_loader(config)


def init_loader(config):
    """The ``keras_preact.pretrained.loader.Loader`` of ``config.init_weights`` (None without), got once per
    process for a network and weights; an error of the loader is re-raised naming the flag, ``--init-weights``."""
    if config.init_weights is None:
        return None
    from keras_preact.pretrained.loader import get_loader

    spec = network_spec(config)
    key = (spec.name, str(config.init_weights))
    if key not in _LOADERS:
        try:
            loader = get_loader(spec, config.init_weights)
        except (ValueError, OSError, ImportError) as error:
            message = str(error).replace("Invalid weights=", "Invalid --init-weights ", 1)
            message = message.replace("as weights=", "as --init-weights").replace("weights=", "--init-weights ")
            raise type(error)(message) from None
        _LOADERS.clear()  # the last one only: a process trains one network
        _LOADERS[key] = loader
    return _LOADERS[key]


_LOADERS = {}


def resolve_pipeline(config):
    """``auto``: tf.data on the TensorFlow backend (the fastest CPU path measured), else ``device``
    (uint8 batches from numpy, augmentation and normalization in the compiled step)."""
    import keras

    if config.pipeline != "auto":
        return config.pipeline
    if keras.backend.backend() == "tensorflow":
        return "tf_data"
    return "device" if config.augmentation in ("cifar", "none") else "tf_data"


def _check_levers(config):
    """The fine-tuning levers: each in its range, one line naming it (docs/fine-tuning.md, "Levers")."""
    from keras_preact.layers.options import check_choice

    check_choice("recipe", config.recipe, RECIPES)
    check_choice("head_init", config.head_init, HEAD_INITS)
    for field, low, high, rule in (("ema_momentum", 0, 1, "in [0, 1) (0: off)"),
                                   ("mixup", 0, math.inf, ">= 0 (0: off)"), ("cutmix", 0, math.inf, ">= 0 (0: off)")):
        value = getattr(config, field)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value < high:
            raise ValueError(f"Invalid {field}={value!r}: a number {rule} is required.")
    if isinstance(config.rand_augment, bool) or not isinstance(config.rand_augment, (int, float)) or not (
            0 <= config.rand_augment <= 1):
        raise ValueError(f"Invalid rand_augment={config.rand_augment!r}: a magnitude in [0, 1] is required (0: off).")
    decay = config.layer_decay
    if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0 < decay <= 1:
        raise ValueError(f"Invalid layer_decay={decay!r}: a number in (0, 1] is required (1: off).")
    _check_positive("gradient_accumulation", config.gradient_accumulation, allow_none=False)
    if config.rand_augment and resolve_pipeline(config) != "device":
        raise ValueError(f"Invalid pipeline={config.pipeline!r} ({resolve_pipeline(config)} here) with rand_augment="
                         f"{config.rand_augment}: RandAugment runs in the training step; use --pipeline device.")
    if config.mixup or config.cutmix:
        if resolve_pipeline(config) == "tf_data":
            raise ValueError(f"Invalid pipeline={config.pipeline!r} (tf.data here) with mixup={config.mixup}, "
                             f"cutmix={config.cutmix}: the labels are mixed on the host; use --pipeline device or "
                             "numpy.")


def validate(config, *, needs_data=True):
    """Raise ValueError naming the field and its allowed values; returns the config. ``needs_data=False``
    (``--dry-run``, which reads no data): a folder dataset may leave ``data_dir`` unset."""
    from keras_preact.layers.options import check_choice
    from keras_preact.models.remat import parse_remat

    parse_remat(config.remat)
    check_choice("architecture", config.architecture, ARCHITECTURES)
    check_choice("augmentation", config.augmentation, AUGMENTATIONS)
    check_choice("schedule", config.schedule, SCHEDULES)
    check_choice("lr_scaling", config.lr_scaling, LR_SCALINGS)
    check_choice("precision", config.precision, PRECISIONS)
    check_choice("distribute", config.distribute, DISTRIBUTIONS)
    check_choice("pipeline", config.pipeline, PIPELINES)
    check_choice("weight_decay_scope", config.weight_decay_scope, WEIGHT_DECAY_SCOPES)
    check_choice("jit_compile", str(config.jit_compile).lower(), ("auto", "true", "false"))
    check_choice("freeze_norm", config.freeze_norm, ("auto", "true", "false"))
    check_choice("normalization", config.normalization, (*NORMALIZATIONS, PIXEL_MEAN, MODEL_NORMALIZATION))
    check_choice("verbose", str(config.verbose), ("auto", "0", "1", "2"))
    for field in ("depth", "batch_size", "reference_batch_size", "total_steps", "checkpoint_every",
                  "synthetic_train_size", "synthetic_test_size"):
        _check_positive(field, getattr(config, field), allow_none=False)
    for field in ("steps", "epochs", "steps_per_epoch", "subset", "steps_per_execution"):
        _check_positive(field, getattr(config, field))
    if not isinstance(config.seed, int) or isinstance(config.seed, bool):
        raise ValueError(f"Invalid seed={config.seed!r}: an integer is required.")
    if not isinstance(config.health_every, int) or config.health_every < 0:
        raise ValueError(f"Invalid health_every={config.health_every!r}: a whole number >= 0 (0: off).")
    if not isinstance(config.synthetic_num_classes, int) or config.synthetic_num_classes < 2:
        raise ValueError(
            f"Invalid synthetic_num_classes={config.synthetic_num_classes!r}: at least 2 are required."
        )
    _check_sizes_and_schedule(config)
    for field in ("validation_split", "head_fraction", "label_smoothing"):
        value = getattr(config, field)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
            raise ValueError(f"Invalid {field}={value!r}: a fraction in [0, 1) is required.")
    budget = config.decoded_budget_mib
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float))
                               or not math.isfinite(budget) or budget < 0):
        raise ValueError(f"Invalid decoded_budget_mib={budget!r}: a finite number of MiB >= 0 is required (0: always "
                         "stream), or None (a quarter of the free memory).")
    if isinstance(config.max_image_pixels, bool) or not isinstance(config.max_image_pixels, int) or (
            config.max_image_pixels < 0):
        raise ValueError(f"Invalid max_image_pixels={config.max_image_pixels!r}: a pixel count >= 0 is required "
                         "(0: no bound).")
    _check_init_weights(config)
    _check_levers(config)
    for field in ("base_lr", "warmup_lr", "lr_decay", "momentum", "weight_decay", "drop_path_rate"):
        value = getattr(config, field)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ValueError(f"Invalid {field}={value!r}: a finite non-negative number is required.")
    _check_unit_options(config.unit_options)
    memory_guard.check_fraction(config.memory_limit)
    if config.batch_size > INT32_MAX:
        raise ValueError(f"Invalid batch_size={config.batch_size}: at most {INT32_MAX} (int32 indexing).")
    if (config.steps_per_execution or 1) > 1:
        import keras

        if keras.backend.backend() == "torch":
            raise ValueError(f"Invalid steps_per_execution={config.steps_per_execution}: Keras' PyTorch backend "
                             "runs one step per call; use 1 (or the JAX or TensorFlow backend).")
    if config.nesterov and not config.momentum:
        raise ValueError("Invalid nesterov=True with momentum=0: Nesterov momentum needs momentum > 0 "
                         "(pass --no-nesterov).")
    if needs_data and config.dataset == "folder" and not config.data_dir:
        raise ValueError(
            "dataset='folder' needs data_dir (--data-dir): a directory with train/ and test/ (or "
            "val/) sub-folders holding one folder of images per class."
        )
    return config


def get_config(preset_name=DEFAULT_PRESET, *, needs_data=True, **overrides):
    """The preset ``preset_name`` with ``overrides`` applied (any ``Config`` field), validated
    (``needs_data`` as in ``validate``)."""
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
    return validate(PRESETS[preset_name].replace(**overrides), needs_data=needs_data)


# What a config file may hold besides the field's own type (``validate`` reads them with ``str``).
FILE_EXTRA_TYPES = {"verbose": (int,), "jit_compile": (bool,)}
_KINDS = {  # a field's base type: (accepted JSON types, what the message says is allowed)
    bool: ((bool,), "true or false (a JSON boolean, not a string)"),
    int: ((int,), "an integer"),
    float: ((int, float), "a number"),
    str: ((str,), "a string"),
    dict: ((dict,), "a JSON object"),
    tuple: ((list, tuple), "a list of integers"),
}


def _file_type_problem(field, value):
    """What ``field`` allows, when ``value`` is not of its type; else None."""
    options = typing.get_args(field.type) or (field.type,)
    if value is None and type(None) in options:
        return None
    base = next(t for t in options if t is not type(None))
    accepted, allowed = _KINDS[base]
    allowed = "a list [height, width] of integers" if field.name.endswith("image_size") else allowed
    accepted += FILE_EXTRA_TYPES.get(field.name, ())
    ok = isinstance(value, accepted) and (base is bool or bool in accepted or not isinstance(value, bool))
    if ok and base is tuple:
        ok = all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    if ok:
        return None
    return allowed + (" or null" if type(None) in options else "")


def check_file_values(values, source="config"):
    """ValueError, one line naming the key, its value and what is allowed, for an unknown key (with the
    nearest field) or a value of the wrong type."""
    fields = {f.name: f for f in dataclasses.fields(Config)}
    for key, value in values.items():
        if key not in fields:
            near = difflib.get_close_matches(key, fields, n=1)
            hint = f"did you mean {near[0]!r}?" if near else f"the fields are {', '.join(fields)}"
            raise ValueError(f"Invalid {source}: unknown key {key!r} (value {value!r}); {hint}")
        problem = _file_type_problem(fields[key], value)
        if problem:
            raise ValueError(f"Invalid {source}: {key}={json.dumps(value)}: {problem} is required.")


def from_dict(values, source="config"):
    """A ``Config`` from ``dataclasses.asdict`` output (config.json), checked key by key and validated;
    ``source`` names the file in messages."""
    check_file_values(values, source)
    values = dict(values)
    for key in ("image_size", "eval_image_size", "boundaries"):
        if values.get(key) is not None:
            values[key] = tuple(values[key])
    return validate(Config(**values))
