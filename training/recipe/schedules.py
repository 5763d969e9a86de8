"""Learning-rate schedules of the paper's recipe, built from ``keras.optimizers.schedules``.

``piecewise`` (paper "Training recipe"): ``warmup_lr`` (0.01) for the first ``warmup`` iterations, then
``base_lr`` (0.1), divided by 10 at each boundary (32k and 48k of 64k at batch 128). One
``PiecewiseConstantDecay``. ``cosine``: linear warm-up from ``warmup_lr`` to ``base_lr``, then cosine decay
to 0 (``CosineDecay``), for short schedules such as the 15-epoch benchmark.
"""

import dataclasses
import math

import keras


@dataclasses.dataclass(frozen=True)
class ResolvedSchedule:
    """The schedule of one run, in optimizer iterations at its batch size."""

    total_steps: int
    steps_per_epoch: int
    epochs: int
    warmup_steps: int
    boundaries: tuple
    base_lr: float
    warmup_lr: float
    # The all-layers phase of fine-tuning keeps the batch-norm statistics frozen (``freeze_norm``).
    freeze_norm: bool = False


def resolve(config, train_size):
    """Iterations of a run (the rule is in ``keras_preact_training.recipe.configs``' docstring)."""
    batch = config.batch_size
    steps_per_epoch = config.steps_per_epoch or max(1, train_size // batch)
    if config.epochs:
        total = config.epochs * steps_per_epoch
    elif config.steps:
        total = config.steps
    else:
        total = math.ceil(config.total_steps * config.reference_batch_size / batch)
    # The paper's runs stop at an iteration count (64k), not at an epoch end: the last epoch may be
    # partial, so the stop, the warm-up and the decays stay exactly where the recipe puts them.
    epochs = math.ceil(total / steps_per_epoch)
    scale = total / config.total_steps
    lr_scale = batch / config.reference_batch_size if config.lr_scaling == "linear" else 1.0
    return ResolvedSchedule(
        total_steps=total,
        steps_per_epoch=steps_per_epoch,
        epochs=epochs,
        warmup_steps=round(config.warmup_steps * scale),
        boundaries=tuple(round(b * scale) for b in config.boundaries),
        base_lr=config.base_lr * lr_scale,
        warmup_lr=config.warmup_lr * lr_scale,
        freeze_norm=frozen_norm(config, train_size),
    )


def frozen_norm(config, train_size):
    """Whether the all-layers phase keeps the batch-norm statistics frozen: ``freeze_norm`` "true"/"false", or
    "auto": when fine-tuning (``init_weights`` with a head phase, ``head_fraction``, or a probed head,
    ``head_init="probe"``) at a batch under 64 or on under 20,000 training images
    (``keras_preact.models.finetune.freeze_norm_rule``)."""
    if config.freeze_norm != "auto":
        return config.freeze_norm == "true"
    if not (config.init_weights and (config.head_fraction or config.head_init == "probe")):
        return False
    from keras_preact.models.finetune import freeze_norm_rule

    return freeze_norm_rule(batch_size=config.batch_size, num_images=max(1, int(train_size)))


def piecewise(s, decay):
    # PiecewiseConstantDecay gives values[i] while step <= boundaries[i]; the optimizer evaluates it
    # at its iteration count before the update, so update number k (0-based) uses lr(k). "The first
    # 400 iterations at 0.01" is steps 0..399: boundary 399.
    boundaries, values = [], []
    if s.warmup_steps:
        boundaries.append(s.warmup_steps - 1)
        values.append(s.warmup_lr)
    values.append(s.base_lr)
    for i, b in enumerate(s.boundaries):
        boundaries.append(b - 1)
        values.append(s.base_lr * decay ** (i + 1))
    if not boundaries:
        return s.base_lr
    return keras.optimizers.schedules.PiecewiseConstantDecay(boundaries, values)


def cosine(s, decay):
    return keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=s.warmup_lr if s.warmup_steps else s.base_lr,
        decay_steps=max(1, s.total_steps - s.warmup_steps),
        warmup_target=s.base_lr if s.warmup_steps else None,
        warmup_steps=s.warmup_steps,
    )


SCHEDULES = {"piecewise": piecewise, "cosine": cosine}


def make(config, resolved):
    return SCHEDULES[config.schedule](resolved, config.lr_decay)


def lr_table(config, resolved):
    """``[(first iteration, lr), ...]``: where the piecewise schedule changes (0-based iterations), as
    ``--dry-run`` prints it; for ``cosine``, the warm-up start, the peak and the end."""
    s = resolved
    if config.schedule == "cosine":
        rows = [(0, s.warmup_lr if s.warmup_steps else s.base_lr)]
        if s.warmup_steps:
            rows.append((s.warmup_steps, s.base_lr))
        return rows + [(s.total_steps, 0.0)]
    rows = [(0, s.warmup_lr)] if s.warmup_steps else []
    rows.append((s.warmup_steps, s.base_lr))
    rows += [(b, s.base_lr * config.lr_decay ** (i + 1)) for i, b in enumerate(s.boundaries)]
    return rows
