"""Data for training, all offline-safe: a built-in synthetic set, image folders, TFDS by name.

Sources (``load(config)``):

- ``synthetic``: class-dependent procedural images (oriented, coloured gratings plus noise),
  deterministic by seed; learnable by a small ResNet in a few hundred steps. The embedded default.
- ``folder``: ``data_dir/train/<class>/*.jpg`` and ``data_dir/test/<class>/...`` (or ``val/``,
  ``validation/``), e.g. the CIFAR-10 JPEG tree; class names are the sorted folder names. Small sets
  (the CIFAR recipe) are decoded once into uint8 arrays cached as ``.npy`` under ``cache_dir``; the
  ImageNet recipe streams the files through tf.data instead.
- any TFDS name (``cifar10``, ``cifar100``, ``imagenet2012``, ...), read from ``data_dir`` with
  ``try_gcs=False``; when it is not prepared this fails at once with a message saying what to put
  where (nothing is ever downloaded; ``manual_dir`` prepares manually downloaded archives offline).

Pipelines (``pipelines(data, config, ...)``, ``config.pipeline``): ``tf_data`` (shuffle, parallel
vectorised augmentation on whole batches, prefetch; the TensorFlow default), ``device`` (numpy sends
uint8 batches, augmentation and normalization run in the compiled step: ``training.augment``; the
default without TensorFlow or on the JAX / PyTorch backends), or ``numpy`` (augmentation and
normalization on the host, no TensorFlow). Every stream is a deterministic function of (seed, global
step): a resumed run continues the exact stream.
Augmentation: CIFAR pad 4 + random crop + horizontal flip (paper "Training recipe"); ImageNet scale
augmentation (shorter side in [256, 480]) + 224 crop + flip; tests use the single original view
(CIFAR) or a centre crop (ImageNet).
"""

import dataclasses
import functools
import hashlib
import math
import os
import pathlib
import tempfile

import keras
import numpy as np

from training.configs import NORMALIZATIONS, PIXEL_MEAN

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif")
TEST_SPLIT_NAMES = ("test", "val", "validation")
# Pad 4 and crop back (paper). fb.resnet.torch (datasets/cifar10.lua L43-48) normalises first and pads
# with zeros, i.e. with the mean: every pipeline here pads after normalization too.
CIFAR_PAD = 4
IMAGENET_SCALE = (256, 480)


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
    """(files, labels, class_names) of a one-folder-per-class tree, validated."""
    classes = sorted(p.name for p in split_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        raise DataError(
            f"No class folders in {split_dir}: expected one sub-folder of images per class."
        )
    files, labels = [], []
    for index, name in enumerate(classes):
        found = sorted(
            str(p) for p in (split_dir / name).iterdir() if p.suffix.lower() in IMAGE_EXTENSIONS
        )
        if not found:
            raise DataError(
                f"Class folder {split_dir / name} has no images ({', '.join(IMAGE_EXTENSIONS)})."
            )
        files += found
        labels += [index] * len(found)
    return files, np.asarray(labels, np.int32), classes


def folder_splits(data_dir):
    """(train_dir, test_dir) of an image-folder data set, or a DataError saying what is expected."""
    root = pathlib.Path(data_dir or "")
    if not data_dir or not root.is_dir():
        raise DataError(
            f"data_dir={str(data_dir)!r} is not a directory. For dataset='folder' give a directory "
            "with train/ and test/ (or val/) sub-folders, one folder of images per class, e.g. "
            "tar xzf ../shared/data/cifar10-jpeg.tar.gz -C /tmp && --data-dir /tmp/cifar10-jpeg"
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


def _decoded_images(files):
    """(index, uint8 image) for every file that decodes, in order; unreadable files are left out."""
    try:
        import tensorflow as tf
    except ImportError:  # machines without TensorFlow: Pillow (a matplotlib dependency)
        tf = None
    if tf is not None:
        ds = tf.data.Dataset.from_tensor_slices((np.arange(len(files)), files)).map(
            lambda i, f: (i, tf.io.decode_image(tf.io.read_file(f), channels=3, expand_animations=False)),
            num_parallel_calls=tf.data.AUTOTUNE, deterministic=True,
        ).ignore_errors()
        for i, x in ds:
            yield int(i), x.numpy()
        return
    from PIL import Image

    for i, f in enumerate(files):
        try:
            with Image.open(f) as image:
                yield i, np.asarray(image.convert("RGB"))
        except (OSError, ValueError, SyntaxError):  # PIL's "cannot identify", truncated, bad header
            continue


def _bad_files_error(bad, total):
    shown = ", ".join(bad[:5]) + (f" (and {len(bad) - 5} more)" if len(bad) > 5 else "")
    return DataError(
        f"{len(bad)} of {total} image files cannot be decoded (corrupt, empty or not an image): {shown}. "
        "Remove or replace them, or pass --skip-bad-images (config skip_bad_images=True) to train without them."
    )


def _decode_files(files, skip_bad=False):
    """(uint8 array [N, H, W, 3] of the readable images, their indices into ``files``).

    All images must have the same size. Unreadable files raise a DataError naming them, or with
    ``skip_bad`` are left out (and counted on stdout).
    """
    out, kept = None, []
    for i, image in _decoded_images(files):
        path = files[i]
        if out is None:
            out = np.empty((len(files),) + image.shape, np.uint8)
        elif image.shape != out.shape[1:]:
            raise DataError(
                f"Images of mixed sizes: {path} is {image.shape[:2]} but {files[0]} is "
                f"{out.shape[1:3]}. The array pipeline needs one size; resize the images or use an "
                "ImageNet-style recipe (augmentation='imagenet'), which streams and resizes."
            )
        out[len(kept)] = image
        kept.append(i)
    if len(kept) < len(files):
        bad = [files[i] for i in sorted(set(range(len(files))) - set(kept))]
        if not skip_bad or not kept:
            raise _bad_files_error(bad, len(files))
        print(f"[data] skipped {len(bad)} of {len(files)} unreadable image files (--skip-bad-images), "
              f"e.g. {bad[0]}", flush=True)
    return out[: len(kept)], np.asarray(kept, np.int64)


def _cache_key(files):
    digest = hashlib.sha1()
    for f in files:
        st = os.stat(f)
        digest.update(f"{f}|{st.st_size}|{int(st.st_mtime)}\n".encode())
    return digest.hexdigest()[:16]


def default_cache_dir():
    return os.environ.get(
        "KERAS_PREACT_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "keras_preact")
    )


def _atomic_save(path, array):
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npy.tmp")
    with os.fdopen(fd, "wb") as f:
        np.save(f, array)
    os.replace(tmp, path)


def _decode_cached(files, labels, cache_dir, skip_bad=False):
    """(images, labels) of ``files``; only complete decodes (every file readable) are cached."""
    path = pathlib.Path(cache_dir or default_cache_dir()) / f"images-{_cache_key(files)}.npy"
    if path.exists():
        return np.load(path), labels
    images, kept = _decode_files(files, skip_bad)
    if len(kept) < len(files):
        return images, labels[kept]
    try:
        _atomic_save(path, images)
    except OSError as e:  # a read-only cache is not fatal
        print(f"[data] could not cache decoded images at {path}: {e}")
    return images, labels


def folder(data_dir, cache_dir=None, skip_bad_images=False):
    """An image-folder data set decoded to arrays (cached as .npy, keyed by file names/sizes/mtimes)."""
    train_dir, test_dir = folder_splits(data_dir)
    train_files, train_labels, classes = _list_folder(train_dir)
    test_files, test_labels, test_classes = _list_folder(test_dir)
    if test_classes != classes:
        raise DataError(
            f"Class folders differ between {train_dir} ({len(classes)}) and {test_dir} "
            f"({len(test_classes)}): {sorted(set(classes) ^ set(test_classes))[:5]}."
        )
    return ArrayData(
        *_decode_cached(train_files, train_labels, cache_dir, skip_bad_images),
        *_decode_cached(test_files, test_labels, cache_dir, skip_bad_images), classes,
    ).validate()


_IMAGE_MAGIC = (b"\xff\xd8\xff", b"\x89PNG", b"GIF8", b"BM")  # JPEG, PNG, GIF, BMP


def _tf_is_image(encoded):
    """Whether encoded bytes start like a JPEG/PNG/GIF/BMP file (a cheap check, no decoding)."""
    import tensorflow as tf

    return tf.reduce_any(tf.stack([tf.strings.substr(encoded, 0, len(m)) == m for m in _IMAGE_MAGIC]))


def folder_stream(data_dir, skip_bad_images=False):
    """An image-folder data set read file by file (ImageNet-style trees of mixed image sizes).

    A file that does not start like an image (text, empty, garbage) fails naming it, or with
    ``skip_bad_images`` is left out.
    """
    import tensorflow as tf

    train_dir, test_dir = folder_splits(data_dir)
    lists = {"train": _list_folder(train_dir), "test": _list_folder(test_dir)}

    def read(f, y):
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
        data = folder_stream(config.data_dir, config.skip_bad_images) if streaming else folder(
            config.data_dir, config.cache_dir, config.skip_bad_images)
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
    elif config.subset:
        data.train_size = min(data.train_size, config.subset)
    return data


def normalization(config, data=None):
    """(mean, std) in 0-255 units: the model consumes ``(pixels - mean) / std``.

    Per channel (``[3]`` each) for the named statistics, or for ``"pixel_mean"`` the paper's per-pixel
    mean subtraction: the mean training image (``[H, W, 3]``, from ``data``) and std 1.
    """
    if config.normalization == PIXEL_MEAN:
        if not isinstance(data, ArrayData):
            raise DataError("normalization='pixel_mean' needs in-memory array data (the CIFAR recipe) to "
                            "compute the mean training image.")
        return data.mean_image, np.ones(3, np.float32)
    mean, std = NORMALIZATIONS[config.normalization]
    return np.asarray(mean, np.float32), np.asarray(std, np.float32)


# ------------------------------------------------------------------------------ tf.data pipelines
def _tf_cifar_augment(images, seed):
    """Pad 4 (zeros), random crop to the original size, random horizontal flip; a whole batch at once."""
    import tensorflow as tf

    b, h, w = tf.shape(images)[0], images.shape[1], images.shape[2]
    padded = tf.pad(images, [[0, 0], [CIFAR_PAD, CIFAR_PAD], [CIFAR_PAD, CIFAR_PAD], [0, 0]])
    offsets = tf.random.stateless_uniform([2, b], seed, 0, 2 * CIFAR_PAD + 1, dtype=tf.int32)
    rows = offsets[0][:, None] + tf.range(h)[None]
    cols = offsets[1][:, None] + tf.range(w)[None]
    out = tf.gather(tf.gather(padded, rows, axis=1, batch_dims=1), cols, axis=2, batch_dims=1)
    flip = tf.random.stateless_uniform([b], seed + [0, 1]) < 0.5
    return tf.where(flip[:, None, None, None], tf.reverse(out, axis=[2]), out)


def _tf_normalize(images, mean, std):
    import tensorflow as tf

    return (tf.cast(images, tf.float32) - mean) / std


def tf_array_train(data, batch_size, *, augmentation, mean, std, seed, start_step=0):
    """Infinite tf.data stream of augmented, normalised batches; batch k depends only on (seed, k)."""
    import tensorflow as tf

    images = tf.constant(data.train_images)
    labels = tf.constant(data.train_labels)
    n = data.train_size

    def make_batch(step, index):
        x = _tf_normalize(tf.gather(images, index), mean, std)
        if augmentation == "cifar":  # after normalization: the padding is the mean (CIFAR_PAD)
            x = _tf_cifar_augment(x, tf.stack([tf.cast(seed, tf.int64), step]))
        return x, tf.gather(labels, index)

    ds = (
        tf.data.Dataset.range(n)
        .shuffle(n, seed=seed, reshuffle_each_iteration=True)
        .repeat()
        .batch(batch_size, drop_remainder=True)
        .enumerate()
        .skip(start_step)
        .map(make_batch, num_parallel_calls=tf.data.AUTOTUNE)
        .prefetch(tf.data.AUTOTUNE)
    )
    return _deterministic(ds)


def tf_array_eval(images, labels, batch_size, *, mean, std):
    import tensorflow as tf

    # A static batch size when it divides the set (multi-process JAX needs one).
    ds = tf.data.Dataset.from_tensor_slices((images, labels)).batch(
        batch_size, drop_remainder=len(labels) % batch_size == 0
    )
    return _deterministic(
        ds.map(lambda x, y: (_tf_normalize(x, mean, std), y), num_parallel_calls=tf.data.AUTOTUNE)
        .cache()
        .prefetch(tf.data.AUTOTUNE)
    )


def _deterministic(ds):
    import tensorflow as tf

    options = tf.data.Options()
    options.deterministic = True
    return ds.with_options(options)


def _decode(encoded):
    import tensorflow as tf

    return tf.io.decode_image(encoded, channels=3, expand_animations=False)


def _resize_shorter(image, size):
    import tensorflow as tf

    shape = tf.cast(tf.shape(image)[:2], tf.float32)
    scale = tf.cast(size, tf.float32) / tf.reduce_min(shape)
    new = tf.cast(tf.round(shape * scale), tf.int32)
    return tf.image.resize(image, new, antialias=True)


def _imagenet_train_view(encoded, seed, crop, aspect):
    """Scale augmentation (shorter side uniform in [256, 480]), random crop, flip (paper Sec. 5 / [1])."""
    import tensorflow as tf

    image = _decode(encoded)
    size = tf.random.stateless_uniform([], seed, IMAGENET_SCALE[0], IMAGENET_SCALE[1] + 1, tf.int32)
    if aspect:  # aspect-ratio augmentation (Table 5 last row): stretch one side by up to 4/3.
        ratio = tf.exp(tf.random.stateless_uniform([], seed + [0, 1], -math.log(4 / 3), math.log(4 / 3)))
        shape = tf.cast(tf.shape(image)[:2], tf.float32)
        image = tf.image.resize(image, tf.cast(shape * tf.stack([ratio, 1.0 / ratio]), tf.int32))
    image = _resize_shorter(image, size)
    image = tf.image.stateless_random_crop(image, [crop[0], crop[1], 3], seed + [0, 2])
    return tf.image.stateless_random_flip_left_right(image, seed + [0, 3])


def _imagenet_eval_view(encoded, crop, train_crop):
    """Shorter side to 256/224 of the crop (the standard 224 test) or to the crop (the 320 test)."""
    import tensorflow as tf

    image = _decode(encoded)
    side = max(crop) if max(crop) > max(train_crop) else math.ceil(max(crop) * 256 / 224)
    image = _resize_shorter(image, side)
    return tf.image.resize_with_crop_or_pad(image, crop[0], crop[1])


def tf_stream_train(data, batch_size, *, image_size, augmentation, mean, std, seed, start_step=0):
    import tensorflow as tf

    aspect = augmentation == "imagenet_aspect"
    ds = data.make("train").take(data.train_size).shuffle(16 * batch_size, seed=seed).repeat()
    ds = ds.enumerate().skip(start_step * batch_size)
    ds = ds.map(
        lambda i, item: (
            _imagenet_train_view(item[0], tf.stack([tf.cast(seed, tf.int64), i]), image_size, aspect),
            item[1],
        ),
        num_parallel_calls=tf.data.AUTOTUNE,
    )
    ds = ds.batch(batch_size, drop_remainder=True)
    return ds.map(lambda x, y: (_tf_normalize(x, mean, std), y)).prefetch(tf.data.AUTOTUNE)


def tf_stream_eval(data, batch_size, *, image_size, train_image_size, mean, std):
    import tensorflow as tf

    ds = data.make("test").map(
        lambda e, y: (_imagenet_eval_view(e, image_size, train_image_size), y),
        num_parallel_calls=tf.data.AUTOTUNE,
    )
    return ds.batch(batch_size).map(lambda x, y: (_tf_normalize(x, mean, std), y)).prefetch(
        tf.data.AUTOTUNE
    )


# -------------------------------------------------------------------------- numpy (no TensorFlow)
def numpy_cifar_augment(images, rng):
    """The CIFAR augmentation of ``_tf_cifar_augment`` in numpy, for TensorFlow-free backends."""
    b, h, w = images.shape[:3]
    padded = np.pad(images, [(0, 0), (CIFAR_PAD, CIFAR_PAD), (CIFAR_PAD, CIFAR_PAD), (0, 0)])
    oy, ox = rng.integers(0, 2 * CIFAR_PAD + 1, (2, b))
    rows = (oy[:, None] + np.arange(h))[:, :, None]
    cols = (ox[:, None] + np.arange(w))[:, None, :]
    out = padded[np.arange(b)[:, None, None], rows, cols]
    flip = rng.random(b) < 0.5
    out[flip] = out[flip, :, ::-1]
    return out


def numpy_array_train(data, batch_size, *, augmentation, mean, std, seed, start_step=0, raw=False):
    """Infinite generator of (images, labels) numpy batches; batch k depends only on (seed, k).

    ``raw=True`` (``pipeline="device"``): uint8 batches, neither augmented nor normalised here (the
    training model does both on the device, ``training.augment``).
    """
    n = data.train_size
    step = start_step
    while True:
        positions = np.arange(step * batch_size, (step + 1) * batch_size)
        epochs, offsets = np.divmod(positions, n)
        index = np.empty(batch_size, np.int64)
        for epoch in np.unique(epochs):
            order = np.random.default_rng([seed, int(epoch)]).permutation(n)
            index[epochs == epoch] = order[offsets[epochs == epoch]]
        x = data.train_images[index]
        if raw:
            yield x, data.train_labels[index]
        else:
            x = (x.astype(np.float32) - mean) / std
            if augmentation == "cifar":  # after normalization: the padding is the mean (CIFAR_PAD)
                x = numpy_cifar_augment(x, np.random.default_rng([seed, 1, step]))
            yield x, data.train_labels[index]
        step += 1


class ArrayBatches(keras.utils.PyDataset):
    """The test set in batches, re-readable every epoch (Keras takes neither a list of batches nor a
    spent generator as ``validation_data``). Normalised when ``mean``/``std`` are given, else uint8."""

    def __init__(self, images, labels, batch_size, *, mean=None, std=None):
        super().__init__()
        self.images, self.labels, self.batch_size = images, labels, batch_size
        self.mean, self.std = mean, std

    def __len__(self):
        return math.ceil(len(self.labels) / self.batch_size)

    def __getitem__(self, index):
        window = slice(index * self.batch_size, (index + 1) * self.batch_size)
        x = self.images[window]
        if self.mean is not None:
            x = (x.astype(np.float32) - self.mean) / self.std
        return x, self.labels[window]


def numpy_array_eval(images, labels, batch_size, *, mean, std, raw=False):
    """Normalised test batches (uint8 ones with ``raw=True``), re-readable every epoch."""
    return ArrayBatches(images, labels, batch_size, mean=None if raw else mean, std=std)


def has_tensorflow():
    try:
        import tensorflow  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_pipeline(config):
    """``auto``: tf.data on the TensorFlow backend (the fastest CPU path measured), else ``device``
    (uint8 batches from numpy, augmentation and normalization in the compiled step)."""
    import keras

    if config.pipeline != "auto":
        return config.pipeline
    if keras.backend.backend() == "tensorflow" and has_tensorflow():
        return "tf_data"
    return "device" if config.augmentation in ("cifar", "none") else "tf_data"


def require_tensorflow(what, alternative=""):
    """A one-line DataError when TensorFlow is not installed and ``what`` needs it."""
    if not has_tensorflow():
        raise DataError(f"{what} needs TensorFlow, which is not installed (pip install tensorflow"
                        f"{' tensorflow-datasets' if 'TFDS' in what else ''}){alternative}.")


def pipelines(data, config, batch_size, *, start_step=0):
    """(train stream, eval data) for ``model.fit``; the train stream is infinite."""
    mean, std = normalization(config, data)
    kind = resolve_pipeline(config)
    if kind == "tf_data":
        require_tensorflow("pipeline='tf_data'", "; use --pipeline device or numpy")
    train_size = tuple(config.image_size)
    eval_size = tuple(config.eval_image_size or config.image_size)
    if isinstance(data, StreamData):
        if kind != "tf_data":
            raise DataError("Streaming data sets (ImageNet recipe) need pipeline='tf_data' (TensorFlow).")
        train = tf_stream_train(data, batch_size, image_size=train_size, augmentation=config.augmentation,
                                mean=mean, std=std, seed=config.seed, start_step=start_step)
        test = tf_stream_eval(data, batch_size, image_size=eval_size, train_image_size=train_size,
                              mean=mean, std=std)
        return train, test
    if kind == "tf_data":
        make_train, make_eval, raw = tf_array_train, tf_array_eval, {}
    else:
        make_train, make_eval, raw = numpy_array_train, numpy_array_eval, {"raw": kind == "device"}
    train = make_train(data, batch_size, augmentation=config.augmentation, mean=mean, std=std,
                       seed=config.seed, start_step=start_step, **raw)
    test = make_eval(data.test_images, data.test_labels, batch_size, mean=mean, std=std, **raw)
    return train, test


def check_batch_size(data, config):
    """The global batch must fit in the training set (one batch is drawn without replacement)."""
    if config.batch_size > data.train_size:
        raise DataError(
            f"Invalid batch_size={config.batch_size}: larger than the {data.train_size} training images; "
            f"at most {data.train_size}."
        )


def check_image_size(data, config):
    """Array data must match the config's image size (the model's input)."""
    if isinstance(data, ArrayData) and data.image_size != tuple(config.image_size):
        raise DataError(
            f"Images are {data.image_size[0]}x{data.image_size[1]} but image_size="
            f"{list(config.image_size)}; pass --image-size {data.image_size[0]} {data.image_size[1]}."
        )


__all__ = [
    "ArrayData",
    "DataError",
    "StreamData",
    "folder",
    "load",
    "pipelines",
    "synthetic",
    "tfds_builder",
]
