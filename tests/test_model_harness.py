"""Every registered network through the same checks (timm's tests/test_models.py, keras-hub's
``run_backbone_test``): forward and backward, ``.keras`` round trip, mixed precision, pyramid
outputs, channels_first. The paper's headline depths (the registry's ``slow`` networks: ResNet-1001/1202,
ImageNet 101/152/200) are checked in test_models.py instead, each built once at its smallest input. A network
deeper than another of its design (family and block: CIFAR ResNet-32/44/56/110, ImageNet ResNet-34) runs these
checks under the ``slow`` marker, as timm's tests leave out the larger variants: its builder, layers and units are
its design's shallowest network's, checked here at that network's registered depth, and its own depth is checked
where depth matters, by the exact parameter counts and builds of test_models.py. channels_first is checked on the
shallowest CIFAR network of a design at two units per stage."""

import numpy as np
import pytest

import support
from keras_preact.models import create_model, list_models, model_spec
from keras_preact.models.cifar import CIFAR_BLOCKS, cifar_depth_block
from keras_preact.models.imagenet import IMAGENET_DEPTHS

pytestmark = pytest.mark.core

NUM_CLASSES = 5
# Checked in test_models.py, built once each: forward and backward, and where depth can matter to them the
# .keras round trip, mixed precision and pyramid outputs (channels_first below, under slow).
HEADLINE = {n for n in list_models() if model_spec(n).slow}


def _small_input(name):
    return model_spec(name).test_input_size


def _models(skip=HEADLINE, slow=()):
    """Every registered network but ``skip``; those in ``slow`` under the ``slow`` marker."""
    return [pytest.param(n, marks=pytest.mark.slow) if n in slow else n for n in list_models() if n not in skip]


def _block(name):
    """The unit a registered network is built of, by its builder's own depth tables."""
    arguments = model_spec(name).arguments
    if model_spec(name).family == "cifar":
        return cifar_depth_block(arguments["depth"], arguments.get("block"))[0]
    return IMAGENET_DEPTHS[arguments["depth"]][0]


def _deeper_of_a_design():
    """The networks with a shallower one of the same family and block in the registry: this file's checks are
    properties of the layers and the builder, which the shallowest network of each design exercises; the deeper
    ones only add tracing and XLA compile time on a CI core (ResNet-110's forward, backward and round trip:
    ~17 s), so they run with the ``slow`` ones."""
    shallowest = {}
    for name in sorted(list_models(), key=lambda n: model_spec(n).arguments["depth"]):
        shallowest.setdefault((model_spec(name).family, _block(name)), name)
    return set(list_models()) - set(shallowest.values())


def _channels_first_arguments(name):
    """The registered arguments ``name``'s channels_first check overrides: the shallowest CIFAR network of a
    design is checked at two units per stage, the fewest with every kind of unit of that design (each stage's
    first unit, strided or preactivating its shortcut, and a unit on an identity shortcut): ``data_format`` is
    a property of the layers, and tracing and XLA-compiling ResNet-164's 54 units took ~85 s of a CI core.
    ImageNet depths are fixed tables (18 and 50 are their designs' shallowest); the deeper networks of a
    design (the ``slow`` runs) are checked at their own depth, for the error their depth accumulates."""
    if model_spec(name).family != "cifar" or name in _deeper_of_a_design():
        return {}
    block = _block(name)
    return {"depth": 2 + 3 * 2 * CIFAR_BLOCKS[block]["layers"], "block": block}


def _batch(name, rng):
    images = rng.uniform(0, 1, size=(2, *_small_input(name))).astype("float32")
    return images, np.array([1, 3])


def test_every_model_is_in_the_harness():
    slow = {n for n in list_models() if model_spec(n).slow}
    assert slow == {"cifar_resnet1001", "cifar_resnet1202", "imagenet_resnet101", "imagenet_resnet152",
                    "imagenet_resnet200"}
    assert HEADLINE == slow


@pytest.mark.parametrize("name", _models(slow=_deeper_of_a_design()))
def test_forward_backward_saving_and_pyramid_outputs(name, rng):
    """One build per network (building and tracing hundreds of units is most of the cost): forward and
    backward, the ``.keras`` round trip, and the pyramid outputs of its backbone."""
    images, labels = _batch(name, rng)
    model = create_model(name, num_classes=NUM_CLASSES, input_shape=_small_input(name))
    assert model.output_shape == (None, NUM_CLASSES)
    support.run_forward_backward_test(model, images, labels)
    support.run_saving_test(model, images)
    support.run_pyramid_outputs_test(model.backbone, images)


@pytest.mark.parametrize("name", _models(slow=_deeper_of_a_design()))
def test_mixed_precision(name, rng):
    images, _ = _batch(name, rng)
    support.run_mixed_precision_test(
        lambda: create_model(name, num_classes=NUM_CLASSES, input_shape=_small_input(name)), images
    )


def test_channels_first_covers_every_design():
    designs = {(model_spec(n).family, _block(n)) for n in list_models()}
    checked = {(model_spec(n).family, _block(n)) for n in set(list_models()) - _deeper_of_a_design()}
    assert checked == designs == {("cifar", "basic"), ("cifar", "bottleneck"), ("cifar", "one_layer"),
                                  ("imagenet", "basic"), ("imagenet", "bottleneck")}
    assert {n for n in list_models() if not model_spec(n).slow} - _deeper_of_a_design() == {
        "cifar_resnet20", "cifar_resnet164", "cifar_resnet110_1layer", "imagenet_resnet18", "imagenet_resnet50"}
    for name in ("cifar_resnet20", "cifar_resnet164", "cifar_resnet110_1layer"):
        arguments = _channels_first_arguments(name)
        assert cifar_depth_block(arguments["depth"], arguments["block"]) == (_block(name), 2)
    assert _channels_first_arguments("imagenet_resnet50") == _channels_first_arguments("cifar_resnet1001") == {}


@pytest.mark.parametrize("name", _models(skip=(), slow=_deeper_of_a_design()))
def test_channels_first(name, rng):
    images, _ = _batch(name, rng)
    # Over hundreds of units the NHWC and NCHW kernels' different summation orders add up to ~1e-3
    # on the probabilities (measured: 1.3e-3 and, with other random weights, 3.6e-3 at ResNet-1001);
    # a wrong layout or weight gives ~1e-1.
    support.run_channels_first_test(
        lambda **kw: create_model(name, num_classes=NUM_CLASSES,
                                  **{"input_shape": _small_input(name), **_channels_first_arguments(name), **kw}),
        images,
        atol=6e-3 if model_spec(name).slow else 1e-5,
    )
