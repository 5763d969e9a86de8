"""Time a few training steps of a run's model on this process's Keras backend (``KERAS_BACKEND``).

``--backend auto`` (``training/machine/backends.py``) runs this once per installed backend, each in its own
process (a backend is fixed per process): the model is the run's, built by ``keras_preact_training.recipe.model`` from
the same ``keras-preact-train`` flags, fed synthetic images of the run's size and batch; the warm-up steps
(compilation) are not timed; the last line printed is one JSON object with the median ms/step.
With ``--steps 0`` it builds nothing and prints only the model-defining config fields (the cache key).

Usage::

    KERAS_BACKEND=torch python -m keras_preact_training.backend_probe --steps 5 -- --depth 8 --image-size 16 16
"""

import argparse
import json
import statistics
import sys
import time

# The Config fields that decide how fast a training step is: the backend probe's cache key.
MODEL_FIELDS = ("architecture", "depth", "unit_options", "drop_path_rate", "remat", "image_size", "batch_size",
                "augmentation", "normalization", "pipeline", "precision", "jit_compile", "steps_per_execution",
                "distribute", "synthetic_num_classes")


def model_fields(config):
    """The ``MODEL_FIELDS`` of ``config`` as JSON values, e.g. ``{"depth": 8, "image_size": [16, 16], ...}``."""
    return json.loads(json.dumps({name: getattr(config, name) for name in MODEL_FIELDS}, default=list))


def num_classes_of(config):
    """The classes the run's last layer will have (the data is not read here): its size barely moves a step."""
    if config.architecture == "imagenet":
        return 1000
    if config.dataset == "synthetic":
        return config.synthetic_num_classes
    return 100 if "100" in f"{config.dataset} {config.normalization}" else 10


def median_step_ms(config, steps, warmup):
    """Median ms of ``steps`` calls of ``train_on_batch`` after ``warmup`` untimed ones, on the model and
    input the run would use (``pipeline="device"``: uint8 images normalized in the step; else float)."""
    import keras
    import numpy as np

    from .data import pipelines, sources
    from .recipe import schedules
    from .recipe.model import build_model

    keras.config.set_dtype_policy(config.precision)
    keras.utils.set_random_seed(config.seed)
    num_classes = num_classes_of(config)
    pipeline = pipelines.resolve_pipeline(config)
    batch = config.batch_size
    resolved = schedules.resolve(config, batch * (steps + warmup))
    stats_data = sources.synthetic(batch, batch, num_classes=num_classes, image_size=tuple(config.image_size))
    mean, std = pipelines.pixel_stats(config, stats_data)
    rng = np.random.default_rng(config.seed)
    images = rng.integers(0, 256, (batch, *config.image_size, 3)).astype("uint8")
    if pipeline == "device":
        _, model = build_model(config, num_classes, resolved, pipeline="device", mean=mean, std=std)
    else:
        _, model = build_model(config, num_classes, resolved, pipeline=pipeline)
        images = ((images.astype("float32") - mean) / std).astype("float32")
    labels = rng.integers(0, num_classes, (batch,)).astype("int32")
    times = []
    for step in range(warmup + steps):
        start = time.perf_counter()
        model.train_on_batch(images, labels)  # returns host floats: the step has finished
        if step >= warmup:
            times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times), pipeline


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    own, train_argv = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(prog="python -m keras_preact_training.backend_probe",
                                     description="Time training steps of a run's model on KERAS_BACKEND.")
    parser.add_argument("--steps", type=int, default=5, help="timed steps (0: print the model fields only)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (compilation)")
    args = parser.parse_args(own)
    if args.steps < 0 or args.warmup < 0:
        parser.error(f"--steps {args.steps} --warmup {args.warmup}: both must be 0 or more")
    from .machine import backends, start_up

    start_up.quiet_tensorflow_start_up()
    from . import cli

    train_parser = cli.build_parser()
    config = cli.config_from_args(train_parser.parse_args(train_argv), train_parser)
    import keras

    result = {"backend": keras.backend.backend(), "model": model_fields(config)}
    if args.steps:
        backends.xla_flags_for_remat(result["backend"], config.remat)
        result["ms_per_step"], result["pipeline"] = median_step_ms(config, args.steps, args.warmup)
        result["steps"] = args.steps
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
