"""Input pipelines for ``model.fit`` (``pipelines(data, config, ...)``, ``config.pipeline``).

``tf_data`` (shuffle, parallel vectorised augmentation on whole batches, prefetch; the TensorFlow
default), ``device`` (numpy sends uint8 batches, augmentation and normalization run in the compiled
step: ``augment``; the default without TensorFlow or on the JAX / PyTorch backends), or ``numpy``
(augmentation and normalization on the host, no TensorFlow). An image folder too large to decode into
memory streams from its files on the last two (``FolderBatches``, a ``keras.utils.PyDataset``). Every stream is a
deterministic function of (seed, global step): a resumed run continues the exact stream.
Augmentation: CIFAR pad 4 + random crop + horizontal flip (paper "Training recipe"); ImageNet scale
augmentation (shorter side in [256, 480]) + 224 crop + flip. Evaluation: the single original view
(CIFAR) or ``keras_preact.preprocessing.eval_view`` (ImageNet), the view every export serves.
"""

import concurrent.futures
import math

import keras
import numpy as np

from keras_preact.preprocessing import InputConfig, decode_image, eval_view, resize_shorter_side

from ..recipe.configs import MODEL_NORMALIZATION, NORMALIZATIONS, PIXEL_MEAN
from .sources import (
    ArrayData,
    DataError,
    FolderFiles,
    StreamData,
    decode_threads,
    require_tensorflow,
    resolve_pipeline,
)

# Pad 4 and crop back (paper). fb.resnet.torch (datasets/cifar10.lua L43-48) normalises first and pads
# with zeros, i.e. with the mean: every pipeline here pads after normalization too.
CIFAR_PAD = 4
IMAGENET_SCALE = (256, 480)


def pixel_stats(config, data=None):
    """(mean, std) in 0-255 units: the model consumes ``(pixels - mean) / std``.

    Per channel (``[3]`` each) for the named statistics, or for ``"pixel_mean"`` the paper's per-pixel
    mean subtraction: the mean training image (``[H, W, 3]``, from ``data``) and std 1.
    """
    if config.normalization == PIXEL_MEAN:
        if not isinstance(data, ArrayData):
            raise DataError("normalization='pixel_mean' needs in-memory array data (the CIFAR recipe) to "
                            "compute the mean training image.")
        return data.mean_image, np.ones(3, np.float32)
    if config.normalization == MODEL_NORMALIZATION:
        from ..recipe.model import init_input_config

        source = init_input_config(config)
        return np.asarray(source.mean, np.float32), np.asarray(source.std, np.float32)
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




def _imagenet_train_view(encoded, seed, crop, aspect):
    """Scale augmentation (shorter side uniform in [256, 480]), random crop, flip (paper Sec. 5 / [1])."""
    import tensorflow as tf

    image = decode_image(encoded)
    size = tf.random.stateless_uniform([], seed, IMAGENET_SCALE[0], IMAGENET_SCALE[1] + 1, tf.int32)
    if aspect:  # aspect-ratio augmentation (Table 5 last row): stretch one side by up to 4/3.
        ratio = tf.exp(tf.random.stateless_uniform([], seed + [0, 1], -math.log(4 / 3), math.log(4 / 3)))
        shape = tf.cast(tf.shape(image)[:2], tf.float32)
        image = tf.image.resize(image, tf.cast(shape * tf.stack([ratio, 1.0 / ratio]), tf.int32))
    image = resize_shorter_side(image, size)
    image = tf.image.stateless_random_crop(image, [crop[0], crop[1], 3], seed + [0, 2])
    return tf.image.stateless_random_flip_left_right(image, seed + [0, 3])


def imagenet_eval_view(encoded, crop, train_crop):
    """keras_preact.preprocessing's evaluation view: shorter side to crop / 0.875 (the standard 224 test)
    or, for a crop larger than the training crop, to the crop itself (the 320 test)."""
    return eval_view(encoded, InputConfig(input_size=(*train_crop, 3)).at_test_size(tuple(crop)))


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
        lambda e, y: (imagenet_eval_view(e, image_size, train_image_size), y),
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
    training model does both on the device, ``keras_preact_training.recipe.augment``).
    """
    step = start_step
    while True:
        index = batch_indices(data.train_size, batch_size, seed, step)
        x = data.train_images[index]
        yield (x if raw else host_augment(x, step, augmentation=augmentation, mean=mean, std=std, seed=seed),
               data.train_labels[index])
        step += 1


def batch_indices(n, batch_size, seed, step):
    """The training-set indices of global batch ``step``: the batches run through the epochs' orders back to
    back, epoch ``e``'s order ``np.random.default_rng([seed, e]).permutation(n)``; a function of (seed, step)
    only, so a resumed run recomputes the batches of an uninterrupted one.

    Examples:

    >>> batch_indices(4, 3, seed=0, step=1).tolist() == [*batch_indices(4, 4, 0, 0)[3:], *batch_indices(4, 4, 0, 1)[:2]]
    True
    """
    positions = np.arange(step * batch_size, (step + 1) * batch_size)
    epochs, offsets = np.divmod(positions, n)
    index = np.empty(batch_size, np.int64)
    for epoch in np.unique(epochs):
        order = np.random.default_rng([seed, int(epoch)]).permutation(n)
        index[epochs == epoch] = order[offsets[epochs == epoch]]
    return index


def host_augment(images, step, *, augmentation, mean, std, seed):
    """``pipeline="numpy"``: training batch ``step`` normalised, then CIFAR-augmented on the host."""
    x = (images.astype(np.float32) - mean) / std
    if augmentation == "cifar":  # after normalization: the padding is the mean (CIFAR_PAD)
        x = numpy_cifar_augment(x, np.random.default_rng([seed, 1, step]))
    return x


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


class FolderBatches(keras.utils.PyDataset):
    """Batches of an image folder decoded from its files, for data sets whose decoded images would not fit in
    memory (``sources.FolderFiles``, ``sources.choose_folder_decoding``): each batch's files decoded with Pillow
    and fitted to the model's size as the in-memory path holds them (``FolderFiles.decode``).

    Training (``seed`` given): infinite, batch ``k`` is global step ``start_step + k`` with the in-memory
    path's indices (``batch_indices``: each epoch shuffled by ``seed`` and the epoch), so the images and labels
    are those of ``numpy_array_train`` and a resumed run sees the batches of an uninterrupted one. uint8 when
    ``raw`` (``pipeline="device"``: augmentation and normalization run in the step,
    ``keras_preact_training.recipe.augment``), else normalised and augmented on the host (``host_augment``).
    Evaluation (``seed=None``): the files in order, the last batch short; normalised unless ``raw``.
    ``shard=(index, count)`` (multi-process data parallelism): each training batch is process ``index``'s slice of
    the global batch, as ``keras_preact_training.machine.distribute.ShardedTrain`` cuts the in-memory path's; with
    ``raw`` only that slice is decoded, else the global batch is (the host augmentation draws for all of it).
    Each batch's files are decoded on ``workers`` threads (Pillow releases the GIL while it decodes and resizes).
    Keras' own ``workers`` (its enqueuer) are not used: an infinite dataset's enqueuer goes on counting across the
    iterator reset after the first ``fit`` peeks a batch to build the metrics, so that batch would be skipped and
    the stream would no longer be a function of (seed, step).

    Examples:

    >>> import os, tempfile
    >>> from PIL import Image
    >>> from keras_preact_training.data.sources import FolderFiles
    >>> with tempfile.TemporaryDirectory() as root:
    ...     files = [os.path.join(root, f"{i}.png") for i in range(3)]
    ...     for i, f in enumerate(files):
    ...         Image.fromarray(np.full((20, 30, 3), 10 * i, np.uint8)).save(f)
    ...     data = FolderFiles(files, np.arange(3), files, np.arange(3), ["a", "b", "c"], image_size=(8, 8))
    ...     x, y = FolderBatches(data, "test", 2)[1]  # the second batch: the third image, fitted to 8 x 8
    ...     train = FolderBatches(data, "train", 2, seed=0)[0]
    >>> x.shape, x.dtype.name, y.tolist(), int(x[0, 0, 0, 0])
    ((1, 8, 8, 3), 'uint8', [2], 20)
    >>> train[1].tolist() == batch_indices(3, 2, seed=0, step=0).tolist()
    True
    """

    def __init__(self, data, split, batch_size, *, seed=None, start_step=0, augmentation="none", mean=None,
                 std=None, raw=True, workers=None, shard=None):
        super().__init__(workers=1, use_multiprocessing=False)
        self.threads = self.default_workers() if workers is None else workers
        self.data, self.batch_size, self.seed, self.start_step = data, batch_size, seed, start_step
        self.shard = shard
        self.files, self.labels = getattr(data, f"{split}_files"), getattr(data, f"{split}_labels")
        self.augmentation, self.mean, self.std, self.raw = augmentation, mean, std, raw
        self._pool = None

    @staticmethod
    def default_workers():
        """Decoding threads: one per core (at most 8; ``sources.decode_threads``)."""
        return decode_threads()

    @property
    def num_batches(self):
        return None if self.seed is not None else math.ceil(len(self.labels) / self.batch_size)

    def __len__(self):
        return self.num_batches

    def __getitem__(self, index):
        if self.seed is None:
            index = np.arange(index * self.batch_size, min((index + 1) * self.batch_size, len(self.labels)))
            step = None
        else:
            step = self.start_step + index
            index = batch_indices(len(self.labels), self.batch_size, self.seed, step)
        own = slice(None)
        if self.shard is not None and step is not None:
            per = self.batch_size // self.shard[1]
            own = slice(self.shard[0] * per, (self.shard[0] + 1) * per)
            if self.raw:  # decode only this process's slice
                index, own = index[own], slice(None)
        x, y = self._decoded(index, step)
        return x[own], y[own]

    def _decoded(self, index, step):
        files = [self.files[i] for i in index]
        if self.threads > 1:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(self.threads, thread_name_prefix="decode")
            x = np.stack(list(self._pool.map(self.data.decode, files)))
        else:
            x = np.stack([self.data.decode(f) for f in files])
        y = self.labels[index]
        if self.raw:
            return x, y
        if step is None:
            return (x.astype(np.float32) - self.mean) / self.std, y
        return host_augment(x, step, augmentation=self.augmentation, mean=self.mean, std=self.std, seed=self.seed), y


def numpy_array_eval(images, labels, batch_size, *, mean, std, raw=False):
    """Normalised test batches (uint8 ones with ``raw=True``), re-readable every epoch."""
    return ArrayBatches(images, labels, batch_size, mean=None if raw else mean, std=std)


def pipelines(data, config, batch_size, *, start_step=0, shard=None):
    """(train stream, eval data) for ``model.fit``; the train stream is infinite. ``shard=(index, count)``: a
    folder streamed from its files feeds process ``index``'s slice of each global training batch."""
    mean, std = pixel_stats(config, data)
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
    if isinstance(data, FolderFiles):
        if kind == "tf_data":
            raise DataError("A folder streamed from its files without tf.data needs pipeline='device' or 'numpy' "
                            "(--pipeline device).")
        stats = {"mean": mean, "std": std, "raw": kind == "device"}
        train = FolderBatches(data, "train", batch_size, seed=config.seed, start_step=start_step,
                              augmentation=config.augmentation, shard=shard, **stats)
        return train, FolderBatches(data, "test", batch_size, **stats)
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


def check_sharded_eval(data, config):
    """Multi-process data parallelism evaluates whole global batches (``distribute.shard_eval_index``): the test
    split must hold one."""
    tested = len(getattr(data, "test_labels", ()))
    if isinstance(data, (ArrayData, FolderFiles)) and tested < config.batch_size:
        raise DataError(
            f"Invalid batch_size={config.batch_size}: multi-process data parallelism evaluates whole global batches "
            f"and the test split holds {tested} images; at most {tested}.")


def check_image_size(data, config):
    """Array data must match the config's image size (the model's input)."""
    if isinstance(data, ArrayData) and data.image_size != tuple(config.image_size):
        raise DataError(
            f"Images are {data.image_size[0]}x{data.image_size[1]} but image_size="
            f"{list(config.image_size)}; pass --image-size {data.image_size[0]} {data.image_size[1]}."
        )


