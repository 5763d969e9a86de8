"""Input pipeline alone vs training step alone, images/s.

    PYTHONPATH=. python benchmarks/train_pipeline_speed.py [--steps 40] [--batch-size 128] [--synthetic]

On the CIFAR-10 JPEG folder (extracted from ../shared/data to a cache dir, decoded once, cached as .npy)
or the built-in synthetic set: the tf.data and numpy training streams (augmentation + normalization)
without a model, ``train_on_batch`` of pre-activation ResNet-20 on one in-memory batch without a
pipeline, and ``model.fit`` on the tf.data stream. If the pipeline is much faster than the step, it is
not the bottleneck.
"""

import argparse
import os
import pathlib
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def images_per_s(batches, batch_size, seconds):
    return batches * batch_size / seconds


def time_stream(stream, steps, batch_size, warmup=3):
    iterator = iter(stream)
    for _ in range(warmup):
        next(iterator)
    start = time.perf_counter()
    for _ in range(steps):
        next(iterator)
    return images_per_s(steps, batch_size, time.perf_counter() - start)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--depth", type=int, default=20)
    p.add_argument("--cache", default=os.path.join("/tmp", "keras_preact_data"))
    p.add_argument("--synthetic", action="store_true", help="use the built-in synthetic set")
    args = p.parse_args()
    if args.steps < 1 or args.batch_size < 1:
        p.error("--steps and --batch-size must be positive")

    import keras
    import numpy as np

    from benchmarks.train_cifar10_folder import extract
    from keras_preact_training.data import pipelines, sources
    from keras_preact_training.recipe import configs, schedules
    from keras_preact_training.recipe import model as model_lib

    if args.synthetic:
        config = configs.get_config("synthetic-resnet8", depth=args.depth, batch_size=args.batch_size)
    else:
        root = extract(args.cache)
        config = configs.get_config(
            "cifar10-folder-resnet20-short", data_dir=str(root), cache_dir=args.cache,
            depth=args.depth, batch_size=args.batch_size,
        )
    data = sources.load(config)
    rows = []
    for kind in ("tf_data", "numpy"):
        stream, _ = pipelines.pipelines(data, config.replace(pipeline=kind), args.batch_size)
        rows.append((f"input pipeline alone ({kind})", time_stream(stream, args.steps, args.batch_size)))

    resolved = schedules.resolve(config, data.train_size)
    _, model = model_lib.build_model(config, data.num_classes, resolved)
    stream, _ = pipelines.pipelines(data, config.replace(pipeline="tf_data"), args.batch_size)
    x, y = next(iter(stream))
    x, y = np.asarray(x), np.asarray(y)
    for _ in range(3):
        model.train_on_batch(x, y)
    start = time.perf_counter()
    for _ in range(args.steps):
        model.train_on_batch(x, y)
    step_rate = images_per_s(args.steps, args.batch_size, time.perf_counter() - start)
    rows.append((f"train step alone (ResNet-{args.depth}, one in-memory batch)", step_rate))

    model.fit(stream, steps_per_epoch=3, epochs=1, verbose=0)  # trace and warm up
    start = time.perf_counter()
    model.fit(stream, steps_per_epoch=args.steps, epochs=1, verbose=0)
    rows.append(("model.fit on the tf.data stream", images_per_s(args.steps, args.batch_size,
                                                                  time.perf_counter() - start)))

    print(f"\nbackend {keras.backend.backend()}, batch {args.batch_size}, {args.steps} steps, "
          f"data {'synthetic' if args.synthetic else 'CIFAR-10 JPEG folder'}\n")
    print("| what | images/s | vs train step |")
    print("|---|---|---|")
    for name, rate in rows:
        print(f"| {name} | {rate:,.0f} | {rate / step_rate:.2f}x |")


if __name__ == "__main__":
    main()
