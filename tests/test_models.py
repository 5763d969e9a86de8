"""Builders: parameter counts equal the official code's (PAPER.md), structure, precision, errors."""

import keras
import numpy as np
import pytest
from keras_preact.testing import run_saving_test, to_numpy, trainable_params

from keras_preact.layers import ORDERINGS, ResidualUnit
from keras_preact.models import (
    cifar_resnet,
    cifar_resnet20,
    create_model,
    imagenet_resnet,
    list_models,
)

pytestmark = pytest.mark.core

# PAPER.md, "Reference parameter counts" (trainable weights).
REFERENCE_PARAMS = [
    ("cifar_resnet164", dict(num_classes=10), 1_703_258),
    ("cifar_resnet164", dict(num_classes=100), 1_726_388),
    ("cifar_resnet1001", dict(num_classes=10), 10_327_706),
    ("cifar_resnet1001", dict(num_classes=100), 10_350_836),
    ("cifar_resnet110", dict(num_classes=10), 1_727_962),
    ("cifar_resnet1202", dict(num_classes=10), 19_421_274),
    ("imagenet_resnet50", {}, 25_549_352),
    ("imagenet_resnet101", {}, 44_541_480),
    ("imagenet_resnet152", {}, 60_185_128),
    ("imagenet_resnet200", {}, 64_666_152),
]


@pytest.mark.parametrize("name, kwargs, expected", REFERENCE_PARAMS)
def test_trainable_parameters_equal_official_code(name, kwargs, expected):
    assert trainable_params(create_model(name, **kwargs)) == expected


def test_tf_slim_layout_matches_keras_applications_count():
    # PAPER.md: ResNet50V2 count_params() with top, BN moving statistics included.
    assert imagenet_resnet(50, layout="tf_slim").count_params() == 25_613_800


@pytest.mark.parametrize("name", list_models())
def test_every_registered_model_builds_with_documented_units(name):
    model = create_model(name, input_shape=(64, 64, 3) if "imagenet" in name else (32, 32, 3))
    units = [l for l in model.layers if isinstance(l, ResidualUnit)]
    depth = int(name.rsplit("resnet", 1)[1])
    layers_per_unit = 2 if units[0].block == "basic" else 3
    assert layers_per_unit * len(units) + 2 == depth  # stem conv + units + classifier
    assert model.output_shape == (None, 10 if "cifar" in name else 1000)


def test_cifar_first_units_follow_official_code():
    basic = cifar_resnet20()
    first = basic.get_layer("stage1_unit1")
    assert first.preactivate_shortcut is True and first.shortcut_type == "A"
    assert basic.get_layer("stage1_unit2").preactivate_shortcut is None
    assert basic.get_layer("stage2_unit1").strides == 2
    bottleneck = cifar_resnet(164)
    unit = bottleneck.get_layer("stage2_unit1")
    assert unit.block == "bottleneck" and unit.shortcut_type == "B" and unit.stride_position == "first"
    assert bottleneck.get_layer("final_norm") is not None  # extra BN-ReLU after the last unit


def test_imagenet_first_unit_skips_preactivation_after_stem():
    model = imagenet_resnet(50, input_shape=(64, 64, 3))
    assert model.get_layer("stage1_unit1").skip_preactivation
    assert not model.get_layer("stage2_unit1").skip_preactivation
    assert model.get_layer("stage2_unit1").strides == 2
    assert model.get_layer("stem_norm") is not None


@pytest.mark.parametrize("ordering", sorted(ORDERINGS))
def test_every_ordering_builds_a_network(ordering):
    model = cifar_resnet(8, ordering=ordering, input_shape=(16, 16, 3))
    y = to_numpy(model(np.zeros((2, 16, 16, 3), "float32"), training=True))
    np.testing.assert_allclose(y.sum(axis=1), 1.0, rtol=1e-5)


def test_block_override_and_ambiguous_depths():
    assert cifar_resnet(110).get_layer("stage1_unit1").block == "basic"  # 110 is 6n+2 and 9n+2
    assert cifar_resnet(164).get_layer("stage1_unit1").block == "bottleneck"
    model = cifar_resnet(29, block="bottleneck")
    assert len([l for l in model.layers if isinstance(l, ResidualUnit)]) == 9


def test_stochastic_depth_grows_linearly():
    model = cifar_resnet20(drop_path_rate=0.2)
    rates = [l.drop_path_rate for l in model.layers if isinstance(l, ResidualUnit)]
    np.testing.assert_allclose(rates, np.linspace(0, 0.2, 9))


def test_headless_pooling_and_input_tensor():
    features = imagenet_resnet(18, include_top=False, pooling="avg", input_shape=(None, None, 3))
    assert features.output_shape == (None, 512)
    maps = cifar_resnet20(include_top=False)
    assert maps.output_shape == (None, 8, 8, 64)
    tensor = keras.Input((32, 32, 3))
    assert cifar_resnet20(input_tensor=tensor).inputs[0] is tensor


def test_cifar_model_saving_round_trip(rng):
    model = cifar_resnet(8, shortcut="exclusive_gating", ordering="full_preact")
    run_saving_test(model, rng.normal(size=(2, 32, 32, 3)).astype("float32"))


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_precision_float32_output(policy, rng):
    keras.config.set_dtype_policy(policy)
    for model in (cifar_resnet20(), imagenet_resnet(18, input_shape=(64, 64, 3))):
        x = rng.uniform(size=(2, *model.input_shape[1:])).astype("float32")
        y = model(x, training=False)
        assert keras.backend.standardize_dtype(y.dtype) == "float32"
        assert np.isfinite(to_numpy(y)).all()
        conv = model.get_layer("stage1_unit1").get_sublayer("conv1")
        assert conv.compute_dtype == policy.split("_")[1] and conv.kernel.dtype == "float32"


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: cifar_resnet(21), "depth"),
        (lambda: cifar_resnet(1001, block="basic"), "depth"),
        (lambda: cifar_resnet(20, block="dense"), "block"),
        (lambda: imagenet_resnet(42), "depth"),
        (lambda: imagenet_resnet(50, layout="caffe"), "layout"),
        (lambda: cifar_resnet(20, ordering="pre"), "ordering"),
        (lambda: cifar_resnet(20, shortcut="highway"), "shortcut"),
        (lambda: cifar_resnet(20, normalization="weird"), "normalization"),
        (lambda: cifar_resnet(20, activation="nope"), "activation"),
        (lambda: cifar_resnet(20, drop_path_rate=1.0), "drop_path_rate"),
        (lambda: cifar_resnet(20, dropout_rate=2.0), "dropout_rate"),
        (lambda: cifar_resnet(164, shortcut_type="A"), "shortcut_type='A'"),
        (lambda: cifar_resnet(20, input_shape=(2, 2, 3)), "input_shape"),
        (lambda: imagenet_resnet(50, input_shape=(16, 16, 3)), "input_shape"),
        (lambda: cifar_resnet(20, num_classes=0), "num_classes"),
        (lambda: cifar_resnet(20, include_top=False, pooling="min"), "pooling"),
        (lambda: cifar_resnet(20, filter_size=3), "filter_size"),
        (lambda: create_model("resnet9000"), "name"),
    ],
)
def test_bad_configurations_raise_before_building(build, message):
    with pytest.raises(ValueError, match=message):
        build()
