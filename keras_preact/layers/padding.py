"""``EdgePadding2D``: pad height and width by repeating the border rows and columns.

Before a 3x3/2 max-pool with one pixel of padding, repeating the border equals PyTorch's ``-inf``
padding (``nn.MaxPool2d(3, 2, padding=1)``, timm's pre-activation ResNetV2 stem): every window that
reaches a padded pixel also holds the real pixel it repeats. Unlike zeros it is right for inputs that
can be negative (a stem conv with no BN-ReLU after it), and unlike ``-inf`` it is finite in every
export format. Built from slices and a concatenation, so it runs the same on every backend.
"""

import keras


@keras.saving.register_keras_serializable(package="keras_preact")
class EdgePadding2D(keras.layers.Layer):
    """Pad ``padding`` pixels on each side of height and width with copies of the border.

    Examples:
        >>> import keras
        >>> from keras_preact.layers import EdgePadding2D
        >>> x = keras.ops.reshape(keras.ops.arange(4.0), (1, 2, 2, 1))
        >>> keras.ops.convert_to_numpy(EdgePadding2D(1)(x))[0, :, :, 0].tolist()
        [[0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 1.0], [2.0, 2.0, 3.0, 3.0], [2.0, 2.0, 3.0, 3.0]]
    """

    def __init__(self, padding=1, data_format=None, **kwargs):
        super().__init__(**kwargs)
        if not isinstance(padding, int) or isinstance(padding, bool) or padding < 0:
            raise ValueError(f"Invalid padding={padding!r}: a non-negative integer is required.")
        data_format = data_format or keras.config.image_data_format()
        if data_format not in ("channels_last", "channels_first"):
            raise ValueError(f"Invalid data_format={data_format!r}. Allowed values: 'channels_last', 'channels_first'.")
        self.padding, self.data_format = padding, data_format
        self._spatial = (1, 2) if data_format == "channels_last" else (2, 3)

    def call(self, inputs):
        x, p = inputs, self.padding
        for axis in self._spatial if p else ():
            first, last = [slice(None)] * 4, [slice(None)] * 4
            first[axis], last[axis] = slice(0, 1), slice(-1, None)
            x = keras.ops.concatenate([x[tuple(first)]] * p + [x] + [x[tuple(last)]] * p, axis=axis)
        return x

    def compute_output_shape(self, input_shape):
        shape = list(input_shape)
        for axis in self._spatial:
            if shape[axis] is not None:
                shape[axis] += 2 * self.padding
        return tuple(shape)

    def get_config(self):
        return {**super().get_config(), "padding": self.padding, "data_format": self.data_format}
