"""Slowdown of model.fit with TrainingHealthCallback at its default frequency, next to plain fit.

    PYTHONPATH=. python benchmarks/analysis_health_overhead.py [--depth 20] [--steps 200] [--repeats 2]

Same model, data, optimizer and steps; the two configurations alternate (A B A B ...) so load
changes on a shared machine hit both. Prints one row per configuration (median over repeats) and
the callback's own cost split into its one-time setup (graph tracing) and per-measurement time.
"""

import argparse
import statistics
import time

import keras
import numpy as np

from keras_preact.analysis import TrainingHealthCallback
from keras_preact.models import cifar_resnet


class StepTimer(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.start = time.perf_counter()

    def on_train_end(self, logs=None):
        self.seconds = time.perf_counter() - self.start


def trial(args, x, y, with_health):
    keras.utils.clear_session()
    keras.utils.set_random_seed(0)
    model = cifar_resnet(args.depth)
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(x[: args.batch_size * 2], y[: args.batch_size * 2], batch_size=args.batch_size, epochs=1,
              verbose=0)  # compile the train step outside the timing
    timer = StepTimer()
    callbacks = [timer]
    health = None
    if with_health:
        health = TrainingHealthCallback((x[: args.probe], y[: args.probe]), args.every)
        callbacks.insert(0, health)
    model.fit(x, y, batch_size=args.batch_size, epochs=1, shuffle=False, verbose=0, callbacks=callbacks)
    return timer.seconds, health


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--depth", type=int, default=20)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--probe", type=int, default=64, help="probe batch size")
    p.add_argument("--every", type=int, default=100, help="every_n_steps (100: the default)")
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.steps * args.batch_size, 32, 32, 3)).astype("float32")
    y = rng.integers(0, 10, len(x))
    times = {False: [], True: []}
    health = None
    for _ in range(args.repeats):
        for with_health in (False, True):
            seconds, h = trial(args, x, y, with_health)
            times[with_health].append(seconds)
            health = h or health
    # The callback's own cost, measured on the trained model: one measurement and one setup.
    start = time.perf_counter()
    health._setup()
    health._record_probe()
    setup_and_first = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(5):
        health._weights(), health._weights(), health._record_probe()
    per_measurement = (time.perf_counter() - start) / 5

    base, ours = statistics.median(times[False]), statistics.median(times[True])
    print(f"ResNet-{args.depth}, 32x32, batch {args.batch_size}, {args.steps} steps per trial, "
          f"probe batch {args.probe}, every_n_steps={args.every}, {args.repeats} repeats (median)")
    print("| configuration | seconds | ms/step | slowdown |")
    print("|---|---|---|---|")
    print(f"| model.fit (reference) | {base:.1f} | {1000 * base / args.steps:.0f} | — |")
    print(f"| model.fit + TrainingHealthCallback | {ours:.1f} | {1000 * ours / args.steps:.0f} | "
          f"{100 * (ours / base - 1):+.1f}% |")
    print(f"all trials (s): reference {[round(t, 1) for t in times[False]]}, "
          f"with callback {[round(t, 1) for t in times[True]]}")
    step = base / args.steps
    print(f"callback cost: setup + first measurement {setup_and_first:.2f} s (once per fit), "
          f"{1000 * per_measurement:.0f} ms per measurement = {100 * per_measurement / (args.every * step):.2f}% "
          f"of {args.every} training steps")


if __name__ == "__main__":
    main()
