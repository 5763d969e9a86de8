"""One loader per ``weights=``: what it names is decided here, once, and ``Loader.load`` puts it into a network
built once.

``get_loader(model_name, weights)`` looks at ``weights`` one time, as keras-hub's ``get_preset_loader`` looks at a
preset, and returns a ``Loader`` holding what the network must be built with (``arguments``: the checkpoint's
layout; ``input_config``; ``num_classes`` and ``class_names``) and the weights themselves: a checked ``.weights.h5``
file (the package's, yours, or another library's checkpoint fetched and converted once through
``keras_preact.pretrained.sources`` and ``keras_preact.pretrained.cache``) or a loaded ``.keras`` classifier.
``load(model, head=False)`` drops the head's tensors (timm's ``load_pretrained`` pops the classifier's keys when
``num_classes`` differs): no second network is built for a fine-tune. Another library's checkpoint that is not
in the cache yet is read and checked by ``get_loader`` (its layout and classes known without building anything of
ours) and converted by ``load`` into the model given: the first load builds one network too. A whole load writes
the cache from that model; a fine-tune converts the backbone straight from the checkpoint and caches nothing.

What ``weights`` may be:

- a registered weights name of the network (``model_spec(name).weights``). The name wins over a file or folder
  of the same name in the working directory unless it is written as a path: ``"cifar10"`` is the registered
  name, ``"./cifar10"`` the folder (the clash is said in one warning line);
- a keras-preact ``.weights.h5`` (a classifier's ``save_weights``) or ``.keras`` file, or a ``keras-preact-train``
  run directory (its ``model.keras``; a folder is a run only when its ``config.json`` is a run's);
- another library's checkpoint: a timm ``.safetensors``/``.pth`` file (with its architecture's input config, as
  its folder would give) or folder (``config.json`` + ``model.safetensors``), a keras.applications ``.h5``, a
  keras-hub preset folder.

Examples:
    >>> from keras_preact.models import create_model
    >>> from keras_preact.pretrained.loader import get_loader
    >>> loader = get_loader("cifar_resnet20", "cifar10")  # checked by sha256, nothing built yet
    >>> loader.num_classes, loader.class_names[:2]
    (10, ('airplane', 'automobile'))
    >>> model = loader.load(create_model("cifar_resnet20"))
"""

import dataclasses
import json
import os
import pathlib
import tempfile
import warnings

import keras

from keras_preact.preprocessing import InputConfig
from keras_preact.pretrained import reading, sources

KERAS_PREACT_SUFFIXES = (".weights.h5", ".keras")
CHECKPOINT_SUFFIXES = (".h5", ".safetensors", ".pth", ".pt", ".bin")  # another library's checkpoint files
RUN_MODEL = "model.keras"  # the trained classifier a keras-preact-train run directory ends with
RUN_CONFIG = "config.json"  # written at a run's start, with its format
RUN_FORMAT = "keras-preact-run/"
LEGACY_RUN_KEYS = ("name", "class_names", "image_size", "normalization")  # a run's config.json before its format
BACKBONE_GROUP = "pre_act_res_net_backbone"  # where a classifier's .weights.h5 keeps its backbone's tensors
ALLOWED = ("a registered weights name, a keras-preact .weights.h5 or .keras file, a keras-preact-train run "
           "directory (holding model.keras), or another library's checkpoint (a keras.applications .h5, a timm "
           ".safetensors/.pth file or folder, a keras-hub preset folder)")


@dataclasses.dataclass(frozen=True)
class Loader:
    """The weights one ``weights=`` names, checked (and converted) before any network is built.

    Attributes:
        model_name: the registered network. label: how messages name the weights.
        num_classes, class_names: the head of the weights (names None where unknown).
        input_config: the preprocessing the weights were trained with (None: the network's).
        arguments: builder arguments the weights need (their layout; a checkpoint's input size: a keras-preact
            model's own weights fit any).
        path: a ``.weights.h5`` file of the whole classifier (for another library's checkpoint: its cache entry),
            or None with ``model``: a loaded classifier.
        spec: the registered ``WeightsSpec`` (None for a path): its source, licence and accuracy.
        conversion: another library's checkpoint that was not in the cache when ``get_loader`` looked
            (``sources.Conversion``): ``load`` converts it into the model given (a whole classifier writes the
            cache from itself, or loads the entry another process wrote meanwhile); None for a cached one.
    """

    model_name: str
    label: str
    num_classes: int
    class_names: tuple = None
    input_config: InputConfig = None
    arguments: dict = dataclasses.field(default_factory=dict)
    path: pathlib.Path = None
    model: keras.Model = None
    spec: object = None
    conversion: object = None

    def load(self, model, head=True):
        """Put the weights into ``model`` (built with ``arguments``): the whole classifier, or with
        ``head=False`` its backbone only, the head's tensors dropped (the model keeps its own new head). A
        checkpoint not in the cache yet is converted into ``model``; a whole classifier then writes the cache.

        Returns:
            ``model``.
        """
        if not head:
            self.load_backbone(model.backbone)
        elif self.conversion is not None and self.conversion.into(model, write=True):
            return model  # converted into the model, and the cache written from it
        elif self.model is not None:
            copy_weights(model, self.model, self.label, self.model_name)
        else:
            self._load_file(model, self.path)
        return model

    def load_backbone(self, backbone):
        """Put the backbone's part of the weights into ``backbone`` (a ``PreActResNetBackbone``)."""
        if self.model is not None:
            copy_weights(backbone, self.model.backbone, self.label, self.model_name)
            return backbone
        if self.conversion is not None:
            self.conversion.into(backbone, write=False)
            return backbone
        with tempfile.TemporaryDirectory() as folder:
            self._load_file(backbone, backbone_file(self.path, pathlib.Path(folder)))
        return backbone

    def _load_file(self, model, path):
        try:
            model.load_weights(path)
        except ValueError as error:
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise ValueError(f"Invalid weights={self.label} of {self.model_name}: {self.path} does not fit "
                             f"the model built (were its architecture arguments overridden?): {first}") from None


def backbone_file(path, folder):
    """A ``.weights.h5`` of the backbone alone, written in ``folder``: the classifier's file without its head
    (the backbone's group, as ``backbone.save_weights`` writes it)."""
    import h5py  # Keras' own dependency for .weights.h5

    target = folder / f"backbone{KERAS_PREACT_SUFFIXES[0]}"
    with h5py.File(path, "r") as source, h5py.File(target, "w") as out:
        group = source["layers"][_backbone_group(source, path)]
        for key in group:
            source.copy(group[key], out, name=key)
    return target


def _backbone_group(h5, path):
    names = [n for n in h5["layers"] if n == BACKBONE_GROUP or n.startswith(BACKBONE_GROUP + "_")]
    if len(names) != 1:
        raise ValueError(f"Invalid weights={str(path)!r}: no keras-preact backbone in it (a classifier's "
                         "save_weights is expected).")
    return names[0]


def copy_weights(target, source, label, model_name):
    """Assign ``source``'s variables to ``target``'s, in order, after checking every shape."""
    targets, sources = target.weights, source.weights
    mismatch = next(((t.path, tuple(t.shape), tuple(s.shape)) for t, s in zip(targets, sources)
                     if tuple(t.shape) != tuple(s.shape)), None)
    if len(targets) != len(sources) or mismatch:
        detail = (f"{mismatch[0]} is {mismatch[1]} there, {mismatch[2]} in the weights" if mismatch
                  else f"{len(targets)} variables there, {len(sources)} in the weights")
        raise ValueError(f"Invalid weights={label} of {model_name}: they do not fit the {target.name} built "
                         f"({detail}; were its architecture arguments overridden?).")
    for t, s in zip(targets, sources):
        t.assign(keras.ops.cast(s, t.dtype))


# ----------------------------------------------------------------------------------------- the one look
def get_loader(model_name, weights, *, allow_non_finite=False):
    """The ``Loader`` of ``weights`` for the registered network ``model_name`` (or a ``ModelSpec``; None for
    ``weights=None``; a ``Loader`` of that network is returned as it is): what ``weights`` names is decided
    once, checked, fetched and converted before anything is built; a ValueError naming ``weights`` and what is
    allowed otherwise. ``allow_non_finite``: convert another library's checkpoint holding NaN or infinite values
    (refused by default, ``reading.check_tensors``; such a conversion is cached apart from the checked ones).

    Examples:
        >>> from keras_preact.pretrained.loader import get_loader
        >>> get_loader("cifar_resnet20", "cifar10").label
        "'cifar10'"
        >>> get_loader("cifar_resnet20", "cifar100")
        Traceback (most recent call last):
        ...
        ValueError: Invalid weights='cifar100' for cifar_resnet20. Allowed values: None, 'cifar10', or ...
    """
    from keras_preact.models.registry import ModelSpec, model_spec

    spec = model_name if isinstance(model_name, ModelSpec) else model_spec(model_name)
    if weights is None or isinstance(weights, Loader) and weights.model_name == spec.name:
        return weights  # a Loader got before: an entry point that checks the weights early looks once
    name = registered_name(spec, weights)
    if name is not None:
        return _registered(spec, spec.weights[name], allow_non_finite)
    path = pathlib.Path(weights).expanduser()
    if path.is_dir():
        return _folder(spec, path, weights, allow_non_finite)
    return _file(spec, path, weights, allow_non_finite)


def written_as_path(weights):
    """Whether ``weights`` is written as a path (a ``PathLike``, a separator, a leading ``.`` or ``~``, or a
    checkpoint file's suffix), not as a name."""
    if isinstance(weights, os.PathLike):
        return True
    return (weights.startswith((".", "~")) or "/" in weights or os.sep in weights
            or weights.endswith(KERAS_PREACT_SUFFIXES + CHECKPOINT_SUFFIXES))


def registered_name(spec, weights):
    """``weights`` when it is a registered weights name of ``spec`` not written as a path; None for a path; a
    ValueError listing the allowed values for anything else."""
    if not isinstance(weights, (str, os.PathLike)):
        raise _invalid(spec, weights)
    if written_as_path(weights):
        return None
    if weights in spec.weights:
        if os.path.exists(weights):
            warnings.warn(f"weights={weights!r} is {spec.name}'s registered weights name; the {weights} in the "
                          f"working directory is weights='./{weights}'.", UserWarning, stacklevel=3)
        return weights
    if not os.path.exists(weights):
        raise _invalid(spec, weights)
    return None


def _invalid(spec, weights):
    names = ", ".join(["None", *map(repr, spec.weights)])
    note = "" if spec.weights else " (no trained weights are registered for it)"
    return ValueError(f"Invalid weights={weights!r:.200} for {spec.name}. Allowed values: {names}{note}, or the "
                      f"path of {ALLOWED.removeprefix('a registered weights name, ')}.")


def _registered(spec, trained, allow_non_finite=False):
    names = tuple(trained.class_names) if trained.class_names else None  # shipped names are read on first use
    if trained.origin == "package":
        path = trained.checked_path(spec.name)
        return Loader(spec.name, repr(trained.name), trained.num_classes, names, trained.input_config,
                      _arguments(trained.arguments, trained.input_config), path, spec=trained)
    from keras_preact.models.presets import IMAGENET_INPUT

    path, _, conversion = sources.prepare(spec.name, trained, spec.arguments["depth"],
                                          allow_non_finite=allow_non_finite)
    input_config = sources.checkpoint_input_config(trained, IMAGENET_INPUT)
    return Loader(spec.name, repr(trained.name), trained.num_classes, names, input_config,
                  _arguments(trained.arguments, input_config), path, spec=trained, conversion=conversion)


def _arguments(arguments, input_config):
    """The builder arguments a checkpoint needs: its layout, and its input size where it has an input config."""
    return {**arguments, **({"input_shape": tuple(input_config.input_size)} if input_config is not None else {})}


def _folder(spec, path, weights, allow_non_finite=False):
    what = f"Invalid weights={str(weights)!r} of {spec.name}"
    if (path / RUN_MODEL).is_file():
        return _keras_model(spec, path / RUN_MODEL, weights)
    config = _json_object(path / RUN_CONFIG)
    if config is not None and "architecture" in config:
        return _converted(spec, path, weights, "timm", sources.timm_input_config(config.get("pretrained_cfg", {})),
                          allow_non_finite)
    if config is not None and "class_name" in config:
        from keras_preact.models.presets import IMAGENET_INPUT

        return _converted(spec, path, weights, "keras_hub", sources.keras_hub_input_config(path, IMAGENET_INPUT),
                          allow_non_finite)
    if config is not None and is_run_config(config):
        raise ValueError(f"{what}: {path} is an unfinished run (resume it to write {RUN_MODEL}); expected "
                         f"{ALLOWED}.")
    raise ValueError(f"{what}: {path} is no run directory (no {RUN_MODEL}), timm folder (config.json with its "
                     f"architecture) or keras-hub preset folder; expected {ALLOWED}.")


def is_run_config(config):
    """Whether a folder's ``config.json`` object is a keras-preact-train run's (its format, or the keys of a
    run written before the format)."""
    return str(config.get("format", "")).startswith(RUN_FORMAT) or all(k in config for k in LEGACY_RUN_KEYS)


def _json_object(path):
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _file(spec, path, weights, allow_non_finite=False):
    what = f"Invalid weights={str(weights)!r} of {spec.name}"
    if not path.is_file():
        raise ValueError(f"{what}: no such file or directory; expected {ALLOWED}.")
    if path.name.endswith(KERAS_PREACT_SUFFIXES) and reading.keras_resnet_v2_file(path) is None:  # checked
        if path.name.endswith(KERAS_PREACT_SUFFIXES[0]):
            return Loader(spec.name, repr(str(weights)), _classes_in_weights_file(path, what), path=path)
        return _keras_model(spec, path, weights)
    if path.suffix in (".h5", ".keras"):  # keras.applications' ResNetV2: a legacy .h5, Keras 3's .weights.h5, .keras
        from keras_preact.models.presets import KERAS_RESNET_V2_INPUT

        return _converted(spec, path, weights, "keras", KERAS_RESNET_V2_INPUT, allow_non_finite)
    if path.suffix in CHECKPOINT_SUFFIXES:
        return _converted(spec, path, weights, "timm", None, allow_non_finite)
    raise ValueError(f"{what}: unknown file type; expected {ALLOWED}.")


def _converted(spec, path, weights, kind, input_config, allow_non_finite=False):
    """Another library's checkpoint at ``path``, converted once (by the first ``load``, into the model it is
    given); a bare timm file takes the input config of the registered timm checkpoint of its architecture (its
    layout and classes), as its folder would."""
    from keras_preact.models.weights import WeightsSpec

    local = WeightsSpec(name="local", file=str(path), origin="file", source=kind, input_config=input_config)
    entry, found, conversion = sources.prepare(spec.name, local, spec.arguments["depth"],
                                               allow_non_finite=allow_non_finite)
    layout = found["layout"]
    if input_config is None:
        input_config = architecture_input_config(spec, layout, found["num_classes"])
    return Loader(spec.name, repr(str(weights)), found["num_classes"], None, input_config,
                  _arguments(sources.LAYOUT_ARGUMENTS[layout], input_config), entry, conversion=conversion)


def architecture_input_config(spec, layout, num_classes):
    """The input config of ``spec``'s registered timm checkpoint of that ``layout`` (``"timm"``, ``"bit"``), the
    one with ``num_classes`` classes first; timm's defaults for its architectures where none is registered."""
    candidates = [w for w in spec.weights.values() if w.origin == "timm" and w.arguments.get("layout") == layout
                  and w.input_config is not None]
    candidates.sort(key=lambda w: w.num_classes != num_classes)
    return candidates[0].input_config if candidates else sources.timm_input_config({})


def _keras_model(spec, path, weights):
    what = f"Invalid weights={str(weights)!r} of {spec.name}"
    try:
        model = keras.saving.load_model(path, compile=False)
    except Exception as error:  # noqa: BLE001 - any reader error, in one line
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise ValueError(f"{what}: {path} does not load as a Keras model: {first}") from None
    if not hasattr(model, "backbone") or not isinstance(getattr(model, "num_classes", None), int):
        raise ValueError(f"{what}: {path} holds {type(model).__name__} {model.name!r}, not a keras-preact classifier "
                         "(PreActResNetClassifier with a dense head).")
    return Loader(spec.name, repr(str(weights)), model.num_classes, model.class_names, model.input_config,
                  model=model)


def _classes_in_weights_file(path, what):
    """The classes of the classifier whose ``save_weights`` wrote ``path`` (its dense kernel's columns)."""
    with reading.keras_h5(path) as f:  # checked: not empty, HDF5, Keras weights; one line otherwise
        dense = [name for name in f.get("layers", ()) if name == "dense" or name.startswith("dense_")]
        kernel = f[f"layers/{dense[0]}/vars/0"] if len(dense) == 1 else None
        classes = int(kernel.shape[-1]) if kernel is not None and len(kernel.shape) == 2 else None
    if classes is None:
        raise ValueError(f"{what}: {path} holds no classifier with one dense head (a keras-preact classifier's "
                         "save_weights is expected).")
    return classes
