"""What a run needs to resume on another machine, copied out of its run directory.

::

    python -m keras_preact_training.carry RUN_DIR DEST      # on the machine that trained (stopped or still running)
    cp -r DEST RUN; keras-preact-train --config RUN/config.json --run-dir RUN --data-dir DATA   # the next one

A long run (the paper's 64,000 iterations take several hours of a CPU machine) can outlive one machine: a
preemptible or time-limited instance, a lease that ends. The resume needs four files: the manifest
``config.json`` (what the run trains), ``history.csv`` (its epochs so far) and the last complete backup
(``checkpoints/backup/latest.json`` and the ``model.weights.h5`` it names: model and optimizer state). ``carry``
copies exactly those into ``DEST`` (written to a temporary folder, then renamed, so ``DEST`` is the old carry or the
new one, never half of each) and prints the command that resumes there. Where the copy goes through storage with a
per-file size limit (an object store's, a repository host's, an attachment's), ``--part-mb N`` writes a weights file
over N MiB as parts of at most N MiB and their index (``keras_preact_training.run.parts``), which the resume
checks and joins back; by default nothing is split. TensorBoard events, ``model.keras``, exports and caches stay
behind: the resumed run rewrites what it needs. The data may live elsewhere on the next machine (``--data-dir``
may change on resume; ``keras_preact_training.run.resume``).

Standard library only: it runs beside a live training without loading Keras.
"""

import argparse
import json
import math
import os
import pathlib
import shutil
import sys
import tempfile

from keras_preact_training.run import parts

MANIFEST, HISTORY = "config.json", "history.csv"
BACKUP = pathlib.PurePath("checkpoints", "backup")
POINTER = "latest.json"
WEIGHTS = "model.weights.h5"
ATTEMPTS = 5  # a live run writes a new backup at most every few seconds


def resumable_files(run_dir):
    """The paths (relative to ``run_dir``) a resume needs; ValueError naming ``run_dir`` when it has no backup."""
    run_dir = pathlib.Path(run_dir)
    if not (run_dir / MANIFEST).is_file():
        raise ValueError(f"Invalid run_dir={str(run_dir)!r}: no {MANIFEST}; pass the --run-dir of a "
                         "keras-preact-train run.")
    try:
        pointer = json.loads((run_dir / BACKUP / POINTER).read_text())
        state = pathlib.PurePath(pointer["state"])
    except (OSError, ValueError, KeyError, TypeError):
        raise ValueError(f"Invalid run_dir={str(run_dir)!r}: no complete backup in {run_dir / BACKUP} yet "
                         "(one is written every --checkpoint-every steps and at every epoch end).") from None
    weights = [BACKUP / state / WEIGHTS]
    if state.name == str(state) and not (run_dir / weights[0]).is_file():  # a carry not resumed yet: its parts
        try:
            index = json.loads(parts.index_path(run_dir / weights[0]).read_text())
            weights = [BACKUP / state / parts.index_path(WEIGHTS).name] + [BACKUP / state / n for n in index["parts"]]
        except (OSError, ValueError, KeyError, TypeError):
            pass
    if state.name != str(state) or not all((run_dir / w).is_file() for w in weights):
        raise ValueError(f"Invalid run_dir={str(run_dir)!r}: {run_dir / BACKUP / POINTER} names "
                         f"{str(state)!r}, which holds no {WEIGHTS}.")
    files = [pathlib.PurePath(MANIFEST), BACKUP / POINTER, *weights]
    if (run_dir / HISTORY).is_file():
        files.insert(1, pathlib.PurePath(HISTORY))
    return files, pointer


def _copy(run_dir, files, staging, part_bytes):
    for relative in files:
        (staging / relative).parent.mkdir(parents=True, exist_ok=True)
        if part_bytes is not None and relative.name == WEIGHTS and (run_dir / relative).stat().st_size > part_bytes:
            parts.split(run_dir / relative, (staging / relative).parent, part_bytes)
        else:
            shutil.copy2(run_dir / relative, staging / relative)


def carry(run_dir, dest, part_bytes=None):
    """Copy ``resumable_files(run_dir)`` into ``dest`` (replacing an earlier carry there); with ``part_bytes``, a
    weights file over that size as parts of at most that size. The backup's pointer."""
    if part_bytes is not None and (not isinstance(part_bytes, int) or isinstance(part_bytes, bool) or part_bytes < 1):
        raise ValueError(
            f"Invalid part_bytes={part_bytes!r}: None (no split) or a whole number of bytes >= 1 is required."
        )
    run_dir, dest = pathlib.Path(run_dir), pathlib.Path(dest)
    files, pointer = resumable_files(run_dir)
    if dest.resolve() == run_dir.resolve():
        raise ValueError(f"Invalid dest={str(dest)!r}: it is the run directory itself; pass another folder.")
    if dest.exists() and not dest.is_dir():
        raise ValueError(f"Invalid dest={str(dest)!r}: a file, not a folder.")
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(prefix=f".tmp-{dest.name}-", dir=dest.parent))
    try:
        for attempt in range(ATTEMPTS):
            try:
                _copy(run_dir, files, staging, part_bytes)
                break
            except FileNotFoundError:  # a live run replaced its backup meanwhile: take the new one
                if attempt == ATTEMPTS - 1:
                    raise
                shutil.rmtree(staging)
                staging.mkdir()
                files, pointer = resumable_files(run_dir)
        # The pointer written is the one read with the weights copied: the carry is always one whole backup.
        (staging / BACKUP / POINTER).write_text(json.dumps(pointer, indent=2) + "\n")
        old = None
        if dest.exists():
            old = dest.parent / f".tmp-old-{dest.name}-{os.getpid()}"
            os.replace(dest, old)
        os.replace(staging, dest)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return pointer


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m keras_preact_training.carry", description=__doc__.splitlines()[0],
                                     allow_abbrev=False)
    parser.add_argument("run_dir", help="the run directory of a keras-preact-train run (running or stopped)")
    parser.add_argument("dest", help="the folder to write (replaced when it exists)")
    parser.add_argument("--part-mb", type=float, default=None,
                        help="largest file written, in MiB, for storage with a per-file size limit: a larger weights "
                             "file goes in parts the resume joins back (default: no split)")
    args = parser.parse_args(argv)
    if args.part_mb is not None and not (math.isfinite(args.part_mb) and args.part_mb * 2**20 >= 1):
        parser.error(f"--part-mb must be a finite size of at least one byte (e.g. 1 or 0.5), got {args.part_mb}")
    try:
        part_bytes = None if args.part_mb is None else int(args.part_mb * 2**20)
        pointer = carry(args.run_dir, args.dest, part_bytes=part_bytes)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    dest = pathlib.Path(args.dest)
    size = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
    print(f"[carry] step {pointer['step']} (epoch {pointer['epoch']}) of {args.run_dir} -> {dest} "
          f"({size / 2**20:.1f} MiB). Resume elsewhere: cp -r {dest} RUN; keras-preact-train --config "
          "RUN/config.json --run-dir RUN --data-dir DATA")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
