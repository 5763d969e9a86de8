"""The fine-tuning guide's library recipe (docs/fine-tuning.md, "The recipe") on 3 CIFAR-10 classes (airplane, cat,
ship): the first 300 training images of each, all 3,000 test images of those classes. The new head fitted in
closed form on the frozen features (``levers.linear_probe``), then every layer for 500 steps of batch 64 (SGD
Nesterov 0.9, warm-up 100 steps from a tenth of the peak rate to it, cosine to 0, the peak 0.01 halved by
``rate_after_probe`` when the probe is right on 99% of the training images or more, weight decay, label smoothing
0.1, mixup 0.1, then flips and whole-pixel shifts),
the batch-norm layers frozen by the rule (``freeze_norm_rule``: frozen on 900 images), or training
(``--no-freeze``): the app's ``finetune-folder --recipe auto`` written with the library and Keras.
Prints one JSON line: test top-1 of the probed head and after the all-layers phase.

    python reproduction/finetune-three-classes/run.py CIFAR10_JPEG_DIR --seed 0 [--no-freeze]
"""

import argparse
import json
import pathlib
import time

import numpy as np
from PIL import Image

CLASSES = ["airplane", "cat", "ship"]
STEPS, WARMUP, BATCH = 500, 100, 64


def load(root, split, count):
    """(float32 images 0-255, labels) of the first ``count`` files of each class in ``root/split``."""
    images, labels = [], []
    for label, name in enumerate(CLASSES):
        files = sorted((pathlib.Path(root) / split / name).iterdir())[:count]
        images += [np.asarray(Image.open(f).convert("RGB")) for f in files]
        labels += [label] * len(files)
    return np.stack(images).astype("float32"), np.asarray(labels)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", help="the CIFAR-10 JPEG folder (train/<class>/NNNN.jpg, test/<class>/NNNN.jpg)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-freeze", action="store_true", help="the batch-norm layers train in phase 2")
    args = parser.parse_args()
    import keras

    from keras_preact.applications import preprocess_input
    from keras_preact.models import create_model, finetune, levers, set_trainable

    train_x, train_y = load(args.data, "train", 300)
    test_x, test_y = load(args.data, "test", 1000)
    keras.utils.set_random_seed(args.seed)
    started = time.time()
    model = create_model("cifar_resnet20", weights="cifar10", class_names=CLASSES)
    x, test = preprocess_input(train_x, model), preprocess_input(test_x, model)
    levers.linear_probe(model, x, train_y)  # 1. the new head in closed form on the frozen features
    model.compile(metrics=["accuracy"], loss="sparse_categorical_crossentropy")
    head = model.evaluate(test, test_y, batch_size=250, verbose=0, return_dict=True)["accuracy"]
    right = float(np.mean(np.argmax(model.predict(x, verbose=0), axis=-1) == train_y))  # the probe, on its images
    peak = finetune.rate_after_probe(0.01, right)  # halved: the features already separate the training images
    freeze = False if args.no_freeze else finetune.freeze_norm_rule(batch_size=BATCH, num_images=len(train_y))
    set_trainable(model, "stem", freeze_norm=freeze)  # 2. every layer from the probed head
    schedule = keras.optimizers.schedules.CosineDecay(peak / 10, STEPS - WARMUP, warmup_target=peak,
                                                      warmup_steps=WARMUP)
    # Keras' decoupled decay of 1e-3 shrinks the weights as the app's coupled 1e-4 does under momentum 0.9
    model.compile(keras.optimizers.SGD(schedule, momentum=0.9, nesterov=True, weight_decay=1e-3),
                  keras.losses.CategoricalCrossentropy(label_smoothing=0.1), metrics=["categorical_accuracy"])
    augment = keras.Sequential([keras.layers.RandomFlip("horizontal", seed=args.seed),
                                keras.layers.RandomTranslation(4 / 32, 4 / 32, fill_mode="constant",
                                                               interpolation="nearest", seed=args.seed)])
    mixup = keras.layers.MixUp(alpha=0.1, seed=args.seed)
    rng = np.random.default_rng(args.seed)

    def batches():
        while True:
            order = rng.permutation(len(x))
            for i in range(0, len(order) - BATCH + 1, BATCH):
                idx = order[i:i + BATCH]
                onehot = keras.utils.to_categorical(train_y[idx], len(CLASSES))
                mixed = mixup({"images": x[idx], "labels": onehot}, training=True)  # mixed, then shifted
                images = augment(mixed["images"], training=True)
                yield keras.ops.convert_to_numpy(images), keras.ops.convert_to_numpy(mixed["labels"])

    model.fit(batches(), steps_per_epoch=STEPS, epochs=1, verbose=0)
    model.compile(metrics=["accuracy"], loss="sparse_categorical_crossentropy")
    final = model.evaluate(test, test_y, batch_size=250, verbose=0, return_dict=True)["accuracy"]
    print(json.dumps({"backend": keras.backend.backend(), "seed": args.seed, "freeze_norm": freeze,
                      "probe_train_accuracy": right, "peak_rate": peak, "head": head,
                      "all": final, "seconds": round(time.time() - started, 1)}), flush=True)


if __name__ == "__main__":
    main()
