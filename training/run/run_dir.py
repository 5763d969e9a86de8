"""The run directory: every file in it is written here, each to a temporary name and renamed.

``prepare_run_dir`` creates it; ``keras_preact.scratch.atomic_path`` is the one atomic writer
(``write_text``, ``write_json``, ``save_model``, the ``.npy`` cache, the backups use it); ``AtomicBackup`` keeps the
last complete backup for an exact resume.
"""

import datetime
import json
import math
import pathlib
import shutil
import tempfile

import keras
import numpy as np

from keras_preact.scratch import atomic_path

from . import parts, run_state

BACKUP_POINTER = "latest.json"


def write_text(path, text):
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_json(path, obj):
    write_text(path, json.dumps(obj, indent=2) + "\n")


def save_model(model, path):
    """``model.save(path)`` atomically, after checking the free space."""
    with atomic_path(path) as tmp:
        run_state.guard_write(path, run_state.weight_bytes(model), lambda: model.save(tmp), cleanup=tmp)


def prepare_run_dir(config):
    """The run directory, created and checked writable before any work."""
    if config.run_dir:
        run_dir = pathlib.Path(config.run_dir)
    else:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        run_dir = pathlib.Path(config.runs_root) / f"{config.name}-{stamp}"
    for path in (run_dir, *run_dir.parents):
        if path.exists() and not path.is_dir():
            raise ValueError(f"Invalid run_dir={str(run_dir)!r}: {path} is a file, not a directory; pass "
                             "--run-dir DIR (a directory, created when missing).")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "checkpoints").mkdir(exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=run_dir, prefix=".write-probe-"):
            pass
    except OSError as e:
        raise ValueError(f"Invalid run_dir={str(run_dir)!r}: not writable ({e.strerror}).") from None
    return run_dir


class AtomicBackup(keras.callbacks.Callback):
    """Backups that survive SIGKILL at any moment, for a resume at the exact step; the stop of a diverged run.

    Each backup (model + optimizer weights, epoch, global step) goes to a fresh ``state-<step>/``
    directory, then ``latest.json`` is replaced atomically to point at it; older states are removed
    afterwards. Backups happen every ``save_freq`` steps and at every epoch end, never with a
    non-finite loss or variable (so the last good state survives a divergence). ``train`` restores the backup
    (``read_backup``, ``run_state.restore``) before anything else and resumes the data stream and the
    epoch where they stopped; ``last_good`` is that backup, the one a divergence falls back to.

    No host synchronisation on other steps: the steps are counted in ``on_train_batch_begin``, which reads no
    value of the device, and this callback has no ``on_train_batch_end``, so Keras dispatches the batch-end
    callbacks off the training loop where its backend allows (JAX, PyTorch). A divergence is found where the
    device's values are read anyway: every variable at each backup, the epoch's loss at its end; the run
    stops there (``finite`` False, ``stop_training``), at most ``save_freq`` steps after the loss became
    non-finite (Keras' ``TerminateOnNaN`` stops at the step, reading the loss on every one).
    """

    def __init__(self, backup_dir, save_freq, start_step, last_good=None):
        super().__init__()
        self.backup_dir, self.save_freq = backup_dir, save_freq
        self.step = start_step
        self.last_saved_step = start_step
        self.last_good = last_good
        self.finite = True
        self._last_begin = None

    def on_epoch_begin(self, epoch, logs=None):
        self._current_epoch = epoch
        self._epoch_start_step = self.step
        self._last_begin = None

    def on_train_batch_begin(self, batch, logs=None):
        # ``batch``: the epoch's steps done before this call; the previous calls' updates are in the variables.
        self._last_begin = batch
        self.step = self._epoch_start_step + batch
        if self.finite and self.step - self.last_saved_step >= self.save_freq:
            self._save_model()

    def on_epoch_end(self, epoch, logs=None):
        self._current_epoch = epoch + 1
        if self._last_begin is not None:  # the last call ran min(steps per call, the steps left) steps
            per_call = getattr(self.model, "steps_per_execution", 1) or 1
            steps = (self.params or {}).get("steps")
            done = self._last_begin + per_call
            self.step = self._epoch_start_step + (min(done, steps) if steps else done)
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            self.finite = False
            self.model.stop_training = True
        if self.finite and self.step != self.last_saved_step:
            self._save_model()

    def _state_finite(self):
        """Whether every model and optimizer variable is finite. A step's loss is computed before its update,
        so a finite loss can come with weights that update made NaN/inf: such a state is no good backup."""
        variables = list(self.model.weights)
        if self.model.optimizer is not None and self.model.optimizer.built:
            variables += list(self.model.optimizer.variables)
        return all(np.isfinite(keras.ops.convert_to_numpy(v)).all() for v in variables)

    def _save_model(self):
        if not self._state_finite():
            self.finite = False  # as for a non-finite loss: the last good backup stays, the run stops
            self.model.stop_training = True
            return
        backup_dir = pathlib.Path(self.backup_dir)
        backup_dir.mkdir(parents=True, exist_ok=True)
        state = backup_dir / f"state-{self.step:010d}"
        with atomic_path(state) as tmp:
            tmp.mkdir()
            needed = run_state.tree_bytes(self.last_good["weights"]) if self.last_good else 0
            run_state.guard_write(tmp / "model.weights.h5", needed or run_state.weight_bytes(self.model),
                                  lambda: self.model.save_weights(tmp / "model.weights.h5"), cleanup=tmp)
            shutil.rmtree(state, ignore_errors=True)
        pointer = {"state": state.name, "step": self.step, "epoch": self._current_epoch,
                   "weights": str(state / "model.weights.h5")}
        write_json(backup_dir / BACKUP_POINTER, pointer)
        for old in backup_dir.iterdir():
            if old.name.startswith("state-") and old.name != state.name:
                shutil.rmtree(old, ignore_errors=True)
        self.last_saved_step = self.step
        self.last_good = pointer



def read_backup(backup_dir):
    """The last complete backup {"step", "epoch", "weights"} or None. A backup carried in parts
    (``keras_preact_training.carry``) is joined into its weights file first (``parts.join``)."""
    pointer = pathlib.Path(backup_dir) / BACKUP_POINTER
    if not pointer.exists():
        return None
    state = json.loads(pointer.read_text())
    state["weights"] = str(parts.join(pathlib.Path(backup_dir) / state["state"] / "model.weights.h5"))
    return state
