"""Published pre-activation checkpoints: fetched through their own ecosystem's loader, checked, converted once.

Each ``origin`` has its loader and cache: ``"keras"`` (keras.applications ResNetV2: ``keras.utils.get_file``
into ``$KERAS_HOME/models``, checked by Keras' published md5), ``"timm"`` (``huggingface_hub.hf_hub_download``
of ``timm/<model>.<tag>``'s ``model.safetensors`` into the Hugging Face cache, checked against the Hub's
sha256), ``"keras_hub"`` (keras-hub's preset loader, which caches through kagglehub). A checkpoint is read
and checked without building a network of ours (``prepare``: its layout and classes), converted into the network
its loader is given (``Conversion.into``), and written once from that network, as a ``.weights.h5`` file named
after the source's digest, under ``$KERAS_HOME/keras_preact/``; later loads read that file. Without a network
each loader's cache is used, and a missing checkpoint fails within seconds with one line saying what to download
and where to put it.

A local checkpoint works as ``weights=PATH`` (``keras_preact.pretrained.loader`` decides what it is): a timm
``.safetensors``/``.pth`` state dict or a timm folder (``config.json`` + ``model.safetensors``), a
keras.applications ResNetV2's ``.h5``, ``.weights.h5`` or ``.keras``, a keras-hub preset folder. Each file is
checked before it is used (``keras_preact.pretrained.reading``): a bad one is one ``CheckpointError`` line.
"""

import dataclasses
import os
import pathlib
import socket
import urllib.parse

from keras_preact.preprocessing import InputConfig, input_config_from_image_converter, timm_crop_fraction
from keras_preact.pretrained import cache, convert_keras, convert_timm, reading

# Depths with published Keras ImageNet weights (keras.applications ResNetV2, TF-slim layout).
KERAS_IMAGENET_WEIGHTS = convert_keras.KERAS_RESNET_V2
KERAS_WEIGHTS_URL = "https://storage.googleapis.com/tensorflow/keras-applications/resnet/"
HF_ENDPOINT = "https://huggingface.co"
KAGGLE_ENDPOINT = "https://www.kaggle.com"
CONNECT_TIMEOUT_S = 5  # a probe of the source's host before any download: offline fails in seconds, not minutes
# The builder arguments each kind of checkpoint needs (imagenet_resnet's layouts).
LAYOUT_ARGUMENTS = {"keras": {"layout": "tf_slim"}, "timm": {"layout": "timm"}, "bit": {"layout": "bit"},
                    "keras_hub": {"layout": "timm"}}


# ------------------------------------------------------------------------------------------ the network
def _offline(what, url, where):
    return OSError(f"Cannot fetch {what}: {url} is unreachable (no network?); download it on a connected machine "
                   f"and put it at {where}, or pass its local path as weights=.")


def reachable(url, timeout=CONNECT_TIMEOUT_S):
    """Whether ``url``'s host accepts a TCP connection within ``timeout`` seconds (DNS included)."""
    parsed = urllib.parse.urlparse(url)
    try:
        with socket.create_connection((parsed.hostname, parsed.port or 443), timeout=timeout):
            return True
    except OSError:
        return False


def fetch_keras(spec):
    """keras.applications' ResNetV2 weights file, through ``keras.utils.get_file`` (its cache, its md5 check)."""
    import keras

    file = spec.checkpoint
    url = KERAS_WEIGHTS_URL + file
    cached = cache.keras_home() / "models" / file
    if not cached.is_file() and not reachable(url):
        raise _offline(f"Keras' {file}", url, cached)
    algorithm, _, value = (spec.checksum or "md5:").partition(":")
    return pathlib.Path(keras.utils.get_file(file, url, cache_dir=str(cache.keras_home()), cache_subdir="models",
                                             file_hash=value or None, hash_algorithm=algorithm))


def _hf():
    try:
        import huggingface_hub
    except ImportError:
        raise ImportError("timm checkpoints are fetched with huggingface_hub: pip install huggingface_hub safetensors "
                          "(or keras-preact[pretrained])") from None
    return huggingface_hub


def fetch_timm(spec):
    """``model.safetensors`` of the Hub repository ``timm/<model>.<tag>`` (the Hugging Face cache); a fresh
    download is checked against the Hub's published sha256 (its LFS etag)."""
    hf = _hf()
    repo = spec.checkpoint
    try:
        return pathlib.Path(hf.hf_hub_download(repo, "model.safetensors", local_files_only=True))
    except Exception:  # not in the cache (or offline mode): download below
        pass
    endpoint = os.environ.get("HF_ENDPOINT", HF_ENDPOINT)
    url = f"{endpoint}/{repo}/resolve/main/model.safetensors"
    hub_cache = os.environ.get("HF_HUB_CACHE") or hf.constants.HF_HUB_CACHE
    if hf.constants.HF_HUB_OFFLINE or not reachable(endpoint):
        raise _offline(f"timm's {repo}", url, f"{hub_cache} (hf download {repo} model.safetensors)")
    metadata = hf.get_hf_file_metadata(hf.hf_hub_url(repo, "model.safetensors"))
    path = pathlib.Path(hf.hf_hub_download(repo, "model.safetensors"))
    published = (metadata.etag or "").strip('"')
    if len(published) == 64 and cache.sha256_of(path) != published:
        raise OSError(f"Invalid download of {repo}: {path} has not the Hub's sha256 {published}; delete it and retry.")
    return path


def kaggle_cache(handle):
    """Where kagglehub keeps a keras-hub preset (``KAGGLEHUB_CACHE``, default ``~/.cache/kagglehub``)."""
    root = pathlib.Path(os.environ.get("KAGGLEHUB_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "kagglehub")))
    owner, model, framework, variation, version = handle.removeprefix("kaggle://").split("/")
    return root / "models" / owner / model / framework / variation / version


def fetch_keras_hub(spec):
    """A keras-hub preset: its folder in kagglehub's cache, else keras-hub's preset loader fetches it."""
    try:
        import keras_hub  # noqa: F401
    except ImportError:
        raise ImportError("keras-hub presets are read with keras-hub: pip install keras-hub") from None
    handle = spec.checkpoint
    cached = kaggle_cache(handle)
    if cached.is_dir():
        return cached
    url = f"{KAGGLE_ENDPOINT}/models/{handle.removeprefix('kaggle://')}"
    if not reachable(KAGGLE_ENDPOINT):
        raise _offline(f"keras-hub's preset {handle}", url, cached)
    import kagglehub  # what keras-hub's preset loader downloads kaggle:// presets with

    return pathlib.Path(kagglehub.model_download(handle.removeprefix("kaggle://")))


FETCHERS = {"keras": fetch_keras, "timm": fetch_timm, "keras_hub": fetch_keras_hub}


# ---------------------------------------------------------------------------------------- conversion
def read_state_dict(path, **options):
    """A timm state dict as ``{name: numpy array}``, read and checked (``reading.read_state_dict``)."""
    return reading.read_state_dict(path, **options)


def read_checkpoint(kind, source_path, depth, *, allow_non_finite=False):
    """(what ``convert`` reads, ``{"layout", "num_classes"}``) of a fetched or local checkpoint (``kind``: keras,
    timm, keras_hub; ``layout`` a ``LAYOUT_ARGUMENTS`` key), checked for the depth-``depth`` network without
    building ours: timm's state dict (``convert_timm.timm_architecture``), a keras.applications file's path and
    what ``reading.keras_resnet_v2_file`` finds in it, keras-hub's ``ImageClassifier`` (the source library's
    network); ``allow_non_finite``: NaN and infinite values are accepted, not refused (``reading.check_tensors``)."""
    if kind == "keras":
        if depth not in KERAS_IMAGENET_WEIGHTS:
            raise ValueError(
                f"Invalid weights: a keras.applications ResNetV2 file has depth 50, 101 or 152, not {depth}."
            )
        found = convert_keras.checked_file(source_path, depth, allow_non_finite=allow_non_finite)
        return (source_path, found), {"layout": "keras", "num_classes": found["num_classes"]}
    if kind == "timm":
        state = read_state_dict(source_path, allow_non_finite=allow_non_finite)
        arch = convert_timm.timm_architecture(state, source_path, allow_non_finite=allow_non_finite)
        _check_depth(arch["depth"], depth, source_path)
        return state, {"layout": arch["layout"], "num_classes": arch["num_classes"] or 1000}
    import keras_hub

    classifier = keras_hub.models.ImageClassifier.from_preset(str(source_path))
    _check_depth(convert_timm.keras_hub_architecture(classifier.backbone)["depth"], depth, source_path)
    return classifier, {"layout": "keras_hub", "num_classes": int(classifier.output_dense.units)}


def convert(kind, source, target):
    """Convert ``source`` (``read_checkpoint``'s) into ``target``, a network of ours in the checkpoint's layout:
    a classifier of its classes, or a backbone (the head's tensors dropped, as timm's ``load_pretrained`` pops the
    classifier's keys for a new head). Returns ``target``."""
    if kind == "keras":
        path, found = source
        convert_keras.load_keras_applications(target, convert_keras.keras_applications_model(path, found=found))
    elif kind == "timm":
        convert_timm.load_timm_state_dict(target, source)
    else:
        convert_timm.load_keras_hub_backbone(target, source.backbone, source)
    return target


def _check_depth(found, depth, path):
    if found != depth:
        raise ValueError(f"Invalid weights={str(path)!r}: a depth-{found} checkpoint for a depth-{depth} network; "
                         f"use imagenet_resnet{found}.")


@dataclasses.dataclass
class Conversion:
    """A checkpoint read and checked but not in the cache yet: converted into the network the caller builds (no
    network of ours is built for the conversion alone).

    Attributes:
        kind: keras, timm or keras_hub. entry: its cache entry (``cache.entry_path``).
        source: what ``convert`` reads (``read_checkpoint``'s). found: ``{"layout", "num_classes"}``.
    """

    kind: str
    entry: pathlib.Path
    source: object
    found: dict

    def into(self, target, *, write):
        """Convert the checkpoint into ``target``; with ``write``, ``target`` is the whole classifier (the
        checkpoint's classes) and the cache entry is written from it (``cache.cached``: one converter at a
        time, written to a temporary file and renamed, its sha256 recorded). The weights do not depend on the
        input shape nor the head's activation, so any classifier of the checkpoint's classes writes the same
        file; one whose variables are not float32 (a ``dtype=`` override) is converted into, never cached.

        Returns:
            True when converted into ``target``; False when another process wrote the entry meanwhile (load it).
        """
        if not write or any(str(v.dtype) != "float32" for v in target.weights):
            convert(self.kind, self.source, target)
            return True
        done = []

        def conversion():
            done.append(convert(self.kind, self.source, target))
            return target, dict(self.found)

        cache.cached(self.entry, conversion, warn=False)  # a mismatch was said when the loader looked
        return bool(done)


def prepare(model_name, spec, depth, *, allow_non_finite=False):
    """(the cache entry of a published or local checkpoint for the depth-``depth`` network ``model_name``,
    ``{"layout", "num_classes"}``, a ``Conversion`` or None): fetched, and either found converted in the cache
    (``keras_preact.pretrained.cache``: keyed by the content of every source file, verified against its recorded
    sha256; the Conversion None) or read and checked, its Conversion converting it into the network the caller
    builds. ``allow_non_finite`` as ``read_checkpoint``'s (a conversion of non-finite values is cached under its
    own key: a checked load never gets it). A package's own file is (its path, None, None)."""
    source = pathlib.Path(spec.file) if spec.origin == "file" else FETCHERS[spec.origin](spec)
    kind = spec.source if spec.origin == "file" else spec.origin
    if kind == "package":
        return source, None, None
    read = source / "model.safetensors" if kind == "timm" and source.is_dir() else source
    context = (kind, depth, spec.num_classes) + (("allow_non_finite",) if allow_non_finite else ())  # checked: old keys
    entry = cache.entry_path(f"{model_name}-{spec.name}", source, *context)
    record = cache.read_record(entry)
    if record is not None:
        return entry, {"layout": record["layout"], "num_classes": record["num_classes"]}, None
    checkpoint, found = read_checkpoint(kind, read, depth, allow_non_finite=allow_non_finite)
    return entry, found, Conversion(kind, entry, checkpoint, found)


# ------------------------------------------------------------------------------------ local checkpoints
def timm_input_config(pretrained_cfg):
    """An InputConfig from timm's ``pretrained_cfg`` (0-1 statistics scaled to 0-255, timm's resize size)."""
    size = tuple(pretrained_cfg.get("input_size", (3, 224, 224)))
    crop = float(pretrained_cfg.get("crop_pct", 0.875))
    mean = tuple(255 * m for m in pretrained_cfg.get("mean", (0.5, 0.5, 0.5)))
    std = tuple(255 * s for s in pretrained_cfg.get("std", (0.5, 0.5, 0.5)))
    interpolation = pretrained_cfg.get("interpolation", "bilinear")
    return InputConfig(input_size=(size[1], size[2], size[0]), mean=mean, std=std,
                       crop_fraction=timm_crop_fraction(size[1], crop),
                       interpolation="bicubic" if interpolation == "bicubic" else "bilinear")


KERAS_HUB_CONVERTER_FILES = (
    "image_converter.json",
    "preprocessor.json",
)  # where a keras-hub preset keeps its converter


def keras_hub_input_config(preset, default):
    """An InputConfig from a keras-hub preset folder's image converter, loaded with keras-hub's own loader
    (``keras_hub.models.ImageClassifierPreprocessor.from_preset(preset).image_converter``, which reads the preset's
    ``preprocessor.json`` or ``image_converter.json``); ``default`` for a preset without one.

    The converter computes ``pixels * scale + offset`` (0-255 pixels in), i.e. ``(pixels - mean) / std`` with
    ``std = 1 / scale`` and ``mean = -offset / scale``; ``image_size`` is the input size (``default``'s where None);
    its ``interpolation`` is kept. The view is the centre crop of the image's largest region of the input's aspect
    ratio, resized (``crop_fraction=1.0``): keras-hub's ``crop_to_aspect_ratio=True``, its default. InputConfig has
    no squashing resize (``crop_to_aspect_ratio=False``) nor padding (``pad_to_aspect_ratio=True``): such a
    preset gets the same crop_fraction 1.0 view, which equals keras-hub's on images of the input's aspect ratio."""
    preset = pathlib.Path(preset)
    if not any((preset / name).is_file() for name in KERAS_HUB_CONVERTER_FILES):
        return default
    import keras_hub

    converter = keras_hub.models.ImageClassifierPreprocessor.from_preset(str(preset)).image_converter
    if converter is None:
        return default
    try:
        return input_config_from_image_converter(converter.get_config(), default)
    except ValueError as error:
        raise ValueError(f"Invalid weights={str(preset)!r}: its keras-hub image converter does not give an input "
                         f"config ({error}).") from None


def checkpoint_input_config(spec, default):
    """The preprocessing ``spec``'s checkpoint was trained with: a registered keras-hub preset's image converter
    (keras-hub keeps it in the preset, so the preset is fetched, or read from kagglehub's cache; ``default`` where
    the preset has none and the spec names none), else the ``input_config`` the spec names (None: the network's)."""
    if spec.origin == "keras_hub":
        return keras_hub_input_config(fetch_keras_hub(spec), spec.input_config or default)
    return spec.input_config
