"""Data sources for training, all offline-safe: a built-in synthetic set, image folders, TFDS by name.

``load(config)`` returns ``ArrayData`` (uint8 arrays in memory), ``StreamData`` (encoded files read through
tf.data) or ``FolderFiles`` (image files decoded batch by batch without TensorFlow, ``pipelines.FolderBatches``):

- ``synthetic``: class-dependent procedural images (oriented, coloured gratings plus noise),
  deterministic by seed; learnable by a small ResNet in a few hundred steps. The embedded default.
- ``folder``: ``data_dir/train/<class>/*.jpg`` and ``data_dir/test/<class>/...`` (or ``val/``,
  ``validation/``), e.g. the CIFAR-10 JPEG tree; class names are the sorted folder names. Small sets
  (the CIFAR recipe) are decoded once into uint8 arrays cached as ``.npy`` under ``cache_dir``; the
  ImageNet recipe streams the files through tf.data instead (``pipelines``); a ``resize_images`` folder whose
  decoded set is over the memory budget streams batch by batch (``choose_folder_decoding``).
- any TFDS name (``cifar10``, ``cifar100``, ``imagenet2012``, ...), read from ``data_dir`` with
  ``try_gcs=False``; when it is not prepared this fails at once with a message saying what to put
  where (nothing is ever downloaded; ``manual_dir`` prepares manually downloaded archives offline).
"""

import dataclasses
import functools
import hashlib
import logging
import os
import pathlib
import threading
import warnings

import numpy as np

from keras_preact.models.class_names import class_name_problem
from keras_preact.preprocessing import (
    InputConfig,
    decode_image,
    decode_image_array,
    image_format,
    is_encoded_image,
    view_geometry,
)
from keras_preact.scratch import atomic_path

from ..recipe.configs import resolve_pipeline

logger = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif")
TEST_SPLIT_NAMES = ("test", "val", "validation")
# Part of the decoded-image cache's key: caches decoded otherwise (TensorFlow's fast JPEG IDCT, before
# decode_image used the accurate one that Pillow uses; 16-bit PNGs clipped by Pillow) are not reused.
DECODER = "jpeg-islow-png16-high-byte"
# The most pixels one decoded image may have (its header is read first): Pillow's own ``Image.MAX_IMAGE_PIXELS``,
# about a quarter of a gigabyte of RGB (a 20000x20000 PNG of one colour is 400 KB and would take 1.2 GB decoded).
MAX_IMAGE_PIXELS = 89_478_485
_PILLOW_BOUND_LOCK = threading.Lock()


class DataError(ValueError):
    """Bad or missing data, raised before any training starts."""


@dataclasses.dataclass
class ArrayData:
    """In-memory data: uint8 images [N, H, W, 3] and int labels in [0, len(class_names))."""

    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    class_names: list

    @property
    def num_classes(self):
        return len(self.class_names)

    @property
    def image_size(self):
        return tuple(int(s) for s in self.train_images.shape[1:3])

    @property
    def train_size(self):
        return len(self.train_labels)

    @functools.cached_property
    def mean_image(self):
        """The mean training image, float32 [H, W, 3] (the paper's per-pixel mean), computed once."""
        return self.train_images.mean(axis=0, dtype=np.float64).astype(np.float32)

    def validate(self):
        problem = class_name_problem(self.class_names)
        if problem or len(self.class_names) < 2:
            raise DataError(f"Invalid class_names: {problem or f'{len(self.class_names)} name(s)'}; two or more "
                            "unique one-line names are required.")
        for split in ("train", "test"):
            images, labels = getattr(self, f"{split}_images"), getattr(self, f"{split}_labels")
            if images.ndim != 4 or images.shape[-1] != 3:
                raise DataError(f"{split}_images must be [N, H, W, 3] RGB, got shape {images.shape}.")
            if len(images) != len(labels) or len(images) == 0:
                raise DataError(
                    f"{split}: {len(images)} images and {len(labels)} labels; need the same non-zero number."
                )
            if labels.size and (labels.min() < 0 or labels.max() >= self.num_classes):
                raise DataError(
                    f"{split} labels out of range: found [{labels.min()}, {labels.max()}], allowed "
                    f"[0, {self.num_classes - 1}] for {self.num_classes} class names."
                )
        if self.test_images.shape[1:] != self.train_images.shape[1:]:
            raise DataError(
                f"Test images {self.test_images.shape[1:3]} and train images "
                f"{self.train_images.shape[1:3]} differ in size."
            )
        return self


@dataclasses.dataclass
class StreamData:
    """Large data read through tf.data: ``make(split)`` -> dataset of (encoded image, label)."""

    make: object
    train_size: int
    test_size: int
    class_names: list

    @property
    def num_classes(self):
        return len(self.class_names)


@dataclasses.dataclass
class FolderFiles:
    """An image folder streamed without TensorFlow: its files and labels, each batch decoded from the files
    (``decode_file``, the in-memory path's decode) to ``image_size`` (``fitted``) by ``pipelines.FolderBatches``."""

    train_files: list
    train_labels: np.ndarray
    test_files: list
    test_labels: np.ndarray
    class_names: list
    image_size: tuple
    crop_fraction: float = 1.0
    max_image_pixels: int | None = MAX_IMAGE_PIXELS

    @property
    def num_classes(self):
        return len(self.class_names)

    @property
    def train_size(self):
        return len(self.train_labels)

    def decode(self, path):
        """The uint8 ``[H, W, 3]`` view of one file, as the in-memory path holds it (``folder(image_size=...)``)."""
        try:
            image = decode_file(path, self.max_image_pixels)
        except (OSError, ValueError) as error:
            raise DataError(f"Cannot decode image file {path} (corrupt, empty or not an image): {error}. Remove or "
                            "replace it, or pass --skip-bad-images.") from None
        return fitted(image, self.image_size, self.crop_fraction)


# ------------------------------------------------------------------------------------ synthetic
def synthetic(train_size=4096, test_size=1024, num_classes=10, image_size=(32, 32), seed=0):
    """Class-dependent procedural images: class k is a grating with its own orientation,
    frequency and colour; random phase, contrast and pixel noise per image. Deterministic by seed."""
    h, w = image_size
    rng = np.random.default_rng(seed)
    angles = np.pi * np.arange(num_classes) / num_classes
    freqs = 2.0 + (np.arange(num_classes) % 3)
    colours = np.stack(
        [np.cos(2 * np.pi * (np.arange(num_classes) / num_classes + c / 3)) for c in range(3)], -1
    )
    yy, xx = np.meshgrid(np.arange(h) / h, np.arange(w) / w, indexing="ij")

    def make(n):
        labels = rng.integers(0, num_classes, n)
        phase = rng.uniform(0, 2 * np.pi, (n, 1, 1))
        contrast = rng.uniform(0.2, 0.6, (n, 1, 1, 1))
        t = xx * np.cos(angles[labels])[:, None, None] + yy * np.sin(angles[labels])[:, None, None]
        wave = np.sin(2 * np.pi * freqs[labels][:, None, None] * t + phase)[..., None]
        tint = 0.6 + 0.4 * colours[labels][:, None, None, :]
        images = 127.5 + 100 * contrast * wave * tint + rng.normal(0, 70, (n, h, w, 3))
        return np.clip(images, 0, 255).astype(np.uint8), labels.astype(np.int32)

    train_images, train_labels = make(train_size)
    test_images, test_labels = make(test_size)
    names = [f"class_{k}" for k in range(num_classes)]
    return ArrayData(train_images, train_labels, test_images, test_labels, names)


# -------------------------------------------------------------------------------------- folders
def _list_folder(split_dir):
    """(files, labels, class_names) of a one-folder-per-class tree, validated: two or more class folders, each
    name one line (``class_name_problem``); entries that are no readable file (a broken or looping symbolic
    link) are left out, counted in one line."""
    classes = sorted(p.name for p in split_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        raise DataError(
            f"No class folders in {split_dir}: expected one sub-folder of images per class."
        )
    problem = class_name_problem(classes)
    if problem:
        raise DataError(f"Invalid class folder in {split_dir}: {problem}; rename the folder.")
    if len(classes) < 2:
        raise DataError(f"One class folder in {split_dir} ({classes[0]!r}): a classifier needs two or more classes, "
                        "one sub-folder of images each.")
    files, labels, unreadable = [], [], []
    for index, name in enumerate(classes):
        entries = [p for p in (split_dir / name).iterdir() if p.suffix.lower() in IMAGE_EXTENSIONS]
        unreadable += [str(p) for p in entries if not p.is_file()]  # is_file: False for a broken or looping link
        found = sorted(str(p) for p in entries if p.is_file())
        if not found:
            raise DataError(
                f"Class folder {split_dir / name} has no images ({', '.join(IMAGE_EXTENSIONS)})."
            )
        files += found
        labels += [index] * len(found)
    if unreadable:
        print(f"[data] skipped {len(unreadable)} entries of {split_dir} that are no readable file (a broken or "
              f"looping symbolic link, or a folder), e.g. {sorted(unreadable)[0]}", flush=True)
    return files, np.asarray(labels, np.int32), classes


def folder_splits(data_dir):
    """(train_dir, test_dir) of an image-folder data set, or a DataError saying what is expected."""
    root = pathlib.Path(data_dir or "")
    if not data_dir or not root.is_dir():
        raise DataError(
            f"data_dir={str(data_dir)!r} is not a directory. For dataset='folder' give a directory "
            "with train/ and test/ (or val/) sub-folders, one folder of images per class, e.g. "
            "--data-dir cifar10-jpeg holding train/airplane/0000.jpg ... and test/airplane/0000.jpg ..."
        )
    train_dir = root / "train"
    test_dirs = [root / n for n in TEST_SPLIT_NAMES if (root / n).is_dir()]
    if not train_dir.is_dir() or not test_dirs:
        present = sorted(p.name for p in root.iterdir()) or ["nothing (empty)"]
        raise DataError(
            f"data_dir={str(data_dir)!r} must contain train/ and test/ (or val/, validation/) "
            f"sub-folders; it contains: {', '.join(present[:10])}."
        )
    return train_dir, test_dirs[0]


def _decoded_images(files, max_pixels=MAX_IMAGE_PIXELS):
    """(index, uint8 image) for every file that decodes, in order; unreadable files are left out. Every file's
    header is checked against ``max_pixels`` first (``check_image_pixels``), before anything is decoded."""
    for f in files:
        check_image_pixels(f, max_pixels)
    try:
        import tensorflow as tf
    except ImportError:  # machines without TensorFlow: Pillow (a matplotlib dependency)
        tf = None
    if tf is not None:
        ds = tf.data.Dataset.from_tensor_slices((np.arange(len(files)), files)).map(
            lambda i, f: (i, decode_image(tf.io.read_file(f))),
            num_parallel_calls=tf.data.AUTOTUNE, deterministic=True,
        ).ignore_errors()
        for i, x in ds:
            yield int(i), x.numpy()
        return
    for i, f in enumerate(files):
        try:
            yield i, decode_file(f, max_pixels)
        except (OSError, ValueError) as error:  # not an image, truncated, bad header
            if isinstance(error, DataError):
                raise
            continue


def decode_file(path, max_pixels=MAX_IMAGE_PIXELS):
    """One image file's uint8 ``[H, W, 3]`` pixels without TensorFlow: ``decode_image_array`` (Pillow), the pixels
    of TensorFlow's ``decode_image``, once its header is within ``max_pixels`` (``check_image_pixels``);
    ValueError or OSError when it is not a readable image."""
    from PIL import Image

    check_image_pixels(path, max_pixels)
    if max_pixels is not None and max_pixels <= MAX_IMAGE_PIXELS:  # within Pillow's bound: it neither warns nor fails
        return decode_image_array(path)
    # A bound raised over Pillow's (or none): its check off while this file decodes, one file at a time (the
    # bound and the warning filters are the process's).
    with _PILLOW_BOUND_LOCK, warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        previous, Image.MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS, None
        try:
            return decode_image_array(path)
        finally:
            Image.MAX_IMAGE_PIXELS = previous


def image_pixels(path):
    """(width, height) of an image file read from its header, nothing decoded (Pillow's format plug-in, without
    ``Image.open``'s decompression-bomb check); None when the file does not start like a JPEG/PNG/GIF/BMP."""
    from PIL import BmpImagePlugin, GifImagePlugin, JpegImagePlugin, PngImagePlugin

    plugins = {"JPEG": JpegImagePlugin.JpegImageFile, "PNG": PngImagePlugin.PngImageFile,
               "GIF": GifImagePlugin.GifImageFile, "BMP": BmpImagePlugin.BmpImageFile}
    with open(path, "rb") as f:
        kind = image_format(f.read(8))
        if kind not in plugins:
            return None
        f.seek(0)
        try:
            with plugins[kind](f) as image:
                return image.size
        except (OSError, ValueError, SyntaxError):  # a bad header: the decode names it
            return None


def check_image_pixels(path, max_pixels=MAX_IMAGE_PIXELS):
    """A one-line ``DataError`` naming ``path`` when its header declares more than ``max_pixels`` pixels
    (default ``MAX_IMAGE_PIXELS``, Pillow's own bound; ``--max-image-pixels``); None: no bound."""
    if max_pixels is None:
        return
    try:
        size = image_pixels(path)
    except OSError:
        return  # unreadable: the decode names it
    if size is not None and size[0] * size[1] > max_pixels:
        raise DataError(f"Image file {path} is {size[0]}x{size[1]} = {size[0] * size[1]:,} pixels, over the bound "
                        f"of {max_pixels:,} pixels per image (--max-image-pixels; default {MAX_IMAGE_PIXELS:,}, "
                        "Pillow's): resize it, remove it, or raise the bound.")


def _bad_files_error(bad, total):
    shown = ", ".join(bad[:5]) + (f" (and {len(bad) - 5} more)" if len(bad) > 5 else "")
    return DataError(
        f"{len(bad)} of {total} image files cannot be decoded (corrupt, empty or not an image): {shown}. "
        "Remove or replace them, or pass --skip-bad-images (config skip_bad_images=True) to train without them."
    )


def _image_array(count, shape, example):
    """An uninitialised uint8 array of ``count`` images of ``shape``, or a DataError if memory cannot hold it."""
    try:
        return np.empty((count,) + tuple(shape), np.uint8)
    except MemoryError:
        need = count * int(np.prod(shape)) / 2**30
        raise DataError(
            f"{count} images of {shape[0]}x{shape[1]} (as {example}) need {need:.1f} GiB decoded, more than "
            "this machine can allocate: resize the images, or use an ImageNet-style recipe "
            "(augmentation='imagenet'), which streams and resizes."
        ) from None


def _decode_files(files, skip_bad=False, view=None, max_pixels=MAX_IMAGE_PIXELS):
    """(uint8 array [N, H, W, 3] of the readable images, their indices into ``files``).

    All images must have the same size, or ``view`` ((height, width), crop_fraction) gives each its
    ``fitted`` view. Unreadable files raise a DataError naming them, or with
    ``skip_bad`` are left out (and counted on stdout).
    """
    out, kept, first = None, [], None
    for i, image in _decoded_images(files, max_pixels):
        path = files[i]
        if view is not None:
            image = fitted(image, *view)
        if first is None:
            first = (i, image)  # the array is made at the second image, once its size is seen to be shared
            continue
        if image.shape != first[1].shape:
            raise DataError(
                f"Images of mixed sizes: {path} is {image.shape[:2]} but {files[first[0]]} is "
                f"{first[1].shape[:2]}. The array pipeline needs one size; resize the images or use an "
                "ImageNet-style recipe (augmentation='imagenet'), which streams and resizes."
            )
        if out is None:
            out = _image_array(len(files), first[1].shape, files[first[0]])
            out[0], kept = first[1], [first[0]]
        out[len(kept)] = image
        kept.append(i)
    if out is None and first is not None:  # a single readable image
        out, kept = first[1][None], [first[0]]
    if len(kept) < len(files):
        bad = [files[i] for i in sorted(set(range(len(files))) - set(kept))]
        if not skip_bad or not kept:
            raise _bad_files_error(bad, len(files))
        print(f"[data] skipped {len(bad)} of {len(files)} unreadable image files (--skip-bad-images), "
              f"e.g. {bad[0]}", flush=True)
    return out[: len(kept)], np.asarray(kept, np.int64)


def _cache_key(files, view=None):
    digest = hashlib.sha1((DECODER + ("" if view is None else f"|fitted torchvision {view}")).encode())
    for f in files:
        st = os.stat(f)
        digest.update(f"{f}|{st.st_size}|{int(st.st_mtime)}\n".encode())
    return digest.hexdigest()[:16]


def default_cache_dir():
    return os.environ.get(
        "KERAS_PREACT_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "keras_preact")
    )


def _decode_cached(files, labels, cache_dir, skip_bad=False, view=None, max_pixels=MAX_IMAGE_PIXELS):
    """(images, labels) of ``files``; only complete decodes (every file readable) are cached."""
    path = pathlib.Path(cache_dir or default_cache_dir()) / f"images-{_cache_key(files, view)}.npy"
    if path.exists():
        return np.load(path), labels
    images, kept = _decode_files(files, skip_bad, view, max_pixels)
    if len(kept) < len(files):
        return images, labels[kept]
    try:
        with atomic_path(path) as tmp:
            np.save(tmp, images)
    except OSError as e:  # a read-only cache is not fatal
        logger.warning("could not cache decoded images at %s: %s", path, e)
    return images, labels


def folder(data_dir, cache_dir=None, skip_bad_images=False, image_size=None, crop_fraction=1.0, validation_split=0.0,
           seed=0, max_image_pixels=MAX_IMAGE_PIXELS):
    """An image-folder data set decoded to arrays (cached as .npy, keyed by file names/sizes/mtimes).

    ``image_size`` (height, width): every image is decoded to the model's view of it (``fitted``: the
    shorter side to the size over ``crop_fraction``, the centre crop), so images of any size train;
    None: as decoded (one size). ``validation_split``: the fraction of each class held out as the test
    split when the folder has no test/ or val/ part (``split_files``). ``max_image_pixels``: the bound on each
    image's pixels, read from its header before anything is decoded (``check_image_pixels``; None: none)."""
    (train_files, train_labels, classes), (test_files, test_labels) = matched_folder_lists(
        data_dir, validation_split, seed)
    view = None if image_size is None else (tuple(image_size), float(crop_fraction))
    return ArrayData(
        *_decode_cached(train_files, train_labels, cache_dir, skip_bad_images, view, max_image_pixels),
        *_decode_cached(test_files, test_labels, cache_dir, skip_bad_images, view, max_image_pixels), classes,
    ).validate()


def folder_lists(data_dir, validation_split=0.0, seed=0):
    """The ``_list_folder`` lists of the train and test splits: ``train/`` and ``test/`` (or ``val/``), or,
    with ``validation_split``, a folder without a test part (``train/`` or the class folders themselves)
    split per class (``split_files``)."""
    root = pathlib.Path(data_dir or "")
    has_test = root.is_dir() and any((root / n).is_dir() for n in TEST_SPLIT_NAMES)
    if not validation_split or has_test:
        train_dir, test_dir = folder_splits(data_dir)
        return _list_folder(train_dir), _list_folder(test_dir)
    if not root.is_dir():
        folder_splits(data_dir)  # its message
    train_dir = root / "train" if (root / "train").is_dir() else root
    return split_files(*_list_folder(train_dir), validation_split, seed)


def split_files(files, labels, classes, fraction, seed=0):
    """(train lists, test lists): ``round(fraction * n)`` (at least 1) of each class's ``n`` files, drawn with
    ``seed``, held out; both keep every class (a class of one image is refused)."""
    if not 0 < fraction < 1:
        raise DataError(f"Invalid validation_split={fraction!r}: a fraction in (0, 1) is required.")
    rng = np.random.default_rng(seed)
    held = np.zeros(len(files), bool)
    for label, name in enumerate(classes):
        index = np.flatnonzero(labels == label)
        if len(index) < 2:
            raise DataError(f"Class {name!r} has {len(index)} image: a validation split needs at least 2 per class.")
        count = min(max(1, round(fraction * len(index))), len(index) - 1)
        held[rng.choice(index, count, replace=False)] = True
    pick = lambda mask: ([f for f, m in zip(files, mask) if m], labels[mask], classes)  # noqa: E731
    return pick(~held), pick(held)


def fitted(image, size, crop_fraction=1.0):
    """``image`` (uint8 ``[H, W, 3]``) as a model sees it at ``size`` (height, width): the sizes and offsets of the
    evaluation view (``keras_preact.preprocessing.view_geometry``: the shorter side resized to
    ``ceil(max(size) / crop_fraction)``, the longer truncated, the centre crop's offsets rounded, as torchvision),
    resized bilinear by Pillow; uint8."""
    from PIL import Image

    config = InputConfig(input_size=(*size, 3), crop_fraction=crop_fraction)
    _, (new_height, new_width), (top, left, height, width) = view_geometry(*image.shape[:2], config)
    if (new_height, new_width) != image.shape[:2]:
        image = np.asarray(Image.fromarray(image).resize((new_width, new_height), Image.BILINEAR))
    return np.ascontiguousarray(image[top:top + height, left:left + width])


def decoded_bytes(count, image_size):
    """Bytes of ``count`` images decoded at ``image_size`` as uint8 RGB."""
    return int(count) * int(image_size[0]) * int(image_size[1]) * 3


def _header_pixels(path):
    """The pixel count a file's header declares (``image_pixels``), 0 when unknown: for tf.numpy_function."""
    try:
        size = image_pixels(path.decode() if isinstance(path, bytes) else str(path))
    except OSError:
        size = None
    return np.int64(0 if size is None else size[0] * size[1])


def _tf_is_image(encoded):
    """Whether encoded bytes start like a JPEG/PNG/GIF/BMP file (a cheap check, no decoding)."""
    return is_encoded_image(encoded)


def folder_stream(data_dir, skip_bad_images=False, validation_split=0.0, seed=0, max_image_pixels=MAX_IMAGE_PIXELS):
    """An image-folder data set read file by file (ImageNet-style trees of mixed image sizes).

    A file that does not start like an image (text, empty, garbage) fails naming it, or with
    ``skip_bad_images`` is left out. A file whose header declares more than ``max_image_pixels`` (None: no
    bound) fails naming it when it is read, before it is decoded.
    """
    import tensorflow as tf

    lists = dict(zip(("train", "test"), folder_lists(data_dir, validation_split, seed)))

    def read(f, y):
        if max_image_pixels is not None:
            pixels = tf.numpy_function(_header_pixels, [f], tf.int64, stateful=False)
            bound = tf.debugging.Assert(pixels <= max_image_pixels, [
                f"Image over --max-image-pixels {max_image_pixels:,} (resize or remove it, or raise the bound):", f,
                "pixels:", pixels])
            with tf.control_dependencies([bound]):
                f = tf.identity(f)
        encoded = tf.io.read_file(f)
        if skip_bad_images:
            return encoded, y, _tf_is_image(encoded)
        check = tf.debugging.Assert(
            _tf_is_image(encoded),
            ["Not an image file (corrupt, empty or not JPEG/PNG/GIF/BMP; --skip-bad-images skips it):", f],
        )
        with tf.control_dependencies([check]):
            return tf.identity(encoded), y, True

    def readable(encoded, label, ok):
        return ok

    def drop_flag(encoded, label, ok):
        return encoded, label

    def make(split):
        files, labels, _ = lists[split]
        ds = tf.data.Dataset.from_tensor_slices((files, labels)).map(read, num_parallel_calls=tf.data.AUTOTUNE)
        return ds.filter(readable).map(drop_flag)

    return StreamData(make, len(lists["train"][0]), len(lists["test"][0]), lists["train"][2])


# ----------------------------------------------------------------------------------------- TFDS
def tfds_builder(name, data_dir=None, manual_dir=None):
    """A prepared TFDS builder, never touching the network; DataError with instructions otherwise."""
    import tensorflow_datasets as tfds

    try:
        builder = tfds.builder(name, data_dir=data_dir, try_gcs=False)
    except Exception as e:  # DatasetNotFoundError and friends
        raise DataError(
            f"Unknown dataset={name!r}: not 'synthetic', 'folder' or a TFDS data set name "
            f"(e.g. 'cifar10', 'cifar100', 'imagenet2012'). {type(e).__name__}: {str(e)[:200]}"
        ) from None
    if builder.is_prepared():
        return builder
    where = builder.data_dir
    if manual_dir:
        if not pathlib.Path(manual_dir).is_dir():
            raise DataError(f"manual_dir={manual_dir!r} is not a directory.")
        config = tfds.download.DownloadConfig(manual_dir=manual_dir, try_download_gcs=False)
        builder.download_and_prepare(download_config=config)
        return builder
    raise DataError(
        f"TFDS data set {name!r} is not prepared under {where} and nothing is downloaded here. "
        f"Either copy a prepared TFDS directory (built elsewhere with `tfds build {name} "
        f"--data_dir DIR`) and pass --data-dir DIR, or, for manually downloaded data (e.g. the "
        f"imagenet2012 tar files), pass --manual-dir DIR_WITH_ARCHIVES. For CIFAR-10 as JPEGs use "
        f"--dataset folder --data-dir <extracted cifar10-jpeg>."
    )


def _test_split(builder):
    for name in TEST_SPLIT_NAMES:
        if name in builder.info.splits:
            return name
    raise DataError(f"TFDS {builder.name} has no test/validation split: {list(builder.info.splits)}.")


def tfds_arrays(builder):
    import tensorflow_datasets as tfds

    def split(name):
        images, labels = tfds.as_numpy(builder.as_dataset(split=name, batch_size=-1, as_supervised=True))
        return images.astype(np.uint8), labels.astype(np.int32)

    train_images, train_labels = split("train")
    test_images, test_labels = split(_test_split(builder))
    names = list(builder.info.features["label"].names)
    return ArrayData(train_images, train_labels, test_images, test_labels, names).validate()


def tfds_stream(builder):
    import tensorflow_datasets as tfds

    test = _test_split(builder)
    splits = {"train": "train", "test": test}

    def make(split):
        return builder.as_dataset(
            split=splits[split], as_supervised=True, shuffle_files=split == "train",
            decoders={"image": tfds.decode.SkipDecoding()},
        )

    info = builder.info
    return StreamData(make, info.splits["train"].num_examples, info.splits[test].num_examples,
                      list(info.features["label"].names))


# ----------------------------------------------------------------------------------------- load
def load(config):
    """The data a config asks for: ArrayData (CIFAR recipe) or StreamData (ImageNet recipe)."""
    streaming = config.augmentation.startswith("imagenet")
    if config.dataset == "synthetic":
        data = synthetic(config.synthetic_train_size, config.synthetic_test_size,
                         config.synthetic_num_classes, tuple(config.image_size), config.seed)
    elif config.dataset == "folder":
        if streaming:
            require_tensorflow(f"augmentation={config.augmentation!r} (a streamed ImageNet-style folder)",
                               "; CIFAR-style folders of one image size train without it")
        decoding = choose_folder_decoding(config, streaming) if config.resize_images else None
        if streaming:
            data = folder_stream(config.data_dir, config.skip_bad_images, config.validation_split, config.seed,
                                 config.max_image_pixels or None)
        elif decoding == STREAMED:
            data = folder_files(config.data_dir, config.image_size, config.skip_bad_images,
                                validation_split=config.validation_split, seed=config.seed,
                                max_image_pixels=config.max_image_pixels or None)
        else:
            data = folder(config.data_dir, config.cache_dir, config.skip_bad_images,
                          config.image_size if config.resize_images else None,
                          validation_split=config.validation_split, seed=config.seed,
                          max_image_pixels=config.max_image_pixels or None)
    else:
        require_tensorflow(f"dataset={config.dataset!r} (a TFDS data set)",
                           "; without TensorFlow use --dataset folder or synthetic")
        builder = tfds_builder(config.dataset, config.data_dir, config.manual_dir)
        data = tfds_stream(builder) if streaming else tfds_arrays(builder)
    if isinstance(data, ArrayData):
        if config.subset:
            data.train_images = data.train_images[: config.subset]
            data.train_labels = data.train_labels[: config.subset]
        data.validate()
    elif isinstance(data, FolderFiles) and config.subset:  # the in-memory path's first images
        data.train_files, data.train_labels = data.train_files[: config.subset], data.train_labels[: config.subset]
    elif config.subset:
        data.train_size = min(data.train_size, config.subset)
    return data


# The decoded set is held in memory when it takes at most this fraction of the memory free at the start
# (``decoded_budget_mib`` sets another budget).
ARRAY_MEMORY_FRACTION = 0.25
IN_MEMORY, STREAMED = "in memory", "streamed"


def decoded_budget(config):
    """(bytes the decoded set may take in memory, or None when unknown; the budget in words).

    ``config.decoded_budget_mib`` when set; else ``ARRAY_MEMORY_FRACTION`` of the memory free now."""
    if config.decoded_budget_mib is not None:
        budget = int(config.decoded_budget_mib * 2**20)
        return budget, f"the budget {_mib(budget)} (--decoded-budget-mib)"
    from ..machine import memory_guard

    reading = memory_guard.read_memory()
    if reading is None:
        return None, "no budget (free memory unknown; --decoded-budget-mib sets one)"
    free = max(reading.limit - reading.used, 0)
    budget = int(ARRAY_MEMORY_FRACTION * free)
    return budget, (f"the budget {_mib(budget)} ({ARRAY_MEMORY_FRACTION:.0%} of the {free / 2**20:.0f} MiB free; "
                    "--decoded-budget-mib sets it)")


def _mib(size):
    return f"{size / 2**20:.1f} MiB ({size:,} bytes)"


def decode_threads():
    """Threads a streamed folder decodes its batches on (``pipelines.FolderBatches``): one per core, at most 8."""
    return max(1, min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()))


def choose_folder_decoding(config, streaming):
    """``IN_MEMORY`` or ``STREAMED``: whether a ``resize_images`` folder is decoded once into memory or batch by
    batch from its files; printed, with the reason, before any work.

    In memory when the decoded set (uint8, train and test at ``image_size``) is at most the budget
    (``decoded_budget``), or no budget is known; else streamed: with an ImageNet-style augmentation through
    tf.data (``folder_stream``, TensorFlow), on the ``device`` and ``numpy`` pipelines (the default without
    TensorFlow or on JAX / PyTorch) by ``keras.utils.PyDataset`` (``pipelines.FolderBatches``: each batch decoded
    from the files with Pillow, the same pixels and batches as in memory). On ``tf_data`` a set over the budget
    is refused with the remedies."""
    train, test = folder_lists(config.data_dir, config.validation_split, config.seed)
    count = len(train[0]) + len(test[0])
    needed = decoded_bytes(count, config.image_size)
    budget, reason = decoded_budget(config)
    size = (f"{count} images at {config.image_size[0]}x{config.image_size[1]}: {needed / 2**20:.1f} MiB decoded "
            f"({needed:,} bytes)")
    if streaming:
        print(f"[data] folder streamed (augmentation={config.augmentation!r} decodes batch by batch with tf.data); "
              f"{size}", flush=True)
        return STREAMED
    if budget is None or needed <= budget:
        print(f"[data] folder decoded into memory: {size}, within {reason}", flush=True)
        return IN_MEMORY
    pipeline = resolve_pipeline(config)
    if pipeline in ("device", "numpy"):
        print(f"[data] folder streamed: {size}, over {reason}; each batch decoded from the files with Pillow "
              f"on {decode_threads()} threads (keras.utils.PyDataset, pipeline {pipeline!r})",
              flush=True)
        return STREAMED
    raise DataError(f"The folder's {size} would not fit in memory (over {reason}): pass --pipeline device to "
                    "stream it batch by batch (augmentation in the step), --augmentation imagenet to stream it with "
                    "tf.data, a larger --decoded-budget-mib, or --image-size smaller.")


def matched_folder_lists(data_dir, validation_split, seed):
    """``folder_lists`` whose train and test splits have the same class folders (else ``DataError``):
    ((train files, labels, classes), (test files, labels))."""
    (train_files, train_labels, classes), (test_files, test_labels, test_classes) = folder_lists(
        data_dir, validation_split, seed)
    if test_classes != classes:
        raise DataError(
            f"Class folders differ between the train ({len(classes)}) and test ({len(test_classes)}) splits of "
            f"{data_dir}: {sorted(set(classes) ^ set(test_classes))[:5]}."
        )
    return (train_files, train_labels, classes), (test_files, test_labels)


def folder_files(data_dir, image_size, skip_bad_images=False, crop_fraction=1.0, validation_split=0.0, seed=0,
                 max_image_pixels=MAX_IMAGE_PIXELS):
    """An image folder streamed without TensorFlow (``FolderFiles``): its lists, nothing decoded.

    A file that does not start like an image (``image_format``) fails naming it, or with ``skip_bad_images`` is
    left out (counted); a file that starts like one but does not decode fails when its batch is read. Every header
    is checked against ``max_image_pixels`` at the start (``check_image_pixels``)."""
    (train_files, train_labels, classes), (test_files, test_labels) = matched_folder_lists(
        data_dir, validation_split, seed)
    splits = []
    for files, labels in ((train_files, train_labels), (test_files, test_labels)):
        keep = np.asarray([_starts_like_an_image(f) for f in files], bool)
        if not keep.all():
            bad = [f for f, k in zip(files, keep) if not k]
            if not skip_bad_images or not keep.any():
                raise _bad_files_error(bad, len(files))
            print(f"[data] skipped {len(bad)} of {len(files)} files that are not images (--skip-bad-images), "
                  f"e.g. {bad[0]}", flush=True)
        splits += [[f for f, k in zip(files, keep) if k], labels[keep]]
        for f in splits[-2]:
            check_image_pixels(f, max_image_pixels)
    return FolderFiles(*splits, classes, tuple(image_size), float(crop_fraction), max_image_pixels)


def _starts_like_an_image(path):
    with open(path, "rb") as f:
        return image_format(f.read(8)) is not None


def has_tensorflow():
    try:
        import tensorflow  # noqa: F401
    except ImportError:
        return False
    return True




def require_tensorflow(what, alternative=""):
    """A one-line DataError when TensorFlow is not installed and ``what`` needs it."""
    if not has_tensorflow():
        raise DataError(f"{what} needs TensorFlow, which is not installed (pip install tensorflow"
                        f"{' tensorflow-datasets' if 'TFDS' in what else ''}){alternative}.")


def folder_images(config, sample=32):
    """(training images, (height, width)) of ``config``'s folder, for ``--recipe auto`` (``recipe.hyperrule``): the
    count of its training split and the median size of the first ``sample`` images, read from their headers (nothing
    decoded)."""
    from PIL import Image

    files = folder_lists(config.data_dir, config.validation_split, config.seed)[0][0]
    sizes = []
    for file in files[:sample]:
        try:
            with Image.open(file) as image:
                sizes.append(image.size[::-1])
        except (OSError, ValueError, SyntaxError):
            continue  # the data checks name it when the run reads it
    height, width = (int(v) for v in (sorted(s[0] for s in sizes)[len(sizes) // 2],
                                      sorted(s[1] for s in sizes)[len(sizes) // 2])) if sizes else config.image_size
    return min(len(files), config.subset or len(files)), (height, width)
