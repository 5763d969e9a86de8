"""A file cut into parts of at most a given size, and joined back: how a carried backup goes through storage
with a per-file size limit (``python -m keras_preact_training.carry --part-mb N``). ``split`` writes
``model.weights.h5`` as ``model.weights.h5.part-000``, ``...-001``, ... with an index ``model.weights.h5.parts.json``
(the parts' names, the whole file's size and sha256); the resume joins them back, checked, before it loads the
backup.

Standard library only: ``keras_preact_training.carry`` runs beside a live training without loading Keras.

Examples:

>>> import pathlib, tempfile
>>> scratch = tempfile.TemporaryDirectory()
>>> folder = pathlib.Path(scratch.name)
>>> _ = (folder / "a.bin").write_bytes(bytes(range(10)))
>>> split(folder / "a.bin", folder / "carried", part_bytes=4)
['a.bin.part-000', 'a.bin.part-001', 'a.bin.part-002']
>>> join(folder / "carried" / "a.bin").read_bytes() == bytes(range(10))
True
>>> scratch.cleanup()
"""

import hashlib
import json
import os
import pathlib
import tempfile

INDEX_SUFFIX = ".parts.json"


def index_path(path):
    """The index that stands for ``path`` when it was carried in parts."""
    path = pathlib.Path(path)
    return path.with_name(path.name + INDEX_SUFFIX)


def split(path, dest_dir, part_bytes):
    """Write ``path`` into ``dest_dir`` as parts of at most ``part_bytes`` and their index; the parts' names."""
    if not isinstance(part_bytes, int) or part_bytes < 1:
        raise ValueError(f"Invalid part_bytes={part_bytes!r}: a whole number of bytes >= 1 is required.")
    path, dest_dir = pathlib.Path(path), pathlib.Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    names, size, digest = [], 0, hashlib.sha256()
    with open(path, "rb") as source:  # one part in memory at a time
        while True:
            chunk = source.read(part_bytes)
            if not chunk and names:
                break
            names.append(f"{path.name}.part-{len(names):03d}")
            (dest_dir / names[-1]).write_bytes(chunk)
            size += len(chunk)
            digest.update(chunk)
            if len(chunk) < part_bytes:
                break
    index = {"file": path.name, "bytes": size, "sha256": digest.hexdigest(), "parts": names}
    index_path(dest_dir / path.name).write_text(json.dumps(index, indent=2) + "\n")
    return names


def join(path):
    """``path`` itself when it exists; else the file its index's parts make, written next to them (a temporary
    name, then renamed) after its size and sha256 are checked. ValueError naming what is missing or wrong."""
    path = pathlib.Path(path)
    if path.is_file():
        return path
    index_file = index_path(path)
    try:
        index = json.loads(index_file.read_text())
        names, size, digest = index["parts"], index["bytes"], index["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        raise ValueError(f"Invalid backup: neither {path} nor a readable index {index_file} of its parts.") from None
    missing = [name for name in names if not (path.parent / name).is_file()]
    if missing:
        raise ValueError(f"Invalid backup: {index_file} lists parts that are not there: {', '.join(missing)} "
                         "(copy every part of the carry).")
    handle, tmp = tempfile.mkstemp(prefix=f".tmp-{path.name}-", dir=path.parent)
    try:
        joined, hashed = 0, hashlib.sha256()
        with os.fdopen(handle, "wb") as f:  # one part in memory at a time
            for name in names:
                data = (path.parent / name).read_bytes()
                f.write(data)
                joined += len(data)
                hashed.update(data)
        if joined != size or hashed.hexdigest() != digest:
            raise ValueError(f"Invalid backup: the parts {index_file} lists join to {joined} bytes that are not the "
                             f"file it records ({size} bytes, sha256 {digest[:12]}...): a part is damaged.")
        os.replace(tmp, path)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise
    return path
