"""Checkpoint files from elsewhere, read safely: every bad file is one ``CheckpointError`` line naming the file
and what is wrong, raised before any of it is used.

``read_state_dict`` reads a timm state dict: ``.safetensors`` (its header checked here first: the length, the
JSON, every tensor's offsets within the file; then safetensors' numpy reader) or a PyTorch ``.pth``/``.pt``/
``.bin`` (``torch.load(weights_only=True)``: a pickle that names anything but tensors is refused, and nothing of
it runs). ``check_tensors`` refuses non-float and non-finite tensors and names missing, extra or mis-shaped
ones. ``keras_h5`` opens a Keras ``.h5``/``.weights.h5`` file (or a ``.keras`` archive's weights) after
checking that it is HDF5 with a Keras weights layout; ``read_keras_h5`` reads and checks its tensors.
"""

import contextlib
import io
import json
import os
import pathlib
import re
import struct
import warnings
import zipfile

import numpy as np

SAFETENSORS_SUFFIXES = (".safetensors",)
TORCH_SUFFIXES = (".pth", ".pt", ".bin")
# safetensors' dtype names and their bytes per element (safetensors' format specification).
SAFETENSORS_DTYPES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8, "I32": 4,
                      "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1}
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
COUNTERS = ("num_batches_tracked",)  # PyTorch BatchNorm's int64 step counters: no weights, passed over
NAMED = 3  # how many offending tensors a message names


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used, in one line that names the file and what is wrong."""


def _refuse(path, problem):
    return CheckpointError(f"Invalid {'state dict' if path is None else f'checkpoint {str(path)!r}'}: {problem}.")


def _first_line(error):
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:200]


def _names(names):
    names = sorted(names)
    more = f" and {len(names) - NAMED} more" if len(names) > NAMED else ""
    return ", ".join(names[:NAMED]) + more


# ------------------------------------------------------------------------------------------ state dicts
def read_state_dict(path, expected=None, *, allow_non_finite=False):
    """A timm state dict as ``{name: numpy array}``, read and checked (``check_tensors``).

    Args:
        path: a ``.safetensors`` file (preferred: no code in it), or a PyTorch ``.pth``/``.pt``/``.bin`` file
            holding only tensors (read with ``torch.load(weights_only=True)``; needs torch).
        expected: ``{name: shape}`` the tensors must match, or None.
        allow_non_finite: accept NaN and infinite values (refused by default: a network fed them outputs NaN).

    Examples:
        >>> import numpy as np, tempfile, pathlib
        >>> from safetensors.numpy import save_file
        >>> from keras_preact.pretrained.reading import read_state_dict
        >>> path = str(pathlib.Path(tempfile.mkdtemp()) / "w.safetensors")
        >>> save_file({"fc.weight": np.ones((2, 3), "float32")}, path)
        >>> {k: v.shape for k, v in read_state_dict(path).items()}
        {'fc.weight': (2, 3)}
        >>> save_file({"fc.weight": np.full((2, 3), np.nan, "float32")}, path)
        >>> read_state_dict(path)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        keras_preact.pretrained.reading.CheckpointError: Invalid checkpoint '...': fc.weight holds NaN or infinite ...
    """
    path = pathlib.Path(path)
    if not path.is_file():
        raise _refuse(path, "no such file")
    if path.suffix in SAFETENSORS_SUFFIXES:
        tensors = read_safetensors(path)
    elif path.suffix in TORCH_SUFFIXES:
        tensors = read_torch(path)
    else:
        raise _refuse(path, f"unknown file type {path.suffix!r}; a state dict is a .safetensors or .pth/.pt/.bin "
                            "file")
    check_tensors(tensors, expected, path=path, allow_non_finite=allow_non_finite)
    return tensors


def check_safetensors_header(path):
    """The header of a ``.safetensors`` file (``{name: {"dtype", "shape", "data_offsets"}}``), checked before
    safetensors reads it: the 8-byte length within the file, JSON, every tensor's bytes within the file."""
    size = os.path.getsize(path)
    if size < 8:
        raise _refuse(path, f"{size} bytes, too short for a safetensors file (an 8-byte header length first)")
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        if length > size - 8:
            raise _refuse(path, f"its safetensors header claims {length} bytes, the file has {size - 8} after "
                                "the length (truncated or not a safetensors file)")
        raw = f.read(length)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as error:
        raise _refuse(path, f"its safetensors header is not JSON ({_first_line(error)})") from None
    if not isinstance(header, dict):
        raise _refuse(path, "its safetensors header is not a JSON object")
    data = size - 8 - length
    for name, entry in header.items():
        if name != "__metadata__":
            _check_entry(path, name, entry, data)
    return header


def _check_entry(path, name, entry, data):
    """One tensor of a safetensors header: a known dtype, a shape, offsets within the ``data`` bytes."""
    try:
        dtype, shape, (begin, end) = entry["dtype"], list(entry["shape"]), entry["data_offsets"]
        sizes = [int(n) for n in shape] + [int(begin), int(end)]
    except (TypeError, KeyError, ValueError):
        raise _refuse(path, f"tensor {name!r} of its safetensors header has no dtype, shape and data_offsets") from None
    if dtype not in SAFETENSORS_DTYPES or min(sizes, default=0) < 0:
        raise _refuse(path, f"tensor {name!r} has dtype {dtype!r} and shape {shape}, not a tensor safetensors "
                            "reads")
    if not begin <= end <= data:
        raise _refuse(path, f"tensor {name!r} lies at bytes {begin}-{end} of {data} data bytes (a truncated "
                            "file)")
    if end - begin != int(np.prod(shape, dtype=np.int64)) * SAFETENSORS_DTYPES[dtype]:
        raise _refuse(path, f"tensor {name!r} ({dtype} {shape}) spans {end - begin} bytes, not its size")


def read_safetensors(path):
    """``{name: numpy array}`` of a ``.safetensors`` file, its header checked first (``check_safetensors_header``)."""
    header = check_safetensors_header(path)
    kinds = {entry["dtype"] for name, entry in header.items() if name != "__metadata__"}
    if "BF16" in kinds or any(kind.startswith("F8") for kind in kinds):
        raise _refuse(path, f"its tensors are {', '.join(sorted(kinds))}; numpy reads float16/32/64, so save it "
                            "as float32")
    try:
        from safetensors.numpy import load_file
    except ImportError:
        raise ImportError("reading .safetensors needs safetensors: pip install safetensors "
                          "(or keras-preact[pretrained])") from None
    try:
        return load_file(str(path))
    except Exception as error:  # noqa: BLE001 - safetensors' own refusal, in one line
        raise _refuse(path, f"safetensors cannot read it ({_first_line(error)})") from None


def read_torch(path):
    """``{name: numpy array}`` of a PyTorch checkpoint holding only tensors (a state dict, or one under
    ``"state_dict"``/``"model"``), read with ``torch.load(weights_only=True)``: nothing of the pickle runs."""
    try:
        import torch
    except ImportError:
        raise ImportError(f"reading {pathlib.Path(path).name} (a PyTorch checkpoint) needs torch: pip install torch; "
                          "or convert it to .safetensors") from None
    only = "only tensor checkpoints are loaded; prefer its .safetensors file"
    try:
        with warnings.catch_warnings():  # torch's notes on pickle protocols: the refusal below says it all
            warnings.simplefilter("ignore")
            state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - torch's refusal (never its advice), in one line
        found = re.search(r"GLOBAL ([\w.]+)", str(error))
        what = f"its pickle calls {found.group(1)}" if found else f"it does not load ({type(error).__name__})"
        raise _refuse(path, f"{what}; {only}") from None
    if isinstance(state, dict):
        state = next((state[key] for key in ("state_dict", "model") if isinstance(state.get(key), dict)), state)
    if not isinstance(state, dict) or not state:
        raise _refuse(path, f"it holds {type(state).__name__}, not a dict of named tensors; {only}")
    other = [str(k) for k, v in state.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)]
    if other:
        raise _refuse(path, f"{_names(other)} {'is no tensor' if len(other) == 1 else 'are no tensors'}; {only}")
    return {k: v.detach().cpu().float().numpy() if v.dtype == torch.bfloat16 else v.detach().cpu().numpy()
            for k, v in state.items()}


def check_tensors(tensors, expected=None, *, path, allow_non_finite=False):
    """Refuse, in one ``CheckpointError`` naming ``path`` (None: a state dict in memory) and the first few
    tensors: non-float tensors (an int8 checkpoint is quantized; PyTorch's ``num_batches_tracked`` counters are
    passed over), NaN or infinite values (unless ``allow_non_finite``), and, against ``expected``
    (``{name: shape}``), missing, extra or mis-shaped tensors.

    Examples:
        >>> import numpy as np
        >>> from keras_preact.pretrained.reading import check_tensors
        >>> check_tensors({"w": np.zeros((2, 2), "float32")}, {"w": (2, 2)}, path="w.safetensors")
        >>> check_tensors({"w": np.zeros((2, 2), "int8")}, path="w.safetensors")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        keras_preact.pretrained.reading.CheckpointError: Invalid checkpoint 'w.safetensors': w is int8, not ...
    """
    weights = {k: np.asarray(v) for k, v in tensors.items() if not str(k).endswith(COUNTERS)}
    integer = [k for k, v in weights.items() if not np.issubdtype(v.dtype, np.floating)]
    if integer:
        raise _refuse(path, f"{_names(integer)} {'is' if len(integer) == 1 else 'are'} "
                            f"{weights[sorted(integer)[0]].dtype}, not floating point; only float tensors are "
                            "loaded (a quantized checkpoint is not)")
    if not allow_non_finite:
        bad = [k for k, v in weights.items() if not np.isfinite(v).all()]
        if bad:
            raise _refuse(path, f"{_names(bad)} {'holds' if len(bad) == 1 else 'hold'} NaN or infinite values; "
                                "a network with them outputs NaN (allow_non_finite=True loads them anyway)")
    if expected is None:
        return
    missing = [k for k in expected if k not in weights]
    extra = [k for k in weights if k not in expected]
    shapes = [k for k in expected if k in weights and tuple(weights[k].shape) != tuple(expected[k])]
    problems = [f"{len(missing)} missing ({_names(missing)})" if missing else "",
                f"{len(extra)} unexpected ({_names(extra)})" if extra else "",
                "mis-shaped: " + ", ".join(f"{k} is {tuple(weights[k].shape)}, expected {tuple(expected[k])}"
                                           for k in sorted(shapes)[:NAMED]) if shapes else ""]
    if any(problems):
        raise _refuse(path, "tensors " + "; ".join(p for p in problems if p) + " (another architecture?)")


# ----------------------------------------------------------------------------------------- Keras files
def keras_layout(h5):
    """``"legacy"`` (Keras 2 HDF5: ``save_weights``' ``layer_names`` or ``model.save``'s ``model_weights``),
    ``"keras3"`` (Keras 3 ``.weights.h5``: ``layers/<name>/vars/<i>``) or None (no Keras weights in it)."""
    if "layer_names" in h5.attrs or "model_weights" in h5:
        return "legacy"
    if "layers" in h5 or "vars" in h5:
        return "keras3"
    return None


@contextlib.contextmanager
def keras_h5(path):
    """An open ``h5py.File`` of a Keras weights file (``.h5``, ``.weights.h5``, or a ``.keras`` archive's
    ``model.weights.h5``), checked first: not empty, HDF5, a Keras weights layout (``keras_layout``)."""
    import h5py  # Keras' own dependency for .h5 and .weights.h5

    path = pathlib.Path(path)
    if not path.is_file():
        raise _refuse(path, "no such file")
    source = _keras_archive_weights(path) if path.suffix == ".keras" else str(path)
    if isinstance(source, str):
        with open(path, "rb") as f:
            head = f.read(len(HDF5_SIGNATURE))
        if not head:
            raise _refuse(path, "the file is empty (0 bytes)")
        if head != HDF5_SIGNATURE:
            raise _refuse(path, "not an HDF5 file (a Keras .h5/.weights.h5 file starts with HDF5's signature)")
    try:
        f = h5py.File(source, "r")
    except Exception as error:  # noqa: BLE001 - h5py's refusal, in one line
        raise _refuse(path, f"HDF5 cannot open it ({_first_line(error)})") from None
    with f:
        if keras_layout(f) is None:
            raise _refuse(path, f"an HDF5 file without Keras weights (top-level {_names(list(f)) or 'nothing'}; "
                                "a Keras file holds layer_names, model_weights or layers)")
        yield f


def _keras_archive_weights(path):
    try:
        with zipfile.ZipFile(path) as archive:
            return io.BytesIO(archive.read("model.weights.h5"))
    except (zipfile.BadZipFile, KeyError, OSError) as error:
        raise _refuse(path, f"not a Keras .keras archive holding model.weights.h5 ({_first_line(error)})") from None


def read_keras_h5(path, *, values=True, allow_non_finite=False):
    """``(layout, {dataset path: numpy array})`` of a Keras weights file (``keras_h5``), its tensors checked by
    ``check_tensors`` (float, finite); ``values=False``: ``{dataset path: shape}``, nothing read or checked."""
    import h5py

    tensors = {}
    with keras_h5(path) as f:
        layout = keras_layout(f)
        f.visititems(lambda name, obj: tensors.__setitem__(name, obj[()] if values else obj.shape)
                     if isinstance(obj, h5py.Dataset) else None)
    if values:
        check_tensors({k: v for k, v in tensors.items() if np.asarray(v).dtype.kind not in "SUO"}, path=path,
                      allow_non_finite=allow_non_finite)
    return layout, tensors


# keras.applications' ResNet50V2/101V2/152V2 (TF-slim's layout): units per stage. A Keras 3 ``.weights.h5`` keeps
# no layer names, so such a file is known by its Conv2D count (the stem, three per unit, one projection per stage).
KERAS_RESNET_V2_UNITS = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}


def keras_resnet_v2_file(path, *, values=False, allow_non_finite=False):
    """``{"depth", "num_classes", "layout"}`` of a keras.applications ResNetV2 weights file (a legacy ``.h5``,
    a Keras 3 ``.weights.h5`` or ``.keras``; ``num_classes`` None without the top), known by its layers' names
    and shapes; None for a Keras file of another network. ``values=True`` also checks its tensors
    (``read_keras_h5``).

    Examples:
        >>> from keras_preact.pretrained.reading import keras_resnet_v2_file
        >>> keras_resnet_v2_file("r50v2.weights.h5")  # doctest: +SKIP
        {'depth': 50, 'num_classes': 1000, 'layout': 'keras3'}
    """
    layout, shapes = read_keras_h5(path, values=False)
    if layout == "legacy":
        blocks = {}
        for name in shapes:
            for stage, block in re.findall(r"(?:^|/)conv([2-5])_block(\d+)_", name):
                blocks[int(stage)] = max(blocks.get(int(stage), 0), int(block))
        units = tuple(blocks.get(stage, 0) for stage in range(2, 6))
        heads = [shape for k, shape in shapes.items() if "predictions" in k and len(shape) == 2]
    else:
        top = {k.split("/")[1] for k in shapes if k.startswith("layers/") and k.count("/") == 3}
        convs = sum(1 for k in top if re.fullmatch(r"conv2d(_\d+)?", k))
        units = next((u for u in KERAS_RESNET_V2_UNITS.values() if convs == 1 + 3 * sum(u) + 4), None)
        heads = [shapes["layers/dense/vars/0"]] if "layers/dense/vars/0" in shapes else []
    depth = next((d for d, u in KERAS_RESNET_V2_UNITS.items() if u == units), None)
    if depth is None:
        return None
    if values:
        read_keras_h5(path, allow_non_finite=allow_non_finite)
    return {"depth": depth, "num_classes": int(heads[0][-1]) if heads else None, "layout": layout}
