"""Train a pre-activation ResNet with ``model.fit``: ``train(config)``.

Python API::

    from training.configs import get_config
    from training.train import train

    result = train(get_config("t3-cifar10-resnet164-preact", dataset="folder", data_dir="/tmp/cifar10-jpeg"))
    result["test_accuracy"], result["run_dir"]

CLI: ``keras-preact-train`` (``training/cli.py``).

Run directory (``--run-dir``, default ``runs/<name>-<timestamp>``): ``config.json`` (resolved config,
enough to re-run: ``keras-preact-train --config RUN_DIR/config.json``), ``history.csv``
(CSVLogger), ``tensorboard/``, ``checkpoints/`` (BackupAndRestore state), ``model.keras``,
``metrics.json``, ``curves.png``. Every file is written to a temporary name and renamed.

Fault tolerance: run the same command with the same ``--run-dir`` after a kill (SIGKILL at any
moment) and the run resumes from the last backup (every ``checkpoint_every`` steps and every epoch
end) at the exact global step, with the exact data stream, and ends with the same epochs and steps.
The backup is restored before anything else, so a run killed after training (evaluation, ``model.keras``,
export) finishes those phases from the trained weights, and a finished run re-run does nothing
(``training/run_state.py``).
A NaN/inf loss stops the run (TerminateOnNaN), raises ``TrainingDiverged`` naming the last good
checkpoint, which is kept.
"""

import contextlib
import dataclasses
import sys
import time

import keras

from keras_preact import scratch

from . import configs, distribute, pipelines, plots, resume, run_lock, run_state, schedules, sources, timing
from . import export as export_lib
from .manifest import RunManifest, input_config_for, model_fingerprint
from .model import build_model
from .plots import read_history
from .run_dir import AtomicBackup, prepare_run_dir, read_backup, save_model, write_json


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite; the last good checkpoint is kept."""


# ------------------------------------------------------------------------------------- training
def set_determinism(config):
    keras.utils.set_random_seed(config.seed)
    if config.deterministic and keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        tf.config.experimental.enable_op_determinism()


def has_tensorboard():
    """The TensorBoard callback needs the ``tensorboard`` package (and TensorFlow) for its writer."""
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        return False
    return sources.has_tensorflow()


def _fit_phases(start_step, steps_per_epoch, total_steps):
    """[(initial_epoch, epochs, steps_per_epoch)] from ``start_step`` to ``total_steps``: the rest of
    a cut epoch, whole epochs, then a last partial epoch (the paper stops at an iteration count)."""
    phases, step = [], start_step
    while step < total_steps:
        epoch, done = divmod(step, steps_per_epoch)
        whole = (total_steps - step) // steps_per_epoch if not done else 0
        if whole:
            phases.append((epoch, epoch + whole, steps_per_epoch))
            step += whole * steps_per_epoch
        else:
            steps = min(steps_per_epoch - done, total_steps - step)
            phases.append((epoch, epoch + 1, steps))
            step += steps
    return phases


def _verbose(config):
    if str(config.verbose) == "auto":
        return 1 if sys.stdout.isatty() else 2
    return int(config.verbose)


def train(config, data=None):
    """Train ``config`` (a ``training.configs.Config``); returns the final metrics and ``run_dir``.

    ``data``: optional ``training.sources.ArrayData`` to train on instead of ``config.dataset``.
    Raises ValueError (naming the bad argument) before any training for bad input, and
    ``TrainingDiverged`` when the loss becomes non-finite.
    """
    configs.validate(config)
    run_dir = prepare_run_dir(config)
    keras.config.set_dtype_policy(config.precision)
    dist = distribute.make(config)
    files_dir = run_dir if dist.is_chief else run_dir / f"worker-{dist.process_index}"
    files_dir.mkdir(exist_ok=True)
    # One owner per worker file set, before anything is written; the kernel frees it when we die.
    with run_lock.owned(files_dir / run_lock.RUN_LOCK, f"run_dir={str(run_dir)!r}"):
        resume.check(run_dir, config)
        return _train(config, data, run_dir, dist, files_dir)


def _train(config, data, run_dir, dist, files_dir):
    """``train`` once this process owns its files in ``run_dir``."""
    data = data.validate() if data is not None else sources.load(config)
    pipelines.check_image_size(data, config)
    pipelines.check_batch_size(data, config)
    resolved = schedules.resolve(config, data.train_size)
    backup_dir = files_dir / "checkpoints" / "backup"
    for directory in (files_dir, backup_dir):  # this process's own folders (the chief's: run_dir)
        scratch.remove_stale(directory)
    chief_backup_dir = run_dir / "checkpoints" / "backup"  # what every worker resumes from
    backup = read_backup(chief_backup_dir)
    start_step = backup["step"] if backup else 0
    done = run_state.finished(run_dir, config, resolved.total_steps, backup) if dist.process_count == 1 else None
    if done is not None:
        print(f"[train] run already finished at step {start_step}; nothing to do (metrics in "
              f"{run_dir / 'metrics.json'})", flush=True)
        return done
    if config.export and dist.is_chief:
        run_state.check_export_target(config.export_dir, config.name)
    set_determinism(config)
    pipeline = pipelines.resolve_pipeline(config)
    distribute.check_pipeline(pipeline, dist)
    with dist.scope():
        mean, std = pipelines.pixel_stats(config, data) if pipeline == "device" else (None, None)
        classifier, model = build_model(config, data.num_classes, resolved, pipeline=pipeline, mean=mean, std=std)
        if backup:  # before anything is decided: with nothing left to fit, fit never restores
            run_state.restore(model, backup)
    if dist.is_chief:
        stats = (a.tolist() for a in pipelines.pixel_stats(config, data))
        manifest = RunManifest(
            name=config.name, class_names=tuple(data.class_names), input_config=input_config_for(config, *stats),
            config=dataclasses.asdict(config), resolved_schedule=dataclasses.asdict(resolved),
            keras_backend=keras.backend.backend(), keras_version=keras.__version__,
            model=model_fingerprint(classifier),
        )
        write_json(run_dir / "config.json", manifest.to_dict())

    sharded = dist.process_count > 1 and config.distribute == "data-parallel"
    per_process_batch = config.batch_size // dist.process_count if sharded else config.batch_size
    eval_data = data
    if sharded and isinstance(data, sources.ArrayData):
        test_images, test_labels = distribute.shard_eval(data.test_images, data.test_labels, config.batch_size,
                                               dist.process_index, dist.process_count)
        eval_data = dataclasses.replace(data, test_images=test_images, test_labels=test_labels)

    def streams(step):
        train_stream, _ = pipelines.pipelines(data, config, config.batch_size, start_step=step)
        if sharded:
            shard = distribute.ShardedTrain(dist.process_index, dist.process_count)
            train_stream = (shard.tf_data(train_stream, config.batch_size) if pipeline == "tf_data"
                            else shard.numpy(train_stream))
        return train_stream

    _, test_stream = pipelines.pipelines(eval_data, config, per_process_batch, start_step=0)

    # Multi-worker: every worker restored the chief's backup (the weights are in sync), so all resume at
    # one step; each still writes its own (saving may run collectives).
    backup_cb = AtomicBackup(backup_dir, config.checkpoint_every, start_step, backup)
    callbacks = [
        keras.callbacks.TerminateOnNaN(),
        timing.EpochTimer(),  # before CSVLogger: train_seconds / eval_seconds land in history.csv
        keras.callbacks.CSVLogger(str(files_dir / "history.csv"), append=True),
        backup_cb,
    ]
    if config.health_every and isinstance(data, sources.ArrayData):
        # Before CSVLogger, so the health signals land in history.csv (keras_preact.analysis).
        from keras_preact.analysis import TrainingHealthCallback

        mean, std = pipelines.pixel_stats(config, data)
        probe = ((data.train_images[:64].astype("float32") - mean) / std, data.train_labels[:64])
        health_dir = str(run_dir / "tensorboard" / "health") if dist.is_chief and has_tensorboard() else None
        callbacks.insert(1, TrainingHealthCallback(probe, config.health_every, log_dir=health_dir,
                                                   model=classifier))
    (run_dir / "tensorboard").mkdir(exist_ok=True)
    if not dist.is_chief:
        pass
    elif has_tensorboard():
        callbacks.append(keras.callbacks.TensorBoard(str(run_dir / "tensorboard"), update_freq="epoch"))
    else:
        print("[train] TensorBoard event files skipped: they need TensorFlow and tensorboard "
              "(pip install tensorflow tensorboard); history.csv and curves.png hold the curves.")

    phases = _fit_phases(start_step, resolved.steps_per_epoch, resolved.total_steps)
    print(
        f"[train] {config.name}: {config.architecture} ResNet-{config.depth}, {classifier.count_params():,} "
        f"params; data {config.dataset} ({data.train_size} train images, {data.num_classes} classes); "
        f"batch {config.batch_size} on {dist.num_replicas} replica(s) ({dist.name}), input {pipeline}; "
        f"{resolved.epochs} epochs x {resolved.steps_per_epoch} steps = {resolved.total_steps} "
        f"iterations; lr {config.schedule} {resolved.warmup_lr}->{resolved.base_lr}, "
        f"warm-up {resolved.warmup_steps}, boundaries {list(resolved.boundaries)}; run dir {run_dir}"
        + (f"; resuming at step {start_step}" if start_step else ""),
        flush=True,
    )
    started = time.time()
    for initial_epoch, epochs, steps in phases:
        with _reported("model.fit"):
            model.fit(
                streams(backup_cb.step), epochs=epochs, initial_epoch=initial_epoch, steps_per_epoch=steps,
                validation_data=test_stream, callbacks=callbacks, verbose=_verbose(config), shuffle=False,
            )
        if not backup_cb.finite or model.stop_training:
            break
    wall = time.time() - started
    run_state.kill_point("trained")
    if not backup_cb.finite:
        last = backup_cb.last_good
        raise TrainingDiverged(
            f"The training loss became NaN/inf near step {backup_cb.step} of {config.name}; stopped "
            f"(TerminateOnNaN). Last good checkpoint: "
            + (f"{last['weights']} (step {last['step']})" if last else "none (diverged before the first backup)")
            + ". Lower the learning rate (--lr) or use float32 (--precision float32)."
        )
    if backup_cb.step != resolved.total_steps:
        raise RuntimeError(f"Trained to step {backup_cb.step}, expected {resolved.total_steps}.")

    with _reported("model.evaluate"):
        evaluation = model.evaluate(test_stream, verbose=0, return_dict=True)
    metrics = {
        "name": config.name,
        "test_loss": float(evaluation["loss"]),
        "test_accuracy": float(evaluation["accuracy"]),
        "test_error": 100.0 * (1.0 - float(evaluation["accuracy"])),
        **({"test_top5_accuracy": float(evaluation["top5_accuracy"])} if "top5_accuracy" in evaluation else {}),
        "epochs": resolved.epochs,
        "steps": backup_cb.step,
        "steps_this_session": backup_cb.step - start_step,
        "wall_time_s": round(wall, 1),
        "train_images_per_s": round((backup_cb.step - start_step) * config.batch_size / max(wall, 1e-9), 1),
        "params": int(classifier.count_params()),
        "run_dir": str(run_dir),
    }
    history = read_history(files_dir / "history.csv")
    if history:
        metrics["train_loss"] = float(history[-1]["loss"])
        metrics["train_accuracy"] = float(history[-1]["accuracy"])
        metrics["history_epochs"] = len(history)
    # Under a multi-process JAX distribution, saving runs collectives (Keras creates variables while
    # it walks the model), so every process saves; the chief's copy is the run's model.
    save_model(classifier, (run_dir if dist.is_chief else files_dir) / "model.keras")
    if dist.is_chief:
        write_json(run_dir / "metrics.json", metrics)
        plots.plot_curves(run_dir / "history.csv", run_dir / "curves.png", resolved.steps_per_epoch,
                          title=f"{config.name} ({config.paper})")
        print_summary(metrics)
        if config.export:
            if dist.process_count > 1:  # the export reloads the model: keep it out of the collectives
                keras.distribution.set_distribution(None)
            metrics["export_dir"] = export(run_dir, config.export_dir)
            write_json(run_dir / "metrics.json", metrics)  # marks the export done
    return metrics


def print_summary(metrics):
    print("\n[train] summary")
    for key in ("name", "test_accuracy", "test_error", "test_top5_accuracy", "train_loss", "epochs",
                "steps", "wall_time_s", "train_images_per_s", "params", "run_dir"):
        if key in metrics:
            value = metrics[key]
            print(f"  {key:<20} {value:.4f}" if isinstance(value, float) else f"  {key:<20} {value}")
    sys.stdout.flush()


class TrainingFailed(RuntimeError):
    """Keras raised inside ``fit``/``evaluate``; the message is its first line (no array dumps)."""


@contextlib.contextmanager
def _reported(what):
    """Re-raise an error from inside Keras as ``TrainingFailed`` with its type and first line."""
    try:
        yield
    except (KeyboardInterrupt, TrainingDiverged, run_state.DiskFullError):  # ours: already one line
        raise
    except Exception as e:  # noqa: BLE001 - any backend error, summarised; the cause stays chained
        first = (str(e).strip().splitlines() or [""])[0]
        if len(first) > 300:
            first = first[:300] + " ..."
        raise TrainingFailed(f"{what} failed: {type(e).__name__}: {first}") from e


def export(run_dir, export_dir):
    if not export_lib.has_tensorflow():
        print("[train] export skipped: SavedModel export needs TensorFlow (pip install tensorflow); "
              f"model.keras is saved. Export later with: keras-preact-export {run_dir}")
        return None
    path = export_lib.export_run(run_dir, export_dir)
    print(f"[train] exported SavedModel to {path}")
    return str(path)
