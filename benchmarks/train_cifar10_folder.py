"""Section 7 benchmark: pre-activation ResNet-20 on the CIFAR-10 JPEG folder on CPU, short schedule.

    PYTHONPATH=. python benchmarks/train_cifar10_folder.py [--epochs 15] [--run-dir runs/bench-cifar10]

Extracts ../shared/data/cifar10-jpeg.tar.gz to a cache dir (never into the repo), trains the preset
``cifar10-folder-resnet20-short`` (15 epochs, cosine with warm-up, SGD 0.9, wd 1e-4, pad-4 crop + flip),
prints test accuracy and wall time next to the paper's ResNet-20 reference (8.75% error at 64k
iterations, original ResNet paper Table 6).
"""

import argparse
import os
import pathlib
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
ARCHIVE = REPO.parent / "shared" / "data" / "cifar10-jpeg.tar.gz"


def extract(cache):
    root = pathlib.Path(cache) / "cifar10-jpeg"
    if not (root / "test").is_dir():
        pathlib.Path(cache).mkdir(parents=True, exist_ok=True)
        subprocess.run(["tar", "xzf", str(ARCHIVE), "-C", str(cache)], check=True)
    return root


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--cache", default=os.path.join("/tmp", "keras_preact_data"))
    p.add_argument("--run-dir", default=str(REPO / "runs" / "bench-cifar10-resnet20"))
    p.add_argument("--subset", type=int)
    args = p.parse_args()

    from keras_preact_training.recipe.configs import get_config
    from keras_preact_training.train import train

    root = extract(args.cache)
    config = get_config(
        "cifar10-folder-resnet20-short", data_dir=str(root), cache_dir=args.cache, epochs=args.epochs,
        batch_size=args.batch_size, run_dir=args.run_dir, subset=args.subset, verbose="2",
    )
    started = time.time()
    metrics = train(config)
    total = time.time() - started
    print("\n| model | data | epochs | iterations | test acc | test error | train wall (s) | total wall (s) |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| pre-act ResNet-20 (ours) | CIFAR-10 JPEG folder | {metrics['epochs']} | {metrics['steps']} | "
          f"{100 * metrics['test_accuracy']:.2f}% | {100 * metrics['test_error']:.2f}% | {metrics['wall_time_s']:.0f} | {total:.0f} |")
    print("| ResNet-20 (He et al. 2015, Table 6) | CIFAR-10 | 182 | 64000 | 91.25% | 8.75% | - | - |")


if __name__ == "__main__":
    main()
