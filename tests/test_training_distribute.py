"""Distribution in real subprocesses: MirroredStrategy on 2 logical CPUs, JAX DataParallel on 2 host
devices, JAX multi-process via keras.distribution.initialize, TF MultiWorkerMirroredStrategy with two
workers on loopback (training killed and resumed in sync, and a check that the Keras fix is still needed)."""

import csv
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]

TRAIN = """
import json, sys
sys.path.insert(0, {repo!r})
{setup}
from keras_preact_training import train
from keras_preact_training.recipe import configs
for batch, run_dir in {runs!r}:
    config = configs.get_config("synthetic-resnet8", depth=8, image_size=(16, 16), synthetic_train_size=128,
        synthetic_test_size=32, batch_size=batch, epochs=2, steps_per_epoch=3, checkpoint_every=2, verbose="0",
        jit_compile={jit!r}, export=False, run_dir=run_dir, distribute={distribute!r})
    try:
        result = train.train(config)
    except ValueError as e:
        print("VALUEERROR", e, flush=True)
    else:
        print("RESULT", json.dumps(result), flush=True)
"""

TWO_LOGICAL_CPUS = """
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
"""


def run_python(code, env_extra, timeout=420):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **env_extra}
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


def result_of(out):
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise AssertionError(out.stdout[-3000:] + out.stderr[-3000:])


def free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def test_mirrored_strategy_on_two_logical_cpus(tmp_path):
    """One process (the logical devices are fixed at TensorFlow's start): a batch the 2 replicas cannot split
    is refused before any work, then a divisible one trains."""
    pytest.importorskip("tensorflow", reason="needs TensorFlow")
    runs = [(15, str(tmp_path / "odd")), (16, str(tmp_path / "run"))]
    code = TRAIN.format(repo=str(REPO), setup=TWO_LOGICAL_CPUS, runs=runs, distribute="mirrored", jit="false")
    out = run_python(code, {"KERAS_BACKEND": "tensorflow"})
    result = result_of(out)
    assert "on 2 replica(s) (mirrored)" in out.stdout
    assert (result["epochs"], result["steps"]) == (2, 6)
    assert "VALUEERROR Invalid batch_size=15: the global batch must be divisible by the 2 replicas" in out.stdout


def only_in_the_jax_pass():
    """The JAX distribution tests start JAX subprocesses whatever the pass's backend: CI runs them once,
    in the JAX pass of the TensorFlow-free environment (where the borrowed GPU machine's runs happen)."""
    if os.environ.get("KERAS_BACKEND") != "jax":
        pytest.skip("JAX subprocesses: run in the JAX pass only")


@pytest.mark.notf
def test_jax_data_parallel_on_two_host_devices(tmp_path):
    only_in_the_jax_pass()
    # jit_compile "auto" (one XLA program per step, as users run it). Eagerly (jit_compile false) every op on
    # the sharded batch is its own two-device program with its own all-reduce rendezvous, and the two
    # forced host devices share one small thread pool: CI hung once in such a rendezvous (2026-11-23, both
    # devices waiting 600 s). XLA gives up on a missed rendezvous after 180 s, before the 420 s subprocess
    # limit, so a hang fails with XLA's own message.
    code = TRAIN.format(repo=str(REPO), setup="", runs=[(16, str(tmp_path / "run"))], distribute="data-parallel",
                        jit="auto")
    flags = ("--xla_force_host_platform_device_count=2 --xla_cpu_multi_thread_eigen=false "
             "--xla_cpu_collective_call_terminate_timeout_seconds=180")
    out = run_python(code, {"KERAS_BACKEND": "jax", "XLA_FLAGS": flags})
    result = result_of(out)
    assert "on 2 replica(s) (data-parallel)" in out.stdout
    assert (result["epochs"], result["steps"]) == (2, 6)


@pytest.mark.notf
def test_jax_multi_process_data_parallel(tmp_path):
    only_in_the_jax_pass()
    port = free_port()
    # jit_compile "auto" (one XLA program per step, as users run it): 31 s against 50 s eagerly (quiet 2-core AMD
    # EPYC), where every op on the sharded batch was its own cross-process program.
    code = TRAIN.format(repo=str(REPO), setup="", runs=[(16, str(tmp_path / "run"))], distribute="data-parallel",
                        jit="auto")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "KERAS_BACKEND": "jax",
                 "KERAS_DISTRIBUTION_JOB_ADDRESSES": f"localhost:{port}",
                 "KERAS_DISTRIBUTION_NUM_PROCESSES": "2", "KERAS_DISTRIBUTION_PROCESS_ID": str(i)},
        )
        for i in range(2)
    ]
    outs = []
    for p in procs:
        try:
            stdout, stderr = p.communicate(timeout=600)
        finally:
            p.kill()
        outs.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    results = [result_of(o) for o in outs]
    assert "on 2 replica(s) (data-parallel)" in outs[0].stdout
    assert [(r["epochs"], r["steps"]) for r in results] == [(2, 6), (2, 6)]
    # Both processes hold the same (replicated) model: identical test metrics.
    assert results[0]["test_loss"] == pytest.approx(results[1]["test_loss"], rel=1e-6)
    assert (tmp_path / "run" / "model.keras").exists() and (tmp_path / "run" / "worker-1" / "history.csv").exists()


@pytest.mark.notf
def test_jax_multi_process_data_parallel_streams_a_folder(tmp_path):
    """``keras-preact-train finetune-folder --distribute data-parallel`` in 2 JAX processes on a folder streamed from
    its files (``--decoded-budget-mib 0``): each process decodes its slice of every global batch (which slice:
    ``test_training_folder_stream.py``), both finish with the same test metrics, the chief writes the run."""
    only_in_the_jax_pass()
    from keras_preact.models import create_model
    from support import write_flower_folder

    flowers = write_flower_folder(tmp_path / "flowers", (20, 30), per_class=12)  # 33 train, 3 held out
    weights = tmp_path / "source.weights.h5"
    create_model("cifar_resnet20", depth=8, num_classes=10, input_shape=(16, 16, 3)).save_weights(weights)
    port = free_port()
    argv = ["finetune-folder", "--init-weights", str(weights), "--depth", "8", "--image-size", "16", "16",
            "--data-dir", str(flowers),
            "--epochs", "1", "--steps-per-epoch", "3", "--batch-size", "2", "--head-fraction", "0",
            "--decoded-budget-mib", "0", "--pipeline", "device", "--distribute", "data-parallel",
            "--run-dir", str(tmp_path / "run"), "--cache-dir", str(tmp_path / "cache"), "--no-export",
            "--verbose", "0", "--jit-compile", "auto"]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "keras_preact_training.cli", *argv], cwd=REPO, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "KERAS_BACKEND": "jax", "PYTHONPATH": str(REPO),
                 "KERAS_DISTRIBUTION_JOB_ADDRESSES": f"localhost:{port}",
                 "KERAS_DISTRIBUTION_NUM_PROCESSES": "2", "KERAS_DISTRIBUTION_PROCESS_ID": str(i)},
        )
        for i in range(2)
    ]
    outs = finish(procs, timeout=600)
    assert [p.returncode for p in procs] == [0, 0], outs
    assert "[data] folder streamed: 36 images at 16x16" in outs[0] and "on 2 replica(s) (data-parallel)" in outs[0]
    # --recipe auto's probed head needs one process's features: across processes the head starts random, said
    assert "[train] head: --head-init probe fits in one process; across 2 processes" in outs[0]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    worker = list(csv.DictReader((tmp_path / "run" / "worker-1" / "history.csv").open()))[-1]
    assert metrics["steps"] == 3
    assert float(worker["val_loss"]) == pytest.approx(metrics["test_loss"], rel=1e-6)


MULTIWORKER_ARGS = ["--depth", "8", "--image-size", "16", "16", "--batch-size", "16", "--verbose", "0",
                    "--jit-compile", "false", "--no-export", "--distribute", "multiworker", "--seed", "1"]


def start_workers(argv, tmp_path, python_code=None):
    """Two TensorFlow workers on loopback (TF_CONFIG), running ``keras_preact_training.train`` (or ``python_code``)."""
    ports = [free_port(), free_port()]
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    command = (
        [sys.executable, "-c", python_code] if python_code else [sys.executable, "-m", "keras_preact_training.cli"]
    )
    return [
        subprocess.Popen(
            command + argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "KERAS_BACKEND": "tensorflow", "PYTHONPATH": str(REPO),
                 "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})},
        )
        for i in range(2)
    ]


def finish(procs, timeout=300):
    """Wait for every worker (killing all of them on a timeout or an error); their outputs."""
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            p.kill()
            p.wait()
    return outs


def trainable_weights(path):
    """A saved model's trainable weights. (BN moving statistics are per worker, as per replica under
    every strategy and in the paper's multi-GPU runs; the chief's are the run's model.)"""
    import keras

    import keras_preact.layers  # noqa: F401

    return [np.asarray(w) for w in keras.saving.load_model(path).trainable_weights]


def test_tf_multi_worker_mirrored_with_two_workers_resumes_after_a_worker_is_killed(tmp_path):
    """Two workers on loopback: one is killed mid-run, the restarted job resumes both from the chief's backup
    and ends with both workers' trainable weights equal, bit for bit (synchronous data parallelism)."""
    pytest.importorskip("tensorflow", reason="needs TensorFlow")
    run = tmp_path / "run"
    argv = MULTIWORKER_ARGS + ["--epochs", "2", "--steps-per-epoch", "6", "--checkpoint-every", "2",
                               "--run-dir", str(run)]
    pointer = run / "checkpoints" / "backup" / "latest.json"
    procs = start_workers(argv, tmp_path)
    killed_at = None
    try:
        deadline = time.time() + 240
        while time.time() < deadline and all(p.poll() is None for p in procs):
            try:
                killed_at = json.loads(pointer.read_text())["step"]
            except (OSError, ValueError, KeyError):
                killed_at = None
            if killed_at and killed_at >= 4:
                procs[1].send_signal(signal.SIGKILL)  # one worker dies ...
                break
            time.sleep(0.01)
    finally:
        for p in procs:  # ... and the job is restarted: the chief goes down with it
            p.kill()
            p.wait()
    first = [p.stdout.read() for p in procs]
    assert killed_at and killed_at >= 4 and procs[1].returncode == -signal.SIGKILL, first[0][-3000:]
    assert "on 2 replica(s) (multiworker)" in first[0] and "resuming" not in first[0]
    assert not (run / "metrics.json").exists()

    procs = start_workers(argv, tmp_path)
    outs = finish(procs)
    assert [p.returncode for p in procs] == [0, 0], outs[0][-3000:] + outs[1][-3000:]
    assert "on 2 replica(s) (multiworker)" in outs[0] and "[train] summary" in outs[0]
    resumed = [int(out.split("resuming at step ")[1].split()[0].rstrip(";")) for out in outs]
    assert resumed[0] == resumed[1] >= killed_at  # both resume from the chief's backup
    metrics = json.loads((run / "metrics.json").read_text())
    assert (metrics["epochs"], metrics["steps"]) == (2, 12)
    assert metrics["steps_this_session"] == 12 - resumed[0]
    chief, other = trainable_weights(run / "model.keras"), trainable_weights(run / "worker-1" / "model.keras")
    assert len(chief) == len(other) > 10
    for a, b in zip(chief, other):
        np.testing.assert_array_equal(a, b)


UNPATCHED = """
import sys
from keras_preact_training import cli
from keras_preact_training.machine import compat
compat.apply_multiworker_fix = lambda: False
sys.exit(cli.main(sys.argv[1:]))
"""


def test_keras_still_needs_the_multiworker_fix(tmp_path):
    """Fails loudly once the installed Keras trains under MultiWorkerMirroredStrategy without
    ``keras_preact_training.machine.compat``: then set ``compat.FIXED_IN`` (or delete the module)."""
    pytest.importorskip("tensorflow", reason="needs TensorFlow")
    from keras_preact_training.machine import compat

    if not compat.needs_multiworker_fix():
        pytest.skip(f"Keras {compat.keras_version()} is past compat.FIXED_IN={compat.FIXED_IN}")
    procs = start_workers(MULTIWORKER_ARGS + ["--epochs", "1", "--steps-per-epoch", "2", "--run-dir",
                                              str(tmp_path / "run")], tmp_path, python_code=UNPATCHED)
    outs = finish(procs, timeout=180)
    import keras

    assert procs[0].returncode != 0, (
        f"Keras {keras.version()} trained under MultiWorkerMirroredStrategy without training/machine/compat.py: "
        f"{compat.UPSTREAM_ISSUE} is fixed. Set compat.FIXED_IN = {compat.keras_version()} (or remove the module)."
    )
    assert "PerReplica" in outs[0], outs[0][-2000:]
