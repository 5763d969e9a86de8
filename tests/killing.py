"""SIGKILL a training process from outside at a moment its run directory shows, as a lost machine would.

The trainer has no hook for this: the tests watch its files and kill the real process when a file appears
(``kill_when``), the way the kernel's OOM killer or a preempted machine ends it. The moments the tests use:

- ``writing_backup(run)``: a backup's temporary folder exists (``checkpoints/backup/.tmp-state-*``), with
  ``weights=True`` once its ``model.weights.h5`` is created: the kill lands while the backup is written;
- ``backed_up(run, step)``: the backup pointer names ``step`` (the last step: trained, not yet evaluated);
- ``saving_model(run)``: ``model.keras`` is being written (its temporary name exists).

As a command (for a process started where the test cannot see its files, e.g. in a mount namespace of its own)::

    python tests/killing.py 'RUN/checkpoints/backup/.tmp-state-*/model.weights.h5' -- TRAINER ARGS...

starts the trainer, kills it once the glob matches, and exits as a shell reports a SIGKILL (137).
"""

import glob
import json
import pathlib
import subprocess
import sys
import time

POLL_S = 0.001


def kill_when(proc, condition, timeout=600):
    """SIGKILL ``proc`` as soon as ``condition()`` holds; its exit code (``-SIGKILL`` when killed)."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        if condition():
            proc.kill()
            break
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise TimeoutError(f"the condition never held in {timeout} s")
        time.sleep(POLL_S)
    return proc.wait()


def _backup(run):
    return pathlib.Path(run) / "checkpoints" / "backup"


def writing_backup(run, weights=False):
    """A backup's temporary folder exists (and, with ``weights``, its weights file has been created)."""
    backup = _backup(run)

    def condition():
        try:
            folders = [p for p in backup.iterdir() if p.name.startswith(".tmp-state")]
        except FileNotFoundError:
            return False
        return any((p / "model.weights.h5").exists() for p in folders) if weights else bool(folders)

    return condition


def backed_up(run, step):
    """The backup pointer names ``step``."""
    pointer = _backup(run) / "latest.json"

    def condition():
        try:
            return json.loads(pointer.read_text())["step"] >= step
        except (OSError, ValueError, KeyError):
            return False

    return condition


def saving_model(run):
    """``model.keras`` is being written under its temporary name."""
    run = pathlib.Path(run)
    return lambda: any(p.name.startswith(".tmp-model") for p in run.iterdir()) if run.is_dir() else False


def main(argv):
    pattern, separator, *command = argv
    assert separator == "--", "usage: killing.py GLOB -- COMMAND..."
    code = kill_when(subprocess.Popen(command), lambda: bool(glob.glob(pattern)))
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
