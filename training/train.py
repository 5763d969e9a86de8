"""Train a pre-activation ResNet with ``model.fit``: the CLI (``main``) and the Python API (``train``).

Python API::

    from training.configs import get_config
    from training.train import train

    result = train(get_config("t3-cifar10-resnet164-preact", dataset="folder", data_dir="/tmp/cifar10-jpeg"))
    result["test_accuracy"], result["run_dir"]

CLI (console script ``keras-preact-train``)::

    python -m training.train                       # ResNet-8 on synthetic data, a few CPU minutes, exported
    python -m training.train --preset t2-resnet110-full-preact --dataset folder --data-dir DIR --epochs 2
    python -m training.train --help                # flags and the preset table

Run directory (``--run-dir``, default ``runs/<name>-<timestamp>``): ``config.json`` (resolved config,
enough to re-run: ``python -m training.train --config RUN_DIR/config.json``), ``history.csv``
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

import argparse
import contextlib
import dataclasses
import datetime
import json
import math
import os
import pathlib
import shutil
import sys
import tempfile
import time

import keras
import numpy as np

from keras_preact import scratch
from training import augment, configs, data as data_lib, distribute, optimizers, plots, run_state, schedules

BACKUP_POINTER = "latest.json"


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite; the last good checkpoint is kept."""


# ------------------------------------------------------------------------------------- run files
def write_atomic(path, text):
    path = pathlib.Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=scratch.tag(path.name) + "-")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def write_json(path, obj):
    write_atomic(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def save_model_atomic(model, path):
    path = pathlib.Path(path)
    tmp = path.with_name(scratch.tag(path.stem) + ".keras")
    run_state.guard_write(path, run_state.weight_bytes(model), lambda: model.save(tmp), cleanup=tmp)
    run_state.kill_point("save")
    os.replace(tmp, path)


def prepare_run_dir(config):
    """The run directory, created and checked writable before any work."""
    if config.run_dir:
        run_dir = pathlib.Path(config.run_dir)
    else:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        run_dir = pathlib.Path(config.runs_root) / f"{config.name}-{stamp}"
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "checkpoints").mkdir(exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=run_dir, prefix=".write-probe-")
        probe.close()
    except OSError as e:
        raise ValueError(f"Invalid run_dir={str(run_dir)!r}: not writable ({e.strerror}).") from None
    return run_dir


def run_config_json(config, data, resolved):
    """config.json: every Config field plus the cross-team contract keys."""
    mean, std = (a.tolist() for a in data_lib.normalization(config, data))
    values = dataclasses.asdict(config)
    values.update(
        name=config.name,
        class_names=list(data.class_names),
        num_classes=data.num_classes,
        image_size=list(config.image_size),
        normalization={"mean": list(mean), "std": list(std)},
        normalization_name=config.normalization,
        resolved_schedule=dataclasses.asdict(resolved),
        keras_backend=keras.backend.backend(),
        keras_version=keras.__version__,
    )
    return values


def config_from_run(path):
    """The Config of a run directory's (or a file's) config.json, to re-run it."""
    path = pathlib.Path(path)
    values = run_state.read_config_json(path / "config.json" if path.is_dir() else path)
    values["normalization"] = values.get("normalization_name", "cifar10")
    return configs.from_dict(values)


# ----------------------------------------------------------------------------------- callbacks
class AtomicBackupAndRestore(keras.callbacks.Callback):
    """Backups that survive SIGKILL at any moment, for a resume at the exact step.

    Each backup (model + optimizer weights, epoch, global step) goes to a fresh ``state-<step>/``
    directory, then ``latest.json`` is replaced atomically to point at it; older states are removed
    afterwards. Backups happen every ``save_freq`` steps and at every epoch end, never with a
    non-finite loss (so the last good state survives a divergence). ``train`` restores the backup
    (``read_backup``, ``run_state.restore``) before anything else and resumes the data stream and the
    epoch where they stopped; ``last_good`` is that backup, the one a divergence falls back to.
    """

    def __init__(self, backup_dir, save_freq, start_step, last_good=None):
        super().__init__()
        self.backup_dir, self.save_freq = backup_dir, save_freq
        self.step = start_step
        self.last_saved_step = start_step
        self.last_good = last_good
        self.finite = True

    def on_epoch_begin(self, epoch, logs=None):
        self._current_epoch = epoch
        self._epoch_start_step = self.step

    def on_train_batch_end(self, batch, logs=None):
        # ``batch`` is the epoch's last step of the call (several with steps_per_execution > 1).
        self.step = self._epoch_start_step + batch + 1
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            self.finite = False
        if self.finite and self.step - self.last_saved_step >= self.save_freq:
            self._save_model()

    def on_epoch_end(self, epoch, logs=None):
        self._current_epoch = epoch + 1
        if self.finite and self.step != self.last_saved_step:
            self._save_model()

    def _save_model(self):
        backup_dir = pathlib.Path(self.backup_dir)
        backup_dir.mkdir(parents=True, exist_ok=True)
        state = backup_dir / f"state-{self.step:010d}"
        tmp = backup_dir / scratch.tag(f"state-{self.step:010d}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        needed = run_state.tree_bytes(self.last_good["weights"]) if self.last_good else 0
        run_state.guard_write(tmp / "model.weights.h5", needed or run_state.weight_bytes(self.model),
                              lambda: self.model.save_weights(tmp / "model.weights.h5"), cleanup=tmp)
        run_state.kill_point("checkpoint")
        shutil.rmtree(state, ignore_errors=True)
        os.replace(tmp, state)
        pointer = {"state": state.name, "step": self.step, "epoch": self._current_epoch,
                   "weights": str(state / "model.weights.h5")}
        write_json(backup_dir / BACKUP_POINTER, pointer)
        for old in backup_dir.iterdir():
            if old.name.startswith("state-") and old.name != state.name:
                shutil.rmtree(old, ignore_errors=True)
        self.last_saved_step = self.step
        self.last_good = pointer



def read_backup(backup_dir):
    """The last complete backup {"step", "epoch", "weights"} or None."""
    pointer = pathlib.Path(backup_dir) / BACKUP_POINTER
    if not pointer.exists():
        return None
    state = json.loads(pointer.read_text())
    state["weights"] = str(pathlib.Path(backup_dir) / state["state"] / "model.weights.h5")
    return state


# ---------------------------------------------------------------------------------------- model
def _cifar_model(config, num_classes):
    from keras_preact.models import cifar_resnet

    return cifar_resnet(config.depth, num_classes, input_shape=(*config.image_size, 3),
                        drop_path_rate=config.drop_path_rate, name=config.name.replace(".", "_"),
                        **config.unit_options)


def _imagenet_model(config, num_classes):
    from keras_preact.models import imagenet_resnet

    # Fully convolutional input so the same weights test at 224 and at 320 (Table 5).
    return imagenet_resnet(config.depth, num_classes, input_shape=(None, None, 3),
                           drop_path_rate=config.drop_path_rate, name=config.name.replace(".", "_"),
                           **config.unit_options)


MODEL_BUILDERS = {"cifar": _cifar_model, "imagenet": _imagenet_model}


def build_model(config, num_classes, resolved, pipeline="tf_data", data=None):
    """(classifier, fit_model). ``fit_model`` holds the classifier and is the one compiled: with
    ``pipeline="device"`` behind on-device augmentation and normalization (``training.augment``, uint8
    pixels in; ``data`` for per-pixel mean statistics). The classifier stays uncompiled, so the saved
    ``model.keras`` loads with plain Keras (no ``TorchSGD`` to import); the backups hold the optimizer."""
    classifier = MODEL_BUILDERS[config.architecture](config, num_classes)
    if pipeline == "device":
        mean, std = data_lib.normalization(config, data)
        model = augment.device_training_model(classifier, augmentation=config.augmentation, mean=mean,
                                              std=std, seed=config.seed)
    else:
        images = keras.Input(classifier.input_shape[1:], name="images")
        model = keras.Model(images, classifier(images), name=f"{classifier.name}_training")
    compile_model(model, config, resolved, num_classes)
    return classifier, model


def compile_model(model, config, resolved, num_classes):
    """Compile for training as the recipe says: ``TorchSGD`` on the schedule, cross-entropy, accuracy."""
    optimizer = optimizers.from_config(config, schedules.make(config, resolved))
    metrics = ["accuracy"]
    if num_classes > 5:
        metrics.append(keras.metrics.SparseTopKCategoricalAccuracy(5, name="top5_accuracy"))
    jit = {"auto": "auto", "true": True, "false": False}[str(config.jit_compile).lower()]
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy", metrics=metrics,
                  jit_compile=jit, steps_per_execution=config.steps_per_execution)
    return model


# ------------------------------------------------------------------------------------- training
def set_determinism(config):
    keras.utils.set_random_seed(config.seed)
    if config.deterministic and keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        tf.config.experimental.enable_op_determinism()


def _shard_eval(images, labels, batch_size, index, count):
    """This process's slices of the test set in global batches (multi-process data-parallel)."""
    per = batch_size // count
    full = (len(labels) // batch_size) * batch_size
    pick = np.concatenate([np.arange(k + index * per, k + (index + 1) * per) for k in range(0, full, batch_size)])
    return images[pick], labels[pick]


class _ShardedTrain:
    """Wrap a global-batch stream so this process keeps its slice of every global batch."""

    def __init__(self, index, count):
        self.index, self.count = index, count

    def numpy(self, stream):
        for x, y in stream:
            per = len(y) // self.count
            sl = slice(self.index * per, (self.index + 1) * per)
            yield x[sl], y[sl]

    def tf_data(self, ds, global_batch):
        n = global_batch // self.count  # static, so Keras sees the per-process batch size

        def cut(x, y):
            x, y = x[self.index * n:(self.index + 1) * n], y[self.index * n:(self.index + 1) * n]
            return tf.ensure_shape(x, [n, *x.shape[1:]]), tf.ensure_shape(y, [n])

        import tensorflow as tf

        return ds.map(cut)


def has_tensorboard():
    """The TensorBoard callback needs the ``tensorboard`` package (and TensorFlow) for its writer."""
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        return False
    return data_lib.has_tensorflow()


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

    ``data``: optional ``training.data.ArrayData`` to train on instead of ``config.dataset``.
    Raises ValueError (naming the bad argument) before any training for bad input, and
    ``TrainingDiverged`` when the loss becomes non-finite.
    """
    configs.validate(config)
    run_dir = prepare_run_dir(config)
    keras.config.set_dtype_policy(config.precision)
    dist = distribute.make(config)
    data = data.validate() if data is not None else data_lib.load(config)
    data_lib.check_image_size(data, config)
    data_lib.check_batch_size(data, config)
    resolved = schedules.resolve(config, data.train_size)
    files_dir = run_dir if dist.is_chief else run_dir / f"worker-{dist.process_index}"
    files_dir.mkdir(exist_ok=True)
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
    if dist.is_chief:
        write_json(run_dir / "config.json", run_config_json(config, data, resolved))

    set_determinism(config)
    pipeline = data_lib.resolve_pipeline(config)
    distribute.check_pipeline(pipeline, dist)
    with dist.scope():
        classifier, model = build_model(config, data.num_classes, resolved, pipeline, data)
        if backup:  # before anything is decided: with nothing left to fit, fit never restores
            run_state.restore(model, backup)

    sharded = dist.process_count > 1 and config.distribute == "data-parallel"
    per_process_batch = config.batch_size // dist.process_count if sharded else config.batch_size
    eval_data = data
    if sharded and isinstance(data, data_lib.ArrayData):
        test_images, test_labels = _shard_eval(data.test_images, data.test_labels, config.batch_size,
                                               dist.process_index, dist.process_count)
        eval_data = dataclasses.replace(data, test_images=test_images, test_labels=test_labels)

    def streams(step):
        train_stream, _ = data_lib.pipelines(data, config, config.batch_size, start_step=step)
        if sharded:
            shard = _ShardedTrain(dist.process_index, dist.process_count)
            train_stream = (shard.tf_data(train_stream, config.batch_size) if pipeline == "tf_data"
                            else shard.numpy(train_stream))
        return train_stream

    _, test_stream = data_lib.pipelines(eval_data, config, per_process_batch, start_step=0)

    # Multi-worker: every worker restored the chief's backup (the weights are in sync), so all resume at
    # one step; each still writes its own (saving may run collectives).
    backup_cb = AtomicBackupAndRestore(backup_dir, config.checkpoint_every, start_step, backup)
    callbacks = [
        keras.callbacks.TerminateOnNaN(),
        keras.callbacks.CSVLogger(str(files_dir / "history.csv"), append=True),
        backup_cb,
    ]
    if config.health_every and isinstance(data, data_lib.ArrayData):
        # Before CSVLogger, so the health signals land in history.csv (keras_preact.analysis).
        from keras_preact.analysis import TrainingHealthCallback

        mean, std = data_lib.normalization(config, data)
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
    history = _dedup_history(files_dir / "history.csv")
    if history:
        metrics["train_loss"] = float(history[-1]["loss"])
        metrics["train_accuracy"] = float(history[-1]["accuracy"])
        metrics["history_epochs"] = len(history)
    # Under a multi-process JAX distribution, saving runs collectives (Keras creates variables while
    # it walks the model), so every process saves; the chief's copy is the run's model.
    save_model_atomic(classifier, (run_dir if dist.is_chief else files_dir) / "model.keras")
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


def _dedup_history(csv_path):
    """CSVLogger rows, one per epoch (a kill between the log and the backup can repeat an epoch)."""
    if not pathlib.Path(csv_path).exists():
        return []
    rows = {int(r["epoch"]): r for r in plots.read_history(csv_path)}
    return [rows[k] for k in sorted(rows)]


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
    if not data_lib.has_tensorflow():
        print("[train] export skipped: SavedModel export needs TensorFlow (pip install tensorflow); "
              f"model.keras is saved. Export later with: keras-preact-export {run_dir}")
        return None
    from keras_preact.export import export_run

    path = export_run(run_dir, export_dir)
    print(f"[train] exported SavedModel to {path}")
    return str(path)


def describe_recipe(config):
    """What ``--dry-run`` prints: the run's iterations, its lr at every change, the optimizer."""
    if config.dataset == "synthetic":
        train_size = config.synthetic_train_size
    elif config.dataset == "folder":
        train_size = len(data_lib._list_folder(data_lib.folder_splits(config.data_dir)[0])[0])
    elif config.dataset in configs.TRAIN_SIZES:
        train_size = configs.TRAIN_SIZES[config.dataset]
    else:
        raise ValueError(f"--dry-run does not know the size of dataset={config.dataset!r}; pass --steps-per-epoch.")
    train_size = min(train_size, config.subset or train_size)
    resolved = schedules.resolve(config, train_size)
    lines = [
        f"preset {config.name} ({config.paper})",
        f"model: {config.architecture} ResNet-{config.depth} {config.unit_options or ''}".rstrip(),
        f"data: {config.dataset}, {train_size} training images, batch {config.batch_size}, augmentation "
        f"{config.augmentation}, normalization {config.normalization}",
        f"iterations: {resolved.total_steps} = {resolved.epochs} epochs x {resolved.steps_per_epoch}",
        f"optimizer: TorchSGD momentum {config.momentum}, nesterov {config.nesterov}, dampening 0, weight "
        f"decay {config.weight_decay} (coupled, scope {config.weight_decay_scope})",
        f"learning rate ({config.schedule}), from iteration:",
    ]
    lines += [f"  {step:>9}  {lr:.6g}" for step, lr in schedules.lr_table(config, resolved)]
    lines.append(f"  {resolved.total_steps:>9}  (stop)")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ CLI
def _preset_table():
    width = max(map(len, configs.PRESETS))
    return "\n".join(f"  {name:<{width}}  {preset.paper}" for name, preset in configs.PRESETS.items())


def build_parser():
    p = argparse.ArgumentParser(
        prog="keras-preact-train",
        description="Train a pre-activation ResNet (He et al. 2016) with model.fit. With no arguments: "
        "ResNet-8 on built-in synthetic data for a few CPU minutes, then export to saved_models/.",
        epilog="presets (one per experiment of the paper):\n" + _preset_table(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("preset_name", nargs="?", metavar="PRESET", help="same as --preset")
    p.add_argument("--preset", choices=sorted(configs.PRESETS), metavar="NAME",
                   help=f"preset (default {configs.DEFAULT_PRESET}; list below)")
    p.add_argument("--config", metavar="CONFIG_JSON", help="re-run a run's config.json (flags override it)")
    p.add_argument("--dataset", help="a TFDS name (cifar10, cifar100, imagenet2012, ...), 'folder' or 'synthetic'")
    p.add_argument("--data-dir", help="TFDS data_dir, or the image-folder root (train/ and test/ or val/)")
    p.add_argument("--manual-dir", help="TFDS manual_dir (e.g. the imagenet2012 archives)")
    p.add_argument("--cache-dir", help="where decoded image folders are cached as .npy")
    p.add_argument("--skip-bad-images", action=argparse.BooleanOptionalAction, default=None,
                   help="folder data: skip unreadable image files (counted) instead of failing")
    p.add_argument("--subset", type=int, help="use the first N training images")
    p.add_argument("--image-size", type=int, nargs=2, metavar=("H", "W"))
    p.add_argument("--depth", type=int, help="network depth (CIFAR 6n+2 / 9n+2; ImageNet 18-200)")
    p.add_argument("--ordering", help="unit ordering (paper Table 2), e.g. full_preact, original")
    p.add_argument("--epochs", type=int, help="number of epochs (the schedule shrinks to fit)")
    p.add_argument("--steps", type=int, help="total iterations (rounded up to whole epochs)")
    p.add_argument("--steps-per-epoch", type=int)
    p.add_argument("--batch-size", type=int, help="global batch size")
    p.add_argument("--lr", type=float, dest="base_lr", help="peak learning rate (default 0.1)")
    p.add_argument("--schedule", choices=configs.SCHEDULES)
    p.add_argument("--lr-scaling", choices=configs.LR_SCALINGS)
    p.add_argument("--weight-decay", type=float)
    p.add_argument("--nesterov", action=argparse.BooleanOptionalAction, default=None,
                   help="Nesterov momentum (default on, as the official trainer)")
    p.add_argument("--weight-decay-scope", choices=configs.WEIGHT_DECAY_SCOPES,
                   help="all: every parameter (the official code's, default); kernels: conv/dense kernels only")
    p.add_argument("--dry-run", action="store_true",
                   help="print the resolved recipe (schedule as iteration/lr, optimizer) and exit; no training")
    p.add_argument("--run-dir", help="run directory; re-run the same command to resume after a kill")
    p.add_argument("--runs-root", help="parent of default run directories (default runs/)")
    p.add_argument("--distribute", choices=configs.DISTRIBUTIONS)
    p.add_argument("--precision", choices=configs.PRECISIONS)
    p.add_argument("--jit-compile", choices=("auto", "true", "false"), help="XLA / jit compilation")
    p.add_argument("--pipeline", choices=configs.PIPELINES,
                   help="input pipeline: tf_data (TensorFlow default), device (uint8 from numpy, "
                   "augmentation and normalization in the compiled step; default without TensorFlow), "
                   "numpy (all on the host)")
    p.add_argument("--steps-per-execution", type=int, help="training steps per compiled call (default 1)")
    p.add_argument("--seed", type=int)
    p.add_argument("--deterministic", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--checkpoint-every", type=int, help="steps between backups (default 50)")
    p.add_argument("--health-every", type=int,
                   help="log per-stage gradient norms, update ratios, activation stats every N steps")
    p.add_argument("--export", action=argparse.BooleanOptionalAction, default=None,
                   help="export a SavedModel at the end (default: on for the default preset)")
    p.add_argument("--export-dir")
    p.add_argument("--verbose", choices=("auto", "0", "1", "2"))
    return p


def config_from_args(args, parser):
    if args.preset and args.preset_name and args.preset != args.preset_name:
        parser.error(f"two presets given: {args.preset_name!r} and --preset {args.preset!r}")
    preset = args.preset or args.preset_name
    overrides = {
        k: v for k, v in vars(args).items()
        if v is not None and k not in ("preset", "preset_name", "config", "ordering", "dry_run")
    }
    if "image_size" in overrides:
        overrides["image_size"] = tuple(overrides["image_size"])
    try:
        if args.config:
            base = config_from_run(args.config)
            if preset:
                parser.error("give either a preset or --config, not both")
            config = configs.validate(base.replace(**overrides))
        else:
            if preset and preset not in configs.PRESETS:
                parser.error(f"argument --preset: invalid choice: {preset!r} (choose from "
                             f"{', '.join(sorted(configs.PRESETS))})")
            config = configs.get_config(preset or configs.DEFAULT_PRESET, **overrides)
        if args.ordering:
            config = configs.validate(config.replace(unit_options={**config.unit_options, "ordering": args.ordering}))
    except (ValueError, OSError) as e:
        parser.error(str(e))
    return config


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    config = config_from_args(args, parser)
    if args.dry_run:
        try:
            print(describe_recipe(config))
        except ValueError as e:
            parser.exit(2, f"keras-preact-train: error: {e}\n")
        return 0
    try:
        train(config)
    except (TrainingDiverged, OSError) as e:
        if isinstance(e, OSError) and not run_state.is_disk_full(e):
            raise
        print(f"keras-preact-train: error: {e}", file=sys.stderr)
        return 1
    except TrainingFailed as e:
        if os.environ.get("KERAS_PREACT_TRACEBACK"):
            raise
        print(f"keras-preact-train: error: {e} (set KERAS_PREACT_TRACEBACK=1 for the traceback)",
              file=sys.stderr)
        return 1
    except ValueError as e:
        parser.exit(2, f"keras-preact-train: error: {e}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
