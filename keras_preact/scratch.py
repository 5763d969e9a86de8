"""Temporary names that carry their writer's process id, and the removal of those left by dead ones.

Every file or folder the package writes goes to ``.tmp-<what>-pid<PID>...`` next to its target and is
renamed into place. A process killed before the rename leaves the temporary behind;
``remove_stale(directory)`` deletes such names whose process no longer runs (on this machine), and
never touches a temporary of a live process (a concurrent writer) or a name it did not make.
``atomic_path(target)`` is the one writer of single files and folders built on it.
"""

import contextlib
import os
import pathlib
import re
import shutil

# ".tmp-<what>-pid<PID>" + an optional "-..." / "." tail; ".tmp-state-<step>-<PID>" is the older form.
_STALE = re.compile(r"^\.tmp-.*-pid(\d+)(?:[-.].*)?$|^\.tmp-state-\d+-(\d+)$")


def tag(what):
    """``.tmp-<what>-pid<PID>``: the prefix of this process's temporaries."""
    return f".tmp-{what}-pid{os.getpid()}"


def pid_alive(pid):
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def remove_stale(directory):
    """Delete the temporaries of dead processes in ``directory``; returns the names removed."""
    try:
        entries = list(os.scandir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return []
    removed = []
    for entry in entries:
        match = _STALE.match(entry.name)
        if not match or pid_alive(int(match.group(1) or match.group(2))):
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            try:
                os.unlink(entry.path)
            except FileNotFoundError:
                pass
        removed.append(entry.name)
    return removed


@contextlib.contextmanager
def atomic_path(path):
    """A temporary path next to ``path`` (``.tmp-<name>-pid<PID>``), renamed onto ``path`` when the
    block succeeds and removed when it fails: ``path`` is complete or absent, never half-written."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(tag(path.name) + "".join(path.suffixes))  # x.weights.h5 stays a .weights.h5
    try:
        yield tmp
    except BaseException:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
