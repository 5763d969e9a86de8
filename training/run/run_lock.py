"""One owner per run directory: ``fcntl.flock`` on a lock file, which the kernel releases when the
process ends (SIGKILL included), so a lock is never stale.

``owned(path, what)`` takes it at once or raises ``RunInUse`` naming the owner's PID and command;
``waited(path, what, say)`` waits for it, saying once who it waits for. The lock file holds the owner's
``{"pid", "command"}``, written once the lock is held.
"""

import contextlib
import errno
import fcntl
import json
import os
import pathlib
import shlex
import sys
import time

RUN_LOCK = ".run.lock"  # training: one per worker file set (the chief's in RUN_DIR, others' in worker-<i>/)
EXPORT_LOCK = ".export.lock"  # exports of one run, one at a time


class RunInUse(ValueError):
    """Another live process holds the lock."""


def owner(path):
    """'PID n (command)' of the holder recorded in the lock file at ``path``."""
    for _ in range(20):  # the holder writes its name just after taking the lock
        try:
            info = json.loads(pathlib.Path(path).read_text(encoding="utf-8"))
            return f"PID {info['pid']} ({info['command']})"
        except (OSError, ValueError, KeyError, TypeError):
            time.sleep(0.05)
    return "another process"


def _record(fd):
    os.ftruncate(fd, 0)
    command = shlex.join(getattr(sys, "orig_argv", sys.argv))
    os.pwrite(fd, json.dumps({"pid": os.getpid(), "command": command}).encode(), 0)


def _open(path):
    """(fd, writable): the lock file, or in a read-only directory the directory itself (owner unnamed)."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o644), True
    except OSError as error:
        if error.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
        return os.open(os.path.dirname(path) or ".", os.O_RDONLY), False


@contextlib.contextmanager
def _locked(path, on_busy):
    fd, writable = _open(path)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            on_busy(owner(path))
            fcntl.flock(fd, fcntl.LOCK_EX)  # reached when on_busy does not raise: wait
        if writable:
            _record(fd)
        yield
    finally:
        os.close(fd)  # releases the lock


def owned(path, what):
    """Hold the lock at ``path`` for this block, or raise ``RunInUse`` at once (``what``: the run's name
    in the message)."""
    def busy(holder):
        raise RunInUse(f"Invalid {what}: it is in use by {holder}; wait for it to end (or stop it), or "
                       "choose another --run-dir.")
    return _locked(path, busy)


def waited(path, what, say):
    """Hold the lock at ``path`` for this block, waiting for its holder; ``say(line)`` tells why."""
    return _locked(path, lambda holder: say(f"waiting for {holder} to finish {what}"))
