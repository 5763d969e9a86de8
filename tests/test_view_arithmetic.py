"""The evaluation view to the pixel: each checkpoint's resize and centre crop computed as its own library does.

timm's checkpoints are evaluated with timm's ``transforms_imagenet_eval`` (``timm/data/transforms_factory.py``):
``Resize(floor(img_size / crop_pct))`` and ``CenterCrop(img_size)`` of torchvision on a PIL image. torchvision does
not install here, so ``torchvision_*`` below write its arithmetic from its ``transforms/functional.py``
(``_compute_resized_output_size``: the shorter side to ``size``, the longer ``int(size * long / short)``;
``center_crop``: offsets ``int(round((side - crop) / 2.0))``) and ``timm_eval_view`` runs those steps with Pillow,
whose resize torchvision's ``Resize`` calls on a PIL image. keras.applications and keras-hub checkpoints are
evaluated with Keras' own layers (``Resizing(crop_to_aspect_ratio=True)``, keras-hub's ``ImageConverter``, and
``CenterCrop``), run here on each backend.

The sizes are the ones where one pixel matters: a longer side of fractional part above 0.5 (240 x 320 to 248:
330.67, which rounding makes 331) and below (300 x 400 to 256: 341.33), an odd margin whose half rounds up
(a1h's 235 to 224: 5.5 -> 6) and down (233 to 224: 4.5 -> 4, ties to even). Pixels are compared where both sides
compute the same numbers: the nearest-neighbour resize (Pillow's and the view's both sample
``floor((i + 0.5) * in / out)``) and identity resizes (integer pixels at their places).
"""

import math

import keras
import numpy as np
import pytest

from keras_preact.layers import EvalView
from keras_preact.models.presets import KERAS_RESNET_V2_INPUT, TIMM_A1H_INPUT, TIMM_RA4_INPUT
from keras_preact.preprocessing import InputConfig, timm_crop_fraction
from support import to_numpy

pytestmark = [pytest.mark.notf, pytest.mark.any_backend]

# (height, width) of the source images: fractional long sides above and below 0.5 at each resize, both
# orientations, squares at a1h's 235 (margin 11) and 233 (margin 9).
SIZES = [(240, 320), (320, 240), (300, 400), (400, 300), (235, 235), (233, 233), (235, 301), (375, 500), (61, 45)]


# ----------------------------------------------------------------------- torchvision's and timm's arithmetic
def torchvision_resized_size(height, width, size):
    """torchvision ``_compute_resized_output_size`` for an int ``size``: (height, width)."""
    short, long = (width, height) if width <= height else (height, width)
    new_short, new_long = size, int(size * long / short)
    return (new_long, new_short) if width <= height else (new_short, new_long)


def torchvision_center_crop_offsets(height, width, crop_height, crop_width):
    """torchvision ``center_crop``'s ``crop_top``, ``crop_left``."""
    return int(round((height - crop_height) / 2.0)), int(round((width - crop_width) / 2.0))


def timm_scale_size(img_size, crop_pct):
    """timm ``transforms_imagenet_eval``: ``scale_size = math.floor(img_size / crop_pct)``."""
    return math.floor(img_size / crop_pct)


def coordinates(height, width):
    """uint8 pixels that say where they are: any shift or stretch of a view changes them."""
    y, x = np.mgrid[0:height, 0:width]
    return np.stack([y % 256, x % 256, (7 * y + 13 * x) % 256], -1).astype(np.uint8)


def timm_eval_view(pixels, img_size, crop_pct, interpolation):
    """timm's eval transform on a PIL image: torchvision's Resize (Pillow's resize at torchvision's size), then
    CenterCrop at torchvision's offsets; float32 pixels."""
    from PIL import Image

    filters = {"nearest": Image.Resampling.NEAREST, "bilinear": Image.Resampling.BILINEAR,
               "bicubic": Image.Resampling.BICUBIC}
    new_height, new_width = torchvision_resized_size(*pixels.shape[:2], timm_scale_size(img_size, crop_pct))
    image = Image.fromarray(pixels).resize((new_width, new_height), filters[interpolation])
    top, left = torchvision_center_crop_offsets(new_height, new_width, img_size, img_size)
    return np.asarray(image.crop((left, top, left + img_size, top + img_size)), np.float32)


def timm_config(img_size, crop_pct, interpolation):
    return InputConfig(input_size=(img_size, img_size, 3), crop_fraction=timm_crop_fraction(img_size, crop_pct),
                       interpolation=interpolation)


# ----------------------------------------------------------------------------------------- geometry
@pytest.mark.core
@pytest.mark.parametrize("height, width", SIZES)
@pytest.mark.parametrize("img_size, crop_pct", [(224, 0.95), (224, 0.9), (224, 0.875), (32, 0.9), (23, 0.95)])
def test_the_timm_view_geometry_is_torchvisions(height, width, img_size, crop_pct):
    """view_geometry (what eval_view, EvalView and serving_bytes slice) is torchvision's Resize and CenterCrop at
    timm's scale size."""
    from keras_preact.preprocessing import view_geometry

    config = timm_config(img_size, crop_pct, "bicubic")
    assert config.resize_size == timm_scale_size(img_size, crop_pct)
    resized = torchvision_resized_size(height, width, timm_scale_size(img_size, crop_pct))
    top, left = torchvision_center_crop_offsets(*resized, img_size, img_size)
    geometry = view_geometry(height, width, config)
    assert geometry.source_box == (0, 0, height, width)
    assert geometry.resized == resized
    assert geometry.crop_box == (top, left, img_size, img_size)


@pytest.mark.core
def test_resize_sizes_are_truncated_and_ceiled_on_both_sides_of_a_half():
    """Sizes of fractional part above and below 0.5, where rounding differs from truncating (the longer side,
    timm's scale size) or from the ceiling (``resize_size``)."""
    from keras_preact.layers.eval_view import shorter_side_size

    assert torchvision_resized_size(240, 320, 248) == shorter_side_size(240, 320, 248) == (248, 330)  # 330.67
    assert torchvision_resized_size(300, 400, 256) == shorter_side_size(300, 400, 256) == (256, 341)  # 341.33
    assert shorter_side_size(320, 240, 248) == (330, 248)
    assert shorter_side_size(61, 45, 37) == (50, 37)  # 50.16
    assert shorter_side_size(47, 61, 37) == (37, 48)  # 48.02
    assert shorter_side_size(45, 59, 37) == (37, 48)  # 48.51
    # timm's floor(img_size / crop_pct): 235.79 -> 235 (a1h), 248.89 -> 248 (ra4), 35.56 -> 35, 24.21 -> 24.
    assert TIMM_A1H_INPUT.resize_size == 235 and TIMM_RA4_INPUT.resize_size == 248
    assert timm_config(32, 0.9, "nearest").resize_size == 35 and timm_config(23, 0.95, "nearest").resize_size == 24
    # resize_size = ceil(crop / crop_fraction): 36.57 -> 37 and 44.44 -> 45 (not 44), 256 exact.
    assert InputConfig(input_size=(32, 32, 3), crop_fraction=0.875).resize_size == 37
    assert InputConfig(input_size=(40, 40, 3), crop_fraction=0.9).resize_size == 45
    assert InputConfig().resize_size == 256


# ------------------------------------------------------------------------------------------- pixels
# Odd sides: no output pixel's sample (i + 0.5) * in / out is an integer, where float32 and Pillow's float64 could
# pick different neighbours. 243 x 323 to 248: 329.65 (rounding says 330); to 35: 46.52 (47).
@pytest.mark.parametrize("height, width", [(243, 323), (323, 243), (233, 301), (61, 45)])
@pytest.mark.parametrize("img_size, crop_pct", [(224, 0.95), (224, 0.9), (32, 0.9)])
def test_the_timm_view_is_timms_transform_to_the_pixel(height, width, img_size, crop_pct):
    """Nearest-neighbour: EvalView equals timm's transform (Pillow's resize at torchvision's size and offsets)
    exactly on every backend; a longer side rounded or an offset floored moves columns or rows."""
    if min(height, width) < timm_scale_size(img_size, crop_pct):
        pytest.skip("an upscale: covered by the downscales")
    pixels = coordinates(height, width)
    expected = timm_eval_view(pixels, img_size, crop_pct, "nearest")
    view = to_numpy(EvalView(timm_config(img_size, crop_pct, "nearest"), normalize=False)(pixels))
    np.testing.assert_array_equal(view, expected)


@pytest.mark.parametrize("config", [TIMM_A1H_INPUT, TIMM_RA4_INPUT], ids=["a1h-235", "ra4-248"])
def test_the_timm_view_of_an_image_at_the_scale_size_is_its_centre(config):
    """An image whose shorter side is timm's scale size is not resized (the longer side ``int(size * long /
    short)`` is its own): the view is the crop at torchvision's offsets, integer pixels, bicubic as the
    checkpoints are evaluated (a1h: margin 11, top round(5.5) = 6)."""
    side = config.resize_size
    pixels = coordinates(side, side + 77)
    top, left = torchvision_center_crop_offsets(side, side + 77, 224, 224)
    view = to_numpy(EvalView(config, normalize=False)(pixels[None]))[0]
    np.testing.assert_allclose(view, pixels[top:top + 224, left:left + 224].astype(np.float32), rtol=0, atol=1e-3)


def test_the_timm_bicubic_view_is_timms_within_pillows_rounding():
    """Bicubic with antialiasing, as a1h is evaluated: on a noisy 243 x 323 image within 0.5 levels of timm's
    transform on average (Pillow rounds each pass to uint8 and clips the cubic's overshoot, measured 0.40), while
    the view one pixel off differs by 60 on average."""
    pixels = np.random.default_rng(0).integers(0, 256, (243, 323, 3), dtype=np.uint8)
    expected = timm_eval_view(pixels, 224, 0.95, "bicubic")
    view = to_numpy(EvalView(TIMM_A1H_INPUT, normalize=False)(pixels))
    assert np.abs(view - expected).mean() < 0.5
    assert np.abs(view[1:] - expected[:-1]).mean() > 10  # what one pixel off looks like


# -------------------------------------------------------------------------------------- Keras' own
def keras_view(pixels, config):
    """Keras' layers: Resizing(crop_to_aspect_ratio=True) to ceil(crop / crop_fraction), then CenterCrop."""
    resized = keras.layers.Resizing(*config.resize_shape, crop_to_aspect_ratio=True,
                                    interpolation=config.interpolation, antialias=config.antialias)(pixels)
    return to_numpy(keras.layers.CenterCrop(*config.crop_size)(resized))


@pytest.mark.parametrize("height, width", [(240, 321), (321, 240), (61, 45), (45, 61)])
@pytest.mark.parametrize("kind", ["keras.applications", "keras-hub", "nearest-24x32"])
def test_the_keras_view_is_keras_layers(height, width, kind):
    """On each backend, EvalView of a keras.applications or keras-hub config equals Keras' own layers on it (on
    JAX within float32 rounding: the layer's resize is two products with the same kernels, measured 0.0012)."""
    config = {
        "keras.applications": lambda: KERAS_RESNET_V2_INPUT,
        "keras-hub": lambda: InputConfig(crop_fraction=1.0, crop_mode="keras", antialias=False),
        "nearest-24x32": lambda: InputConfig(input_size=(24, 32, 3), crop_mode="keras", interpolation="nearest"),
    }[kind]()
    assert config.crop_mode == "keras"
    pixels = np.random.default_rng(height).integers(0, 256, (height, width, 3), dtype=np.uint8).astype(np.float32)
    view = to_numpy(EvalView(config, normalize=False)(pixels))
    atol = 0.01 if keras.backend.backend() == "jax" else 1e-4
    np.testing.assert_allclose(view, keras_view(pixels, config), rtol=0, atol=atol)


@pytest.mark.core
def test_the_keras_view_geometry():
    """Keras' arithmetic: the centred square of a 240 x 321 image starts at int(81 / 2) = 40 (torchvision's round
    would say 40 too; at 240 x 323, 41.5 -> 41 where torchvision says 42), then the centre 224 of 256 at 16."""
    from keras_preact.preprocessing import view_geometry

    assert view_geometry(240, 321, KERAS_RESNET_V2_INPUT) == ((0, 40, 240, 240), (256, 256), (16, 16, 224, 224))
    assert view_geometry(240, 323, KERAS_RESNET_V2_INPUT).source_box == (0, 41, 240, 240)
    keras_hub = KERAS_RESNET_V2_INPUT.replace(crop_fraction=1.0)
    assert view_geometry(500, 375, keras_hub) == ((62, 0, 375, 375), (224, 224), (0, 0, 224, 224))


@pytest.mark.parametrize("height, width", [(240, 321), (45, 61)])
def test_the_keras_hub_view_is_keras_hubs_image_converter(height, width):
    """keras-hub's ResNet image converter (its defaults: crop to the aspect ratio, no antialiasing) resizes as
    EvalView does with keras-hub's input config."""
    keras_hub = pytest.importorskip("keras_hub", reason="keras-hub's ImageConverter")
    config = InputConfig(input_size=(32, 32, 3), crop_fraction=1.0, crop_mode="keras", antialias=False,
                         mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))
    converter = keras_hub.layers.ResNetImageConverter(image_size=(32, 32), scale=1.0)
    pixels = np.random.default_rng(width).integers(0, 256, (height, width, 3), dtype=np.uint8).astype(np.float32)
    np.testing.assert_allclose(to_numpy(EvalView(config)(pixels[None])), to_numpy(converter(pixels[None])),
                               rtol=0, atol=1e-3)


# ------------------------------------------------------------------- TensorFlow's graph (tf.data, serving_bytes)
@pytest.mark.parametrize("height, width", [(243, 323), (323, 243), (233, 301)])
def test_the_tensorflow_view_is_timms_transform_to_the_pixel(height, width):
    """eval_view (training's evaluation in tf.data and every SavedModel's serving_bytes) on encoded PNGs, images of
    sizes the graph does not know: timm's transform to the pixel (nearest), the a1h and ra4 scale sizes."""
    tf = pytest.importorskip("tensorflow", reason="eval_view is a TensorFlow graph function")
    from keras_preact.preprocessing import eval_view
    from support import encode_image

    pixels = coordinates(height, width)
    encoded = tf.constant([encode_image(pixels, "PNG")])
    for crop_pct in (0.95, 0.9):
        view = eval_view(encoded, timm_config(224, crop_pct, "nearest")).numpy()[0]
        np.testing.assert_array_equal(view, timm_eval_view(pixels, 224, crop_pct, "nearest"))


@pytest.mark.parametrize("height, width", [(240, 323), (323, 240), (45, 61)])
def test_the_tensorflow_view_is_keras_layers(height, width):
    """eval_view of a keras.applications or keras-hub config equals Keras' own layers on TensorFlow."""
    tf = pytest.importorskip("tensorflow", reason="eval_view is a TensorFlow graph function")
    if keras.backend.backend() != "tensorflow":
        pytest.skip("Keras' layers compute in TensorFlow on the TensorFlow backend only")
    from keras_preact.preprocessing import eval_view

    pixels = np.random.default_rng(width).integers(0, 256, (height, width, 3), dtype=np.uint8)
    for config in (KERAS_RESNET_V2_INPUT, InputConfig(crop_fraction=1.0, crop_mode="keras", antialias=False)):
        view = eval_view(tf.constant(pixels), config).numpy()
        np.testing.assert_array_equal(view, keras_view(pixels.astype(np.float32), config))
