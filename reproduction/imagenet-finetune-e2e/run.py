"""One ImageNet-family network end to end through the apps: a random timm-format resnetv2_18 checkpoint, fine-tuned
for one epoch at 224 x 224 on a small CIFAR-10 folder (keras-preact-train, preset finetune-folder), exported
(SavedModel), served (keras-preact-serve) and queried over REST with JPEGs; served top-1 against model.predict.

Usage (from the repository root, TensorFlow installed, safetensors installed):
    python reproduction/imagenet-finetune-e2e/run.py --cifar-dir /tmp/cifar10-jpeg --work /tmp/imagenet-e2e
Writes results.json, results.md and log excerpts next to this file; the checkpoint, data folder (symlinks),
run directory and export stay under --work.
"""

import argparse
import base64
import json
import os
import platform
import re
import subprocess
import sys
import sysconfig
import time
import urllib.request
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CLASSES = ("airplane", "automobile", "bird", "cat", "deer")
TRAIN_PER_CLASS, TEST_PER_CLASS, QUERIES = 40, 20, 10


def make_folder(cifar, out):
    """train/ and test/ of CLASSES: the first TRAIN_PER_CLASS / TEST_PER_CLASS images of each, as symlinks."""
    for split, count in (("train", TRAIN_PER_CLASS), ("test", TEST_PER_CLASS)):
        for name in CLASSES:
            folder = out / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for source in sorted((cifar / split / name).iterdir())[:count]:
                link = folder / source.name
                if not link.exists():
                    link.symlink_to(source)
    return out


def write_checkpoint(folder):
    """A random timm resnetv2_18 (ImageNet-1k head) as timm's hub folder: config.json + model.safetensors."""
    sys.path.insert(0, str(ROOT / "tests"))
    import pretrained_reference as ref
    from test_pretrained_convert import write_timm_folder

    return write_timm_folder(folder, "resnetv2_18", ref.random_state(18, num_classes=1000, seed=0))


NOISE = ("I0000 ", "W0000 ", "E0000 ", "WARNING: All log messages", "To enable the following instructions")


def clean(log, work):
    """The log without TensorFlow's start-up lines (CUDA probing, CPU features), paths shortened."""
    lines = Path(log).read_text().splitlines(keepends=True)
    text = "".join(line for line in lines if not line.startswith(NOISE))
    Path(log).write_text(
        text.replace(str(work), "$WORK").replace(sysconfig.get_paths()["purelib"] + "/", "<site-packages>/")
    )


def timed(command, log, work):
    print("$", " ".join(command), flush=True)
    start = time.monotonic()
    with open(log, "w") as out:
        code = subprocess.call(command, stdout=out, stderr=subprocess.STDOUT)
    seconds = time.monotonic() - start
    clean(log, work)
    if code:
        sys.exit(f"{command[0]} exited {code}; see {log}")
    return round(seconds, 1)


def serve_and_query(model_dir, images, log, work):
    """keras-preact-serve on a free port; one REST predict with the JPEGs as b64; the server stopped (SIGTERM)."""
    out = open(log, "w")
    server = subprocess.Popen(["keras-preact-serve", str(model_dir), "--port", "0", "--host", "127.0.0.1"],
                              stdout=subprocess.PIPE, stderr=out, text=True)
    start = time.monotonic()
    try:
        line = server.stdout.readline()
        out.write(line)
        url = re.search(r"at (http://\S+)", line).group(1)
        while True:  # ready once loaded and warmed up
            try:
                with urllib.request.urlopen(url.split("/v1/")[0] + "/v2/health/ready", timeout=5) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                time.sleep(1)
        ready = time.monotonic() - start
        body = {"signature_name": "serving_bytes",
                "instances": [{"b64": base64.b64encode(path.read_bytes()).decode()} for path in images]}
        request = urllib.request.Request(
            url + ":predict", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=120) as reply:
            predictions = json.loads(reply.read())["predictions"]
    finally:
        server.terminate()
        code = server.wait(60)
        out.write(server.stdout.read())
        out.close()
        clean(log, work)
    return predictions, round(ready, 1), code, url


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cifar-dir", type=Path, default=Path("/tmp/cifar10-jpeg"))
    parser.add_argument("--work", type=Path, default=Path("/tmp/imagenet-e2e"))
    parser.add_argument("--backend", default="tensorflow")
    args = parser.parse_args()
    work = args.work.resolve()
    started, load = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), os.getloadavg()
    data = make_folder(args.cifar_dir, work / "cifar5")
    checkpoint = write_checkpoint(work / "resnetv2_18-random")
    run_dir, export_dir = work / "run", work / "saved_models"
    train = ["keras-preact-train", "finetune-folder", "--backend", args.backend, "--architecture", "imagenet",
             "--depth", "18", "--image-size", "224", "224", "--init-weights", str(checkpoint), "--data-dir", str(data),
             "--augmentation", "imagenet", "--epochs", "1", "--batch-size", "20", "--run-dir", str(run_dir),
             "--export", "--export-dir", str(export_dir), "--verbose", "2"]
    train_s = timed(train, HERE / "train.log", work)
    model_dir = next(p for p in export_dir.iterdir() if p.is_dir())

    queries = [sorted((data / "test" / name).iterdir())[i] for i in range(QUERIES // len(CLASSES)) for name in CLASSES]
    predictions, ready_s, serve_code, url = serve_and_query(model_dir, queries, HERE / "serve.log", work)

    os.environ["KERAS_BACKEND"] = args.backend
    import keras
    import tensorflow as tf

    from keras_preact.preprocessing import eval_view

    model = keras.saving.load_model(run_dir / "model.keras")
    config = model.input_config
    views = np.stack([eval_view(tf.constant(p.read_bytes()), config).numpy() for p in queries])
    x = (views - np.array(config.mean, np.float32)) / np.array(config.std, np.float32)
    probabilities = model.predict(x, verbose=0)
    local_top1 = [model.class_names[i] for i in probabilities.argmax(1)]
    served_top1 = [p["class_names"][0] if isinstance(p["class_names"][0], str) else p["class_names"][0].decode()
                   for p in predictions]
    served_p = np.array([p["probabilities"] for p in predictions])
    served_top5 = [[int(c) for c in p["classes"]] for p in predictions]
    predict_top5 = [[int(c) for c in np.argsort(-row, kind="stable")[:5]] for row in probabilities]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    result = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs (2-core AMD EPYC, AVX2 only; "
        "loaded by the project's CI and other sessions)",
        "load_average_at_start": [round(x, 2) for x in load],
        "started": started,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "backend": args.backend,
        "versions_used": {
            "python": platform.python_version(),
            "keras": keras.__version__,
            "tensorflow": tf.__version__,
        },
        "checkpoint": "random timm resnetv2_18 (1000 classes), timm hub folder: config.json + model.safetensors",
        "data": f"{len(CLASSES)} CIFAR-10 classes x {TRAIN_PER_CLASS} train / {TEST_PER_CLASS} test JPEGs (32 x 32)",
        "train_command": " ".join(train).replace(str(work), "$WORK"),
        "train_wall_s": train_s,
        "test_metrics": metrics,
        "model_dir": model_dir.name,
        "versions": sorted(p.name for p in model_dir.iterdir()),
        "serve_ready_s": ready_s,
        "serve_exit_code": serve_code,
        "queries": [str(p.relative_to(data)) for p in queries],
        "served_top1": served_top1,
        "predict_top1": local_top1,
        "top1_equal": served_top1 == local_top1,
        "served_top5_classes": served_top5,
        "top5_equal": served_top5 == predict_top5,
        "max_abs_probability_difference": float(np.abs(served_p - probabilities).max()),
    }
    (HERE / "results.json").write_text(json.dumps(result, indent=2).replace(str(work), "$WORK") + "\n")
    print(json.dumps(result, indent=2))
    if not (result["top1_equal"] and result["top5_equal"]):
        sys.exit("served top-1 differs from model.predict")


if __name__ == "__main__":
    main()
