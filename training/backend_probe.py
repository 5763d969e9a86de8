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
import select
import statistics
import subprocess
import sys
import tempfile
import time

from .machine import backends

MEASURE_STEPS = 5  # timed training steps per backend (--measure-steps)
MEASURE_WARMUP_STEPS = 2  # untimed first steps: compilation, allocator warm-up
MEASURE_TIMEOUT_S = 600
ROUNDS = 2  # --backend fastest: timed rounds per backend, taken in turn (A B A B)
NOISE_FRACTION = 0.1  # the fastest two closer than this are said to be within the noise
START_SECONDS = {"tensorflow": 30, "jax": 15, "torch": 15}  # a child's import and first steps, quiet 2-core CPU
INVALID_CONFIG = 2  # the child's exit status where the config on stdin is invalid (its ValueError, one line)


def num_classes_of(config):
    """The classes the run's last layer will have (the data is not read here): its size barely moves a step."""
    if config.architecture == "imagenet":
        return 1000
    if config.dataset == "synthetic":
        return config.synthetic_num_classes
    return 100 if "100" in f"{config.dataset} {config.normalization}" else 10


def step_timer(config, warmup):
    """(timer, pipeline): the run's model and input built and ``warmup`` untimed ``train_on_batch`` calls made;
    ``timer(steps)`` is then the median ms of ``steps`` more (``pipeline="device"``: uint8 images normalized in the
    step; else float)."""
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
    resolved = schedules.resolve(config, batch * (MEASURE_STEPS + warmup))
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
    for _ in range(warmup):
        model.train_on_batch(images, labels)

    def timer(steps):
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            model.train_on_batch(images, labels)  # returns host floats: the step has finished
            times.append((time.perf_counter() - start) * 1000)
        return statistics.median(times)

    return timer, pipeline


def median_step_ms(config, steps, warmup):
    """(median ms of ``steps`` calls of ``train_on_batch`` after ``warmup`` untimed ones, pipeline), on the model
    and input the run would use (``step_timer``)."""
    timer, pipeline = step_timer(config, warmup)
    return timer(steps), pipeline


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


class ChildPool:
    """A child process per backend (``python -m keras_preact_training.backend_probe --rounds N``), all started at
    once: each imports Keras, builds the run's model, takes its untimed steps and says it is ready; then
    ``time_round(backend, ...)`` has one of them time its steps while the others wait, so that no child's start
    runs beside a timed round. ``time_round`` is ``measure_in_children``'s ``child``."""

    def __init__(self, names, config, steps, warmup, rounds, timeout=MEASURE_TIMEOUT_S):
        self.timeout, self.processes, self.errors, self.gone, self.ready = timeout, {}, {}, {}, False
        self.starting = list(names)  # not yet ready
        env = {**os.environ}
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        payload = json.dumps(dataclasses.asdict(config)) + "\n"
        for backend in names:
            self.errors[backend] = tempfile.TemporaryFile("w+")
            self.processes[backend] = subprocess.Popen(
                [sys.executable, "-m", "keras_preact_training.backend_probe", "--steps", str(steps), "--warmup",
                 str(warmup), "--rounds", str(rounds)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=self.errors[backend], text=True, env={**env, "KERAS_BACKEND": backend})
            self.processes[backend].stdin.write(payload)
            self.processes[backend].stdin.flush()

    def _reply(self, backend):
        """The child's next JSON line, or None with why in ``self.gone`` (its exit and last line, or the timeout)."""
        process = self.processes[backend]
        if backend not in self.gone:
            readable, _, _ = select.select([process.stdout], [], [], self.timeout)
            line = process.stdout.readline() if readable else None
            if line:
                return json.loads(line)
            if line is None:
                process.kill()
                self.gone[backend] = f"timed out after {self.timeout} s"
            else:
                process.wait()
                self.errors[backend].seek(0)
                last = (self.errors[backend].read().strip().splitlines() or ["no message"])[-1][:200]
                self.gone[backend] = f"exit {process.returncode}: {last}"
        return None

    def time_round(self, backend, config, steps, warmup):
        """(ms/step, None) of one round of ``backend``'s steps, or (None, why); the first call waits until every
        child is ready, or one finds the config invalid."""
        while not self.ready and self.starting:
            name = self.starting[0]
            self._reply(name)
            self.starting.pop(0)
            self.ready = self.gone.get(name, "").startswith(f"exit {INVALID_CONFIG}: ")
        self.ready = True
        if backend not in self.gone:
            try:
                self.processes[backend].stdin.write("go\n")
                self.processes[backend].stdin.flush()
            except OSError:
                pass  # the child has gone: _reply says how
        reply = self._reply(backend)
        return (float(reply["ms_per_step"]), None) if reply else (None, self.gone[backend])

    def close(self):
        for backend, process in self.processes.items():
            if backend in self.starting:  # stopped before it was ready: nothing to wait for
                process.kill()
            try:
                process.stdin.close()
                process.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                process.kill()
                process.wait()
            process.stdout.close()
            self.errors[backend].close()


def rough_seconds(config, names, steps, warmup, rounds):
    """About how long ``measure_in_children`` takes on a quiet machine: the slowest backend's start, then every
    step, each guessed from a ResNet-8 step at batch 128 on 32x32 images on a 2-core CPU (about 0.15 s)."""
    size = config.depth / 8 * config.batch_size / 128 * config.image_size[0] * config.image_size[1] / 1024
    scale = 50 if config.architecture == "imagenet" else 1
    return max(START_SECONDS.get(b, 15) for b in names) + len(names) * (warmup + rounds * steps) * 0.15 * size * scale


def within_noise(times):
    """Whether the fastest two of ``times`` ({backend: [ms or s of each round]}) are within the noise of each
    other: the runner-up's best round is not slower than the fastest's slowest, or by under ``NOISE_FRACTION``.

    Examples:
        >>> within_noise({"torch": [41.0, 48.0], "jax": [45.0, 52.0]})  # the rounds overlap
        True
        >>> within_noise({"torch": [41.0, 42.0], "tensorflow": [60.0, 61.0]})
        False
    """
    ranked = sorted(times.items(), key=lambda item: min(item[1]))
    if len(ranked) < 2:
        return False
    (_, first), (_, second) = ranked[:2]
    return min(second) <= max(first) or min(second) < min(first) * (1 + NOISE_FRACTION)


def _plan_line(config, names, steps, warmup, rounds):
    order = " ".join(names)
    return (f"[measure] timing {', '.join(names)} on {config.architecture} ResNet-{config.depth} (image "
            f"{config.image_size[0]}x{config.image_size[1]}, batch {config.batch_size}) to train on the fastest: "
            f"each started in a child process, {warmup} untimed steps, then {rounds} rounds of {steps} timed steps "
            f"taken in turn ({' | '.join([order] * rounds)}); about "
            f"{rough_seconds(config, names, steps, warmup, rounds):.0f} s on a quiet machine")


def _round_line(index, rounds, times, seconds):
    figures = ", ".join(f"{name} {ms[index]:.0f}" for name, ms in times.items() if len(ms) > index)
    return f"[measure] round {index + 1}/{rounds}: {figures or 'no figures'} ms/step ({seconds:.0f} s)"


def _noise_line(times):
    ranked = sorted(times.items(), key=lambda item: min(item[1]))
    (first, a), (second, b) = ranked[:2]
    return (f"[measure] {first} and {second} are within the noise of each other ({first} {min(a):.0f}-{max(a):.0f} "
            f"ms/step over the rounds, {second} {min(b):.0f}-{max(b):.0f}): either trains about as fast here; taking "
            f"{first}")


def measure_in_children(config, steps=MEASURE_STEPS, warmup=MEASURE_WARMUP_STEPS, child=None, rounds=ROUNDS,
                        say=None):
    """``measure`` before Keras loads (``--backend fastest``): every installed backend timed in a child process,
    ``rounds`` rounds taken in turn (A B A B), each backend's figure its best round. What it does is said
    (``say``, default print) before it starts, each round's figures as they come, and whether the fastest two are
    within the noise (``within_noise``). ``child(backend, config, steps, warmup) -> (ms or None, why)`` times
    one round (default: a ``ChildPool``). The children check ``config``: ValueError with the first one's message
    where it is invalid (exit ``INVALID_CONFIG``), the other backends not timed."""
    say = say or (lambda line: print(line, flush=True))
    present = [b for b in backends.QUICKEST_IMPORT_FIRST if backends.installed(b)]
    if len(present) < 2:  # one installed: nothing to choose between
        return {}, {}
    say(_plan_line(config, present, steps, warmup, rounds))
    pool = ChildPool(present, config, steps, warmup, rounds) if child is None else None
    times, failed = {b: [] for b in present}, {}
    try:
        for index in range(rounds):
            start = time.monotonic()
            for backend in (b for b in present if b not in failed):
                ms, why = (pool.time_round if pool else child)(backend, config, steps, warmup)
                if ms is None and why.startswith(f"exit {INVALID_CONFIG}: "):
                    raise ValueError(why.split(": ", 1)[1])
                if ms is None:
                    failed[backend] = why
                else:
                    times[backend].append(ms)
            say(_round_line(index, rounds, times, time.monotonic() - start))
    finally:
        if pool:
            pool.close()
    times = {b: ms for b, ms in times.items() if ms and b not in failed}
    if within_noise(times):
        say(_noise_line(times))
    return {b: min(ms) for b, ms in times.items()}, failed


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
    parser.add_argument("--rounds", type=int, default=1,
                        help="rounds of --steps: above 1, the child says it is ready after the untimed steps, then "
                        "times a round for each line 'go' on stdin (ChildPool)")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.warmup < 0 or args.rounds < 1:
        parser.error(f"--steps {args.steps} --warmup {args.warmup} --rounds {args.rounds}: at least 1, 0 and 1 are "
                     "required")
    import keras

    from .recipe import configs

    try:  # a ValueError names the argument at fault (the config's checks, the model's builder)
        config = configs.from_dict(json.loads(sys.stdin.readline()), "the run config on stdin")
        backends.xla_flags_for_remat(keras.backend.backend(), config.remat)
        timer, pipeline = step_timer(config, args.warmup)
    except ValueError as error:
        print(str(error).strip().splitlines()[0] if str(error).strip() else repr(error), file=sys.stderr)
        return INVALID_CONFIG
    if args.rounds > 1:
        print(json.dumps({"ready": True}), flush=True)
    for _ in range(args.rounds):
        if args.rounds > 1 and not sys.stdin.readline():
            return 0  # the parent stopped the measurement
        figures = {"backend": keras.backend.backend(), "ms_per_step": timer(args.steps), "pipeline": pipeline}
        print(json.dumps({**figures, "steps": args.steps}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
