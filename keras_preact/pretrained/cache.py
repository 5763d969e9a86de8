"""The cache of converted checkpoints, ``$KERAS_HOME/keras_preact/``: a conversion is written once and trusted
only while it is what was written.

- The key covers every byte the conversion reads: the sha256 of each file of the source (a weights file, or
  every file of a checkpoint folder, its config included), never a file name or one file of a folder.
- Each entry is a ``.weights.h5`` file and a ``.json`` record of its own sha256 (and what the conversion found:
  layout, classes); the file is verified against the record on every load. An edited, truncated or unrecorded
  file is converted again, with one warning line; it is never served.
- The file is written to a temporary path in the same folder, then renamed (then the record), so a kill or a
  full disk leaves no partial entry; too little space (checked, then allocated, before h5py writes) is one
  ``OSError`` line naming ``KERAS_HOME`` and the space needed.
- One process converts an entry at a time (``fcntl.flock`` on a lock file beside it, where the platform has
  it): a second process converting the same checkpoint waits for the first and reads its file.

Examples:
    >>> import pathlib, tempfile
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "config.json").write_text("{}")
    >>> len(source_digest(folder))  # every file of the folder, by content
    64
"""

import contextlib
import errno
import gc
import hashlib
import json
import os
import pathlib
import shutil
import tempfile
import warnings

import numpy as np

from keras_preact.models.weights import sha256_of

CACHE_SUBDIR = "keras_preact"
SUFFIX = ".weights.h5"
RECORD_SUFFIX = ".json"
MARGIN = 1.1  # an HDF5 file's headers and alignment beyond its tensors' bytes
FORMAT = 2  # bumped when what a cached conversion holds changes: older entries are not read


def keras_home():
    """``$KERAS_HOME`` (default ``~/.keras``), where Keras and keras-preact cache downloads and conversions."""
    return pathlib.Path(os.environ.get("KERAS_HOME", os.path.join(os.path.expanduser("~"), ".keras")))


def source_digest(path):
    """The sha256 of every source byte a conversion reads: a file's content, or each file of a folder (its path
    relative to the folder and its content's sha256, in sorted order; hidden files, e.g. a download tool's
    ``.cache/``, skipped)."""
    path = pathlib.Path(path)
    if path.is_file():
        return sha256_of(path)
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        relative = file.relative_to(path)
        if any(part.startswith(".") for part in relative.parts):
            continue
        digest.update(f"{relative.as_posix()}\0{sha256_of(file)}\n".encode())
    return digest.hexdigest()


def entry_path(name, source, *context):
    """The cached conversion of ``source`` (a file or folder) for ``name``: ``$KERAS_HOME/keras_preact/
    <name>-<key>.weights.h5``, the key the sha256 of the source's content and ``context`` (what else the
    conversion depends on: the network's depth, its classes)."""
    key = hashlib.sha256(f"{FORMAT}|{source_digest(source)}|{context!r}".encode()).hexdigest()[:16]
    return keras_home() / CACHE_SUBDIR / f"{name}-{key}{SUFFIX}"


def record_path(entry):
    return entry.with_name(entry.name.removesuffix(SUFFIX) + RECORD_SUFFIX)


def read_record(entry, *, warn=True):
    """The record of the cached conversion ``entry`` when the file is whole and unchanged (its sha256 the
    record's); None when there is none, or, with one warning line (unless ``warn=False``: it was said before),
    when it does not match."""
    entry = pathlib.Path(entry)
    record_file = record_path(entry)
    if not entry.exists() and not record_file.exists():
        return None
    try:
        record = json.loads(record_file.read_text())
        whole = isinstance(record, dict) and entry.is_file() and sha256_of(entry) == record.get("sha256")
    except (OSError, ValueError):
        whole = False
    if whole:
        return record
    if warn:
        warnings.warn(f"The cached conversion {entry} does not match its record (edited, truncated or "
                      "half-written); converting the checkpoint again.", RuntimeWarning, stacklevel=2)
    return None


@contextlib.contextmanager
def _one_writer(entry):
    """Hold an exclusive lock on ``<entry>.lock`` (fcntl where the platform has it; elsewhere none: each writer
    still renames a whole file into place)."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    lock = entry.with_name(entry.name + ".lock")
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def cached(entry, convert, *, warn=True):
    """The record of the cached conversion ``entry``, verified; when missing or not matching, ``convert()``
    (returning the converted model and a dict of what the conversion found) is called and written first (one
    process at a time; ``warn`` as ``read_record``'s).

    Returns:
        The record: ``sha256`` and ``bytes`` of the file, and ``convert``'s dict.
    """
    entry = pathlib.Path(entry)
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise _unwritable(entry, error) from None
    with _one_writer(entry):
        record = read_record(entry, warn=warn)
        if record is None:
            model, found = convert()
            record = write(model, entry, found)
    return record


def weight_bytes(model):
    """The bytes of ``model``'s variables (what its ``.weights.h5`` file holds, headers aside)."""
    return sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in model.weights)


def write(model, entry, found):
    """``model.save_weights`` to a temporary file beside ``entry``, its sha256 recorded, both renamed into place;
    an ``OSError`` (``ENOSPC``) line naming ``KERAS_HOME`` when the space lacks, before or during the write."""
    entry = pathlib.Path(entry)
    needed = int(weight_bytes(model) * MARGIN) + (1 << 16)
    free = shutil.disk_usage(entry.parent).free
    if free < needed or not _reserve(entry, needed):
        raise _full(entry, needed, shutil.disk_usage(entry.parent).free)
    parts = []
    try:
        record = _write_parts(model, entry, found, parts)
    except OSError as error:
        if error.errno not in (errno.ENOSPC, errno.EDQUOT) and "No space left" not in str(error):
            raise
        error.__traceback__ = None  # its frames hold the half-written h5py file
        full = True
    else:
        full = False
    finally:
        for part in parts:
            pathlib.Path(part).unlink(missing_ok=True)
    if full:
        gc.collect()  # close the failed writer's h5py objects now, not at exit
        raise _full(entry, needed, shutil.disk_usage(entry.parent).free)
    return record


def _reserve(entry, needed):
    """Whether ``needed`` bytes can be allocated beside ``entry`` (``os.posix_fallocate`` of a file removed at
    once, where the platform has it). HDF5 does not survive a disk filling under it (h5py's objects fail to close,
    and the process may die at exit), so the space is proven before h5py writes; only another writer filling the
    disk in between can still reach h5py."""
    if not hasattr(os, "posix_fallocate"):
        return True
    fd, reservation = tempfile.mkstemp(suffix=".reserve", dir=entry.parent)
    try:
        os.posix_fallocate(fd, 0, needed)
    except OSError as error:  # a file system that cannot allocate ahead (EINVAL, EOPNOTSUPP) proves nothing
        return error.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
    finally:
        os.close(fd)
        os.remove(reservation)
    return True


def _write_parts(model, entry, found, parts):
    fd, weights_part = tempfile.mkstemp(suffix=SUFFIX, dir=entry.parent)
    os.close(fd)
    parts.append(weights_part)
    model.save_weights(weights_part)
    record = {"sha256": sha256_of(weights_part), "bytes": os.path.getsize(weights_part), **found}
    fd, record_part = tempfile.mkstemp(suffix=RECORD_SUFFIX, dir=entry.parent)
    parts.append(record_part)
    with os.fdopen(fd, "w") as f:
        json.dump(record, f)
    os.replace(weights_part, entry)  # the file first: a kill in between leaves a record that does not match
    os.replace(record_part, record_path(entry))
    return record


def _mb(n):
    return f"{n / 2**20:.{2 if n < 10 * 2**20 else 1}f} MB"


def _full(entry, needed, free):
    return OSError(errno.ENOSPC, f"No space left to cache the converted checkpoint at {entry}: it needs about "
                                 f"{_mb(needed)} free, {_mb(free)} is available there. Free some space or set "
                                 f"KERAS_HOME to a folder with room (KERAS_HOME={keras_home()}).")


def _unwritable(entry, error):
    return OSError(error.errno, f"Cannot cache the converted checkpoint at {entry} ({error.strerror}): set "
                                f"KERAS_HOME to a writable folder with room (KERAS_HOME={keras_home()}).")
