"""Command-line flags generated from ``configs.Config``'s fields (flax's ``config_flags``, big_vision's
``--config.x``): ``--batch-size`` sets ``batch_size``, ``--no-export`` clears ``export``, ``--image-size H W``
sets a pair. The types, choices and help come from the dataclass and the tables below, so a new
field is a flag of ``keras-preact-train`` and of ``python -m keras_preact_training.reproduce`` at once.
"""

import argparse
import dataclasses
import json
import typing

from . import configs

# Choices of the string fields (the validation tables of ``configs``).
CHOICES = {
    "architecture": configs.ARCHITECTURES,
    "augmentation": configs.AUGMENTATIONS,
    "schedule": configs.SCHEDULES,
    "lr_scaling": configs.LR_SCALINGS,
    "precision": configs.PRECISIONS,
    "distribute": configs.DISTRIBUTIONS,
    "pipeline": configs.PIPELINES,
    "weight_decay_scope": configs.WEIGHT_DECAY_SCOPES,
    "recipe": configs.RECIPES,
    "head_init": configs.HEAD_INITS,
    "jit_compile": ("auto", "true", "false"),
    "freeze_norm": ("auto", "true", "false"),
    "verbose": ("auto", "0", "1", "2"),
}
ALIASES = {"base_lr": ("--lr",)}  # short spellings kept from the first CLI
METAVARS = {"memory_limit": "FRACTION", "decoded_budget_mib": "MIB", "max_image_pixels": "PIXELS",
            "ema_momentum": "MOMENTUM", "layer_decay": "DECAY", "gradient_accumulation": "K", "mixup": "ALPHA",
            "cutmix": "ALPHA", "rand_augment": "MAGNITUDE"}  # other fields: their name in capitals
PAIRS = {"image_size": 2, "eval_image_size": 2}  # (height, width); other tuples take any length
HELP = {
    "architecture": "network family: cifar (3 stages, 16-64 channels, 32x32 input) or imagenet (4 stages, "
    "the ImageNet stem)",
    "drop_path_rate": "stochastic depth: the largest rate at which a unit's residual branch is dropped in "
    "training (0: none)",
    "image_size": "training image height and width, in pixels",
    "eval_image_size": "evaluation image height and width (ImageNet: 224 or 320; default --image-size)",
    "synthetic_train_size": "dataset synthetic: training images generated",
    "synthetic_test_size": "dataset synthetic: test images generated",
    "synthetic_num_classes": "dataset synthetic: classes",
    "augmentation": "training augmentation: cifar (pad 4, random crop, flip), imagenet or imagenet_aspect (the "
    "ImageNet recipes' random-size crops, flip), none",
    "normalization": "the per-channel mean and std the pixels are normalized with: cifar10, cifar100, imagenet, "
    "centered, pixel_mean (the mean training image, the paper's) or model (the init weights' own)",
    "reference_batch_size": "the batch the schedule's iterations are counted at (the paper's 128)",
    "total_steps": "the schedule's iterations at --reference-batch-size (the paper's 64000 on CIFAR)",
    "warmup_steps": "iterations at --warmup-lr before the peak learning rate (paper: ResNet-110 and deeper)",
    "boundaries": "iterations where the learning rate is multiplied by --lr-decay (piecewise schedule)",
    "schedule": "learning-rate schedule: piecewise (the paper's steps at --boundaries) or cosine",
    "warmup_lr": "learning rate of the warm-up iterations",
    "lr_decay": "the factor at each of --boundaries",
    "lr_scaling": "scale --lr with the batch: none, or linear in --batch-size / --reference-batch-size",
    "momentum": "SGD momentum (default 0.9)",
    "weight_decay": "L2 weight decay, coupled as the official trainer's (default 1e-4)",
    "steps_per_epoch": "iterations per epoch (default: the training images / --batch-size)",
    "seed": "random seed of the weights, the data order and the augmentation",
    "deterministic": "deterministic kernels where the backend has them (slower on some)",
    "precision": "Keras dtype policy: float32, mixed_float16 or mixed_bfloat16",
    "distribute": "several devices: mirrored, multiworker (TensorFlow), data-parallel (JAX) or none "
    "(docs/training.md)",
    "export_dir": "where --export writes the SavedModel (default saved_models/)",
    "verbose": "Keras fit's progress output: auto, 0 (silent), 1 (bar), 2 (a line per epoch)",
    "dataset": "a TFDS name (cifar10, cifar100, imagenet2012, ...), 'folder' or 'synthetic'",
    "data_dir": "TFDS data_dir, or the image-folder root (train/ and test/ or val/)",
    "manual_dir": "TFDS manual_dir (e.g. the imagenet2012 archives)",
    "cache_dir": "where decoded image folders are cached as .npy",
    "skip_bad_images": "folder data: skip unreadable image files (counted) instead of failing",
    "subset": "use the first N training images",
    "init_weights": "start from trained weights: a registered weights name of the network (e.g. cifar10), a "
    ".weights.h5 or .keras file, or a run directory; a new head when the data's classes differ "
    "(docs/fine-tuning.md)",
    "head_fraction": "the first fraction of the iterations trains only the new head, the backbone frozen "
    "(BN in inference mode); then every layer",
    "label_smoothing": "label smoothing of the cross-entropy (0: none)",
    "freeze_norm": "fine-tuning: keep the batch-norm statistics frozen when every layer trains; auto: at a batch under "
    "64 or on under 20,000 training images (docs/fine-tuning.md)",
    "recipe": "auto (the finetune-folder preset's): steps, warm-up, resolution, mixup and frozen BN chosen from the "
    "folder's image count and size after BiT's HyperRule, printed before any work; fixed: the preset's and flags'",
    "probe_rate_rule": "with --head-init probe: halve the peak rate when the probe classifies 99%% or more of "
    "the training images right (the features already separate them; keras_preact.models.finetune.rate_after_probe)."
    " --recipe auto's, unless --lr is given",
    "ema_momentum": "weight EMA (Keras' use_ema), e.g. 0.999: evaluated, saved and exported from the averaged "
    "weights; 0: off",
    "layer_decay": "layer-wise learning-rate decay: stage k of D trains at lr * decay**(D-k), the head at lr; 1: off",
    "gradient_accumulation": "batches whose gradients are averaged per optimizer update (a larger effective batch "
    "in the memory of one); 1: off",
    "mixup": "mixup alpha (images and one-hot labels mixed, Beta(alpha, alpha)); 0: off",
    "head_init": "fine-tuning: where a new head starts: random (its initialiser) or probe (fitted in closed form "
    "on the frozen features of the training images before the first step, then trained on: LP-FT); --recipe auto "
    "takes probe",
    "linear_probe": "no training: the backbone's features of the training images computed once (no backpropagation) "
    "and the head fitted in closed form (ridge regression to the one-hot labels); evaluated, saved and exported as a "
    "run",
    "rand_augment": "RandAugment (Keras' layer: 2 ops per batch) at this magnitude in [0, 1], e.g. 0.5, in the "
    "training step (--pipeline device); 0: off",
    "cutmix": "cutmix alpha (a box of another image pasted, labels by its area); 0: off. With --mixup: one of the "
    "two per batch",
    "resize_images": "folder data: give every image the network's view at --image-size (shorter side resized, "
    "centre crop), so folders of any image size train",
    "validation_split": "folder data without test/ or val/: the fraction of each class held out for testing",
    "decoded_budget_mib": "--resize-images folder data: the MiB its decoded images may take in memory; a larger set "
    "streams, each batch decoded from the files (default: a quarter of the free memory; 0: always stream)",
    "max_image_pixels": "folder data: the most pixels one image may have, read from its header before decoding "
    "(default 89,478,485, Pillow's own; 0: no bound)",
    "depth": "network depth (CIFAR 6n+2 / 9n+2, 3n+2 with the one_layer block; ImageNet 18-200)",
    "epochs": "number of epochs (the schedule shrinks to fit)",
    "steps": "total iterations (rounded up to whole epochs)",
    "batch_size": "global batch size",
    "base_lr": "peak learning rate (default 0.1)",
    "nesterov": "Nesterov momentum (default on, as the official trainer)",
    "weight_decay_scope": "all: every parameter (the official code's, default); kernels: conv/dense kernels only",
    "run_dir": "run directory; re-run the same command to resume after a kill",
    "runs_root": "parent of default run directories (default runs/)",
    "jit_compile": "XLA / jit compilation",
    "pipeline": "input pipeline: tf_data (TensorFlow default), device (uint8 from numpy, augmentation and "
    "normalization in the compiled step; default without TensorFlow), numpy (all on the host)",
    "steps_per_execution": "training steps per compiled call (default: 1 on CPU and on PyTorch; on a GPU/TPU "
    "the largest divisor of the steps per epoch up to 32 and --checkpoint-every; 1 with --health-every)",
    "checkpoint_every": "steps between backups (default 50)",
    "health_every": "log per-stage gradient norms, update ratios, activation stats every N steps",
    "export": "export a SavedModel at the end (default: on for the default preset)",
    "unit_options": "residual-unit options as JSON, e.g. '{\"ordering\": \"original\"}'",
    "memory_limit": "stop the run with one line when the host memory in use reaches this fraction of the "
    "limit (the cgroup's, else the machine's), before Linux's OOM killer ends it without a word; default "
    "0.95, 0: off",
    "remat": "recompute activations in the backward pass to save memory (same loss, gradients and weights): "
    "units (keep each residual unit's input), stages (each stage's input) or segments:K (the input of "
    "every K consecutive units); default none. docs/training.md: Training the deepest networks on one device",
}
# Not flags: the preset's identity (``name``/``paper``); ``unit_options`` is a JSON flag.
NOT_FLAGS = ("name", "paper")


def _field_type(field):
    """(base type, nargs) of a Config field: ``Optional[int]`` -> int; a tuple default -> a pair."""
    hint = field.type
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    base = args[0] if args else hint
    default = field.default if field.default is not dataclasses.MISSING else None
    if base is tuple or isinstance(default, tuple):
        return int, PAIRS.get(field.name, "*")
    if field.name in CHOICES or field.name == "verbose":
        return str, None
    return (base if base in (int, float, str, bool, dict) else str), None


def _json_object(text):
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"invalid JSON {text!r}: {error.msg}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"a JSON object is required, got {text!r}")
    return value


def add_config_flags(parser, exclude=()):
    """One flag per ``Config`` field (``--field-name``), default None (= the preset's value)."""
    group = parser.add_argument_group("config fields (override the preset)")
    for field in dataclasses.fields(configs.Config):
        if field.name in NOT_FLAGS or field.name in exclude:
            continue
        kind, nargs = _field_type(field)
        names = ["--" + field.name.replace("_", "-"), *ALIASES.get(field.name, ())]
        help_text = HELP.get(field.name)
        if kind is bool:
            group.add_argument(*names, dest=field.name, action=argparse.BooleanOptionalAction, default=None,
                               help=help_text)
        elif kind is dict:
            group.add_argument(*names, dest=field.name, type=_json_object, metavar="JSON", help=help_text)
        else:
            metavar = (("H", "W") if nargs == 2 else None if field.name in CHOICES
                       else METAVARS.get(field.name, field.name.upper()))
            group.add_argument(*names, dest=field.name, type=kind, nargs=nargs, choices=CHOICES.get(field.name),
                               metavar=metavar, help=help_text)
    return group


def overrides_from_args(args, exclude=()):
    """The Config overrides the flags gave (fields left at None are the preset's)."""
    fields = {f.name for f in dataclasses.fields(configs.Config)} - set(NOT_FLAGS) - set(exclude)
    overrides = {k: v for k, v in vars(args).items() if k in fields and v is not None}
    for key, value in overrides.items():
        if isinstance(value, list):
            overrides[key] = tuple(value)
    return overrides


def parse_assignment(text):
    """``FIELD=VALUE`` (``--set``): the field must exist; the value is JSON where it parses, else text."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"--set expects FIELD=VALUE, got {text!r}")
    key, value = text.split("=", 1)
    fields = {f.name for f in dataclasses.fields(configs.Config)}
    if key not in fields:
        raise argparse.ArgumentTypeError(f"--set: unknown config field {key!r}; fields: {', '.join(sorted(fields))}")
    try:
        value = json.loads(value)
    except json.JSONDecodeError:
        pass
    return key, tuple(value) if isinstance(value, list) else value
