"""What a run directory holds after a kill, and how a re-run picks up from it.

- ``restore(model, backup)`` loads the last backup (model + optimizer) before anything is decided, so
  evaluation, ``model.keras`` and the export use the trained weights even when nothing is left to fit.
- ``finished(run_dir, config, total_steps)``: the metrics of a run whose every phase (fit, evaluation,
  ``model.keras``, ``metrics.json``, export when asked) is done; a re-run is then a no-op.
- ``guard_write(...)``: a write that needs disk space fails with one line naming the path and the
  space needed (checked before writing, and on ENOSPC while writing) instead of an h5py traceback.
"""

import errno
import gc
import importlib.util
import json
import os
import pathlib
import shutil
import zipfile

MARGIN = 1.25  # free space asked for, relative to the estimated size of the write


class DiskFullError(OSError):
    """Not enough free space to write a checkpoint, the model or the export (one line, no traceback)."""


# ------------------------------------------------------------------------------------- restore
def restore(model, backup):
    """Load a ``read_backup`` state (model and optimizer variables) into a compiled ``model``."""
    if model.optimizer is not None and not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    model.load_weights(backup["weights"])


def error_of(accuracy):
    """The error, a fraction like the accuracy: ``1 - accuracy``."""
    return 1.0 - float(accuracy)


def read_metrics(path):
    """A run's ``metrics.json``, every accuracy and error a fraction in [0, 1]: a file written before
    ``test_error`` was a fraction (it held ``100 * (1 - test_accuracy)``, a percentage) reads as one now
    written, its ``test_error`` recomputed from ``test_accuracy``. OSError or ValueError for a missing or
    unreadable file."""
    metrics = json.loads(pathlib.Path(path).read_text())
    if isinstance(metrics, dict) and "test_error" in metrics and isinstance(metrics.get("test_accuracy"), (int, float)):
        metrics["test_error"] = error_of(metrics["test_accuracy"])
    return metrics


def finished(run_dir, config, total_steps, backup):
    """The saved metrics when the run is complete (nothing left to do), else None."""
    run_dir = pathlib.Path(run_dir)
    if backup is None or backup["step"] < total_steps:
        return None
    try:
        metrics = read_metrics(run_dir / "metrics.json")
    except (OSError, ValueError):
        return None
    if not isinstance(metrics, dict) or metrics.get("steps") != total_steps:
        return None
    if not zipfile.is_zipfile(run_dir / "model.keras"):  # missing or truncated
        return None
    # Without TensorFlow the export is skipped (said in one line); there is nothing more to finish.
    if config.export and not metrics.get("export_dir") and importlib.util.find_spec("tensorflow") is not None:
        return None
    return metrics


# ---------------------------------------------------------------------------------- disk space
def weight_bytes(model):
    """Bytes of the model's and optimizer's variables (what a backup writes)."""
    variables = list(model.weights)
    optimizer = getattr(model, "optimizer", None)  # an uncompiled model has none
    if optimizer is not None and optimizer.built:
        variables += list(optimizer.variables)
    total = 0
    for v in variables:
        size = 1
        for d in v.shape:
            size *= int(d)
        total += size * _itemsize(v.dtype)
    # h5 / zip metadata: a few KB per variable.
    return total + 4096 * len(variables)


def _itemsize(dtype):
    import numpy as np

    try:
        return np.dtype(str(dtype)).itemsize
    except TypeError:
        return 4


def tree_bytes(path):
    """Size of a file or of all files under a folder (0 when it does not exist)."""
    path = pathlib.Path(path)
    if path.is_file():
        return path.stat().st_size
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return 0


def _mb(n):
    """MB to one decimal; to two below 10 MB, so that what is needed and what is free never read the same."""
    return f"{n / 2**20:.{2 if n < 10 * 2**20 else 1}f} MB"


def _full(path, needed, free, inodes_free=None):
    """The one line of a write refused for space: too few bytes free, or (bytes enough) no inode left."""
    if free >= needed and inodes_free == 0:
        lack = f"its file system has {_mb(free)} free but no free inode (`df -i`): remove some files"
    else:
        lack = f"it needs about {_mb(needed)} free, {_mb(free)} is available there. Free some space"
    return DiskFullError(
        errno.ENOSPC,
        f"No space left to write {path}: {lack} (or choose another --run-dir / --export-dir) and re-run "
        "the same command; the last complete checkpoint is kept.",
    )


def no_space_message(path, needed, flag):
    """The one line of a write to ``path`` that ran out of space (``needed`` bytes, ``flag``: where to)."""
    parent = pathlib.Path(path)
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    return (f"No space left to write {path}: it needs about {_mb(needed * MARGIN)} free, "
            f"{_mb(shutil.disk_usage(parent).free)} is available there. Free some space (or choose another "
            f"{flag}) and re-run the same command; nothing partial is left.")


def is_disk_full(error):
    return isinstance(error, OSError) and (
        error.errno in (errno.ENOSPC, errno.EDQUOT) or "No space left" in str(error)
    )


def guard_write(path, needed, write, cleanup=None):
    """Run ``write()`` that writes about ``needed`` bytes at ``path``; DiskFullError when space lacks.

    ``cleanup`` (a path) is removed when the write fails for lack of space.
    """
    path = pathlib.Path(path)
    needed = int(needed * MARGIN)
    parent = path.parent if not path.is_dir() else path
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    free = shutil.disk_usage(parent).free
    if free >= needed:
        try:
            return write()
        except OSError as error:
            if not is_disk_full(error):
                raise
            error.__traceback__ = None  # its frames hold the half-written h5py file
        # Collect the failed writer's h5py objects now, while they can still be closed, not at exit.
        gc.collect()
        free, inodes_free = shutil.disk_usage(parent).free, os.statvfs(parent).f_favail
    else:
        inodes_free = None
    if cleanup is not None:
        cleanup = pathlib.Path(cleanup)
        if cleanup.is_dir():
            shutil.rmtree(cleanup, ignore_errors=True)
        else:
            cleanup.unlink(missing_ok=True)
    raise _full(path, needed, free, inodes_free) from None


# ------------------------------------------------------------------------------------- export
def check_export_target(export_dir, name):
    """ValueError before training when ``export_dir/name`` cannot become a writable directory."""
    target = pathlib.Path(export_dir) / name
    path = target
    while not path.exists() and path != path.parent:
        path = path.parent
    if not path.is_dir():
        raise ValueError(
            f"Invalid export_dir={str(export_dir)!r}: {path} is a file, not a directory; pass "
            "--export-dir DIR (a directory, created when missing) or --no-export."
        )
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"Invalid export_dir={str(export_dir)!r}: {path} is not writable.")


# ------------------------------------------------------------------------------------- config
def read_config_json(path):
    """A config.json's object; ValueError naming the file for bad JSON or a non-object."""
    text = pathlib.Path(path).read_text()
    try:
        values = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(
            f"Invalid config file {str(path)!r}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})."
        ) from None
    if not isinstance(values, dict):
        raise ValueError(
            f"Invalid config file {str(path)!r}: it must hold a JSON object of config fields "
            f"({{\"name\": ..., \"depth\": ...}}), not {type(values).__name__}."
        )
    return values
