"""The training-speed levers and their judge: the plain PyTorch reference is the same network as ours,
``TorchSGD``'s multi-tensor PyTorch update is the per-variable one, the CLI chooses and prints its
backend, and every run's ``history.csv`` times training and evaluation apart; the side-by-side
benchmark runs end to end on a tiny image folder."""

import csv
import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import keras
import killing
import numpy as np
import pytest

from keras_preact.models import create_model
from keras_preact_training import cli
from keras_preact_training.machine import backends
from keras_preact_training.recipe.optimizers import TorchSGD
from support import ONE_THREAD, tiny_training_command

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # benchmarks/ is not installed
HAS_TORCH = importlib.util.find_spec("torch") is not None
pytestmark = pytest.mark.notf
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="the PyTorch reference needs torch")


def write_folder(root, per_class=4, classes=3, size=32, seed=0):
    from PIL import Image

    rng = np.random.default_rng(seed)
    for split, n in (("train", per_class), ("test", 2)):
        for c in range(classes):
            folder = root / split / f"class{c}"
            folder.mkdir(parents=True)
            for i in range(n):
                pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(folder / f"{i:04d}.png")
    return root


# ----------------------------------------------------------------------------- the PyTorch reference
@needs_torch
@pytest.mark.parametrize("depth", [20, 32])
def test_reference_network_is_ours(depth, rng):
    """Our weights copied into the reference (by creation order): equal logits, BN in both modes."""
    import torch

    from benchmarks import reference_torch_cifar as ref

    ours = create_model(f"cifar_resnet{depth}")
    theirs = ref.PreActResNet(depth, 10)
    state = [(k, v) for k, v in theirs.state_dict().items() if not k.endswith("num_batches_tracked")]
    assert len(state) == len(ours.weights)
    assert sum(p.numel() for p in theirs.parameters()) == sum(int(np.prod(w.shape)) for w in ours.trainable_weights)
    for (key, tensor), weight in zip(state, ours.weights):
        value = keras.ops.convert_to_numpy(weight)
        value = value.transpose(3, 2, 0, 1) if value.ndim == 4 else value.T if value.ndim == 2 else value
        assert tuple(tensor.shape) == value.shape, (key, weight.path)
        tensor.copy_(torch.from_numpy(np.ascontiguousarray(value)))
    images = rng.normal(size=(4, 32, 32, 3)).astype("float32")
    logits = keras.Model(ours.input, ours.get_layer("logits").output)
    for training in (False, True):
        theirs.train(training)
        with torch.no_grad():
            got = theirs(torch.from_numpy(images).permute(0, 3, 1, 2)).numpy()
        expected = keras.ops.convert_to_numpy(logits(images, training=training))
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4, err_msg=f"training={training}")


@needs_torch
@pytest.mark.any_backend  # the reference is PyTorch alone: nothing the Keras backend or TensorFlow changes
@pytest.mark.once
def test_reference_trains_and_writes_the_history_columns_of_ours(tmp_path):
    from benchmarks import reference_torch_cifar as ref

    data = write_folder(tmp_path / "data", per_class=8)
    metrics = ref.main(["--data-dir", str(data), "--out", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "c"),
                        "--epochs", "2", "--steps-per-epoch", "2", "--batch-size", "8", "--depth", "8"])
    rows = list(csv.DictReader(open(tmp_path / "out" / "history.csv")))
    assert [int(r["epoch"]) for r in rows] == [0, 1]
    assert {"loss", "accuracy", "val_loss", "val_accuracy", "train_seconds", "eval_seconds"} <= set(rows[0])
    assert all(float(r["train_seconds"]) > 0 and float(r["eval_seconds"]) > 0 for r in rows)
    assert json.loads((tmp_path / "out" / "metrics.json").read_text())["steps"] == metrics["steps"] == 4
    import torch

    # --device auto trains where PyTorch sees a GPU, and says where: the metrics name the device.
    assert metrics["device"] == (torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu")


@needs_torch
def test_reference_checkpoint_of_resnet20_loads_back_equal_and_keeps_one_optimizer_file(tmp_path):
    """The reference's state at an epoch end: ``checkpoint.pt`` and the ``optimizer-<step>.pt`` it names (the
    older one removed), which load back equal: the model's weights and the momentum buffers."""
    import torch
    import torch.nn.functional as F

    from benchmarks import reference_torch_cifar as ref

    torch.manual_seed(0)
    model = ref.PreActResNet(20, 10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4)
    F.cross_entropy(model(torch.randn(4, 3, 32, 32)), torch.tensor([0, 1, 2, 3])).backward()
    optimizer.step()  # the momentum buffers exist
    for step in (390, 780):
        ref.save_checkpoint(tmp_path, dict(model=model.state_dict(), rows=[], step=step), optimizer.state_dict())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt", "optimizer-0000780.pt"]
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    momentum = torch.load(tmp_path / state["optimizer_file"], weights_only=False)["state"]
    assert all(torch.equal(momentum[i]["momentum_buffer"], optimizer.state[p]["momentum_buffer"])
               for i, p in enumerate(model.parameters()))
    assert all(torch.equal(state["model"][k], v) for k, v in model.state_dict().items())


@needs_torch
def test_reference_refuses_cuda_without_a_gpu_before_any_work(tmp_path):
    import torch

    from benchmarks import reference_torch_cifar as ref

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: --device cuda is allowed")
    data = write_folder(tmp_path / "data")
    with pytest.raises(SystemExit, match="--device cuda, but PyTorch sees no GPU.*use --device cpu or auto"):
        ref.main(["--data-dir", str(data), "--out", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "c"),
                  "--device", "cuda"])
    assert not (tmp_path / "out").exists() and not (tmp_path / "c").exists()


def _reference_command(data, out, *extra):
    return [sys.executable, str(REPO / "benchmarks" / "reference_torch_cifar.py"), "--data-dir", str(data),
            "--out", str(out), "--cache-dir", str(out.parent / "cache"), "--total-steps", "7",
            "--steps-per-epoch", "2", "--batch-size", "4", "--depth", "8", "--schedule", "piecewise", *extra]


@needs_torch
@pytest.mark.any_backend  # the reference's own processes, PyTorch alone: the same in every pass
@pytest.mark.once
def test_reference_stopped_after_an_epoch_resumes_elsewhere_with_the_weights_of_a_straight_run(tmp_path):
    """The reference at the paper's length spans machines too: SIGKILLed from outside once it has written a
    checkpoint (as a lost machine ends it), its three files carried to another folder resume there, the last
    epoch partial (7 iterations = 3 epochs of 2 + 1), equal to a run never stopped."""
    import torch

    data = write_folder(tmp_path / "data", per_class=4)
    env = {**os.environ, **ONE_THREAD}
    first = tmp_path / "first"
    with open(tmp_path / "first.log", "w+") as log:
        proc = subprocess.Popen(_reference_command(data, first), env=env, stdout=log, stderr=subprocess.STDOUT)
        code = killing.kill_when(proc, (first / "checkpoint.pt").exists, timeout=300)
        log.seek(0)
        assert code == -signal.SIGKILL, log.read()[-2000:]
    state = torch.load(first / "checkpoint.pt", weights_only=False)
    step = state["step"]  # the kill lands after the first epoch's checkpoint, before the run ends: 2, 4 or 6
    assert step in (2, 4, 6)
    carried = ["checkpoint.pt", "history.csv", state["optimizer_file"]]  # the momentum of its step beside it
    assert state["optimizer_file"] == f"optimizer-{step:07d}.pt"
    assert set(carried) <= {p.name for p in first.iterdir()}
    moved = tmp_path / "second"
    moved.mkdir()
    for name in carried:
        (moved / name).write_bytes((first / name).read_bytes())
    resumed = subprocess.run(_reference_command(data, moved), env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resuming at step {step} (epoch {step // 2})" in resumed.stdout
    straight = subprocess.run(_reference_command(data, tmp_path / "straight"), env=env, capture_output=True,
                              text=True, timeout=300)
    assert straight.returncode == 0, straight.stderr[-2000:]
    a, b = (torch.load(d / "checkpoint.pt", weights_only=False) for d in (moved, tmp_path / "straight"))
    assert a["step"] == b["step"] == 7 and [r["epoch"] for r in a["rows"]] == [0, 1, 2, 3]
    for key, value in b["model"].items():
        assert torch.equal(a["model"][key], value), key
    for column in ("loss", "val_accuracy"):
        assert [r[column] for r in a["rows"]] == [r[column] for r in b["rows"]]
    metrics = json.loads((moved / "metrics.json").read_text())
    assert metrics["steps"] == 7 and metrics["epochs"] == 4

    other = subprocess.run(_reference_command(data, moved, "--seed", "1"), env=env, capture_output=True, text=True,
                           timeout=300)
    assert other.returncode != 0 and "holds a run of" in other.stderr and "pass another --out" in other.stderr


@needs_torch
def test_reference_at_the_papers_length_has_the_paper_presets_schedule():
    """--total-steps 64000 --schedule piecewise is preset cifar10-folder-resnet20-paper: warm-up to 400, /10 at
    32k and 48k, 164 whole epochs of 390 and a last one of 40."""
    from benchmarks import reference_torch_cifar as ref
    from keras_preact_training.recipe import configs, schedules

    config = configs.get_config("cifar10-folder-resnet20-paper", needs_data=False)
    resolved = schedules.resolve(config, 50000)
    assert (resolved.total_steps, resolved.warmup_steps, resolved.boundaries) == (64000, 400, (32000, 48000))
    ours = schedules.make(config, resolved)
    warmup = round(400 / 64000 * 64000)
    for step in (0, 399, 400, 31999, 32000, 47999, 48000, 63999):
        assert ref.piecewise_learning_rate(step, 64000, warmup) == pytest.approx(float(ours(step)), rel=1e-6)


@needs_torch
def test_reference_learning_rate_is_keras_cosine_decay_with_warmup():
    from benchmarks import reference_torch_cifar as ref

    schedule = keras.optimizers.schedules.CosineDecay(0.01, 90, warmup_target=0.1, warmup_steps=10)
    for step in (0, 5, 10, 50, 99, 100):
        assert ref.learning_rate(step, 100, 10) == pytest.approx(float(schedule(step)), rel=1e-5, abs=1e-7)


@needs_torch
def test_reference_piecewise_rate_is_the_converged_presets_schedule():
    """The paper's recipe scaled to 50 epochs: warm-up 0.01 to iteration 122, 0.1, /10 at 9,750 and 14,625."""
    from benchmarks import reference_torch_cifar as ref
    from keras_preact_training.recipe import configs, schedules

    config = configs.get_config("cifar10-folder-resnet20-converged", needs_data=False)
    resolved = schedules.resolve(config, 50000)
    assert (resolved.total_steps, resolved.warmup_steps, resolved.boundaries) == (19500, 122, (9750, 14625))
    ours = schedules.make(config, resolved)
    warmup = round(400 / 64000 * resolved.total_steps)  # the reference's --warmup-fraction default
    for step in (0, 121, 122, 9749, 9750, 14624, 14625, 19499):
        assert ref.piecewise_learning_rate(step, 19500, warmup) == pytest.approx(float(ours(step)), rel=1e-6)


# ------------------------------------------------------------------------------- TorchSGD on PyTorch
@pytest.mark.skipif(keras.backend.backend() != "torch", reason="the multi-tensor update is PyTorch's")
def test_torch_sgd_multi_tensor_update_equals_the_per_variable_update(monkeypatch, rng):
    variables = [keras.Variable(rng.normal(size=s).astype("float32"), name=n)
                 for s, n in (((3, 3, 2, 4), "kernel"), ((4,), "gamma"), ((5,), "bias"))]
    copies = [keras.Variable(keras.ops.convert_to_numpy(v), name=v.name) for v in variables]
    fused, plain = (TorchSGD(learning_rate=0.05, coupled_weight_decay=0.01, weight_decay_scope="kernels")
                    for _ in range(2))
    fused.build(variables)
    plain.build(copies)
    monkeypatch.setattr(plain, "_backend_update_step", lambda g, v, lr: keras.optimizers.Optimizer.
                        _backend_update_step(plain, g, v, lr))
    for _ in range(3):
        grads = [rng.normal(size=v.shape).astype("float32") for v in variables]
        fused.apply([keras.ops.convert_to_tensor(g) for g in grads], variables)
        plain.apply([keras.ops.convert_to_tensor(g) for g in grads], copies)
    for a, b in zip(variables, copies):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b), rtol=1e-6, atol=1e-7)
    monkeypatch.setattr(TorchSGD, "update_step", lambda *a: pytest.fail("per-variable update_step was called"))
    fused.apply([keras.ops.convert_to_tensor(g) for g in grads], variables)


# ------------------------------------------------------------------------------- --backend
def test_backend_flag_in_process_must_match_the_imported_keras(capsys):
    other = next(b for b in backends.BACKENDS if b != keras.backend.backend())
    assert cli.main(["--backend", other, "--dry-run"]) == 2
    assert f"Keras is already imported with backend {keras.backend.backend()}" in capsys.readouterr().err
    assert cli.main(["--backend", keras.backend.backend(), "--dry-run"]) == 0
    assert f"[backend] {keras.backend.backend()} (Keras already imported" in capsys.readouterr().out


def test_cli_in_a_fresh_process_runs_on_the_backend_it_prints(tmp_path):
    backend = keras.backend.backend()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3",
           **ONE_THREAD}
    run_dir = tmp_path / "run"
    done = subprocess.run(
        tiny_training_command(run_dir, "--backend", backend, "--synthetic-train-size", "64", "--synthetic-test-size",
                              "32", "--verbose", "0", "--no-export", epochs=2, steps_per_epoch=2),
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )  # nothing into the checkout
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"[backend] {backend} (--backend;" in done.stdout
    assert json.loads((run_dir / "config.json").read_text())["keras_backend"] == backend
    rows = list(csv.DictReader(open(run_dir / "history.csv")))
    assert len(rows) == 2 and all(float(r["train_seconds"]) > 0 and float(r["eval_seconds"]) > 0 for r in rows)


# ------------------------------------------------------------------------------- the benchmark
@needs_torch
@pytest.mark.skipif(keras.backend.backend() != "torch", reason="one backend is enough (CI's PyTorch pass)")
def test_side_by_side_benchmark_runs_end_to_end(tmp_path, capsys, monkeypatch):
    from benchmarks import train_speed_vs_pytorch as bench

    monkeypatch.setenv("HOME", str(tmp_path))  # the decoded-image caches of both trainers
    for name, value in ONE_THREAD.items():  # the candidates' processes inherit this environment
        monkeypatch.setenv(name, value)
    data = write_folder(tmp_path / "data", per_class=48, classes=3, size=16)  # 144 images: one batch of 128
    out = tmp_path / "figures.json"
    bench.main(["--data-dir", str(data), "--depth", "8", "--image-size", "16", "16",  # the tool's check, small
                "--backends", "torch", "--pipelines", "device", "--rounds", "1",
                "--epochs", "2", "--steps-per-epoch", "1", "--json", str(out), "--keep", str(tmp_path / "kept")])
    printed = capsys.readouterr().out
    figures = json.loads(out.read_text())
    assert set(figures) == {"keras-preact-train/torch/device", "reference-torch"}
    assert figures["reference-torch"]["ratio"] == [1.0]
    assert all(v["train"][0] > 0 and v["eval"][0] > 0 for v in figures.values())
    assert "| keras-preact-train/torch/device |" in printed
    for kept in ("keras-preact-train_torch_device", "reference-torch"):  # --keep: every run's history
        assert len((tmp_path / "kept" / kept / "history.csv").read_text().splitlines()) == 3
