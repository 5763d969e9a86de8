"""Image preprocessing driven by a model's ``InputConfig``: one definition for evaluation and export.

The evaluation view of an encoded image is, in this order (``eval_view``):

1. ``decode_image``: JPEG/PNG/GIF/BMP bytes to uint8 RGB ``[H, W, 3]`` (the first frame of a GIF);
2. the resize and 3. the centre crop to the crop ``(height, width)`` = ``input_size[:2]``, computed as the
   checkpoint's own library computes them (``InputConfig.crop_mode``, ``view_geometry``):

   - ``"torchvision"`` (timm's eval transform, the default): ``resize_shorter_side`` to
     ``InputConfig.resize_size`` = ``ceil(max(crop) / crop_fraction)``, the longer side truncated
     (``int(size * longer / shorter)``, torchvision's ``Resize``), then ``center_crop`` at offsets
     ``int(round((side - crop) / 2))`` (torchvision's ``CenterCrop``; Python's round, ties to even);
   - ``"keras"`` (keras.applications and keras-hub): ``resize_to_aspect_ratio``, Keras'
     ``Resizing(crop_to_aspect_ratio=True)``: the centred largest region of the target's aspect ratio
     (Keras' float32 arithmetic, offsets truncated), resized to ``ceil(crop / crop_fraction)`` per side; then
     the centre crop at offsets ``(side - crop) // 2`` (``keras.layers.CenterCrop``);

   both resize with the config's ``interpolation`` and ``antialias``, float32 output;

then ``normalize``: ``(pixels - mean) / std`` in 0-255 pixel units. ``crop_fraction`` 0.875 is the
standard ImageNet test (shorter side 256, centre 224 x 224); 1.0 resizes the shorter side to the crop
itself (CIFAR, whose images are already at the crop size, and the 320 x 320 test of a network trained at
224: ``InputConfig.at_test_size``).

``InputConfig``, ``view_geometry`` and the format tables need nothing but the standard library. The image
functions are TensorFlow graph functions (``tf.io``/``tf.image``), run inside ``tf.data`` and inside exported
SavedModels; TensorFlow is imported when one is called, and without it the call raises one ImportError
saying so. On every backend, without TensorFlow, the same view is the Keras layer
``keras_preact.layers.EvalView`` (``keras.ops``, saved with a model) on pixels that ``decode_image_array``
decodes with Pillow.

Examples:
    >>> from keras_preact.preprocessing import InputConfig
    >>> config = InputConfig(input_size=(224, 224, 3), crop_fraction=0.875)
    >>> config.resize_size, config.crop_size  # shorter side to 256, then the centre 224 x 224
    (256, (224, 224))
"""

import collections
import dataclasses
import math
import numbers

IMAGE_FORMATS = ("JPEG", "PNG", "GIF", "BMP")  # what tf.io.decode_image reads (and Pillow's names)
# The leading bytes of each accepted format (the prefixes tf.io.decode_image itself recognises).
IMAGE_MAGIC = {"JPEG": b"\xff\xd8\xff", "PNG": b"\x89PNG", "GIF": b"GIF8", "BMP": b"BM"}
INTERPOLATIONS = ("bilinear", "nearest", "bicubic", "area", "lanczos3", "lanczos5", "gaussian", "mitchellcubic")
# Whose arithmetic the resize and centre crop follow: torchvision's (timm's checkpoints) or Keras' (keras.applications,
# keras-hub); ``view_geometry`` says what each computes.
CROP_MODES = ("torchvision", "keras")
OPTIONAL_FIELDS = ("crop_mode", "antialias")  # InputConfig.to_dict writes them where they are not the defaults
STANDARD_CROP_FRACTION = 0.875  # 224 / 256: the shorter side resized to 256, the centre 224 x 224 kept
MISSING_TENSORFLOW = (
    "keras_preact.preprocessing.{} runs tf.io/tf.image graph ops and needs TensorFlow: pip install tensorflow"
)


def _tensorflow(function):
    try:
        import tensorflow as tf
    except ImportError:
        raise ImportError(MISSING_TENSORFLOW.format(function)) from None
    return tf


# ------------------------------------------------------------------------------------- InputConfig
def _is_number(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _nested_shape(value):
    """The shape of a nested list/tuple of numbers, or None when it is ragged or holds non-numbers."""
    if _is_number(value):
        return ()
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        value = value.tolist()
    if not isinstance(value, (list, tuple)) or not value:
        return None
    shapes = {_nested_shape(v) for v in value}
    if len(shapes) != 1 or None in shapes:
        return None
    return (len(value), *shapes.pop())


def _as_tuples(value):
    if hasattr(value, "tolist"):
        value = value.tolist()
    return tuple(_as_tuples(v) for v in value) if isinstance(value, (list, tuple)) else float(value)


def _as_lists(value):
    return [_as_lists(v) for v in value] if isinstance(value, tuple) else value


def _flat(value):
    return [x for v in value for x in _flat(v)] if isinstance(value, tuple) else [value]


@dataclasses.dataclass(frozen=True)
class InputConfig:
    """What a network expects: its input size, pixel statistics and evaluation crop.

    Attributes:
        input_size: ``(height, width, channels)`` of the network input; ``(height, width)`` is the
            crop the evaluation view ends with.
        mean, std: per-channel statistics in 0-255 pixel units (``normalize``); ``mean`` may also be
            an ``[height, width, channels]`` mean image (per-pixel mean subtraction).
        crop_fraction: the share of the resized image's shorter side the centre crop keeps, in (0, 1]:
            the shorter side is first resized to ``resize_size = ceil(max(crop) / crop_fraction)``.
        interpolation: the resize method (a ``tf.image.ResizeMethod`` name, ``INTERPOLATIONS``).
        crop_mode: whose arithmetic the resize and the centre crop follow (``CROP_MODES``, ``view_geometry``):
            ``"torchvision"`` (timm's checkpoints and the networks trained here: the shorter side resized, the
            longer truncated, offsets rounded) or ``"keras"`` (keras.applications and keras-hub: Keras'
            ``Resizing(crop_to_aspect_ratio=True)`` then ``CenterCrop``, offsets truncated).
        antialias: whether a downscaling resize low-pass filters first (as PIL, which timm's transforms resize
            with); keras-hub's ``ImageConverter`` does not (``antialias=False``, its default).

    Every field is checked on construction; a bad one raises ValueError naming it.

    Examples:
        >>> from keras_preact.preprocessing import InputConfig
        >>> config = InputConfig()  # ImageNet's: fb.resnet.torch's statistics, the centre 224 of 256
        >>> config.resize_size, config.at_test_size(320).resize_size  # the paper's 320 x 320 test: no crop
        (256, 320)
        >>> InputConfig.from_dict(config.to_dict()) == config
        True
        >>> InputConfig(std=(58.4, 57.1, 0.0))
        Traceback (most recent call last):
        ...
        ValueError: Invalid std=(58.4, 57.1, 0.0): expected 3 positive numbers (one per channel) in 0-255 pixel units.
    """

    input_size: tuple = (224, 224, 3)
    mean: tuple = (123.675, 116.28, 103.53)
    std: tuple = (58.395, 57.12, 57.375)
    crop_fraction: float = STANDARD_CROP_FRACTION
    interpolation: str = "bilinear"
    crop_mode: str = "torchvision"
    antialias: bool = True

    def __post_init__(self):
        size = self.input_size
        if hasattr(size, "tolist"):
            size = size.tolist()
        if not isinstance(size, (list, tuple)) or len(size) != 3 or not all(
            isinstance(s, numbers.Integral) and not isinstance(s, bool) and s > 0 for s in size
        ):
            raise ValueError(f"Invalid input_size={self.input_size!r}: expected (height, width, channels), "
                             "three positive integers.")
        size = tuple(int(s) for s in size)
        object.__setattr__(self, "input_size", size)
        channels = size[2]
        for field in ("mean", "std"):
            value = getattr(self, field)
            shape = _nested_shape(value)
            allowed = [(channels,)] + ([size] if field == "mean" else [])
            if shape not in allowed or (field == "std" and not all(v > 0 for v in _flat(_as_tuples(value)))):
                what = "positive numbers" if field == "std" else "finite numbers"
                image = f", or an {list(size)} image (a per-pixel mean)" if field == "mean" else ""
                shown = value if shape is None or len(shape) < 2 else f"<{'x'.join(map(str, shape))} values>"
                raise ValueError(f"Invalid {field}={shown!r}: expected {channels} {what} (one per channel){image} "
                                 "in 0-255 pixel units.")
            object.__setattr__(self, field, _as_tuples(value))
        if not _is_number(self.crop_fraction) or not 0 < self.crop_fraction <= 1:
            raise ValueError(f"Invalid crop_fraction={self.crop_fraction!r}: expected a number in (0, 1] (the share "
                             "of the resized shorter side the centre crop keeps; 0.875 for the standard 224/256).")
        object.__setattr__(self, "crop_fraction", float(self.crop_fraction))
        if self.interpolation not in INTERPOLATIONS:
            raise ValueError(f"Invalid interpolation={self.interpolation!r}. Allowed values: "
                             f"{', '.join(map(repr, INTERPOLATIONS))}.")
        if self.crop_mode not in CROP_MODES:
            raise ValueError(f"Invalid crop_mode={self.crop_mode!r}. Allowed values: "
                             f"{', '.join(map(repr, CROP_MODES))} (whose arithmetic the resize and crop follow).")
        if not isinstance(self.antialias, bool):
            raise ValueError(f"Invalid antialias={self.antialias!r}: True or False.")

    @property
    def crop_size(self):
        """``(height, width)`` of the centre crop: the network input size."""
        return self.input_size[:2]

    @property
    def resize_size(self):
        """The shorter side's size before the centre crop: ``ceil(max(crop) / crop_fraction)``.

        The rule training's ImageNet evaluation used (``ceil(crop * 256 / 224)``: 256 at 224, 37 at
        32). The quotient is rounded to 6 decimals before the ceiling, so that a fraction that is not
        exact in binary (e.g. 0.9 at 90) does not add a pixel; at 0.875 the quotient is a multiple of
        1/7, so this changes nothing.
        """
        return self._fraction_size(max(self.crop_size))

    @property
    def resize_shape(self):
        """``(height, width)`` the ``"keras"`` crop mode resizes to: ``ceil(side / crop_fraction)`` for each side
        of the crop (``(resize_size, resize_size)`` for a square crop)."""
        return tuple(self._fraction_size(side) for side in self.crop_size)

    def _fraction_size(self, side):
        return math.ceil(round(side / self.crop_fraction, 6))

    def at_test_size(self, test_size):
        """This config evaluated at another resolution, by the rule training's evaluation uses: a
        test crop larger than the training crop (the paper's 320 x 320 test of a network trained at
        224) resizes the shorter side to the crop itself (``crop_fraction=1.0``); a smaller or equal one
        keeps this ``crop_fraction``. ``test_size``: an int or ``(height, width)``.
        """
        height, width = (test_size, test_size) if isinstance(test_size, numbers.Integral) else tuple(test_size)
        larger = max(height, width) > max(self.crop_size)
        mean = self.mean if isinstance(self.mean[0], float) else None
        if mean is None:
            raise ValueError("Invalid test_size: a per-pixel mean image is defined at one input size only.")
        return dataclasses.replace(self, input_size=(height, width, self.input_size[2]),
                                   crop_fraction=1.0 if larger else self.crop_fraction)

    def replace(self, **changes):
        """A copy with ``changes`` applied (and checked)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self):
        """JSON-ready: lists for the tuples. ``InputConfig.from_dict(config.to_dict()) == config``.

        ``crop_mode`` and ``antialias`` are written only where they differ from their defaults, so a config of the
        default arithmetic writes (and fingerprints, in a run's manifest) as it did before they existed."""
        defaults = {f.name: f.default for f in dataclasses.fields(self) if f.name in OPTIONAL_FIELDS}
        return {f.name: _as_lists(getattr(self, f.name)) for f in dataclasses.fields(self)
                if f.name not in defaults or getattr(self, f.name) != defaults[f.name]}

    @classmethod
    def from_dict(cls, config):
        """An InputConfig from ``to_dict()``'s output; unknown keys raise ValueError naming them, absent
        ones take the defaults."""
        if not isinstance(config, dict):
            raise ValueError(f"Invalid input config {config!r:.100}: expected a dict with the keys "
                             f"{', '.join(f.name for f in dataclasses.fields(cls))}.")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(config) - names)
        if unknown:
            raise ValueError(f"Invalid input config: unknown key(s) {', '.join(map(repr, unknown))}; the keys are "
                             f"{', '.join(sorted(names))}.")
        return cls(**config)


def _view_config(config):
    """An InputConfig from an InputConfig or a tuple ``(crop_size, crop_fraction[, interpolation])``."""
    if isinstance(config, InputConfig):
        return config
    if isinstance(config, (tuple, list)) and len(config) in (2, 3):
        crop_size, crop_fraction, *interpolation = config
        size = (crop_size, crop_size) if isinstance(crop_size, numbers.Integral) else tuple(crop_size)
        return InputConfig(input_size=(*size, 3), crop_fraction=crop_fraction,
                           interpolation=interpolation[0] if interpolation else "bilinear")
    raise ValueError(f"Invalid input_config={config!r}: expected an InputConfig or (crop_size, crop_fraction"
                     "[, interpolation]).")


def input_config_from_image_converter(converter_config, default):
    """An InputConfig from a keras-hub ``ImageConverter``'s ``get_config()``: Keras' arithmetic
    (``crop_mode="keras"``, its ``crop_to_aspect_ratio=True``: the centred region of the input's aspect ratio,
    resized; ``crop_fraction`` 1.0), its ``antialias`` (keras-hub's default False) and ``interpolation``, and
    ``pixels * scale + offset`` as ``(pixels - mean) / std`` (``std = 1 / scale``, ``mean = -offset / scale``).
    ``image_size`` None takes ``default``'s input size. A converter that pads to the aspect ratio, or squashes
    (``crop_to_aspect_ratio=False``), has no InputConfig: ValueError naming it.

    Examples:
        >>> from keras_preact.preprocessing import InputConfig, input_config_from_image_converter
        >>> converter = {"image_size": [224, 224], "scale": 1 / 127.5, "offset": -1.0, "interpolation": "bicubic"}
        >>> config = input_config_from_image_converter(converter, InputConfig())
        >>> config.mean, config.crop_mode, config.antialias, config.crop_fraction
        ((127.5, 127.5, 127.5), 'keras', False, 1.0)
    """
    if converter_config.get("pad_to_aspect_ratio") or not converter_config.get("crop_to_aspect_ratio", True):
        raise ValueError("Invalid image converter: pad_to_aspect_ratio=True or crop_to_aspect_ratio=False has no "
                         "InputConfig (its view crops the centred region of the input's aspect ratio).")

    def per_channel(name, empty):
        value = converter_config.get(name)
        value = [empty] * 3 if value is None else value
        return [float(value)] * 3 if _is_number(value) else [float(v) for v in value]

    scale, offset = per_channel("scale", 1.0), per_channel("offset", 0.0)
    if not all(v > 0 for v in scale):
        raise ValueError(f"Invalid image converter: scale={converter_config.get('scale')!r} must be positive.")
    size = converter_config.get("image_size")
    return InputConfig(input_size=(*size, 3) if size is not None else default.input_size,
                       mean=tuple(-o / s for o, s in zip(offset, scale)), std=tuple(1.0 / s for s in scale),
                       crop_fraction=1.0, interpolation=converter_config.get("interpolation", "bilinear"),
                       crop_mode="keras", antialias=bool(converter_config.get("antialias", False)))


def timm_crop_fraction(size, crop_pct):
    """The crop fraction whose ``InputConfig.resize_size`` is timm's ``floor(size / crop_pct)`` (timm's
    ``pretrained_cfg`` gives ``crop_pct``; ``resize_size`` rounds up, so ``size / floor(size / crop_pct)`` is nudged
    to the largest fraction that still gives timm's size).

    Examples:
        >>> from keras_preact.preprocessing import InputConfig, timm_crop_fraction
        >>> InputConfig(crop_fraction=timm_crop_fraction(224, 0.95)).resize_size  # timm: floor(224 / 0.95)
        235
    """
    resize = math.floor(size / crop_pct)
    fraction = size / resize
    while math.ceil(size / fraction) > resize:  # float rounding: the largest fraction giving resize
        fraction = math.nextafter(fraction, 2.0)
    return fraction


# ------------------------------------------------------------------------------- view geometry
class ViewGeometry(collections.namedtuple("ViewGeometry", ["source_box", "resized", "crop_box"])):
    """Where the evaluation view of an image comes from (``view_geometry``): ``source_box``
    ``(top, left, height, width)`` of the image that is resized (the whole image in the ``"torchvision"`` mode),
    ``resized`` ``(height, width)`` it is resized to, and ``crop_box`` ``(top, left, height, width)`` of the resized
    image that is kept.

    Examples:
        >>> from keras_preact.preprocessing import InputConfig, view_geometry
        >>> view_geometry(235, 300, InputConfig(crop_fraction=224 / 235)).crop_box  # a margin of 11: round(5.5)
        (6, 38, 224, 224)
    """

    __slots__ = ()


def torchvision_resized_size(height, width, size):
    """``(height, width)`` of an image whose shorter side torchvision's ``Resize(size)`` resizes to ``size``:
    the longer side ``int(size * longer / shorter)`` (truncated; ``_compute_resized_output_size``).

    Examples:
        >>> from keras_preact.preprocessing import torchvision_resized_size
        >>> torchvision_resized_size(240, 320, 248)  # 320 * 248 / 240 = 330.67: 330, not 331
        (248, 330)
    """
    if width <= height:
        return int(size * height / width), size
    return size, int(size * width / height)


def torchvision_crop_offsets(height, width, crop_height, crop_width):
    """``(top, left)`` of torchvision's ``CenterCrop``: ``int(round((side - crop) / 2.0))`` (Python's round, ties to
    even).

    Examples:
        >>> from keras_preact.preprocessing import torchvision_crop_offsets
        >>> torchvision_crop_offsets(235, 235, 224, 224), torchvision_crop_offsets(233, 233, 224, 224)
        ((6, 6), (4, 4))
    """
    return int(round((height - crop_height) / 2.0)), int(round((width - crop_width) / 2.0))


def keras_aspect_ratio_box(height, width, target_height, target_width):
    """``(top, left, height, width)`` of the region Keras' ``resize(crop_to_aspect_ratio=True)`` keeps: the centred
    largest region of the target's aspect ratio, sides and offsets computed in float32 and truncated, as Keras'
    backends compute them.

    Examples:
        >>> from keras_preact.preprocessing import keras_aspect_ratio_box
        >>> keras_aspect_ratio_box(240, 321, 224, 224)  # the centred 240 x 240 square, (321 - 240) / 2 truncated
        (0, 40, 240, 240)
    """
    import numpy as np

    f32 = np.float32
    crop_height = max(min(height, int(f32(width * target_height) / f32(target_width))), 1)
    crop_width = max(min(width, int(f32(height * target_width) / f32(target_height))), 1)
    return int(f32(height - crop_height) / f32(2)), int(f32(width - crop_width) / f32(2)), crop_height, crop_width


def view_geometry(height, width, input_config):
    """The ``ViewGeometry`` of an image of ``height`` x ``width`` in the evaluation view of ``input_config`` (an
    ``InputConfig`` or ``(crop_size, crop_fraction[, interpolation])``), by its ``crop_mode``: what ``eval_view``,
    the ``EvalView`` layer and every export's ``serving_bytes`` compute.

    Examples:
        >>> from keras_preact.preprocessing import InputConfig, view_geometry
        >>> view_geometry(240, 320, InputConfig(crop_fraction=224 / 248))  # timm's: 330 wide, left round(53.0)
        ViewGeometry(source_box=(0, 0, 240, 320), resized=(248, 330), crop_box=(12, 53, 224, 224))
        >>> view_geometry(240, 320, InputConfig(crop_mode="keras"))  # Keras': the centre square, 256, then 16
        ViewGeometry(source_box=(0, 40, 240, 240), resized=(256, 256), crop_box=(16, 16, 224, 224))
    """
    config = _view_config(input_config)
    crop_height, crop_width = config.crop_size
    if config.crop_mode == "keras":
        resized = config.resize_shape
        source = keras_aspect_ratio_box(height, width, *resized)
        top, left = (resized[0] - crop_height) // 2, (resized[1] - crop_width) // 2
    else:
        source = (0, 0, height, width)
        resized = torchvision_resized_size(height, width, config.resize_size)
        top, left = torchvision_crop_offsets(*resized, crop_height, crop_width)
    return ViewGeometry(source, resized, (top, left, crop_height, crop_width))


# --------------------------------------------------------------------------------- formats
def image_format(data):
    """The format name (``IMAGE_FORMATS``) whose magic bytes ``data`` starts with, or None.

    Examples:
        >>> from keras_preact.preprocessing import image_format
        >>> image_format(b"\\x89PNG\\r\\n\\x1a\\n"), image_format(b"\\xff\\xd8\\xff\\xe0"), image_format(b"<svg")
        ('PNG', 'JPEG', None)
    """
    head = bytes(data[:8])
    return next((name for name, magic in IMAGE_MAGIC.items() if head.startswith(magic)), None)


SIXTEEN_BIT_GRAY = ("I;16", "I;16B", "I;16L", "I;16N", "I")  # Pillow's modes of 16-bit grayscale PNGs


def pillow_pixels(image):
    """uint8 ``[H, W, 3]`` pixels of a Pillow image, as TensorFlow's ``decode_image(channels=3)`` gives them.

    ``convert("RGB")`` does that for 8-bit images of every mode (1, L, LA, P, RGB, RGBA, CMYK...), but clips a
    16-bit grayscale image's samples at 255 (nearly white); libpng, under TensorFlow, keeps each sample's high
    byte, as here.

    Examples:
        >>> import numpy as np
        >>> from PIL import Image
        >>> from keras_preact.preprocessing import pillow_pixels
        >>> gray16 = Image.fromarray(np.array([[0, 255, 256, 65535]], np.uint16))
        >>> gray16.mode, pillow_pixels(gray16)[0, :, 0].tolist()
        ('I;16', [0, 0, 1, 255])
    """
    import numpy as np

    if image.mode in SIXTEEN_BIT_GRAY:
        gray = (np.clip(np.asarray(image, np.int64), 0, 65535) >> 8).astype(np.uint8)
        return np.repeat(gray[:, :, None], 3, axis=2)
    return np.asarray(image.convert("RGB"))


def decode_image_array(encoded):
    """Encoded JPEG/PNG/GIF/BMP bytes (or a file path) to a uint8 ``[H, W, 3]`` numpy array with Pillow,
    without TensorFlow: ``decode_image``'s pixels (libjpeg's accurate IDCT; a GIF's first frame).

    A file that is not an image raises ValueError naming what Pillow reads.

    Examples:
        >>> import io
        >>> from PIL import Image
        >>> from keras_preact.preprocessing import decode_image_array
        >>> png = io.BytesIO()
        >>> Image.new("RGB", (6, 4), (10, 20, 30)).save(png, "PNG")
        >>> image = decode_image_array(png.getvalue())
        >>> image.shape, image.dtype.name, image[0, 0].tolist()
        ((4, 6, 3), 'uint8', [10, 20, 30])
    """
    import io

    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:
        raise ImportError(
            "keras_preact.preprocessing.decode_image_array decodes with Pillow: pip install pillow"
        ) from None
    source = io.BytesIO(bytes(encoded)) if isinstance(encoded, (bytes, bytearray, memoryview)) else encoded
    try:
        with Image.open(source, formats=IMAGE_FORMATS) as image:
            return pillow_pixels(image)
    except FileNotFoundError:
        raise
    except (UnidentifiedImageError, SyntaxError, OSError) as error:
        raise ValueError(f"Invalid encoded image: not a readable {'/'.join(IMAGE_FORMATS)} image ({error}).") from None


def is_encoded_image(encoded):
    """A bool tensor: whether the string tensor ``encoded`` starts like a JPEG/PNG/GIF/BMP file (a
    cheap check on the first bytes, nothing decoded).

    Examples:
        >>> import tensorflow as tf
        >>> from keras_preact.preprocessing import is_encoded_image
        >>> bool(is_encoded_image(tf.io.encode_png(tf.zeros((2, 2, 3), tf.uint8)))), bool(is_encoded_image(b"text"))
        (True, False)
    """
    tf = _tensorflow("is_encoded_image")
    return tf.reduce_any(tf.stack([tf.strings.substr(encoded, 0, len(m)) == m for m in IMAGE_MAGIC.values()]))


# ------------------------------------------------------------------------------- image functions
def decode_image(encoded, channels=3):
    """Encoded JPEG/PNG/GIF/BMP bytes (a scalar string tensor) to a uint8 ``[H, W, channels]`` image;
    a GIF gives its first frame.

    Uncompressed 1-, 4- and 8-bit BMPs are decoded through their palette here, in graph ops (as Pillow and
    the BMP specification read them): TensorFlow's BMP decoder reads 8-bit palette indices as gray levels
    and refuses 1- and 4-bit BMPs.

    JPEGs are decoded with libjpeg's accurate integer IDCT (``dct_method="INTEGER_ACCURATE"``), as Pillow
    (the TensorFlow-free path and the ONNX/OpenVINO servers) and torchvision decode them, so every path
    sees the same pixels. TensorFlow's default, the fast IDCT, differs by up to 5 levels on CIFAR-10's
    JPEGs (every test image).

    Examples:
        >>> import tensorflow as tf
        >>> from keras_preact.preprocessing import decode_image
        >>> image = decode_image(tf.io.encode_jpeg(tf.zeros((4, 6, 3), tf.uint8)))
        >>> tuple(image.shape), image.dtype.name
        ((4, 6, 3), 'uint8')
    """
    tf = _tensorflow("decode_image")
    encoded = tf.convert_to_tensor(encoded, tf.string)

    def decode_other():
        return tf.io.decode_image(encoded, channels=channels, expand_animations=False)

    def decode_bmp():
        header = _bmp_header(tf, encoded)
        return tf.cond(header["indexed"], lambda: _decode_indexed_bmp(tf, encoded, header, channels), decode_other)

    return tf.cond(
        tf.io.is_jpeg(encoded),
        lambda: tf.io.decode_jpeg(encoded, channels=channels, dct_method="INTEGER_ACCURATE"),
        lambda: tf.cond(tf.strings.substr(encoded, 0, 2) == IMAGE_MAGIC["BMP"], decode_bmp, decode_other),
    )


# BITMAPINFOHEADER and its successors (V2-V5, OS/2 2.x): a palette of 4-byte BGRX entries follows the header.
BMP_INFO_HEADER_SIZES = (40, 52, 56, 64, 108, 124)
BMP_INDEXED_BITS = (1, 4, 8)


def _bmp_header(tf, encoded):
    """The fields of a BMP's header that an indexed (palette) image needs, as int64 tensors, and ``indexed``: whether
    the BMP ``encoded`` is an uncompressed 1-, 4- or 8-bit BMP with an info header (what ``tf.io.decode_bmp`` gets
    wrong: it reads 8-bit indices as gray levels, ignoring the palette, and refuses 1- and 4-bit images)."""
    # Ten little-endian int32 from byte 10 (zeros past a short file): the pixels' offset, the info header's size, width,
    # height (negative: rows stored top-down), planes | bits << 16, compression, 3 sizes, the palette's colours.
    head = tf.strings.substr(tf.strings.join([tf.strings.substr(encoded, 10, 40), tf.constant(bytes(40))]), 0, 40)
    head = tf.cast(tf.io.decode_raw(head, tf.int32, little_endian=True), tf.int64)
    fields = {"offset": head[0], "header_size": head[1], "width": head[2], "height": head[3], "bits": head[4] // 65536,
              "compression": head[5], "colors": head[9]}
    fields["indexed"] = (
        tf.reduce_any(tf.equal(fields["header_size"], BMP_INFO_HEADER_SIZES))
        & tf.reduce_any(tf.equal(fields["bits"], BMP_INDEXED_BITS))
        & tf.equal(fields["compression"], 0)
    )
    return fields


def _decode_indexed_bmp(tf, encoded, header, channels):
    """An uncompressed 1-, 4- or 8-bit BMP decoded through its palette (as Pillow and the BMP specification read it):
    rows padded to 4 bytes, bottom-up unless the height is negative, the most significant bits the leftmost pixel;
    indices past the palette are black. uint8 ``[H, W, channels]`` (``channels`` 0 or 3: RGB; 4: opaque RGBA; 1: the
    luma of ITU-R 601-2, as Pillow's ``convert("L")``)."""
    width, bits = header["width"], header["bits"]
    height = tf.abs(header["height"])
    row_bytes = (width * bits + 31) // 32 * 4
    fits = ((width > 0) & (height > 0) & (header["offset"] >= 0)
            & (header["offset"] + row_bytes * height <= tf.cast(tf.strings.length(encoded), tf.int64)))
    with tf.control_dependencies([tf.debugging.Assert(fits, ["The BMP is truncated or its size is invalid."])]):
        data = tf.strings.substr(encoded, header["offset"], row_bytes * height)
    rows = tf.reshape(tf.io.decode_raw(data, tf.uint8), tf.stack([height, row_bytes]))
    rows = tf.gather(rows, tf.where(header["height"] > 0, height - 1 - tf.range(height), tf.range(height)))  # top first
    per_byte = 8 // bits
    shifts = tf.cast(tf.range(per_byte - 1, -1, -1) * bits, tf.uint8)
    mask = tf.cast(tf.bitwise.right_shift(tf.constant(255, tf.int64), 8 - bits), tf.uint8)  # the low ``bits`` bits
    indices = tf.bitwise.bitwise_and(tf.bitwise.right_shift(rows[:, :, None], shifts), mask)
    indices = tf.reshape(indices, tf.stack([height, row_bytes * per_byte]))[:, :width]
    # The palette's BGRX entries, zeros (black) after its colours; 256 entries cover every index of 8 bits or fewer.
    colors = tf.where(header["colors"] > 0, tf.minimum(header["colors"], 256), 256)
    palette = tf.strings.join(
        [tf.strings.substr(encoded, 14 + header["header_size"], colors * 4), tf.constant(bytes(1024))]
    )
    palette = tf.reshape(tf.io.decode_raw(tf.strings.substr(palette, 0, 1024), tf.uint8), (256, 4))[:, 2::-1]
    rgb = tf.gather(palette, tf.cast(indices, tf.int32))
    if channels == 1:
        luma = tf.cast(rgb, tf.int32) * tf.constant([19595, 38470, 7471], tf.int32)
        return tf.cast((tf.reduce_sum(luma, -1, keepdims=True) + 0x8000) // 65536, tf.uint8)
    if channels == 4:
        return tf.concat([rgb, tf.fill(tf.concat([tf.shape(rgb)[:2], [1]], 0), tf.constant(255, tf.uint8))], -1)
    return rgb


def resize_shorter_side(image, size, interpolation="bilinear", antialias=True):
    """Resize ``image`` (``[H, W, C]`` or ``[N, H, W, C]``) so that its shorter side is ``size``, as torchvision's
    ``Resize(size)``: the longer side ``int(size * longer / shorter)`` (truncated, in float64 as Python computes it;
    ``torchvision_resized_size``). The output is float32. ``antialias=True`` (the default, as training and PIL)
    low-pass filters when downscaling.

    Examples:
        >>> import tensorflow as tf
        >>> from keras_preact.preprocessing import resize_shorter_side
        >>> tuple(resize_shorter_side(tf.zeros((240, 320, 3)), 248).shape)  # 320 * 248 / 240 = 330.67
        (248, 330, 3)
    """
    tf = _tensorflow("resize_shorter_side")
    shape = tf.shape(image)[-3:-1]
    shorter = tf.cast(tf.reduce_min(shape), tf.float64)
    new = tf.cast(tf.floor(tf.cast(size, tf.float64) * tf.cast(shape, tf.float64) / shorter), tf.int32)
    return tf.cast(tf.image.resize(image, new, method=interpolation, antialias=antialias), tf.float32)


def resize_to_aspect_ratio(image, size, interpolation="bilinear", antialias=True):
    """Resize ``image`` (``[H, W, C]`` or ``[N, H, W, C]``) to ``size`` ``(height, width)`` as Keras'
    ``resize(crop_to_aspect_ratio=True)`` (keras-hub's ``ImageConverter``): the centred largest region of the
    target's aspect ratio (``keras_aspect_ratio_box``: float32 arithmetic, truncated), then resized. float32 out.

    Examples:
        >>> import tensorflow as tf
        >>> from keras_preact.preprocessing import resize_to_aspect_ratio
        >>> tuple(resize_to_aspect_ratio(tf.zeros((240, 320, 3)), (224, 224)).shape)
        (224, 224, 3)
    """
    tf = _tensorflow("resize_to_aspect_ratio")
    height, width = tf.shape(image)[-3], tf.shape(image)[-2]
    target_height, target_width = size
    crop_height = tf.cast(tf.cast(width * target_height, tf.float32) / target_width, tf.int32)
    crop_height = tf.maximum(tf.minimum(height, crop_height), 1)
    crop_width = tf.cast(tf.cast(height * target_width, tf.float32) / target_height, tf.int32)
    crop_width = tf.maximum(tf.minimum(width, crop_width), 1)
    top = tf.cast(tf.cast(height - crop_height, tf.float32) / 2, tf.int32)
    left = tf.cast(tf.cast(width - crop_width, tf.float32) / 2, tf.int32)
    image = image[..., top:top + crop_height, left:left + crop_width, :]
    return tf.cast(tf.image.resize(image, size, method=interpolation, antialias=antialias), tf.float32)


def center_crop(image, size, crop_mode="torchvision"):
    """The centre ``size`` (an int or ``(height, width)``) of ``image`` (``[H, W, C]`` or ``[N, H, W, C]``), at the
    offsets of ``crop_mode``: ``"torchvision"`` ``int(round((side - crop) / 2))`` (ties to even, as torchvision's
    ``CenterCrop``), ``"keras"`` ``(side - crop) // 2`` (``keras.layers.CenterCrop``).

    A side shorter than the crop is first zero-padded (``tf.image.resize_with_crop_or_pad``); after
    ``resize_shorter_side`` to at least the crop that never happens.

    Examples:
        >>> import tensorflow as tf
        >>> from keras_preact.preprocessing import center_crop
        >>> image = tf.reshape(tf.range(25), (5, 5, 1))
        >>> center_crop(image, 2)[..., 0].numpy().tolist()  # offsets round(1.5) = 2
        [[12, 13], [17, 18]]
        >>> center_crop(image, 2, "keras")[..., 0].numpy().tolist()  # offsets 3 // 2 = 1
        [[6, 7], [11, 12]]
    """
    tf = _tensorflow("center_crop")
    if crop_mode not in CROP_MODES:
        raise ValueError(f"Invalid crop_mode={crop_mode!r}. Allowed values: {', '.join(map(repr, CROP_MODES))}.")
    height, width = (size, size) if isinstance(size, numbers.Integral) else tuple(size)
    shape = tf.shape(image)
    image = tf.image.resize_with_crop_or_pad(image, tf.maximum(shape[-3], height), tf.maximum(shape[-2], width))
    extra = tf.shape(image)[-3:-1] - tf.constant([height, width])
    if crop_mode == "keras":
        top, left = tf.unstack(extra // 2)
    else:
        top, left = tf.unstack(tf.cast(tf.round(tf.cast(extra, tf.float64) / 2.0), tf.int32))
    return image[..., top:top + height, left:left + width, :]


def view_pixels(image, input_config):
    """The resize and centre crop of decoded ``image`` (``[H, W, C]`` or ``[N, H, W, C]``, 0-255 units) by
    ``input_config``'s ``crop_mode`` (``view_geometry``); float32, not normalized.

    Examples:
        >>> import tensorflow as tf
        >>> from keras_preact.preprocessing import InputConfig, view_pixels
        >>> tuple(view_pixels(tf.zeros((240, 320, 3)), InputConfig()).shape)
        (224, 224, 3)
    """
    tf = _tensorflow("view_pixels")
    config = _view_config(input_config)
    if config.crop_mode == "keras":
        resized = resize_to_aspect_ratio(image, config.resize_shape, config.interpolation, config.antialias)
    else:
        resized = resize_shorter_side(image, config.resize_size, config.interpolation, config.antialias)
    return tf.cast(center_crop(resized, config.crop_size, config.crop_mode), tf.float32)


def eval_view(image, input_config):
    """The evaluation view: decode (when given encoded bytes), resize and centre-crop to the input size as the
    config's ``crop_mode`` says (``view_geometry``); float32 pixels in 0-255 units, not normalized.

    Args:
        image: a scalar string tensor of encoded bytes, a vector of them (a batch, each image of any
            size), or a decoded ``[H, W, 3]`` image (any dtype, 0-255 units).
        input_config: an ``InputConfig``, or ``(crop_size, crop_fraction[, interpolation])`` with
            ``crop_size`` an int or ``(height, width)``.

    Returns:
        float32 ``[height, width, 3]`` (``[N, height, width, 3]`` for a batch of encoded images).

    Examples:
        >>> import tensorflow as tf
        >>> from keras_preact.preprocessing import InputConfig, eval_view
        >>> jpeg = tf.io.encode_jpeg(tf.fill((300, 400, 3), tf.constant(128, tf.uint8)))
        >>> view = eval_view(jpeg, InputConfig())  # shorter side to 256, the centre 224 x 224
        >>> tuple(view.shape), view.dtype.name
        ((224, 224, 3), 'float32')
        >>> tuple(eval_view(tf.stack([jpeg, jpeg]), (32, 1.0)).shape)  # a batch; (crop, crop_fraction)
        (2, 32, 32, 3)
    """
    tf = _tensorflow("eval_view")
    config = _view_config(input_config)
    height, width = config.crop_size
    image = tf.convert_to_tensor(image)

    def one(item):
        if item.dtype == tf.string:
            item = decode_image(item)
        return tf.ensure_shape(view_pixels(item, config), (height, width, 3))

    if image.dtype == tf.string and image.shape.rank == 1:
        return tf.map_fn(one, image, fn_output_signature=tf.TensorSpec((height, width, 3), tf.float32))
    return one(image)


def normalize(images, mean, std):
    """``(images - mean) / std`` in float32: ``mean``/``std`` per channel (or a mean image), in the
    pixel units of ``images`` (0-255).

    Examples:
        >>> from keras_preact.preprocessing import normalize
        >>> normalize([[[125.3, 123.0, 113.9]]], mean=(125.3, 123.0, 113.9), std=(63.0, 62.1, 66.7)).numpy().tolist()
        [[[0.0, 0.0, 0.0]]]
    """
    tf = _tensorflow("normalize")
    return (tf.cast(images, tf.float32) - tf.constant(mean, tf.float32)) / tf.constant(std, tf.float32)
