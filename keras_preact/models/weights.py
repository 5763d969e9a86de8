"""Trained weights of registered networks: ``.weights.h5`` files checked against a sha256 before loading, and
published checkpoints of other libraries fetched through their own loaders and converted once.

A registry entry's ``weights`` maps a name (``"cifar10"``) to a ``WeightsSpec``: for the package's own weights
(``origin="package"``) the file (relative to ``keras_preact/weights/``, the package data, or an absolute path),
its sha256, the class names, and what it scored; for a published checkpoint (``origin`` ``"keras"``, ``"timm"``
or ``"keras_hub"``) its id in that ecosystem, the architecture it needs (``arguments``: a layout), its
preprocessing (``input_config``), licence and published accuracy (``keras_preact.pretrained.sources`` fetches
and converts it).
``create_model(name, weights="cifar10")`` checks the file, builds the network and loads it; ``weights=`` may
also be a local checkpoint file or folder (``keras_preact.pretrained.loader`` decides what ``weights=`` is).
"""

import dataclasses
import hashlib
import pathlib
import re

from keras_preact.models.class_names import ClassNames
from keras_preact.preprocessing import InputConfig

WEIGHTS_DIR = pathlib.Path(__file__).resolve().parent.parent / "weights"
SUFFIX = ".weights.h5"  # what keras.Model.load_weights reads
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
# The published checkpoints' ecosystems (``keras_preact.pretrained.sources`` fetches each) and their entries' fields.
ORIGINS = ("keras", "timm", "keras_hub")
_FIELDS = ("origin", "checkpoint", "checksum", "num_classes", "class_names", "arguments", "input_config", "licence",
           "dataset", "top1", "top5", "source")


@dataclasses.dataclass(frozen=True)
class WeightsSpec:
    """One set of trained weights of a registered network.

    Attributes:
        name: the ``weights=`` name, e.g. ``"cifar10"``.
        file: a ``.weights.h5`` file, relative to ``WEIGHTS_DIR`` (package data) or absolute.
        sha256: the file's sha256 (64 lowercase hex digits), checked on every load.
        class_names: one name per output class (index = label); their number is ``num_classes``.
        dataset, top1, top5, source: what they were trained on, their test accuracy (fractions), and
            how they were made (a preset, a run); for documentation and ``keras-preact-evaluate``.
        origin: ``"package"`` (``file``/``sha256`` above), ``"keras"``, ``"timm"``, ``"keras_hub"`` (a published
            checkpoint, ``ORIGINS``) or ``"file"`` (a local checkpoint given as ``weights=``).
        checkpoint, checksum: the checkpoint's id in its ecosystem (a file URL, ``"timm/<model>.<tag>"``, a
            keras-hub preset) and its published checksum (``md5:``/``sha256:``) where the source publishes one.
        num_classes: the head's classes (from ``class_names`` where given). arguments: builder arguments the
            checkpoint needs (``{"layout": "timm"}``). input_config: its preprocessing (None: the network's).
        licence: the checkpoint's licence.
    """

    name: str
    file: str = None
    sha256: str = None
    class_names: tuple = None
    dataset: str = ""
    top1: float = None
    top5: float = None
    source: str = ""
    origin: str = "package"
    checkpoint: str = None
    checksum: str = None
    num_classes: int = None
    arguments: dict = dataclasses.field(default_factory=dict)
    input_config: object = None
    licence: str = ""

    def __post_init__(self):
        if self.num_classes is None and self.class_names:
            object.__setattr__(self, "num_classes", len(self.class_names))

    @property
    def path(self):
        path = pathlib.Path(self.file)
        return path if path.is_absolute() else WEIGHTS_DIR / path

    def checked_path(self, model_name):
        """The package's file, after checking it exists and has the registered sha256; one ValueError otherwise
        (a published checkpoint is fetched and converted by ``keras_preact.pretrained.loader.get_loader``)."""
        if self.origin != "package":
            raise ValueError(f"Invalid weights={self.name!r} of {model_name}: a published checkpoint, fetched and "
                             "converted by keras_preact.pretrained.loader.get_loader, not a file to check.")
        path, what = self.path, f"weights={self.name!r} of {model_name}"
        todo = ("reinstall keras-preact (the weights are package data), or, for a model you registered, point "
                "its weights entry at the right file and sha256")
        if not path.is_file():
            raise ValueError(f"Invalid {what}: {path} is missing (expected sha256 {self.sha256}, actual: no file); "
                             f"{todo}.")
        actual = sha256_of(path)
        if actual != self.sha256:
            raise ValueError(f"Invalid {what}: {path} has sha256 {actual}, the registry expects {self.sha256} "
                             f"(a truncated or different file); {todo}.")
        return path


def sha256_of(path, chunk=1 << 20):
    """The sha256 of a file, in lowercase hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def parse_weights(model_name, weights):
    """``{name: WeightsSpec}`` from a registry entry's ``weights`` mapping (name -> dict of fields)."""
    if weights is None:
        return {}
    if not isinstance(weights, dict):
        raise ValueError(f"Invalid weights={weights!r:.200} for {model_name}: expected a dict of name -> "
                         "{'file', 'sha256', 'class_names', ...}.")
    return {name: _parse_entry(model_name, name, entry) for name, entry in weights.items()}


def _parse_entry(model_name, name, entry):
    fields = [f.name for f in dataclasses.fields(WeightsSpec) if f.name != "name"]
    where = f"weights[{name!r}] of {model_name}"
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"Invalid {where}: the name must be a Python identifier.")
    if isinstance(entry, WeightsSpec):
        entry = {f: getattr(entry, f) for f in fields}
    if not isinstance(entry, dict) or set(entry) - set(fields):
        unknown = sorted(set(entry) - set(fields)) if isinstance(entry, dict) else entry
        raise ValueError(f"Invalid {where}: unknown {unknown!r:.200}; the fields are {', '.join(fields)}.")
    origin = entry.get("origin", "package")
    if origin != "package":
        return _parse_published(where, name, entry)
    missing = [f for f in ("file", "sha256", "class_names") if f not in entry]
    if missing:
        raise ValueError(f"Invalid {where}: {', '.join(missing)} missing.")
    if not isinstance(entry["file"], str) or not entry["file"].endswith(SUFFIX):
        raise ValueError(f"Invalid {where}: file={entry['file']!r} must be a {SUFFIX} file name or path.")
    if not isinstance(entry["sha256"], str) or not _SHA256.match(entry["sha256"]):
        raise ValueError(f"Invalid {where}: sha256={entry['sha256']!r} must be 64 lowercase hex digits.")
    names = entry["class_names"]
    if not isinstance(names, (list, tuple)) or not names or not all(
        isinstance(n, str) and n and "\n" not in n for n in names
    ):
        raise ValueError(f"Invalid {where}: class_names must be a non-empty list of one-line strings.")
    return WeightsSpec(name=name, **{**entry, "class_names": tuple(names)})


def _parse_published(where, name, entry):
    """A registry entry of a published checkpoint, checked: origin, checkpoint id, num_classes, arguments."""
    unknown = sorted(set(entry) - set(_FIELDS))
    if unknown:
        raise ValueError(
            f"Invalid {where}: unknown {unknown!r}; a published checkpoint's fields are {', '.join(_FIELDS)}."
        )
    if entry["origin"] not in ORIGINS:
        raise ValueError(f"Invalid {where}: origin={entry['origin']!r}. Allowed values: 'package', "
                         f"{', '.join(map(repr, ORIGINS))}.")
    if not isinstance(entry.get("checkpoint"), str) or not entry["checkpoint"]:
        raise ValueError(f"Invalid {where}: checkpoint (the source's id of the checkpoint) is required.")
    classes = entry.get("num_classes")
    if not isinstance(classes, int) or isinstance(classes, bool) or classes < 1:
        raise ValueError(f"Invalid {where}: num_classes={classes!r} must be a positive integer.")
    config = entry.get("input_config")
    if config is not None and not isinstance(config, InputConfig):
        raise ValueError(f"Invalid {where}: input_config must be a keras_preact.preprocessing.InputConfig.")
    names = entry.get("class_names")
    if names and len(names) != classes:
        raise ValueError(f"Invalid {where}: {len(names)} class_names for num_classes={classes}.")
    entry = {**entry, "arguments": dict(entry.get("arguments") or {}),
             "class_names": (names if isinstance(names, ClassNames) else tuple(names)) if names else None}
    return WeightsSpec(name=name, **entry)
