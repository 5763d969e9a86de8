"""Conversions of published pre-activation checkpoints, proven equal without a download: each source model is
built with random weights in its own library (or written under its own parameter names), converted, and its
logits and pyramid features compared with ours on the same images (max abs difference <= 1e-4).

Judges: keras.applications' ResNetV2 itself; keras-hub's own timm converter (``Backbone.from_preset`` on a
timm-format folder) and keras-hub's ``ResNetBackbone``; for timm's BiT models, which keras-hub does not read, a
numpy transcription of timm's ``ResNetV2`` forward (``pretrained_reference.py``), itself checked against
keras-hub on the BatchNorm models.
"""

import json

import keras
import numpy as np
import pretrained_reference as ref
import pytest

from keras_preact.pretrained import convert_timm
from keras_preact.pretrained.convert_timm import from_timm_state_dict
from support import to_numpy

pytestmark = pytest.mark.core
TOLERANCE = 1e-4
SIZE = (64, 64, 3)


def images(seed=0, n=2, size=SIZE):
    return np.random.default_rng(seed).uniform(-2, 2, (n, *size)).astype("float32")


def outputs(model, x):
    """(logits, stage outputs) of one of our classifiers (classifier_activation=None)."""
    backbone = model.backbone
    stages = keras.Model(backbone.inputs, [backbone.get_layer(info["layer"]).output for info in backbone.feature_info])
    return to_numpy(model(x)), [to_numpy(f) for f in stages(x)]


def assert_close(ours, theirs, what):
    (logits, features), (their_logits, their_features) = ours, theirs
    assert len(features) == len(their_features) == 4
    diffs = [float(np.abs(logits - their_logits).max())] + [float(np.abs(a - b).max()) for a, b in
                                                             zip(features, their_features)]
    assert max(diffs) <= TOLERANCE, f"{what}: max abs differences (logits, stages 1-4) {diffs}"
    return diffs


@pytest.mark.notf
@pytest.mark.parametrize("depth, bit", [(18, False), (50, False), (50, True)], ids=["resnetv2_18", "resnetv2_50",
                                                                                  "resnetv2_50x1_bit"])
def test_timm_checkpoint_matches_timm_forward(depth, bit):
    """A random checkpoint under timm's names, converted, gives timm's ResNetV2 forward (BN and BiT's GN+StdConv)."""
    state = ref.random_state(depth, bit=bit)
    model = from_timm_state_dict(state, input_shape=SIZE, classifier_activation=None)
    assert model.backbone.residual_units[0][0].options.normalization == ("group" if bit else "batch")
    x = images()
    assert_close(outputs(model, x), ref.forward(state, x, bit=bit), f"resnetv2_{depth}{'x1_bit' if bit else ''}")


def write_timm_folder(folder, architecture, state, **pretrained_cfg):
    """A timm hub folder: config.json and model.safetensors, as ``timm.models.push_to_hf_hub`` writes them."""
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    num_classes = state["head.fc.weight"].shape[0]
    config = {"architecture": architecture, "num_classes": num_classes, "num_features": state["norm.weight"].shape[0],
              "pretrained_cfg": {"input_size": [3, 224, 224], "mean": [0.5] * 3, "std": [0.5] * 3,
                                 "crop_pct": 0.95, "interpolation": "bicubic", "num_classes": num_classes,
                                 **pretrained_cfg}}
    (folder / "config.json").write_text(json.dumps(config))
    save_file({k: np.ascontiguousarray(v) for k, v in state.items()}, str(folder / "model.safetensors"))
    return folder


def keras_hub_outputs(backbone, classifier, x):
    stages = keras.Model(backbone.inputs, [backbone.pyramid_outputs[f"P{level}"] for level in range(2, 6)])
    return to_numpy(classifier(x)), [to_numpy(f) for f in stages(x)]


@pytest.mark.hub
@pytest.mark.parametrize("depth", [18, 50])
def test_timm_checkpoint_matches_keras_hub_timm_converter(depth, tmp_path):
    """keras-hub's own timm converter reads the same timm-format folder: ours, keras-hub's and the numpy
    transcription of timm agree. keras-hub's preset loader knows resnetv2_50/101/152; for resnetv2_18 its
    converter's ``convert_weights`` runs on the ResNetBackbone its config would give."""
    keras_hub = pytest.importorskip("keras_hub")
    pytest.importorskip("safetensors")
    from keras_hub.src.utils.timm import convert_resnet
    from keras_hub.src.utils.transformers.safetensor_utils import SafetensorLoader

    state = ref.random_state(depth, num_classes=5, seed=depth)
    folder = write_timm_folder(tmp_path / f"resnetv2_{depth}", f"resnetv2_{depth}", state)
    if depth == 50:
        classifier = keras_hub.models.ImageClassifier.from_preset(str(folder))
        backbone = classifier.backbone
    else:
        backbone = keras_hub.models.ResNetBackbone(
            stackwise_num_filters=[64, 128, 256, 512], stackwise_num_blocks=[2, 2, 2, 2],
            stackwise_num_strides=[1, 2, 2, 2], block_type="basic_block", use_pre_activation=True,
            input_conv_filters=[64], input_conv_kernel_sizes=[7], image_shape=(None, None, 3))
        with SafetensorLoader(str(folder), prefix="") as loader:
            convert_resnet.convert_weights(backbone, loader, {"architecture": "resnetv2_18"})
        classifier = keras_hub.models.ResNetImageClassifier(backbone=backbone, num_classes=5, activation=None)
        with SafetensorLoader(str(folder), prefix="") as loader:
            convert_resnet.convert_head(classifier, loader, {"architecture": "resnetv2_18"})
    x = images(seed=depth)
    theirs = keras_hub_outputs(backbone, classifier, x)
    ours = outputs(from_timm_state_dict(state, input_shape=SIZE, classifier_activation=None), x)
    assert_close(ours, theirs, f"resnetv2_{depth} against keras-hub")
    assert_close(ref.forward(state, x), theirs, f"the numpy timm forward against keras-hub, resnetv2_{depth}")


def randomize(model, seed):
    """Random BN statistics and scales (fresh BN is ~identity), small last convs: a fair, O(1) comparison."""
    rng = np.random.default_rng(seed)
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            g, b, m, v = layer.get_weights()
            layer.set_weights([rng.uniform(0.5, 1.5, g.shape), rng.normal(0, 0.2, b.shape), rng.normal(0, 0.3, m.shape),
                               rng.uniform(0.5, 2.0, v.shape)])
        elif isinstance(layer, keras.layers.Conv2D) and layer.name.endswith("_3_conv"):  # a bottleneck's last
            layer.set_weights([w * 0.1 for w in layer.get_weights()])


@pytest.mark.hub
def test_keras_hub_resnet_v2_preset_matches(tmp_path):
    """keras-hub's resnet_v2_50_imagenet architecture, built from its config with random weights and saved as a
    preset folder, loads into ours with the same logits and pyramid features."""
    keras_hub = pytest.importorskip("keras_hub")
    from keras_preact.models import imagenet_resnet

    backbone = keras_hub.models.ResNetBackbone(
        stackwise_num_filters=[64, 128, 256, 512], stackwise_num_blocks=[3, 4, 6, 3],
        stackwise_num_strides=[1, 2, 2, 2], block_type="bottleneck_block", use_pre_activation=True,
        input_conv_filters=[64], input_conv_kernel_sizes=[7], image_shape=(None, None, 3))
    classifier = keras_hub.models.ResNetImageClassifier(backbone=backbone, num_classes=5, activation=None)
    randomize(backbone, 3)
    classifier.save_to_preset(str(tmp_path / "preset"))
    loaded = keras_hub.models.ImageClassifier.from_preset(str(tmp_path / "preset"))
    arch = convert_timm.keras_hub_architecture(loaded.backbone)
    assert arch == {"depth": 50, "layout": "timm"}
    model = imagenet_resnet(50, 5, layout="timm", input_shape=SIZE, classifier_activation=None)
    convert_timm.load_keras_hub_backbone(model, loaded.backbone, loaded)
    x = images(seed=3)
    assert_close(outputs(model, x), keras_hub_outputs(backbone, classifier, x), "keras-hub resnet_v2_50 preset")


@pytest.mark.notf
def test_keras_applications_resnet50v2_matches():
    """keras.applications' ResNet50V2 (weights=None, random BN statistics) converted: same logits and stages."""
    from keras_preact.applications import from_keras_applications

    source = keras.applications.ResNet50V2(weights=None, input_shape=SIZE, classifier_activation=None, classes=5)
    randomize(source, 4)
    model = from_keras_applications(source)
    names = [f"conv{s}_block{n}_out" for s, n in zip(range(2, 6), (3, 4, 6, 3))]
    stages = keras.Model(source.inputs, [source.get_layer(n).output for n in names])
    x = images(seed=4)
    assert_close(outputs(model, x), (to_numpy(source(x)), [to_numpy(f) for f in stages(x)]), "ResNet50V2")


@pytest.mark.notf
@pytest.mark.parametrize("defect", ["swapped_bn_mean_var", "transposed_kernel"])
def test_a_wrong_mapping_fails_the_comparison(defect, monkeypatch):
    """The comparison catches a wrong mapping: swapped BN mean/variance, a kernel transposed (kh <-> kw)."""
    if defect == "swapped_bn_mean_var":
        monkeypatch.setitem(convert_timm.NORM_FIELDS, "batch", ("weight", "bias", "running_var", "running_mean"))
    else:
        monkeypatch.setattr(convert_timm, "_conv_kernel", lambda w: np.transpose(w, (3, 2, 1, 0)))
    state = ref.random_state(18)
    model = from_timm_state_dict(state, input_shape=SIZE, classifier_activation=None)
    x = images()
    with pytest.raises(AssertionError, match="max abs differences"):
        assert_close(outputs(model, x), ref.forward(state, x), defect)


@pytest.mark.notf
def test_a_checkpoint_of_another_network_is_refused():
    state = ref.random_state(18)
    del state["stages.3.blocks.1.conv2.weight"]
    with pytest.raises(ValueError, match=r"state dict: tensors 1 missing \(stages\.3\.blocks\.1\.conv2\.weight"):
        from_timm_state_dict(state, input_shape=SIZE)
    state = ref.random_state(18)
    state["stages.0.blocks.0.extra.weight"] = np.zeros(3, "float32")
    with pytest.raises(ValueError, match=r"1 unexpected \(stages\.0\.blocks\.0\.extra\.weight\)"):
        from_timm_state_dict(state, input_shape=SIZE)
