"""``--recipe auto``: a schedule chosen by the data, after BiT's HyperRule (Kolesnikov et al. 2020, "Big Transfer
(BiT): General Visual Representation Learning", Sec. 3.3).

BiT picks the schedule length from the number of training images (under 20k: 500 steps; under 500k: 10k; else
20k), mixup (alpha 0.1) from 20k images on, and the resolution from the image size (under 96 x 96 pixels: resized
to 160 and cropped to 128; else 512 and 480). For this project's networks:

- steps and warm-up: BiT's counts (500 / 10,000 / 20,000 steps; warm-up 100 / 500 / 500) at the run's batch
  size (BiT's is 512), the warm-up linear from a tenth of the rate;
- resolution: a CIFAR network (``architecture="cifar"``) keeps its own input size (the resolution its weights
  were trained at; BiT's 128 would cost 16 times the compute of a 32 x 32 network for features it never
  learned at that scale); an ImageNet network takes BiT's 128 for images under 96 x 96 pixels, else its own;
- evaluation: at every pass over the training images, but at most ``EVALUATIONS`` times along the schedule
  (a few hundred labelled images make a pass of a few steps; evaluating a large test split after each of
  them would cost more than the training);
- mixup: 0.1, BiT's alpha, at every size. BiT turns it off under 20k images; measured on CIFAR-10's halves
  (``reproduction/cifar10-transfer/``: 500 and 2,500 labelled images, a ResNet-20 from the other five classes)
  it adds 0.4 points at 500 images and changes nothing at 2,500 (mean of 2 seeds). With mixup on the
  TensorFlow backend's default pipeline the run takes ``--pipeline device`` (the labels are mixed on the host);
- a new head starts from the linear probe (``head_init="probe"``: fitted in closed form on the frozen features
  before the first step) and every layer trains from the first step (``head_fraction=0``): LP-FT, Kumar et al.
  2022, "Fine-Tuning can Distort Pretrained Features" (a random head's first gradients move the features it
  needs; BiT trains every layer from a zero head);
- the all-layers rate after the probe: halved when the probe already classifies 99% or more of the training images
  right (``probe_rate_rule``, ``keras_preact.models.finetune.rate_after_probe``: such features leave that phase
  little to learn and much to overfit), unless ``--lr`` is given; said in one line after the probe;
- frozen BN in the all-layers phase: the fine-tuning rule, ``--freeze-norm auto``
  (``keras_preact.models.finetune.freeze_norm_rule``: a batch under 64 or under 20k images), whatever the recipe.

Flags given on the command line win over the rule (``apply(..., given=...)``); the line printed says what the
run will do, and which flags were given.
"""

import dataclasses
import math

SMALL, MEDIUM = 20_000, 500_000  # BiT's dataset sizes
STEPS = {"small": (500, 100), "medium": (10_000, 500), "large": (20_000, 500)}  # (steps, warm-up)
SMALL_IMAGE = 96 * 96  # BiT: images with fewer pixels are upsampled
BIT_SMALL_CROP = 128
MIXUP_ALPHA = 0.1
EVALUATIONS = 10  # the most held-out evaluations along the schedule (one per "epoch" of steps_per_epoch steps)


@dataclasses.dataclass(frozen=True)
class Plan:
    """What ``--recipe auto`` chose: the config fields."""

    fields: dict


def plan(config, num_images, image_size):
    """The ``Plan`` for ``num_images`` training images of ``image_size`` (height, width) pixels."""
    kind = "small" if num_images < SMALL else "medium" if num_images < MEDIUM else "large"
    steps, warmup = STEPS[kind]
    own = tuple(config.image_size)
    small_images = image_size[0] * image_size[1] < SMALL_IMAGE
    size = (BIT_SMALL_CROP,) * 2 if config.architecture == "imagenet" and small_images else own
    mixup = MIXUP_ALPHA
    steps_per_epoch = max(1, num_images // config.batch_size, math.ceil(steps / EVALUATIONS))
    fields = dict(steps=steps, epochs=None, steps_per_epoch=steps_per_epoch, total_steps=steps,
                  reference_batch_size=config.batch_size, warmup_steps=warmup, warmup_lr=config.base_lr / 10,
                  boundaries=(), image_size=size, mixup=mixup, head_init="probe", head_fraction=0.0,
                  probe_rate_rule=True)
    return Plan(fields)


def apply(config, num_images, image_size, given=()):
    """(``config`` with the plan's fields, except those ``given``; the line that says what the run will do)."""
    from . import schedules

    chosen = plan(config, num_images, image_size)
    length = {"steps", "epochs", "steps_per_epoch", "total_steps"}
    fields = {k: v for k, v in chosen.fields.items()
              if k not in given and not (k in length and length & set(given))}
    if "base_lr" in given:  # a rate given is the rate trained at
        fields.pop("probe_rate_rule", None)
    if fields.get("mixup") and config.pipeline == "auto":
        fields["pipeline"] = "device"
    config = config.replace(**fields)
    resolved = schedules.resolve(config, num_images)
    kept = sorted(set(given) & set(chosen.fields))
    head = "from a linear probe" if config.head_init == "probe" else "random"
    line = (f"[recipe] auto: {num_images:,} images of {image_size[0]}x{image_size[1]}: {resolved.total_steps} steps at "
            f"{config.image_size[0]} px (warm-up {resolved.warmup_steps}, evaluated every {resolved.steps_per_epoch}), "
            f"mixup {config.mixup or 'off'}, head {head}, BN {'frozen' if resolved.freeze_norm else 'trained'}"
            + (" in phase 2" if config.head_fraction else "") + " (BiT's HyperRule"
            + (f"; given: {', '.join('--' + k.replace('_', '-') for k in kept)})" if kept else ")"))
    return config, line
