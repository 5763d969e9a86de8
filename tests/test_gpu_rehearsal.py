"""The GPU session, rehearsed on a CPU: the strong PyTorch reference (``benchmarks/reference_torch_strong.py``: the
same networks as ours, augmentation as tensor ops, the recipe's steps) and the one command a lent GPU machine runs
(``benchmarks/gpu/run.sh`` and ``session.py``) at tiny settings, with a fake ``$OUT``."""

import csv
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import tarfile

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # benchmarks/ is not installed
HAS_TORCH = importlib.util.find_spec("torch") is not None
pytestmark = [pytest.mark.notf, pytest.mark.skipif(not HAS_TORCH, reason="the PyTorch reference needs torch")]
HISTORY_COLUMNS = ["epoch", "loss", "accuracy", "val_loss", "val_accuracy", "lr", "train_seconds", "eval_seconds"]


def tiny_tarball(root, per_class=4, test_per_class=2, size=16):
    """A CIFAR-like JPEG folder (10 classes of random 16x16 images) packed as the real tarball is: one top folder."""
    from PIL import Image

    rng = np.random.default_rng(0)
    folder = root / "src" / "tiny-jpeg"
    for split, n in (("train", per_class), ("test", test_per_class)):
        for c in range(10):
            (folder / split / f"class{c}").mkdir(parents=True)
            for i in range(n):
                Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(
                    folder / split / f"class{c}" / f"{i:04d}.jpg")
    tarball = root / "tiny.tar.gz"
    with tarfile.open(tarball, "w:gz") as tar:
        tar.add(folder, arcname="tiny-jpeg")
    return tarball


def run_script(tmp_path, *args, timeout=900):
    """``bash benchmarks/gpu/run.sh ARGS`` as on the lent machine, with this interpreter and a fake $OUT."""
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path / "out"), "GPU_WORK": str(tmp_path / "work"),
           "GPU_DATA_TAR": str(tiny_tarball(tmp_path) if not (tmp_path / "tiny.tar.gz").exists()
                               else tmp_path / "tiny.tar.gz")}
    done = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu" / "run.sh"), *args], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def out_files(out):
    """What a lent machine would hand back: at most 8 plain files, no sub-folders (session.py's layout)."""
    files = sorted(p.name for p in out.iterdir())
    assert all((out / f).is_file() for f in files) and len(files) <= 8, files
    return files


# ------------------------------------------------------------------------------------- the strong reference
@pytest.mark.any_backend  # our parameter count and the reference's change with no Keras backend
@pytest.mark.parametrize("depth", [20, 110, 164])
def test_strong_reference_networks_have_our_parameter_counts(depth):
    """ResNet-20 and 110 (basic units) and 164 (bottleneck units, option-B projections): the reference's
    parameters are our trainable weights, its BN running statistics our non-trainable ones, to the number."""
    from benchmarks import reference_torch_strong as strong
    from keras_preact.models import cifar_resnet

    ours = cifar_resnet(depth)
    theirs, _ = strong.build(depth, 10, strong.torch.device("cpu"))
    trainable = sum(int(np.prod(w.shape)) for w in ours.trainable_weights)
    running = sum(b.numel() for k, b in theirs.named_buffers() if k.endswith(("running_mean", "running_var")))
    assert sum(p.numel() for p in theirs.parameters()) == trainable
    assert running == ours.count_params() - trainable
    assert trainable + running == {20: 271098, 110: 1736058, 164: 1727482}[depth]


@pytest.mark.any_backend
@pytest.mark.parametrize("depth", [8, 11])
def test_strong_reference_computes_our_function(depth):
    """Our weights copied into the reference by creation order (ResNet-8 basic, ResNet-11 bottleneck): the same
    logits, BN in inference and in training mode."""
    import keras
    import torch

    from benchmarks import reference_torch_strong as strong
    from keras_preact.models import cifar_resnet

    ours = cifar_resnet(depth, input_shape=(16, 16, 3))
    theirs, _ = strong.build(depth, 10, torch.device("cpu"), channels_last=True)
    state = [(k, v) for k, v in theirs.state_dict().items() if not k.endswith("num_batches_tracked")]
    assert len(state) == len(ours.weights)
    with torch.no_grad():
        for (key, tensor), weight in zip(state, ours.weights):
            value = keras.ops.convert_to_numpy(weight)
            value = value.transpose(3, 2, 0, 1) if value.ndim == 4 else value.T if value.ndim == 2 else value
            assert tuple(tensor.shape) == value.shape, (key, weight.path)
            tensor.copy_(torch.from_numpy(np.ascontiguousarray(value)))
    images = np.random.default_rng(depth).normal(size=(4, 16, 16, 3)).astype("float32")
    logits = keras.Model(ours.input, ours.get_layer("logits").output)
    for training in (False, True):
        theirs.train(training)
        with torch.no_grad():
            got = theirs(strong.to_nchw(torch.from_numpy(images), channels_last=True)).numpy()
        np.testing.assert_allclose(got, keras.ops.convert_to_numpy(logits(images, training=training)),
                                   rtol=1e-4, atol=1e-4, err_msg=f"training={training}")


@pytest.mark.any_backend
@pytest.mark.once
def test_strong_reference_augmentation_is_a_padded_crop_flipped_half_the_time():
    """Every image out is the window of its zero-padded image at an offset in [0, 8] on each axis, mirrored or
    not; over 512 images every offset occurs on both axes and about half are mirrored; a seed repeats it."""
    import torch

    from benchmarks import reference_torch_strong as strong

    x = torch.randn(512, 8, 8, 3)
    out = strong.augment(x, torch.Generator().manual_seed(0))
    assert out.shape == x.shape
    assert torch.equal(out, strong.augment(x, torch.Generator().manual_seed(0)))
    padded = torch.nn.functional.pad(x, (0, 0, 4, 4, 4, 4))
    rows, cols, flips = set(), set(), 0
    for i in range(len(x)):
        found = [(oy, ox, flip) for oy in range(9) for ox in range(9) for flip in (False, True)
                 if torch.equal(out[i], (lambda w: w.flip(1) if flip else w)(padded[i, oy:oy + 8, ox:ox + 8]))]
        assert found, f"image {i} is no padded crop of its input"
        oy, ox, flip = found[0]
        rows.add(oy), cols.add(ox)
        flips += flip
    assert rows == cols == set(range(9))
    assert 200 < flips < 312


@pytest.mark.any_backend
@pytest.mark.once
@pytest.mark.parametrize("precision", ["float32", "bf16"])
def test_strong_reference_steps_lower_the_loss(precision):
    """The recipe's optimizer (Nesterov SGD 0.9, weight decay 1e-4) at lr 0.1: three steps on one batch lower its
    loss, in float32 and under bfloat16 autocast."""
    import torch
    import torch.nn.functional as F

    from benchmarks import reference_torch_strong as strong

    torch.manual_seed(0)
    model, run = strong.build(8, 10, torch.device("cpu"))
    optimizer = strong.make_optimizer(model, torch.device("cpu"))
    assert optimizer.defaults | {"lr": None} == optimizer.defaults | dict(
        lr=None, momentum=0.9, nesterov=True, weight_decay=1e-4, dampening=0)
    x = strong.to_nchw(strong.normalize(torch.randint(0, 256, (32, 16, 16, 3), dtype=torch.uint8)), True)
    y = torch.randint(0, 10, (32,))
    losses = [float(strong.train_step(run, optimizer, x, y, 0.1, precision == "bf16")[0]) for _ in range(4)]
    model.eval()
    with torch.no_grad():
        after = float(F.cross_entropy(run(x), y))
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0], losses
    assert np.isfinite(after)


@pytest.mark.any_backend
@pytest.mark.once
def test_strong_reference_command_writes_the_history_columns_of_ours(tmp_path):
    from benchmarks import reference_torch_strong as strong

    metrics = strong.main(["--synthetic", "64", "--image-size", "16", "--depth", "8", "--epochs", "2",
                           "--steps-per-epoch", "2", "--batch-size", "16", "--precision", "bf16",
                           "--out", str(tmp_path / "out")])
    rows = list(csv.DictReader(open(tmp_path / "out" / "history.csv")))
    assert list(rows[0]) == HISTORY_COLUMNS and [int(r["epoch"]) for r in rows] == [0, 1]
    assert json.loads((tmp_path / "out" / "metrics.json").read_text())["steps"] == metrics["steps"] == 4
    assert metrics["precision"] == "bf16" and metrics["params"] == 75290  # ResNet-8's trainable weights
    with pytest.raises(SystemExit):
        strong.main(["--synthetic", "64", "--depth", "9", "--out", str(tmp_path / "bad")])
    assert not (tmp_path / "bad").exists()  # refused before any work


# ------------------------------------------------------------------------------------------ the GPU command
@pytest.mark.any_backend
@pytest.mark.once
def test_gpu_command_tiny_throughput_table_against_the_strong_reference(tmp_path):
    """``run.sh throughput --tiny``: the data unpacked from its tarball, rounds in rotated order, a table row per
    candidate with its ratio to the baseline, every file under the fake $OUT (no GPU here: utilisation n/a)."""
    stdout = run_script(tmp_path, "throughput", "--tiny", "--depths", "8", "--rounds", "2",
                        "--candidates", "strong-float32", "strong-bf16")
    out = tmp_path / "out"
    assert out_files(out) == ["gpu-util.csv", "results.json", "session.log", "summary.md"]
    results = json.loads((out / "results.json").read_text())
    runs = results["throughput"]
    assert [(r["round"], r["candidate"]) for r in runs] == [(1, "strong-float32"), (1, "strong-bf16"),
                                                          (2, "strong-bf16"), (2, "strong-float32")]
    assert all(r["status"] == "ok" and r["images_per_s_median"] > 0 for r in runs)
    summary = (out / "summary.md").read_text()
    assert "| ResNet-8 | strong-float32 |" in summary and "| 1.00x | n/a | 2/2 |" in summary
    assert "| ResNet-8 | strong-bf16 |" in summary and summary in stdout
    assert (tmp_path / "work" / "data" / "train" / "class0").is_dir()


@pytest.mark.any_backend
@pytest.mark.once
def test_gpu_command_out_of_budget_skips_runs_and_still_writes_the_table(tmp_path):
    run_script(tmp_path, "throughput", "--tiny", "--depths", "8", "--budget-s", "0.001")
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert {r["status"] for r in results["throughput"]} == {"skipped: budget"}
    assert "| ResNet-8 | kp-jax-float32 | skipped: budget | | | 0/2 |" in (tmp_path / "out" / "summary.md").read_text()


@pytest.mark.slow
@pytest.mark.any_backend
@pytest.mark.once
def test_gpu_command_tiny_rehearsal_end_to_end_and_the_paper_run_resumes(tmp_path):
    """``run.sh all --tiny``: every candidate (Keras on JAX float32 and mixed_bfloat16, on PyTorch, the strong
    reference) on ResNet-8 and the bottleneck ResNet-11, then the paper run stopped after 2 of its 4 epochs and
    carried out as one archive; the same command with ``--resume-from`` that archive finishes it."""
    run_script(tmp_path, "all", "--tiny", "--epochs-this-call", "2", "--rounds", "1")
    out = tmp_path / "out"
    files = out_files(out)
    assert {"summary.md", "results.json", "paper-resnet8-full_preact.tar.gz",
            "paper-resnet8-full_preact-curves.png"} <= set(files)
    results = json.loads((out / "results.json").read_text())
    assert {(r["depth"], r["candidate"], r["status"]) for r in results["throughput"]} == {
        (d, c, "ok") for d in (8, 11) for c in ("kp-jax-float32", "kp-jax-mixed_bfloat16", "kp-torch-float32",
                                                "strong-float32", "strong-bf16")}
    first = results["paper_run"]
    assert first["status"] == "carried" and first["step"] >= 4 and not first["finished"]
    carried = tmp_path / "carried.tar.gz"
    (out / "paper-resnet8-full_preact.tar.gz").rename(carried)
    with tarfile.open(carried) as tar:
        names = tar.getnames()
    assert "paper-resnet8-full_preact/carry/config.json" in names and "paper-resnet8-full_preact/train.log" in names
    import shutil

    shutil.rmtree(tmp_path / "work" / "paper-resnet8-full_preact")  # the next machine has only the archive
    shutil.rmtree(out)
    run_script(tmp_path, "paper-run", "--tiny", "--resume-from", str(carried))
    second = json.loads((out / "results.json").read_text())["paper_run"]
    assert second["status"] == "finished" and second["step"] == 8 and second["epochs_before"] == first["step"] // 2
    with tarfile.open(out / "paper-resnet8-full_preact.tar.gz") as tar:
        history = tar.extractfile("paper-resnet8-full_preact/history.csv").read().decode()
        log = tar.extractfile("paper-resnet8-full_preact/train.log").read().decode()
    assert [int(r["epoch"]) for r in csv.DictReader(history.splitlines())] == [0, 1, 2, 3]
    assert log.count("=== ") == 2  # both calls' output, in order
