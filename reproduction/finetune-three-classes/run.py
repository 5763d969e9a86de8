"""The fine-tuning guide's two-phase library recipe (docs/fine-tuning.md) on 3 CIFAR-10 classes (airplane, cat,
ship): the first 300 training images of each, all 3,000 test images of those classes. Phase 2 with the batch-norm
rule (``freeze_norm_rule``: frozen at batch 32 on 900 images), or with the statistics training (``--no-freeze``).
Prints one JSON line: test top-1 after the head phase and after the all-layers phase.

    python reproduction/finetune-three-classes/run.py CIFAR10_JPEG_DIR --seed 0 [--no-freeze]
"""

import argparse
import json
import pathlib
import time

import numpy as np
from PIL import Image

CLASSES = ["airplane", "cat", "ship"]


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
    from keras_preact.models import create_model, finetune, set_trainable

    train_x, train_y = load(args.data, "train", 300)
    test_x, test_y = load(args.data, "test", 1000)
    keras.utils.set_random_seed(args.seed)
    started = time.time()
    model = create_model("cifar_resnet20", weights="cifar10", class_names=CLASSES, trainable_from="head")
    x, test = preprocess_input(train_x, model), preprocess_input(test_x, model)
    model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(x, train_y, batch_size=32, epochs=5, verbose=0)
    head = model.evaluate(test, test_y, batch_size=250, verbose=0, return_dict=True)["accuracy"]
    freeze = False if args.no_freeze else finetune.freeze_norm_rule(batch_size=32, num_images=len(train_y))
    set_trainable(model, "stem", freeze_norm=freeze)
    model.compile(keras.optimizers.Adam(1e-5), "sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(x, train_y, batch_size=32, epochs=5, verbose=0)
    final = model.evaluate(test, test_y, batch_size=250, verbose=0, return_dict=True)["accuracy"]
    print(json.dumps({"backend": keras.backend.backend(), "seed": args.seed, "freeze_norm": freeze, "head": head,
                      "all": final, "seconds": round(time.time() - started, 1)}), flush=True)


if __name__ == "__main__":
    main()
