"""keras_preact.preprocessing: InputConfig, image formats, and the evaluation view's exact geometry."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from keras_preact.models import get_input_config
from keras_preact.preprocessing import (
    IMAGE_FORMATS,
    IMAGE_MAGIC,
    INTERPOLATIONS,
    InputConfig,
    decode_image,
    image_format,
)
from support import encode_image, photo_like

IMAGENET_224 = InputConfig()  # crop 224 of a shorter side of 256
IMAGENET_320 = IMAGENET_224.at_test_size(320)  # the 320 x 320 test: shorter side 320, crop_fraction 1.0
# (width, height): landscape, portrait, smaller than the crop, square at the crop, a thin strip.
SIZES = [(500, 375), (375, 500), (100, 60), (224, 224), (640, 210)]


# ----------------------------------------------------------------------------- InputConfig (no TF)
@pytest.mark.notf
def test_input_config_sizes():
    assert IMAGENET_224.crop_size == (224, 224) and IMAGENET_224.resize_size == 256
    assert IMAGENET_320.crop_size == (320, 320) and IMAGENET_320.crop_fraction == 1.0
    assert IMAGENET_320.resize_size == 320
    assert IMAGENET_224.at_test_size(224) == IMAGENET_224  # not larger than the training crop: unchanged
    assert IMAGENET_224.at_test_size((160, 192)).crop_fraction == 0.875
    assert InputConfig(input_size=(32, 32, 3), crop_fraction=0.875).resize_size == 37  # ceil(36.57)
    assert InputConfig(input_size=(90, 90, 3), crop_fraction=0.9).resize_size == 100  # not 101
    assert InputConfig(input_size=(160, 200, 3)).resize_size == math.ceil(200 / 0.875)  # the longer crop side
    cifar = get_input_config("cifar_resnet110")
    assert cifar.crop_size == (32, 32) and cifar.resize_size == 32  # the whole 32 x 32 image
    assert get_input_config("imagenet_resnet50") == IMAGENET_224


@pytest.mark.notf
def test_resize_sizes_on_both_sides_of_a_half():
    """Every size the view computes, at fractional parts below and above 0.5, where rounding differs from the
    ceiling (``resize_size``), from timm's floor (``floor(img_size / crop_pct)``) or from torchvision's truncated
    longer side."""
    from keras_preact.preprocessing import timm_crop_fraction, torchvision_resized_size, view_geometry

    assert InputConfig(input_size=(32, 32, 3), crop_fraction=0.875).resize_size == 37  # 36.57
    assert InputConfig(input_size=(40, 40, 3), crop_fraction=0.9).resize_size == 45  # 44.44
    for size, crop_pct, scale_size in ((224, 0.95, 235), (224, 0.9, 248), (23, 0.95, 24), (224, 0.875, 256)):
        config = InputConfig(input_size=(size, size, 3), crop_fraction=timm_crop_fraction(size, crop_pct))
        assert config.resize_size == scale_size  # 235.79, 248.89, 24.21, 256: floored
    assert torchvision_resized_size(240, 320, 248) == (248, 330)  # 330.67
    assert torchvision_resized_size(300, 400, 256) == (256, 341)  # 341.33
    assert torchvision_resized_size(400, 300, 256) == (341, 256)
    assert view_geometry(240, 320, (224, 224 / 248)).resized == (248, 330)


@pytest.mark.notf
@pytest.mark.parametrize("config", [
    IMAGENET_224,
    IMAGENET_320,
    InputConfig(input_size=(32, 32, 3), mean=(125.3, 123.0, 113.9), std=(63.0, 62.1, 66.7), crop_fraction=1.0,
                interpolation="bicubic"),
    InputConfig(input_size=(2, 3, 3), mean=np.arange(18, dtype=np.float32).reshape(2, 3, 3), std=(1, 2, 3)),
])
def test_input_config_round_trips_through_json(config):
    data = json.loads(json.dumps(config.to_dict()))
    assert InputConfig.from_dict(data) == config
    assert set(data) == {"input_size", "mean", "std", "crop_fraction", "interpolation"}  # as written before
    hash(config)  # frozen, hashable (tuples inside)


@pytest.mark.notf
def test_input_config_round_trips_its_crop_mode_and_antialias():
    config = InputConfig(crop_fraction=1.0, interpolation="bicubic", crop_mode="keras", antialias=False)
    data = json.loads(json.dumps(config.to_dict()))
    assert (data["crop_mode"], data["antialias"]) == ("keras", False)
    assert InputConfig.from_dict(data) == config
    assert set(config.replace(antialias=True).to_dict()) == {*data} - {"antialias"}  # the defaults are not written


@pytest.mark.notf
def test_input_config_normalizes_its_fields():
    config = InputConfig(input_size=[64, 48, 3], mean=np.float32([1, 2, 3]), std=[1, 1, 1], crop_fraction=1)
    assert config.input_size == (64, 48, 3) and config.mean == (1.0, 2.0, 3.0) and config.std == (1.0, 1.0, 1.0)
    assert isinstance(config.crop_fraction, float)
    assert config == InputConfig(input_size=(64, 48, 3), mean=(1, 2, 3), std=(1, 1, 1), crop_fraction=1.0)


@pytest.mark.notf
@pytest.mark.parametrize("changes, field", [
    (dict(input_size=(224, 224)), "input_size"),
    (dict(input_size=(224, 0, 3)), "input_size"),
    (dict(input_size=(224.0, 224, 3)), "input_size"),
    (dict(mean=(1.0, 2.0)), "mean"),
    (dict(mean=(1.0, float("nan"), 2.0)), "mean"),
    (dict(mean=np.zeros((4, 4, 3))), "mean"),  # a mean image must have the input size
    (dict(std=(1.0, 0.0, 1.0)), "std"),
    (dict(std=np.ones((224, 224, 3))), "std"),
    (dict(crop_fraction=0.0), "crop_fraction"),
    (dict(crop_fraction=1.5), "crop_fraction"),
    (dict(crop_fraction="0.875"), "crop_fraction"),
    (dict(crop_fraction=True), "crop_fraction"),
    (dict(interpolation="linear"), "interpolation"),
    (dict(crop_mode="timm"), "crop_mode"),
    (dict(antialias="yes"), "antialias"),
])
def test_input_config_rejects_bad_fields_naming_them(changes, field):
    with pytest.raises(ValueError, match=f"^Invalid {field}="):
        InputConfig(**changes)
    with pytest.raises(ValueError, match=f"^Invalid {field}="):
        InputConfig.from_dict({**IMAGENET_224.to_dict(), **changes})


@pytest.mark.notf
def test_from_dict_names_unknown_keys():
    with pytest.raises(ValueError, match="unknown key.*'crop_pct'"):
        InputConfig.from_dict({**IMAGENET_224.to_dict(), "crop_pct": 0.9})
    with pytest.raises(ValueError, match="expected a dict"):
        InputConfig.from_dict([224, 224, 3])
    old = InputConfig.from_dict({"input_size": [32, 32, 3]})  # absent keys (an archive written before): defaults
    assert (old.crop_fraction, old.crop_mode, old.antialias) == (0.875, "torchvision", True)


@pytest.mark.notf
def test_image_formats_are_recognised_by_their_magic_bytes():
    assert IMAGE_FORMATS == tuple(IMAGE_MAGIC) == ("JPEG", "PNG", "GIF", "BMP")
    pixels = photo_like(12, 20)
    for fmt in IMAGE_FORMATS:
        assert image_format(encode_image(pixels, fmt)) == fmt
    for data in (b"", b"not an image", b"II*\x00tiff", encode_image(pixels, "TIFF"), b"\xff\xd8"):
        assert image_format(data) is None
    assert "bilinear" in INTERPOLATIONS


@pytest.mark.notf
def test_image_functions_without_tensorflow_fail_in_one_line():
    code = ("import sys; sys.modules['tensorflow'] = None\n"
            "from keras_preact import preprocessing\n"
            "try:\n    preprocessing.eval_view(b'', preprocessing.InputConfig())\n"
            "except ImportError as e:\n    print(e)\n")
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "KERAS_BACKEND": "jax"},
        check=True,
    ).stdout
    assert out == "keras_preact.preprocessing.eval_view runs tf.io/tf.image graph ops and needs TensorFlow: " \
                  "pip install tensorflow\n"


# ------------------------------------------------------------------------- image functions (TF)
@pytest.fixture(scope="module")
def tf():
    return pytest.importorskip("tensorflow", reason="the image functions are TensorFlow graph functions")


def training_eval_view(encoded, crop, train_crop):
    """The ImageNet evaluation view, written out here: the shorter side to ``ceil(crop * 256 / 224)`` (or the crop
    when it is larger than the training crop), the longer side truncated and the centre crop's offsets rounded as
    torchvision's ``Resize`` and ``CenterCrop`` compute them (``int(size * long / short)``,
    ``int(round((side - crop) / 2.0))``); the shared view must equal it bit for bit."""
    import math

    import tensorflow as tf

    # The decode is the accurate-IDCT one decode_image uses since it was made to equal Pillow's (below).
    image = tf.io.decode_jpeg(encoded, channels=3, dct_method="INTEGER_ACCURATE")
    side = crop if crop > train_crop else math.ceil(crop * 256 / 224)
    height, width = image.shape[:2]
    short, long = (width, height) if width <= height else (height, width)
    new = (int(side * long / short), side) if width <= height else (side, int(side * long / short))
    image = tf.image.resize(image, new, antialias=True).numpy()
    top, left = int(round((new[0] - crop) / 2.0)), int(round((new[1] - crop) / 2.0))
    return tf.constant(image[top:top + crop, left:left + crop])


@pytest.mark.parametrize("fmt, options", [
    ("JPEG", dict(quality=75)),  # CIFAR-10 folder's quality, 4:2:0 chroma
    ("JPEG", dict(quality=95, subsampling=0)),  # 4:4:4
    ("JPEG", dict(quality=50, progressive=True)),
    ("PNG", {}),
    ("BMP", {}),
])
def test_decode_image_gives_pillows_pixels(tf, fmt, options):
    """TensorFlow's decode equals Pillow's bit for bit (the TensorFlow-free data path, the ONNX/OpenVINO
    servers, the PyTorch reference): JPEGs with the accurate IDCT, not TensorFlow's default fast one."""
    import io

    from PIL import Image

    for height, width, seed in ((32, 32, 0), (37, 53, 1), (224, 300, 2)):
        data = encode_image(photo_like(height, width, seed), fmt, **options)
        with Image.open(io.BytesIO(data)) as image:
            expected = np.asarray(image.convert("RGB"))
        decoded = decode_image(tf.constant(data)).numpy()
        np.testing.assert_array_equal(decoded, expected)
        assert decoded.dtype == np.uint8
    fast = tf.io.decode_image(tf.constant(data), channels=3).numpy()
    assert fmt != "JPEG" or not np.array_equal(fast, expected)  # the default IDCT would not pass


def test_training_evaluates_with_the_shared_view(tf):
    """keras_preact_training.data.pipelines' ImageNet evaluation view is the shared ``eval_view`` at the run's
    config."""
    from keras_preact_training.data import pipelines

    encoded = tf.constant(encode_image(photo_like(375, 500)))
    for crop, train_crop in ((224, 224), (320, 224)):
        ours = pipelines.imagenet_eval_view(encoded, (crop, crop), (train_crop, train_crop))
        np.testing.assert_array_equal(ours.numpy(), training_eval_view(encoded, crop, train_crop).numpy())


@pytest.mark.parametrize("width, height", SIZES)
@pytest.mark.parametrize("config", [IMAGENET_224, IMAGENET_320], ids=["224-0.875", "320-1.0"])
def test_eval_view_geometry(tf, config, width, height):
    """Shorter side to resize_size (the other side truncated), bilinear with antialiasing, centre crop at
    offsets rounded (ties to even), as torchvision's Resize and CenterCrop."""
    from keras_preact.preprocessing import decode_image, eval_view

    encoded = tf.constant(encode_image(photo_like(height, width, seed=width), quality=92))
    view = eval_view(encoded, config).numpy()
    crop = config.crop_size[0]
    assert view.shape == (crop, crop, 3) and view.dtype == np.float32
    side = 256 if crop == 224 else 320
    new_h, new_w = (side, int(side * width / height)) if height < width else (int(side * height / width), side)
    assert min(new_h, new_w) == side
    resized = tf.image.resize(decode_image(encoded), (new_h, new_w), method="bilinear", antialias=True).numpy()
    top, left = int(round((new_h - crop) / 2.0)), int(round((new_w - crop) / 2.0))
    np.testing.assert_array_equal(view, resized[top:top + crop, left:left + crop])
    # The tuple form says the same.
    np.testing.assert_array_equal(eval_view(encoded, (crop, config.crop_fraction, "bilinear")).numpy(), view)


@pytest.mark.parametrize("width, height", SIZES)
@pytest.mark.parametrize("crop, config", [(224, IMAGENET_224), (320, IMAGENET_320)], ids=["224", "320"])
def test_eval_view_equals_trainings_evaluation(tf, crop, config, width, height):
    from keras_preact.preprocessing import eval_view

    encoded = tf.constant(encode_image(photo_like(height, width, seed=height), quality=90))
    expected = training_eval_view(encoded, crop, train_crop=224).numpy()
    np.testing.assert_array_equal(eval_view(encoded, config).numpy(), expected)


def test_eval_view_equals_trainings_evaluation_at_the_cifar_size(tf):
    """At 32 with crop_fraction 0.875 both give ceil(32 / 0.875) = 37, then the centre 32 x 32."""
    from keras_preact.preprocessing import eval_view

    encoded = tf.constant(encode_image(photo_like(45, 60), "PNG"))
    config = InputConfig(input_size=(32, 32, 3), crop_fraction=0.875)
    np.testing.assert_array_equal(eval_view(encoded, config).numpy(),
                                  training_eval_view(encoded, 32, train_crop=32).numpy())


def test_eval_view_of_an_image_at_the_crop_size_with_fraction_one_is_the_image(tf):
    from keras_preact.preprocessing import eval_view

    pixels = photo_like(32, 32)
    np.testing.assert_array_equal(eval_view(tf.constant(encode_image(pixels, "PNG")), (32, 1.0)).numpy(), pixels)
    np.testing.assert_array_equal(eval_view(pixels, (32, 1.0)).numpy(), pixels)  # decoded input


def test_eval_view_takes_a_batch_of_encoded_images_of_any_sizes(tf):
    from keras_preact.preprocessing import eval_view

    encoded = [encode_image(photo_like(h, w, seed=i), fmt) for i, ((w, h), fmt) in
               enumerate(zip(SIZES, ["JPEG", "PNG", "GIF", "BMP", "JPEG"]))]
    batch = eval_view(tf.constant(encoded), IMAGENET_224).numpy()
    assert batch.shape == (len(SIZES), 224, 224, 3)
    for one, data in zip(batch, encoded):
        np.testing.assert_array_equal(one, eval_view(tf.constant(data), IMAGENET_224).numpy())


def test_resize_shorter_side_and_center_crop(tf):
    from keras_preact.preprocessing import center_crop, resize_shorter_side

    image = tf.constant(photo_like(30, 75))
    assert resize_shorter_side(image, 12).shape == (12, 30, 3)
    assert resize_shorter_side(tf.stack([image, image]), 60).shape == (2, 60, 150, 3)  # batches too
    assert resize_shorter_side(tf.constant(photo_like(10, 25)), 4).shape == (4, 10, 3)
    # The longer side truncated on both sides of a half: 320 * 248 / 240 = 330.67, 400 * 256 / 300 = 341.33.
    assert resize_shorter_side(tf.zeros((240, 320, 3)), 248).shape == (248, 330, 3)
    assert resize_shorter_side(tf.zeros((400, 300, 3)), 256).shape == (341, 256, 3)
    assert resize_shorter_side(image, 12, interpolation="nearest", antialias=False).dtype == tf.float32
    # Offsets round((30 - 10) / 2) = 10, round(27.5) = 28 (torchvision); 12, 35 at even margins.
    np.testing.assert_array_equal(center_crop(image, (10, 20)).numpy(), image.numpy()[10:20, 28:48])
    np.testing.assert_array_equal(center_crop(image, 5).numpy(), image.numpy()[12:17, 35:40])
    np.testing.assert_array_equal(center_crop(image, (10, 20), "keras").numpy(), image.numpy()[10:20, 27:47])
    np.testing.assert_array_equal(center_crop(tf.stack([image]), 5).numpy()[0], image.numpy()[12:17, 35:40])
    with pytest.raises(ValueError, match="Invalid crop_mode='timm'"):
        center_crop(image, 5, "timm")


def test_normalize_matches_numpy(tf):
    from keras_preact.preprocessing import normalize

    pixels = photo_like(8, 8)
    mean, std = IMAGENET_224.mean, IMAGENET_224.std
    expected = (pixels.astype(np.float32) - np.float32(mean)) / np.float32(std)
    np.testing.assert_array_equal(normalize(pixels, mean, std).numpy(), expected)
    mean_image = np.random.default_rng(0).uniform(0, 255, (8, 8, 3)).astype(np.float32)
    np.testing.assert_allclose(normalize(pixels, mean_image, std).numpy(),
                               (pixels - mean_image) / np.float32(std), rtol=1e-6)


def test_is_encoded_image(tf):
    from keras_preact.preprocessing import is_encoded_image

    pixels = photo_like(6, 6)
    for fmt in IMAGE_FORMATS:
        assert bool(is_encoded_image(tf.constant(encode_image(pixels, fmt))))
    assert not bool(is_encoded_image(tf.constant(b"garbage")))
