"""The layers the published checkpoints need: ``EdgePadding2D`` (PyTorch's -inf max-pool padding),
``WeightStandardizedConv2D`` (BiT's StdConv2d), the ``convolution`` unit option with GroupNorm; on every
backend, through a ``.keras`` file and every export format this backend writes."""

import importlib.util

import keras
import numpy as np
import pytest

from keras_preact.export import FORMATS, export_model, load
from keras_preact.layers import EdgePadding2D, ResidualUnit, WeightStandardizedConv2D
from keras_preact.models import PreActResNetBackbone, PreActResNetClassifier
from support import to_numpy

pytestmark = [pytest.mark.core, pytest.mark.notf]


def torch_style_max_pool(x):
    """nn.MaxPool2d(3, 2, padding=1) on NHWC numpy: -inf padding."""
    x = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)), constant_values=-np.inf)
    windows = np.lib.stride_tricks.sliding_window_view(x, (3, 3), axis=(1, 2))[:, ::2, ::2]
    return windows.max(axis=(-2, -1))


@pytest.mark.parametrize("size", [7, 8])
def test_edge_padding_then_max_pool_is_pytorch_minus_inf_padding(size):
    x = np.random.default_rng(size).normal(-3, 1, (2, size, size, 4)).astype("float32")  # mostly negative
    pooled = keras.layers.MaxPooling2D(3, strides=2)(EdgePadding2D(1)(x))
    np.testing.assert_array_equal(to_numpy(pooled), torch_style_max_pool(x))
    zero_padded = keras.layers.MaxPooling2D(3, strides=2)(keras.layers.ZeroPadding2D(1)(x))
    assert not np.array_equal(to_numpy(zero_padded), torch_style_max_pool(x))  # what the edge padding fixes
    first = EdgePadding2D(2, data_format="channels_first")(np.transpose(x, (0, 3, 1, 2)))
    np.testing.assert_array_equal(to_numpy(first), np.pad(np.transpose(x, (0, 3, 1, 2)), ((0, 0),) * 2 + ((2, 2),) * 2,
                                                          mode="edge"))


def test_weight_standardized_conv_is_timm_std_conv():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2, 6, 6, 3)).astype("float32")
    conv = WeightStandardizedConv2D(5, 3, padding="same", use_bias=False)
    conv.build(x.shape)
    # A kernel variance of 4e-6: BiT's eps (1e-8) shifts the outputs by 0.1%, another (1e-5) by half (far off).
    kernel = rng.normal(0.3e-3, 2e-3, (3, 3, 3, 5)).astype("float32")
    conv.kernel.assign(kernel)
    flat = kernel.reshape(-1, 5).astype("float64")  # per output channel, over kh, kw, in (timm: F.batch_norm)
    standardized = ((flat - flat.mean(0)) / np.sqrt(flat.var(0) + 1e-8)).reshape(kernel.shape).astype("float32")
    plain = keras.layers.Conv2D(5, 3, padding="same", use_bias=False)
    plain.build(x.shape)
    plain.kernel.assign(standardized)
    np.testing.assert_allclose(to_numpy(conv(x)), to_numpy(plain(x)), atol=1e-5)
    assert WeightStandardizedConv2D.from_config(conv.get_config()).epsilon == 1e-8
    with pytest.raises(ValueError, match="Invalid epsilon=0"):
        WeightStandardizedConv2D(5, 3, epsilon=0)
    with pytest.raises(
        ValueError, match="Invalid convolution='std'. Allowed values: 'standard', 'weight_standardized'"
    ):
        ResidualUnit(8, convolution="std")


def bit_like_classifier():
    """A small network of BiT's parts: the timm stem's edge-padded pool, GroupNorm, standardized convs."""
    backbone = PreActResNetBackbone([1, 1], [64, 128], [1, 2], stem="imagenet_edge_pool", stem_filters=32,
                                    unit_options={"block": "bottleneck", "normalization": "group", "norm_groups": 8,
                                                  "convolution": "weight_standardized"}, input_shape=(32, 32, 3))
    return PreActResNetClassifier(backbone, 5)


def test_bit_parts_round_trip_a_keras_file(tmp_path):
    model = bit_like_classifier()
    assert type(model.backbone.get_layer("stem_conv")).__name__ == "WeightStandardizedConv2D"
    x = np.random.default_rng(2).normal(size=(2, 32, 32, 3)).astype("float32")
    model.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    np.testing.assert_allclose(to_numpy(loaded(x)), to_numpy(model(x)), atol=1e-6)


def _writable():
    has_tf = importlib.util.find_spec("tensorflow") is not None
    backend = keras.backend.backend()
    return [f for f, spec in FORMATS.items() if backend in spec.exporters and all(
        importlib.util.find_spec(m) is not None for m in (*spec.exporters[backend], *spec.runtime_modules))
        and (has_tf or "tensorflow" not in (*spec.exporters[backend], *spec.runtime_modules))]


def test_bit_parts_in_every_export_format(tmp_path):
    formats = _writable()
    if not formats:
        pytest.skip(f"{keras.backend.backend()} writes no export format here")
    model = bit_like_classifier()
    mean, std = (127.5, 127.5, 127.5), (127.5, 127.5, 127.5)
    path = export_model(model, tmp_path, formats=formats, name="bit_parts", class_names=list("abcde"), mean=mean,
                        std=std, top_k=3)
    images = np.random.default_rng(3).integers(0, 256, (3, 32, 32, 3), dtype=np.uint8)
    expected = np.asarray(model.predict((images.astype("float32") - 127.5) / 127.5, verbose=0))
    for fmt in formats:
        np.testing.assert_allclose(load(path, fmt).predict(images)["probabilities"], expected, atol=1e-4,
                                   err_msg=fmt)
