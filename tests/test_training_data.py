"""Data sources and pipelines: synthetic, image folders (+ .npy cache), TFDS offline guard, augmentation."""

import os
import subprocess
import sys
import time

import numpy as np
import pytest

from keras_preact import preprocessing
from keras_preact_training.data import pipelines, sources
from keras_preact_training.recipe import configs


def _write_tree(root, sizes, per_class=3, classes=("cat", "dog"), splits=("train", "test")):
    from PIL import Image

    rng = np.random.default_rng(0)
    for split in splits:
        for c in classes:
            d = root / split / c
            d.mkdir(parents=True)
            for i in range(per_class):
                h, w = sizes(split, c, i)
                Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(d / f"{i:04d}.png")
    return root


@pytest.mark.core
def test_synthetic_is_deterministic_and_class_dependent():
    a = sources.synthetic(256, 64, 4, (16, 16), seed=3)
    b = sources.synthetic(256, 64, 4, (16, 16), seed=3)
    c = sources.synthetic(256, 64, 4, (16, 16), seed=4)
    np.testing.assert_array_equal(a.train_images, b.train_images)
    assert not np.array_equal(a.train_images, c.train_images)
    assert a.train_images.dtype == np.uint8 and a.train_images.shape == (256, 16, 16, 3)
    assert set(np.unique(a.train_labels)) == {0, 1, 2, 3}
    # Learnable: a nearest-centroid classifier on Fourier amplitudes (orientation/frequency per
    # class) beats chance (25%) by far on the test split.
    def features(x):
        return np.abs(np.fft.fft2(x.astype(np.float32) - 127.5, axes=(1, 2))).reshape(len(x), -1)

    centroids = np.stack([features(a.train_images[a.train_labels == k]).mean(0) for k in range(4)])
    predicted = np.argmin(((features(a.test_images)[:, None] - centroids[None]) ** 2).sum(-1), 1)
    assert (predicted == a.test_labels).mean() > 0.6


@pytest.mark.core
@pytest.mark.notf
def test_folder_decodes_labels_sorted_and_caches(tmp_path):
    root = _write_tree(tmp_path / "tree", lambda s, c, i: (8, 10))
    cache = tmp_path / "cache"
    d = sources.folder(root, cache)
    assert d.class_names == ["cat", "dog"]
    assert d.train_images.shape == (6, 8, 10, 3) and list(d.train_labels) == [0, 0, 0, 1, 1, 1]
    from PIL import Image

    np.testing.assert_array_equal(d.train_images[3], np.asarray(Image.open(root / "train/dog/0000.png")))
    cached = sorted(cache.glob("images-*.npy"))
    assert len(cached) == 2  # train and test
    # A second load reads the cache: poison it and see the poisoned pixels come back.
    poisoned = np.load(cached[0])
    poisoned[:] = 7
    np.save(cached[0], poisoned)
    again = sources.folder(root, cache)
    assert (again.train_images == 7).all() or (again.test_images == 7).all()


@pytest.mark.core
@pytest.mark.notf
def test_folder_bad_inputs_are_named(tmp_path):
    with pytest.raises(sources.DataError, match="is not a directory"):
        sources.folder(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(sources.DataError, match="must contain train/ and test/"):
        sources.folder(tmp_path / "empty")
    mixed = _write_tree(tmp_path / "mixed", lambda s, c, i: (8, 8) if i else (9, 8))
    with pytest.raises(sources.DataError, match="mixed sizes"):
        sources.folder(mixed, tmp_path / "c1")
    hollow = _write_tree(tmp_path / "hollow", lambda s, c, i: (8, 8))
    (hollow / "train" / "zebra").mkdir()
    with pytest.raises(sources.DataError, match="zebra has no images"):
        sources.folder(hollow, tmp_path / "c2")


@pytest.mark.core
def test_labels_out_of_range_are_rejected():
    d = sources.synthetic(16, 8, 3, (8, 8))
    d.train_labels[0] = 3
    with pytest.raises(sources.DataError, match=r"train labels out of range.*\[0, 2\]"):
        d.validate()


def test_tfds_missing_data_fails_fast_without_network(tmp_path):
    # A subprocess with a hard timeout: TFDS must not probe GCS or download.
    code = (
        "import sys; sys.path.insert(0, '.')\n"
        "from keras_preact_training.data import sources\n"
        f"try:\n    sources.tfds_builder('cifar10', data_dir={str(tmp_path)!r})\n"
        "except sources.DataError as e:\n    print('DATAERROR', e)\n"
    )
    started = time.time()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=os.path.dirname(os.path.dirname(__file__)))
    assert "DATAERROR" in out.stdout, out.stderr[-2000:]
    assert "not prepared" in out.stdout and "--data-dir" in out.stdout and "--manual-dir" in out.stdout
    assert time.time() - started < 60  # seconds, not a network time-out


def test_unknown_dataset_is_named():
    with pytest.raises(sources.DataError, match="Unknown dataset='no_such_set'"):
        sources.tfds_builder("no_such_set")


def test_tf_cifar_augmentation_is_a_padded_crop_and_flip():
    import tensorflow as tf

    images = np.random.default_rng(0).integers(1, 255, (64, 8, 8, 3), dtype=np.uint8)
    out = pipelines._tf_cifar_augment(tf.constant(images), tf.constant([1, 2], tf.int64)).numpy()
    padded = np.pad(images, [(0, 0), (4, 4), (4, 4), (0, 0)])
    flips = 0
    for i in range(64):
        windows = [padded[i, y:y + 8, x:x + 8] for y in range(9) for x in range(9)]
        plain = any(np.array_equal(out[i], w) for w in windows)
        flipped = any(np.array_equal(out[i], w[:, ::-1]) for w in windows)
        assert plain or flipped
        flips += flipped and not plain
    assert 0 < flips < 64


@pytest.mark.core
@pytest.mark.notf
def test_numpy_cifar_augmentation_is_a_padded_crop_and_flip():
    images = np.random.default_rng(0).integers(1, 255, (32, 8, 8, 3), dtype=np.uint8)
    out = pipelines.numpy_cifar_augment(images, np.random.default_rng(1))
    padded = np.pad(images, [(0, 0), (4, 4), (4, 4), (0, 0)])
    for i in range(32):
        windows = [padded[i, y:y + 8, x:x + 8] for y in range(9) for x in range(9)]
        assert any(np.array_equal(out[i], w) or np.array_equal(out[i], w[:, ::-1]) for w in windows)


@pytest.mark.notf
@pytest.mark.parametrize("pipeline", ["tf_data", "numpy", "device"])
def test_stream_resumes_exactly_at_a_step(pipeline):
    if pipeline == "tf_data":
        pytest.importorskip("tensorflow")
    config = configs.get_config("synthetic-resnet8", image_size=(8, 8), pipeline=pipeline, seed=5)
    d = sources.synthetic(40, 8, 3, (8, 8), seed=5)

    def batches(start, count):
        train, _ = pipelines.pipelines(d, config, 16, start_step=start)
        it = iter(train)
        return [tuple(np.asarray(t) for t in next(it)) for _ in range(count)]

    full = batches(0, 7)
    resumed = batches(4, 3)
    for (x, y), (rx, ry) in zip(full[4:], resumed):
        np.testing.assert_array_equal(x, rx)
        np.testing.assert_array_equal(y, ry)
    # Every epoch (40 images = 2.5 batches) is a permutation: 5 batches hold each image twice.
    labels = np.concatenate([y for _, y in full[:5]])
    assert np.bincount(labels, minlength=3).tolist() == (2 * np.bincount(d.train_labels, minlength=3)).tolist()
    x, _ = full[0]
    # The device pipeline sends uint8 pixels (augmented and normalised in the compiled step).
    assert x.dtype == (np.uint8 if pipeline == "device" else np.float32) and x.shape == (16, 8, 8, 3)


def _encoded_in_every_mode():
    """{(Pillow mode, format): encoded bytes} of small random images: every mode Pillow writes as PNG, GIF, BMP or
    JPEG (the formats TensorFlow decodes), 16-bit grayscale PNG and palette images with transparency included."""
    import io

    from PIL import Image

    rng = np.random.default_rng(0)
    rgb = Image.fromarray(rng.integers(0, 256, (6, 7, 3), dtype=np.uint8))
    rgba = Image.fromarray(rng.integers(0, 256, (6, 7, 4), dtype=np.uint8))
    images = {"1": rgb.convert("1"), "L": rgb.convert("L"), "LA": rgba.convert("LA"), "P": rgb.convert("P"),
              "RGB": rgb, "RGBA": rgba, "CMYK": rgb.convert("CMYK"),
              "I;16": Image.fromarray(rng.integers(0, 65536, (6, 7), dtype=np.uint16))}
    encoded = {}
    for mode, image in images.items():
        for fmt in ("PNG", "GIF", "BMP", "JPEG"):
            out = io.BytesIO()
            try:
                image.save(out, format=fmt)
            except (OSError, ValueError, KeyError):  # a mode the format cannot hold
                continue
            encoded[(mode, fmt)] = out.getvalue()
    for fmt in ("PNG", "GIF"):
        out = io.BytesIO()
        rgb.convert("P").save(out, format=fmt, transparency=3)
        encoded[("P with transparency", fmt)] = out.getvalue()
    return encoded


@pytest.mark.core
@pytest.mark.notf
def test_a_16_bit_grayscale_png_decodes_without_tensorflow_to_its_high_bytes(tmp_path, monkeypatch):
    """Without TensorFlow (Pillow's path) a 16-bit grayscale PNG decodes as libpng under TensorFlow does: each
    sample's high byte, in all three channels; Pillow's convert("RGB") made it nearly white."""
    from PIL import Image

    values = np.random.default_rng(1).integers(0, 65536, (2, 5, 6), dtype=np.uint16)
    values[0, 0, :4] = [0, 255, 256, 65535]
    files = []
    for i, v in enumerate(values):
        Image.fromarray(v).save(tmp_path / f"{i}.png")
        files.append(str(tmp_path / f"{i}.png"))
    assert Image.open(files[0]).mode == "I;16"
    monkeypatch.setitem(sys.modules, "tensorflow", None)  # import tensorflow fails: the TensorFlow-free path
    images, kept = sources._decode_files(files)
    assert kept.tolist() == [0, 1] and images.dtype == np.uint8
    np.testing.assert_array_equal(images, np.repeat((values >> 8).astype(np.uint8)[..., None], 3, axis=-1))
    assert images[0, 0, :4, 0].tolist() == [0, 0, 1, 255]


MODES = sorted(_encoded_in_every_mode())


@pytest.mark.parametrize("mode, fmt", MODES, ids=[f"{m}-{f}" for m, f in MODES])
def test_every_image_mode_decodes_to_tensorflows_pixels_without_tensorflow(mode, fmt):
    """Pillow's path (``pillow_pixels``) gives TensorFlow's pixels (``keras_preact.preprocessing.decode_image``,
    channels 3) for every Pillow mode in every format both decode."""
    import io

    from PIL import Image

    pytest.importorskip("tensorflow")
    from keras_preact.preprocessing import decode_image

    data = _encoded_in_every_mode()[(mode, fmt)]
    with Image.open(io.BytesIO(data)) as image:
        ours = preprocessing.pillow_pixels(image)
    theirs = decode_image(data).numpy()
    assert ours.dtype == np.uint8 and ours.shape == theirs.shape == (6, 7, 3)
    np.testing.assert_array_equal(ours, theirs)


def _indexed_bmp(indices, palette, bits, top_down=False, colors=None):
    """A BMP of ``indices`` (``[H, W]`` ints) through ``palette`` (``[N, 3]`` RGB), ``bits`` per pixel, written here
    byte by byte from the format's layout (BITMAPINFOHEADER, BGRX palette, rows padded to 4 bytes, bottom-up unless
    ``top_down``), so that Pillow and TensorFlow both read a file neither of them wrote."""
    import struct

    height, width = indices.shape
    row_bytes = (width * bits + 31) // 32 * 4
    rows = np.zeros((height, row_bytes * 8 // bits), np.uint8)
    rows[:, :width] = indices
    packed = np.zeros((height, row_bytes), np.uint8)
    for k in range(8 // bits):  # the most significant bits hold the leftmost pixel
        packed |= (rows[:, k::8 // bits] << (8 - bits * (k + 1))).astype(np.uint8)
    if not top_down:
        packed = packed[::-1]
    entries = np.zeros((len(palette), 4), np.uint8)
    entries[:, :3] = np.asarray(palette, np.uint8)[:, ::-1]
    offset = 14 + 40 + entries.size
    info = struct.pack("<IiiHHIIiiII", 40, width, -height if top_down else height, 1, bits, 0, packed.size, 2835, 2835,
                       len(palette) if colors is None else colors, 0)
    return (
        b"BM" + struct.pack("<IHHI", offset + packed.size, 0, 0, offset) + info + entries.tobytes() + packed.tobytes()
    )


def _bmp_cases():
    """{name: BMP bytes}: Pillow's 8-bit palette and 1-bit BMPs, and hand-written 1-, 4- and 8-bit ones (odd widths,
    top-down rows, a palette shorter than the bits allow)."""
    import io

    from PIL import Image

    rng = np.random.default_rng(3)
    rgb = Image.fromarray(rng.integers(0, 256, (13, 11, 3), dtype=np.uint8))
    cases = {}
    for mode in ("P", "1"):
        out = io.BytesIO()
        rgb.convert(mode).save(out, format="BMP")
        cases[f"pillow-{mode}"] = out.getvalue()
    for bits, width, top_down, colors in [(1, 13, False, 2), (1, 33, True, 2), (4, 7, False, 16), (4, 9, True, 5),
                                          (8, 5, False, 256), (8, 6, True, 40)]:
        palette = rng.integers(0, 256, (colors, 3))
        indices = rng.integers(0, colors, (9, width))
        cases[f"{bits}bit-w{width}-{'topdown' if top_down else 'bottomup'}-{colors}colors"] = _indexed_bmp(
            indices, palette, bits, top_down)
    return cases


BMP_CASES = sorted(_bmp_cases())


@pytest.mark.parametrize("case", BMP_CASES)
def test_palette_and_1_bit_bmps_decode_through_their_palette_on_the_tensorflow_path(case):
    """TensorFlow's BMP decoder reads an 8-bit BMP's palette indices as gray levels and refuses 1- and 4-bit BMPs;
    ``keras_preact.preprocessing.decode_image`` (training, evaluation and the exported ``serving_bytes``) gives the
    palette's colours, Pillow's pixels exactly, and the 1-, 3- and 4-channel images Pillow's convert gives."""
    import io

    from PIL import Image

    pytest.importorskip("tensorflow")
    from keras_preact.preprocessing import decode_image

    data = _bmp_cases()[case]
    with Image.open(io.BytesIO(data)) as image:
        ours, gray, rgba = (
            preprocessing.pillow_pixels(image),
            np.asarray(image.convert("L")),
            np.asarray(image.convert("RGBA")),
        )
    np.testing.assert_array_equal(decode_image(data).numpy(), ours)
    np.testing.assert_array_equal(decode_image(data, channels=1).numpy()[..., 0], gray)
    np.testing.assert_array_equal(decode_image(data, channels=4).numpy(), rgba)


def test_a_truncated_palette_bmp_is_an_invalid_argument_on_the_tensorflow_path():
    """A palette BMP whose pixels end past the file is refused (InvalidArgumentError, what tf.data's ignore_errors
    and the server's 400 catch), as Pillow refuses it."""
    tf = pytest.importorskip("tensorflow")
    from keras_preact.preprocessing import decode_image

    data = _bmp_cases()["pillow-P"]
    with pytest.raises(tf.errors.InvalidArgumentError, match="truncated or its size is invalid"):
        decode_image(data[:-20])


def test_a_folder_of_palette_and_1_bit_bmps_loads_the_same_pixels_with_and_without_tensorflow(tmp_path, monkeypatch):
    """Training and evaluation data loading (``sources._decode_files``): TensorFlow's path and Pillow's give the same
    images for Pillow's 8-bit palette and 1-bit BMPs (TensorFlow's path dropped the 1-bit one as undecodable and
    made the palette one gray)."""
    pytest.importorskip("tensorflow")
    cases = _bmp_cases()
    files = []
    for name in ("pillow-P", "pillow-1"):
        (tmp_path / f"{name}.bmp").write_bytes(cases[name])
        files.append(str(tmp_path / f"{name}.bmp"))
    with_tf, kept = sources._decode_files(files, skip_bad=True)
    assert kept.tolist() == [0, 1]
    monkeypatch.setitem(sys.modules, "tensorflow", None)  # import tensorflow fails: the TensorFlow-free path
    without_tf, kept = sources._decode_files(files, skip_bad=True)
    assert kept.tolist() == [0, 1]
    np.testing.assert_array_equal(with_tf, without_tf)
    assert len({tuple(p) for p in with_tf[0].reshape(-1, 3)} - {(v, v, v) for v in range(256)}) > 0  # colours, not gray


@pytest.mark.core
@pytest.mark.notf
def test_one_huge_image_first_in_a_folder_gets_the_mixed_sizes_line_before_any_array_is_made(tmp_path):
    """A 2000x1500 image first among 19 small ones: the one-line "mixed sizes" error, as in a small folder, found
    at the second image before the array is made (made from the first image's size, it was 20 x 9 MB here, and
    1.64 TiB for 50,000 CIFAR images: "Unable to allocate", a 29-line traceback). Python's traced allocations
    stay under three of the huge image (its pixels, and their bytes on the way from Pillow)."""
    import tracemalloc

    from PIL import Image

    Image.new("RGB", (2000, 1500)).save(tmp_path / "000.png")
    for i in range(1, 20):
        Image.new("RGB", (32, 32), (i, i, i)).save(tmp_path / f"{i:03d}.png")
    files = sorted(str(p) for p in tmp_path.glob("*.png"))
    tracemalloc.start()
    try:
        with pytest.raises(sources.DataError) as raised:
            sources._decode_files(files)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    message = str(raised.value)
    assert message.startswith(f"Images of mixed sizes: {files[1]} is (32, 32) but {files[0]} is (1500, 2000).")
    assert "\n" not in message and peak < 3 * 2000 * 1500 * 3, peak  # the image, and its bytes on the way (Pillow)
