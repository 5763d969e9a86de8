"""``EvalView``: a model's evaluation view as a Keras preprocessing layer, on every backend.

The layer form of ``keras_preact.preprocessing.eval_view`` followed by ``normalize``, in ``keras.ops`` alone:
the region, resize and centre crop of ``keras_preact.preprocessing.view_geometry`` (the config's ``crop_mode``:
torchvision's arithmetic for timm's checkpoints, Keras' for keras.applications and keras-hub;
``keras.ops.image.resize`` with the config's ``interpolation`` and ``antialias``), then ``(pixels - mean) / std``. Its
config is the ``InputConfig``, so it is saved with a model (``get_config``, ``.keras`` files) as keras-hub's
``ImageConverter`` is saved with a preset. On TensorFlow it gives ``eval_view``'s numbers exactly; on JAX
(``resize_weights``) and PyTorch the resize kernels are the same (TensorFlow's ``scale_and_translate``
antialiasing), summed in another order: within 0.01 in 0-255 units.

Examples:
    >>> import numpy as np
    >>> from keras_preact.layers import EvalView
    >>> from keras_preact.preprocessing import InputConfig, torchvision_resized_size, view_geometry
    >>> view = EvalView(InputConfig())  # ImageNet's: the shorter side to 256, the centre 224 x 224
    >>> tuple(view(np.zeros((300, 400, 3), "uint8")).shape)
    (224, 224, 3)
"""

import keras
import numpy as np

from keras_preact.preprocessing import InputConfig, torchvision_resized_size, view_geometry

# What keras.ops.image.resize offers on every backend, of InputConfig's interpolations.
EVAL_VIEW_INTERPOLATIONS = ("bilinear", "nearest", "bicubic")


def _as_input_config(value):
    if isinstance(value, dict):
        return InputConfig.from_dict(value)
    if not isinstance(value, InputConfig):
        raise ValueError(f"Invalid input_config={value!r:.200}: a keras_preact.preprocessing.InputConfig (or its "
                         "to_dict()) is required.")
    return value


def shorter_side_size(height, width, size):
    """``(new_height, new_width)`` with the shorter side ``size`` and the longer ``int(size * longer / shorter)``
    (truncated), as torchvision's ``Resize(size)`` and ``resize_shorter_side`` compute it.

    Examples:
        >>> shorter_side_size(300, 400, 256)  # 400 * 256 / 300 = 341.33
        (256, 341)
        >>> shorter_side_size(240, 320, 248)  # 330.67: truncated, not rounded
        (248, 330)
    """
    return torchvision_resized_size(height, width, size)


def _triangle(x):
    return np.maximum(0.0, 1.0 - np.abs(x))


def _keys_cubic(x):  # Keys' cubic convolution kernel with a = -0.5, as TensorFlow's and JAX's bicubic
    x = np.abs(x)
    return np.where(x < 1, (1.5 * x - 2.5) * x * x + 1, np.where(x < 2, ((-0.5 * x + 2.5) * x - 4) * x + 2, 0.0))


RESIZE_KERNELS = {"bilinear": _triangle, "bicubic": _keys_cubic}


def resize_weights(in_size, out_size, interpolation, start=0, count=None, antialias=True):
    """float32 ``[count, in_size]``: rows ``start..start + count`` of the resize of a side of ``in_size`` to
    ``out_size`` (``interpolation`` bilinear or bicubic), as TensorFlow's ``scale_and_translate`` computes them:
    output ``i`` samples ``(i + 0.5) * in_size / out_size``, the kernel stretched by the scale when downscaling
    with ``antialias``, each row's weights summing to 1.

    Examples:
        >>> resize_weights(2, 4, "bilinear").tolist()  # doubling: samples at 0.25, 0.75, 1.25, 1.75 of 2 pixels
        [[1.0, 0.0], [0.75, 0.25], [0.25, 0.75], [0.0, 1.0]]
        >>> [round(float(w), 4)
        ...  for w in resize_weights(4, 2, "bilinear")[0]]  # halving: the triangle stretched over 3 taps
        [0.4286, 0.4286, 0.1429, 0.0]
    """
    count = out_size - start if count is None else count
    inv_scale = in_size / out_size
    kernel_scale = max(inv_scale, 1.0) if antialias else 1.0
    sample = (np.arange(start, start + count) + 0.5) * inv_scale
    weights = RESIZE_KERNELS[interpolation]((np.arange(in_size) + 0.5 - sample[:, None]) / kernel_scale)
    return (weights / weights.sum(axis=1, keepdims=True)).astype(np.float32)


@keras.saving.register_keras_serializable(package="keras_preact")
class EvalView(keras.layers.Layer):
    """The evaluation view of a model's ``InputConfig`` as a Keras layer: shorter side, centre crop, normalize.

    Args:
        input_config: a ``keras_preact.preprocessing.InputConfig`` (or its ``to_dict()``), e.g. a model's
            ``model.input_config``: the crop (``input_size[:2]``), ``resize_size`` (from ``crop_fraction``),
            ``interpolation`` (``EVAL_VIEW_INTERPOLATIONS``) and ``mean``/``std``.
        normalize: ``True`` (default): ``(pixels - mean) / std``, the model's input; ``False``: the view in
            0-255 pixel units, as ``keras_preact.preprocessing.eval_view``.
        **kwargs: ``keras.layers.Layer``'s (``name``...).

    Call it on decoded pixels in 0-255 units, channels last, of any dtype: one image ``[H, W, C]`` or a batch
    of one size ``[N, H, W, C]``; the output is float32 ``[..., height, width, C]``. Each call resizes to the
    size its input needs, so images of different sizes are viewed one call each (eagerly on JAX and
    PyTorch; in a ``tf.data`` map on TensorFlow). ``keras_preact.preprocessing.decode_image_array`` decodes
    files without TensorFlow.

    Examples:
        >>> import numpy as np
        >>> from keras_preact.layers import EvalView
        >>> from keras_preact.preprocessing import InputConfig, torchvision_resized_size, view_geometry
        >>> config = InputConfig(input_size=(4, 4, 3), crop_fraction=0.5, mean=(1.0, 2.0, 3.0), std=(2.0, 2.0, 2.0))
        >>> view = EvalView(config)  # the shorter side to ceil(4 / 0.5) = 8, the centre 4 x 4
        >>> images = np.full((2, 8, 12, 3), 9, "uint8")  # a batch of one size
        >>> out = view(images)
        >>> tuple(out.shape), np.asarray(out)[0, 0, 0].tolist()
        ((2, 4, 4, 3), [4.0, 3.5, 3.0])
        >>> EvalView.from_config(view.get_config()).input_config == config
        True
    """

    def __init__(self, input_config, normalize=True, **kwargs):
        kwargs.setdefault("dtype", "float32")
        super().__init__(**kwargs)
        config = _as_input_config(input_config)
        if config.interpolation not in EVAL_VIEW_INTERPOLATIONS:
            raise ValueError(f"Invalid input_config: interpolation={config.interpolation!r} is not one "
                             f"keras.ops.image.resize offers on every backend; allowed: "
                             f"{', '.join(map(repr, EVAL_VIEW_INTERPOLATIONS))}.")
        if not isinstance(normalize, bool):
            raise ValueError(f"Invalid normalize={normalize!r}: True (the model's input) or False (0-255 pixels).")
        self.input_config, self.normalize = config, normalize

    @classmethod
    def for_model(cls, model, normalize=True):
        """The view of ``model.input_config`` (a keras_preact classifier's, kept in its ``.keras`` file).

        Examples:
            >>> from keras_preact.layers import EvalView
            >>> from keras_preact.models import cifar_resnet
            >>> EvalView.for_model(cifar_resnet(8)).input_config.crop_size
            (32, 32)
        """
        config = getattr(model, "input_config", None)
        if config is None:
            raise ValueError(f"Invalid model={getattr(model, 'name', model)!r}: it carries no input_config; build it "
                             "with keras_preact.models.create_model, or pass an InputConfig to EvalView.")
        return cls(config, normalize=normalize)

    def call(self, images):
        if len(images.shape) not in (3, 4):
            raise ValueError(f"Invalid images of shape {tuple(images.shape)}: [H, W, C] or [N, H, W, C] (channels "
                             "last) is required.")
        images = keras.ops.cast(images, "float32")
        config = self.input_config
        if images.shape[-3] is None or images.shape[-2] is None:
            # A TensorFlow graph (tf.data) of images whose size it does not know: keras.ops.image.resize takes
            # Python sizes only, so TensorFlow resizes to the size the graph computes, as eval_view does.
            from keras_preact.preprocessing import view_pixels

            return self._normalized(view_pixels(images, config))
        (top, left, height, width), resized, crop = view_geometry(images.shape[-3], images.shape[-2], config)
        images = images[..., top:top + height, left:left + width, :]
        if keras.backend.backend() == "jax" and config.interpolation in RESIZE_KERNELS:
            return self._normalized(self._resized_crop_by_weights(images, resized, crop))
        images = keras.ops.image.resize(images, resized, interpolation=config.interpolation,
                                        antialias=config.antialias, data_format="channels_last")
        top, left, height, width = crop
        return self._normalized(images[..., top:top + height, left:left + width, :])

    def _resized_crop_by_weights(self, images, resized, crop):
        """The crop of the resize as two products with ``resize_weights`` (its rows in the crop only), on JAX:
        ``jax.image.resize`` compiles anew for each input size (2 s each, measured on a loaded 2-core EPYC), a
        product in a tenth of that, and evaluation views images of many sizes."""
        top, left, height, width = crop
        interpolation, antialias = self.input_config.interpolation, self.input_config.antialias
        rows = resize_weights(images.shape[-3], resized[0], interpolation, top, height, antialias)
        columns = resize_weights(images.shape[-2], resized[1], interpolation, left, width, antialias)
        import jax

        highest = jax.lax.Precision.HIGHEST  # float32 products on GPUs and TPUs too (not TF32 or bfloat16 passes)
        images = jax.numpy.einsum("oh,...hwc->...owc", rows, images, precision=highest)
        return jax.numpy.einsum("pw,...owc->...opc", columns, images, precision=highest)

    def _normalized(self, images):
        if self.normalize:
            mean = keras.ops.convert_to_tensor(np.asarray(self.input_config.mean, np.float32))
            std = keras.ops.convert_to_tensor(np.asarray(self.input_config.std, np.float32))
            images = (images - mean) / std
        return images

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-3], *self.input_config.crop_size, input_shape[-1])

    def get_config(self):
        return {**super().get_config(), "input_config": self.input_config.to_dict(), "normalize": self.normalize}
