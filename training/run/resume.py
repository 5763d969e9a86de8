"""A resume that knows what it resumes: before a backup is restored, the re-run's config is compared
with the run's manifest (``config.json``).

Fields that change the model or the data stream (architecture, depth, unit options, data set,
normalization, batch, seed, schedule, ...) must match, or ``check`` raises one line listing each
difference (the manifest is left as it was). The fields in ``MAY_CHANGE`` (verbosity, checkpoint
frequency, ``--health-every``, compilation, rematerialisation, ``--memory-limit``, ``--decoded-budget-mib``
(in memory or streamed, the batches are the same), export options, where the run and its data live) may
change; the new values are printed and the manifest records them. Data found elsewhere must hold the run's
classes (``check_classes``), so a run carried to another machine (``keras_preact_training.carry``) resumes on the
same data set.
"""

import dataclasses
import json
import pathlib

from .manifest import FILENAME, RunManifest
from .run_dir import read_backup

MAY_CHANGE = (
    "paper",
    "verbose",
    "checkpoint_every",
    "health_every",
    "jit_compile",
    "steps_per_execution",
    "remat",
    "export",
    "export_dir",
    "run_dir",
    "runs_root",
    "cache_dir",
    "memory_limit",
    "decoded_budget_mib",
    "data_dir",
    "manual_dir",
)  # where the data lives: another machine (keras_preact_training.carry); its classes are checked


def _plain(config):
    return json.loads(json.dumps(dataclasses.asdict(config)))  # tuples as lists, as config.json holds them


def differences(run_values, config):
    """{field: (the run's value, this command's)} for every field ``run_values`` records that differs."""
    new = _plain(config)
    return {k: (v, new[k]) for k, v in run_values.items() if k in new and v != new[k]}


def _listed(changes):
    return "; ".join(f"{k}: {old!r} in the run, {new!r} now" for k, (old, new) in changes.items())


def check(run_dir, config):
    """ValueError (one line) when the backup in ``run_dir`` was trained with another model or data
    stream than ``config``; prints the allowed changes. Nothing to resume: nothing to check."""
    run_dir = pathlib.Path(run_dir)
    backup = read_backup(run_dir / "checkpoints" / "backup")
    if backup is None or not (run_dir / FILENAME).is_file():
        return
    manifest = RunManifest.read(run_dir)
    run_values = _plain(manifest.training_config(source=repr(str(run_dir / FILENAME))))
    run_values = {k: v for k, v in run_values.items() if k in manifest.config}  # older runs: what they record
    changes = differences(run_values, config)
    fixed = {k: v for k, v in changes.items() if k not in MAY_CHANGE}
    if fixed:
        raise ValueError(
            f"Invalid resume of run_dir={str(run_dir)!r} (trained to step {backup['step']}): this command "
            f"changes what the run trains ({_listed(fixed)}). Re-run it as it was "
            f"(keras-preact-train --config {run_dir / FILENAME}) or start a new run with another --run-dir."
        )
    if changes:
        print(f"[train] changed on resume, as allowed: {_listed(changes)}", flush=True)


def check_classes(run_dir, class_names, backup):
    """ValueError (one line) when a resumed run's data has other classes than its manifest records."""
    run_dir = pathlib.Path(run_dir)
    if backup is None or not (run_dir / FILENAME).is_file():
        return
    recorded = tuple(RunManifest.read(run_dir).class_names or ())
    if recorded and recorded != tuple(class_names):
        raise ValueError(
            f"Invalid resume of run_dir={str(run_dir)!r}: the data has classes {list(class_names)}, the run was "
            f"trained on {list(recorded)}; pass the --data-dir of the run's data set."
        )
