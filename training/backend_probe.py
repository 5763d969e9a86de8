"""``keras-preact-train --measure-backends``: time a few training steps of a run's model on each installed
Keras backend, say which is fastest and how to choose it (``KERAS_BACKEND`` or ``keras.json``).

Asked for, never run by default. The backend Keras loaded in this process is timed here; each other one in a
child process of its own (a backend is fixed per process): ``python -m keras_preact_training.backend_probe``
reads the run's ``Config`` as JSON on stdin (``dataclasses.asdict``) and prints one JSON line. The model is the
run's (``keras_preact_training.recipe.model``), fed synthetic images of the run's size and batch; the warm-up
steps (compilation) are not timed; the figure is the median ms/step.

Examples::

    keras-preact-train --depth 8 --image-size 16 16 --measure-backends
    # [measure] torch 41 ms/step, jax 55, tensorflow 60 (ResNet-8, batch 128; 5 steps after 2 untimed)
    # [measure] fastest: torch; to train on it: KERAS_BACKEND=torch keras-preact-train ... (or "backend": ...)
"""

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time

from .machine import backends

MEASURE_STEPS = 5  # timed training steps per backend (--measure-steps)
MEASURE_WARMUP_STEPS = 2  # untimed first steps: compilation, allocator warm-up
MEASURE_TIMEOUT_S = 600
INVALID_CONFIG = 2  # the child's exit status where the config on stdin is invalid (its ValueError, one line)


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


def run_child(backend, config, steps, warmup, timeout=MEASURE_TIMEOUT_S):
    """(ms/step, None) of ``backend`` on ``config`` timed in a child process, or (None, why) when it gave none."""
    env = {**os.environ, "KERAS_BACKEND": backend}
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    command = [
        sys.executable,
        "-m",
        "keras_preact_training.backend_probe",
        "--steps",
        str(steps),
        "--warmup",
        str(warmup),
    ]
    payload = json.dumps(dataclasses.asdict(config))
    try:
        done = subprocess.run(command, input=payload, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout} s"
    if done.returncode != 0:
        return None, f"exit {done.returncode}: {(done.stderr.strip().splitlines() or ['no message'])[-1][:200]}"
    try:
        return float(json.loads(done.stdout.strip().splitlines()[-1])["ms_per_step"]), None
    except (IndexError, ValueError, KeyError):
        return None, f"no result line in its output: {done.stdout[-200:]!r}"


def _time_each(names, time_one):
    """({backend: ms/step}, {backend: why it gave none}) of ``time_one(backend) -> (ms or None, why)``."""
    figures, failed = {}, {}
    for backend in names:
        ms, why = time_one(backend)
        if ms is None:
            failed[backend] = why
        else:
            figures[backend] = ms
    return figures, failed


def measure(config, steps=MEASURE_STEPS, warmup=MEASURE_WARMUP_STEPS, child=run_child):
    """({backend: ms/step}, {backend: why it failed}) for every installed backend: the one Keras loaded here
    in this process, the others through ``child``."""
    import keras

    here = keras.backend.backend()

    def time_one(backend):
        if backend == here:
            return median_step_ms(config, steps, warmup)[0], None
        return child(backend, config, steps, warmup)

    return _time_each([here, *(b for b in backends.BACKENDS if b != here and backends.installed(b))], time_one)


def measure_in_children(config, steps=MEASURE_STEPS, warmup=MEASURE_WARMUP_STEPS, child=run_child):
    """``measure`` before Keras loads (``--backend fastest``): every installed backend timed in a child process,
    the quickest to start first. The children check ``config``: ValueError with the first one's message where it
    is invalid (exit ``INVALID_CONFIG``), the other backends not started."""

    def time_one(backend):
        ms, why = child(backend, config, steps, warmup)
        if ms is None and why.startswith(f"exit {INVALID_CONFIG}: "):
            raise ValueError(why.split(": ", 1)[1])
        return ms, why

    present = [b for b in backends.QUICKEST_IMPORT_FIRST if backends.installed(b)]
    return _time_each(present if len(present) > 1 else (), time_one)  # one installed: nothing to choose between


def report(config, figures, failed, steps, warmup):
    """The lines ``--measure-backends`` prints: the figures (fastest first), the failures, the choice and how to
    make it."""
    ranked = sorted(figures.items(), key=lambda item: item[1])
    numbers = ", ".join(f"{name} {ms:.0f}" + (" ms/step" if i == 0 else "") for i, (name, ms) in enumerate(ranked))
    lines = [f"[measure] {numbers} ({config.architecture} ResNet-{config.depth}, image {config.image_size[0]}x"
             f"{config.image_size[1]}, batch {config.batch_size}; median of {steps} steps after {warmup} untimed)"]
    lines += [f"[measure] {name} failed: {why}" for name, why in failed.items()]
    if ranked:
        fastest = ranked[0][0]
        lines.append(f"[measure] fastest: {fastest}; to train on it: KERAS_BACKEND={fastest} keras-preact-train ..., "
                     f"or \"backend\": \"{fastest}\" in ~/.keras/keras.json (every Keras program), or --backend "
                     f"{fastest} for one run (--backend fastest measures, then trains on the fastest)")
    return lines


def main(argv=None):
    """The child: the ``Config`` (JSON) on stdin, timed on this process's backend; one JSON line out."""
    import argparse

    parser = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="python -m keras_preact_training.backend_probe",
        description="Time training steps of the run config on stdin (JSON) on KERAS_BACKEND.",
    )
    parser.add_argument("--steps", type=int, default=MEASURE_STEPS, help="timed steps")
    parser.add_argument("--warmup", type=int, default=MEASURE_WARMUP_STEPS, help="untimed steps first (compilation)")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.warmup < 0:
        parser.error(f"--steps {args.steps} --warmup {args.warmup}: at least 1 and 0 are required")
    import keras

    from .recipe import configs

    try:  # a ValueError names the argument at fault (the config's checks, the model's builder)
        config = configs.from_dict(json.loads(sys.stdin.read()), "the run config on stdin")
        backends.xla_flags_for_remat(keras.backend.backend(), config.remat)
        ms, pipeline = median_step_ms(config, args.steps, args.warmup)
    except ValueError as error:
        print(str(error).strip().splitlines()[0] if str(error).strip() else repr(error), file=sys.stderr)
        return INVALID_CONFIG
    print(
        json.dumps({"backend": keras.backend.backend(), "ms_per_step": ms, "pipeline": pipeline, "steps": args.steps}),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
