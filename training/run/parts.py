"""A file cut into parts of at most a given size, and joined back: how a carried backup fits a repository's
per-file limit (this project keeps each committed file under 2 MB). ResNet-20's backup, model and optimizer
state, is one 2.4 MB ``model.weights.h5``; ``training.carry`` writes it as ``model.weights.h5.part-000``,
``...-001``, ... with an index ``model.weights.h5.parts.json`` (the parts' names, the whole file's size and
sha256), and the resume joins them back before it loads the backup.

Standard library only: ``training.carry`` runs beside a live training without loading Keras.

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
    data = path.read_bytes()
    dest_dir.mkdir(parents=True, exist_ok=True)
    names = []
    for number, start in enumerate(range(0, max(len(data), 1), part_bytes)):
        names.append(f"{path.name}.part-{number:03d}")
        (dest_dir / names[-1]).write_bytes(data[start:start + part_bytes])
    index = {"file": path.name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "parts": names}
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
    data = b"".join((path.parent / name).read_bytes() for name in names)
    if len(data) != size or hashlib.sha256(data).hexdigest() != digest:
        raise ValueError(f"Invalid backup: the parts {index_file} lists join to {len(data)} bytes that are not the "
                         f"file it records ({size} bytes, sha256 {digest[:12]}...): a part is damaged.")
    handle, tmp = tempfile.mkstemp(prefix=f".tmp-{path.name}-", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise
    return path
