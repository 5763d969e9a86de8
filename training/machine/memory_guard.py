"""Stop a training or evaluation that outgrows host memory with one line, before Linux's OOM killer ends it
without a word.

On a CPU host the backends rarely raise an out-of-memory error: memory grows until the kernel's OOM killer
sends SIGKILL and nothing is printed. ``watch(what, fraction)`` (around ``model.fit`` and ``model.evaluate``
in ``keras_preact_training.train``, around ``model.evaluate`` in ``keras_preact_training.evaluate``) runs a daemon
thread that reads the memory in use every ``INTERVAL_S`` seconds and, once it reaches ``fraction`` of the limit, prints
one line on stderr and ends the process at once with ``os._exit(1)``, the exit code of a failed run of
``keras-preact-train`` and of ``keras-preact-evaluate`` (a bad argument exits 2). Ray's memory monitor does
the same (``RAY_memory_usage_threshold``, default 0.95). The line starts with the command's ``prefix``
("[train]" by default, "[evaluate]") and carries its ``remedies`` (by default training's,
``OUT_OF_MEMORY_HINT``, which ``keras_preact_training.train``'s out-of-memory error carries too); ``check_fraction`` is
both commands' ``--memory-limit`` check.
Every file of a run is written to a temporary name and renamed, so a target is complete or absent; a
temporary cut off mid-write is removed by the next run in that directory, as after a SIGKILL.

Memory in use and the limit: the process's memory cgroup where a limit is set (cgroup v2 ``memory.max`` /
``memory.current``, v1 ``memory.limit_in_bytes`` / ``memory.usage_in_bytes``, each less the reclaimable
``inactive_file`` page cache, as Ray and the kubelet count it; the fullest of the process's cgroup and its
ancestors); else the machine's ``/proc/meminfo`` (MemTotal - MemAvailable of MemTotal). A limit of "max",
or at least the machine's memory, is no limit. Where neither can be read (not Linux) the guard is off and
says so once.

Cost: a poll reads /proc/meminfo, or a limited cgroup's three files (which cgroups have a limit is found once
per ``watch``). Measured on a busy 2-core machine: 0.07-0.08 ms of CPU per poll back to back, 0.4-0.5 ms per
poll from the sleeping thread (its wake-up included): under 0.5% of one core at 10 polls a second. Growth
faster than one poll (a single allocation larger than what is left) can still reach the OOM killer first.
Standard library only.
"""

import contextlib
import dataclasses
import math
import os
import pathlib
import sys
import threading

DEFAULT_FRACTION = 0.95  # Ray's RAY_memory_usage_threshold
INTERVAL_S = 0.1
EXIT_CODE = (
    1  # the exit code of a failed run: keras-preact-train's (keras_preact_training.cli) and keras-preact-evaluate's
)
PREFIX = "[train]"  # the line's first word: the command's (keras_preact_training.evaluate passes "[evaluate]")
FRACTION_RULE = (f"0 (the memory guard off) or a fraction 0 < f <= 1 of the memory limit is required "
                 f"(default {DEFAULT_FRACTION:g})")
NO_LIMIT = 2**60  # cgroup v1 writes 2**63 - 4096 for "no limit"; anything this large is none
THREAD_NAME = "keras-preact-memory-guard"
GIB = 2**30
# Training's remedies: the default of the guard's line, and what keras_preact_training.train's out-of-memory error ends
# with.
OUT_OF_MEMORY_HINT = (
    ' -- out of memory: train with --remat segments:<k> or --remat units (docs/training.md, "Training the '
    'deepest networks on one device") or a smaller --batch-size'
)


@dataclasses.dataclass(frozen=True)
class Memory:
    """One reading: ``used`` of ``limit`` bytes, and where they were read (``source``, for the message)."""

    used: int
    limit: int
    source: str

    @property
    def left(self):
        return max(self.limit - self.used, 0)


def _read_text(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _read_int(path):
    text = (_read_text(path) or "").strip()
    return int(text) if text.isdigit() else None  # "max" (cgroup v2: no limit) -> None


def _stat_value(path, key):
    """``key``'s value in a ``memory.stat`` file (0 when absent: nothing subtracted)."""
    for line in (_read_text(path) or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


def read_meminfo(root="/"):
    """The machine's memory from ``<root>/proc/meminfo``: MemTotal - MemAvailable of MemTotal; None when absent."""
    values = {}
    for line in (_read_text(os.path.join(root, "proc/meminfo")) or "").splitlines():
        name, _, rest = line.partition(":")
        fields = rest.split()
        if name in ("MemTotal", "MemAvailable") and fields and fields[0].isdigit():
            values[name] = int(fields[0]) * 1024  # kB
    if "MemTotal" not in values or "MemAvailable" not in values:
        return None
    total = values["MemTotal"]
    return Memory(used=max(total - values["MemAvailable"], 0), limit=total, source="this machine's memory")


def _own_cgroups(root):
    """{controller: path} from ``<root>/proc/self/cgroup`` ("0::/a/b" for v2, "4:memory:/a" for v1)."""
    paths = {}
    for line in (_read_text(os.path.join(root, "proc/self/cgroup")) or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for controller in parts[1].split(","):  # "" for v2
                paths[controller] = parts[2]
    return paths


def _with_ancestors(mount, own):
    """``mount/own`` and every directory above it up to ``mount`` (the ones that exist)."""
    directory = mount / own.strip("/") if own else mount
    dirs = [d for d in (directory, *directory.parents) if d == mount or mount in d.parents]
    return [d for d in dirs if d.is_dir()]


@dataclasses.dataclass(frozen=True)
class _Cgroup:
    """A memory cgroup directory with a limit, and the names of its files (v2 or v1)."""

    directory: str
    limit_file: str
    usage_file: str
    stat_key: str  # memory.stat's reclaimable page cache, subtracted from the usage
    source: str

    def read(self):
        limit = _read_int(os.path.join(self.directory, self.limit_file))
        usage = _read_int(os.path.join(self.directory, self.usage_file))
        if limit is None or usage is None:
            return None
        used = max(usage - _stat_value(os.path.join(self.directory, "memory.stat"), self.stat_key), 0)
        return Memory(used=used, limit=limit, source=self.source)


def limited_cgroups(root="/", machine_total=None):
    """The process's memory cgroup and its ancestors that have a limit (v2, else v1); a limit of "max", of
    at least ``NO_LIMIT`` or of at least ``machine_total`` is none. Empty without a cgroup file system."""
    base = pathlib.Path(root) / "sys/fs/cgroup"
    own = _own_cgroups(root)
    if (base / "cgroup.controllers").exists():  # v2 (unified) mounted at /sys/fs/cgroup
        dirs = _with_ancestors(base, own.get(""))
        names = ("memory.max", "memory.current", "inactive_file", "the container's cgroup limit, memory.max")
    else:  # v1: the memory controller's own hierarchy
        dirs = _with_ancestors(base / "memory", own.get("memory"))
        names = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file",
                 "the container's cgroup limit, memory.limit_in_bytes")
    found = []
    for directory in dirs:
        limit = _read_int(directory / names[0])
        if limit is not None and limit < NO_LIMIT and not (machine_total and limit >= machine_total):
            found.append(_Cgroup(str(directory), *names))
    return found


def memory_reader(root="/"):
    """A function returning the memory to watch now: the fullest of the limited cgroups where one is set,
    else (or when their files cannot be read) the machine's. Which cgroups have a limit is found once, here, so a poll
    reads only their
    files (or /proc/meminfo). None instead of a function where neither is readable (not Linux)."""
    machine = read_meminfo(root)
    cgroups = limited_cgroups(root, machine.limit if machine else None)
    if cgroups:
        def fullest():  # a cgroup whose files cannot be read now: the machine's memory instead
            readings = [m for m in (c.read() for c in cgroups) if m is not None]
            return max(readings, key=lambda m: m.used / max(m.limit, 1), default=None) or read_meminfo(root)
        return fullest
    return (lambda: read_meminfo(root)) if machine else None


def read_memory(root="/"):
    """One reading of ``memory_reader(root)``; None where no memory can be read."""
    reader = memory_reader(root)
    return reader() if reader else None


def process_rss(root="/"):
    """This process's resident memory in bytes (``VmRSS`` of ``<root>/proc/self/status``); None when absent."""
    for line in (_read_text(os.path.join(root, "proc/self/status")) or "").splitlines():
        fields = line.split()
        if fields[:1] == ["VmRSS:"] and len(fields) > 1 and fields[1].isdigit():
            return int(fields[1]) * 1024
    return None


def check_fraction(value, name="memory_limit"):
    """``value`` when it is a ``--memory-limit``: 0 (the guard off) or a number 0 < f <= 1 (not a bool, not
    NaN); else ``ValueError`` naming ``name`` and the flag, with ``FRACTION_RULE``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value == 0 or 0 < value <= 1):
        raise ValueError(f"Invalid {name}={value!r} (--memory-limit): {FRACTION_RULE}.")
    return value


def threshold_bytes(limit, fraction):
    """The bytes in use at which the guard stops the run: ``ceil(fraction * limit)``."""
    return math.ceil(fraction * limit)


def trips(memory, fraction):
    """Whether ``memory`` is at or over ``fraction`` of its limit."""
    return memory.used >= threshold_bytes(memory.limit, fraction)


def message(what, memory, fraction, rss, *, prefix=PREFIX, remedies=None):
    """The one line the guard prints: ``prefix`` first (the command's), ``remedies`` (text starting " -- ")
    after the numbers; ``None``: training's, ``OUT_OF_MEMORY_HINT``."""
    if remedies is None:
        remedies = OUT_OF_MEMORY_HINT
    rss_text = f"{rss / GIB:.2f} GiB" if rss is not None else "unknown"
    return (
        f"{prefix} error: out of host memory during {what}: {memory.left / GIB:.2f} GiB left of "
        f"{memory.limit / GIB:.2f} GiB ({memory.source}; {memory.used / memory.limit:.0%} in use reached "
        f"--memory-limit {fraction:g}), this process's RSS {rss_text}; stopped before the kernel's OOM killer "
        f"would end the run without a word{remedies}; --memory-limit FRACTION changes the threshold "
        f"(default {DEFAULT_FRACTION:g}), --memory-limit 0 switches this guard off"
    )


def _exit_now(line):
    """Flush what the run printed, write ``line`` on stderr and end the process at once."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os.write(2, (line + "\n").encode())
    os._exit(EXIT_CODE)


class MemoryGuard:
    """The polling thread of ``watch``; ``poll()`` is one reading and decision (``exit`` is called with the
    line when it trips: ``_exit_now`` unless a test gives its own). ``reader``: ``memory_reader(root)``;
    ``prefix``, ``remedies``: the line's (``message``)."""

    def __init__(self, what, fraction, *, root="/", reader=None, interval=INTERVAL_S, exit=_exit_now,
                 prefix=PREFIX, remedies=None):
        self.what, self.fraction, self.root, self.interval, self.exit = what, fraction, root, interval, exit
        self.prefix, self.remedies = prefix, remedies
        self.reader = reader or memory_reader(root) or (lambda: None)
        self._stop = threading.Event()
        self._thread = None

    def poll(self):
        """Read the memory; at or over the threshold, call ``exit`` with the line. Returns whether it tripped."""
        memory = self.reader()
        if memory is None or not trips(memory, self.fraction):
            return False
        self.exit(message(self.what, memory, self.fraction, process_rss(self.root), prefix=self.prefix,
                          remedies=self.remedies))
        return True

    def _run(self):
        while not self.poll() and not self._stop.wait(self.interval):
            pass

    def start(self):
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None


_said_off = False


@contextlib.contextmanager
def watch(what, fraction, *, root="/", prefix=PREFIX, remedies=None):
    """Guard the block (``what``: "model.fit", "model.evaluate"); ``fraction`` 0 is off. Where no memory can
    be read, says once (starting with ``prefix``) that the guard is off and runs the block unguarded.
    ``prefix`` and ``remedies``: the command's words in the line (``message``)."""
    global _said_off
    if not fraction:
        yield None
        return
    reader = memory_reader(root)
    if reader is None:
        if not _said_off:
            _said_off = True
            print(f"{prefix} memory guard off: neither a cgroup memory limit nor /proc/meminfo is readable here "
                  "(not Linux); a run that outgrows memory may end without a word", file=sys.stderr, flush=True)
        yield None
        return
    guard = MemoryGuard(what, fraction, root=root, reader=reader, prefix=prefix, remedies=remedies).start()
    try:
        yield guard
    finally:
        guard.stop()
