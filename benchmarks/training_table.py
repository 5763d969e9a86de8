"""The training table: the whole training loop, one step, evaluation and ``model.fit``'s host cost per step, each
side by side with plain PyTorch (``benchmarks/reference_torch_cifar.py``: the same network, eager,
``channels_last``), rounds alternating between ours and the reference in one run.

- ``host_cost``: ``model.fit`` on a network whose arithmetic is negligible (one ``Dense(1)`` on 4 features, batch
  8), ms per step per backend and ``steps_per_execution``: what Keras' loop costs the host on every step, the
  part that bounds a GPU on small networks (Keras on PyTorch runs one step per call: ``steps_per_execution``
  1 only); the reference is a plain PyTorch loop over the same batches. The ``app callbacks`` cases fit the same
  model with ``keras-preact-train``'s callbacks (``make_callbacks``: NaN stop, backups every 50 steps, history,
  epoch timer, TensorBoard where installed) and its ``verbose=2``: what the app adds to the host's share.
- ``step``: one ``train_on_batch`` of ``keras-preact-train``'s short CIFAR preset (pre-act ResNet-20, batch 128,
  random images) against the reference's step, in one process per backend.
- ``eval``: one inference batch (``predict_on_batch``) of the same model against the reference's ``no_grad``
  forward pass.
- ``epoch``: ``keras-preact-train`` against ``reference_torch_cifar.py`` on the CIFAR-10 image folder, one process
  each, from every run's ``history.csv`` after its first epoch: the epoch (training and the whole test split's
  evaluation) in seconds, training and evaluation images/s.

Each measurement runs in a child process (``--child``) that prints one ``FIGURES`` JSON line: its backend is the
one Keras loads there, and the reference runs in the same process where torch is installed.
"""

import argparse
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
REFERENCE = "plain PyTorch"
TAG = "FIGURES "


def rotate(names, r):
    return names[r % len(names):] + names[: r % len(names)]


def alternate(calls, rounds, per_call):
    """{name: [ms per unit, one per round]}: every round times each call once, in rotating order; ``per_call``
    is how many units (steps, batches) one call does."""
    times = {name: [] for name in calls}
    for r in range(rounds):
        for name in rotate(list(calls), r):
            start = time.perf_counter()
            calls[name]()
            times[name].append(1000 * (time.perf_counter() - start) / per_call)
    return times


def has_torch():
    return importlib.util.find_spec("torch") is not None


def app_callbacks(directory):
    """``keras-preact-train``'s callbacks (``keras_preact_training.train.make_callbacks``) of a run in ``directory``,
    with the presets' backup frequency."""
    import types

    from keras_preact_training import train as train_lib
    from keras_preact_training.recipe import configs

    directory = pathlib.Path(directory)
    config = configs.get_config("synthetic-resnet8", needs_data=False)
    run = types.SimpleNamespace(config=config, data=None, files_dir=directory, run_dir=directory, start_step=0,
                                backup=None, is_chief=True,
                                tensorboard_dir=directory / "tensorboard" if train_lib.has_tensorboard() else None)
    return train_lib.make_callbacks(run)


def host_cost_calls(steps, spes, batch=8):
    """``model.fit`` of one epoch of ``steps`` batches per ``steps_per_execution``, plain and with the app's
    callbacks, and the plain PyTorch loop."""
    import keras

    rng = np.random.default_rng(0)
    x = rng.normal(size=(steps * batch, 4)).astype("float32")
    y = rng.normal(size=(steps * batch, 1)).astype("float32")
    calls = {}
    for spe in spes:
        if spe > 1 and keras.backend.backend() == "torch":
            continue  # Keras' PyTorch trainer runs one step per call
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse", steps_per_execution=spe)
        def fit(model=model):
            model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)

        fit()  # compilation and tracing, untimed
        calls[f"steps_per_execution {spe}"] = fit
        app = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        app.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse", steps_per_execution=spe)
        run_dir = tempfile.TemporaryDirectory(prefix="host-cost-")  # removed when the process ends
        callbacks = app_callbacks(run_dir.name)

        def fit_app(model=app, callbacks=callbacks, run_dir=run_dir):
            model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=2, callbacks=callbacks)

        fit_app()
        calls[f"steps_per_execution {spe}, app callbacks"] = fit_app
    if has_torch():
        import torch

        net = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
        batches = [
            (torch.from_numpy(x[i : i + batch]), torch.from_numpy(y[i : i + batch])) for i in range(0, len(x), batch)
        ]

        def loop():
            for xb, yb in batches:
                loss = torch.nn.functional.mse_loss(net(xb), yb)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()

        loop()
        calls[REFERENCE] = loop
    return calls


def model_calls(kind, steps):
    """``train_on_batch`` (``kind="step"``) or ``predict_on_batch`` (``"eval"``) of the short CIFAR preset's
    compiled model, ``steps`` times a call, and the reference's step or forward pass."""
    from benchmarks.profile_train_step import build_step_model, reference_step

    model, x, y = build_step_model()
    one = (lambda: model.train_on_batch(x, y)) if kind == "step" else (lambda: model.predict_on_batch(x))
    for _ in range(2):
        one()
    calls = {"keras-preact": lambda: [one() for _ in range(steps)]}
    if has_torch():
        if kind == "step":
            ref_one = reference_step()
        else:
            import torch

            from benchmarks import reference_torch_cifar as ref

            net = ref.PreActResNet(20, 10).to(memory_format=torch.channels_last).eval()
            images = ref.normalize(np.random.default_rng(0).integers(0, 256, x.shape, dtype=np.uint8), True)

            def ref_one():
                with torch.no_grad():
                    return net(images)

            ref_one()
        calls[REFERENCE] = lambda: [ref_one() for _ in range(steps)]
    return calls


def child(args):
    """In this process (KERAS_BACKEND set): alternate the calls and print one FIGURES line."""
    import keras

    if args.child == "host_cost":
        calls = host_cost_calls(args.steps, args.steps_per_execution)
    else:
        calls = model_calls(args.child, args.steps)
    times = alternate(calls, args.rounds, args.steps)
    from benchmarks.rows import versions

    print(TAG + json.dumps({"backend": keras.backend.backend(), "times": times, "versions": versions()}), flush=True)


def run_child(python, backend, kind, rounds, steps, spes=(1,)):
    """One child process; its {case: [ms per round]} (the reference's under ``REFERENCE``)."""
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3",
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    argv = [python, "-m", "benchmarks.training_table", "--child", kind, "--rounds", str(rounds), "--steps", str(steps),
            "--steps-per-execution", *map(str, spes)]
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith(TAG)]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{kind} on {backend} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(lines[0][len(TAG):])


def in_process(kind, backends, pythons, rounds, steps, spes=(1,)):
    """Rows' material for host_cost, step and eval: [(case, backend, ours, reference, versions, reference's name)]."""
    found, references = [], []
    for backend in backends:
        python = pythons.get(backend, sys.executable)
        figures = run_child(python, backend, kind, rounds, steps, spes)
        reference = figures["times"].pop(REFERENCE, None)
        references.append(reference)
        for case, ours in figures["times"].items():
            found.append([case, figures["backend"], ours, reference, figures["versions"], REFERENCE])
    # An interpreter without torch (TensorFlow's) is set beside the reference measured in another one.
    elsewhere = next((r for r in references if r), None)
    for entry in found:
        if entry[3] is None and elsewhere:
            entry[3], entry[5] = elsewhere, REFERENCE + " (in the other interpreter's run)"
    return [tuple(entry) for entry in found]


def epoch(backends, pythons, rounds, epochs, steps_per_epoch, data_dir, depth=20, image_size=(32, 32)):
    """Whole ``keras-preact-train`` runs against ``reference_torch_cifar.py``, alternating: for each backend,
    (case, backend, ours, reference, unit, better, versions, reference's name) for the epoch's seconds, training and
    evaluation images/s."""
    from benchmarks import train_speed_vs_pytorch as speed

    notf = pythons.get("torch", sys.executable)
    argv = ["--data-dir", str(data_dir), "--python", pythons.get("tensorflow", sys.executable), "--notf-python", notf,
            "--backends", *backends, "--pipelines", "device", "--rounds", str(rounds), "--epochs", str(epochs),
            "--steps-per-epoch", str(steps_per_epoch), "--depth", str(depth), "--image-size", *map(str, image_size)]
    args = speed.parse_args(argv)
    names = speed.candidates(args)
    speed.prepare(args)
    length = ["--epochs", str(epochs), "--steps-per-epoch", str(steps_per_epoch)]
    test_images = speed.count_images(pathlib.Path(data_dir) / "test")
    figures = {name: [] for name in names}
    chosen = {}  # name -> the backends its runs trained on ("[backend] torch (...)": --backend fastest's choice)
    with tempfile.TemporaryDirectory(prefix="bench-epoch-") as tmp:
        for r in range(rounds):
            for name in rotate(list(names), r):
                result = speed.run_one(args, name, names[name], pathlib.Path(tmp), length)
                chosen.setdefault(name, set()).update(result["backend_line"].split()[1:2])
                rows = result["rows"][1:] or result["rows"]
                train = sum(float(x["train_seconds"]) for x in rows) / len(rows)
                evaluation = sum(float(x["eval_seconds"]) for x in rows) / len(rows)
                figures[name].append({"epoch": train + evaluation, "train": steps_per_epoch * 128 / train,
                                      "eval": test_images / evaluation})
    reference = figures.pop(speed.REFERENCE)
    found = []
    for name, ours in figures.items():
        backend = name.split("/")[1]
        if backend == "fastest":
            backend = f"fastest: {', '.join(sorted(chosen[name]))}"
        what = f"{steps_per_epoch} steps of 128 + {test_images} test images"
        for key, case, unit, better in (("epoch", f"whole epoch ({what})", "s/epoch", "lower"),
                                        ("train", "training", "images/s", "higher"),
                                        ("eval", "evaluation", "images/s", "higher")):
            found.append((case, backend, [f[key] for f in ours], [f[key] for f in reference], unit, better,
                          versions_of(args.python if backend.startswith(("tensorflow", "fastest")) else notf),
                          REFERENCE))
    return found


def versions_of(python):
    """``rows.versions()`` as the interpreter ``python`` sees them."""
    code = "import json; from benchmarks.rows import versions; print(json.dumps(versions()))"
    done = subprocess.run([python, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--child", choices=("host_cost", "step", "eval"), required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--steps-per-execution", type=int, nargs="+", default=[1])
    child(p.parse_args(argv))


if __name__ == "__main__":
    main()
