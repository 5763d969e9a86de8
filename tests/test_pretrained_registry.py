"""Published checkpoints by name in the registry: listed with their source, licence and accuracy; fetched through
their ecosystem's loader and cache (here: caches filled with random checkpoints, no download); converted once;
offline, one line within seconds; local files and folders by path."""

import ast
import hashlib
import pathlib
import time
from types import SimpleNamespace

import keras
import numpy as np
import pretrained_reference as ref
import pytest

from keras_preact.applications import decode_predictions
from keras_preact.models import (
    create_model,
    imagenet_class_names,
    list_models,
    model_spec,
    presets,
    register_model,
)
from keras_preact.models.registry import unregister_model
from keras_preact.pretrained import sources
from support import to_numpy

pytestmark = [pytest.mark.core, pytest.mark.notf]
SIZE = (64, 64, 3)


def images(seed=0):
    return np.random.default_rng(seed).uniform(-2, 2, (2, *SIZE)).astype("float32")


def logits(model, x):
    """The pre-softmax outputs of a registered classifier."""
    return to_numpy(keras.Model(model.inputs, model.get_layer("logits").output)(x))


@pytest.mark.any_backend
def test_list_models_pretrained_lists_every_published_checkpoint():
    pretrained = list_models(pretrained=True)
    for name in [
        "imagenet_resnet18.timm_ra4_in1k",
        "imagenet_resnet34.timm_ra4_in1k",
        "imagenet_resnet50.imagenet",
        "imagenet_resnet50.timm_a1h_in1k",
        "imagenet_resnet50.timm_bit_in21k",
        "imagenet_resnet50.keras_hub_imagenet",
        "imagenet_resnet101.imagenet",
        "imagenet_resnet101.timm_bit_in21k",
        "imagenet_resnet101.keras_hub_imagenet",
        "imagenet_resnet152.imagenet",
        "cifar_resnet20.cifar10",
    ]:
        assert name in pretrained
    assert "imagenet_resnet200" not in {n.split(".")[0] for n in pretrained}
    timm = model_spec("imagenet_resnet34").weights["timm_ra4_in1k"]
    assert (timm.origin, timm.checkpoint, timm.licence, timm.top1) == (
        "timm", "timm/resnetv2_34.ra4_e3600_r224_in1k", "Apache-2.0", 0.77626)
    # timm's preprocessing: inception statistics (mean and std 0.5), bicubic, the shorter side to floor(224 / 0.9)
    config = timm.input_config
    assert (config.mean, config.std, config.interpolation, config.resize_size) == (
        (127.5, 127.5, 127.5), (127.5, 127.5, 127.5), "bicubic", 248)
    # the network's own statistics (ImageNet's mean and std, which differ), where no checkpoint says otherwise
    plain = model_spec("imagenet_resnet18").input_config
    assert (plain.mean, plain.std) == (IMAGENET_STATISTICS["mean"], IMAGENET_STATISTICS["std"])
    bit = model_spec("imagenet_resnet50").weights["timm_bit_in21k"]
    assert (bit.num_classes, bit.arguments, bit.dataset) == (21843, {"layout": "bit"}, "ImageNet-21k")
    keras_weights = model_spec("imagenet_resnet50").weights["imagenet"]
    assert keras_weights.checksum == "md5:3ef43a0b657b3be2300d5770ece849e0" and keras_weights.top1 == 0.760


@pytest.mark.any_backend
def test_every_registered_network_is_named_literally_in_presets_py():
    """Each network is one entry of presets.py with its name spelled out (a grep finds it), not built by a loop."""
    source = pathlib.Path(presets.__file__).resolve()
    strings = {node.value for node in ast.walk(ast.parse(source.read_text()))
               if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    assert set(presets.MODEL_PRESETS) <= set(list_models())
    assert [name for name in presets.MODEL_PRESETS if name not in strings] == []


# ImageNet's statistics in 0-255 units: a mean and a std that differ, so a swap of the two is seen (timm's
# inception statistics of the registered timm checkpoints are 127.5 for both).
IMAGENET_STATISTICS = {"mean": (123.675, 116.28, 103.53), "std": (58.395, 57.12, 57.375)}
HUB_REPO = "timm/resnetv2_18.ra4_e3600_r224_in1k"


@pytest.fixture
def timm_imagenet_statistics():
    """``test_timm_resnet18`` with the weights ``stats``: the ra4 checkpoint registered with ImageNet's statistics."""
    spec = model_spec("imagenet_resnet18")
    entry = dict(origin="timm", checkpoint=HUB_REPO, num_classes=1000, class_names=imagenet_class_names(),
                 arguments={"layout": "timm"}, input_config=spec.weights["timm_ra4_in1k"].input_config.replace(
                     **IMAGENET_STATISTICS))
    register_model("test_timm_resnet18", family="imagenet", arguments={"depth": 18}, input_config=spec.input_config,
                   weights={"stats": entry})
    yield "test_timm_resnet18"
    unregister_model("test_timm_resnet18")


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """Empty caches and unreachable hosts (the reserved .invalid domain never resolves)."""
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras"))
    monkeypatch.setenv("KAGGLEHUB_CACHE", str(tmp_path / "kaggle"))
    monkeypatch.setenv("HF_ENDPOINT", "https://huggingface.invalid")
    monkeypatch.setattr(sources, "KERAS_WEIGHTS_URL", "https://keras-weights.invalid/resnet/")
    monkeypatch.setattr(sources, "KAGGLE_ENDPOINT", "https://kaggle.invalid")
    try:
        import huggingface_hub.constants

        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    except ImportError:
        pass
    return tmp_path


@pytest.mark.parametrize("name", ["imagenet_resnet50.imagenet", "imagenet_resnet18.timm_ra4_in1k",
                                  "imagenet_resnet50.keras_hub_imagenet"])
def test_offline_a_missing_checkpoint_fails_fast_in_one_line(name, offline):
    origin = model_spec(name.split(".")[0]).weights[name.split(".")[1]].origin
    pytest.importorskip({"keras": "keras", "timm": "huggingface_hub", "keras_hub": "keras_hub"}[origin])
    start = time.monotonic()
    with pytest.raises(OSError) as error:
        create_model(name)
    message = str(error.value)
    assert time.monotonic() - start < 15
    assert "\n" not in message and "unreachable" in message and "put it at" in message
    assert str(offline) in message  # where to put it: the loader's cache


def write_hf_cache(root, repo, state):
    """A Hugging Face hub cache entry for ``repo`` (refs/main -> a snapshot holding model.safetensors)."""
    from safetensors.numpy import save_file

    folder = root / f"models--{repo.replace('/', '--')}"
    commit = "0" * 40
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(commit)
    (folder / "snapshots" / commit).mkdir(parents=True)
    save_file(state, str(folder / "snapshots" / commit / "model.safetensors"))


def test_registered_timm_checkpoint_loads_from_the_hugging_face_cache_and_converts_once(offline,
                                                                                         timm_imagenet_statistics):
    """create_model("imagenet_resnet18.timm_ra4_in1k") offline with the checkpoint in the Hub cache: timm's
    layout, the entry's preprocessing (its mean and its std: also from an entry where they differ), timm's
    outputs, the ImageNet-1k class names; the conversion is written once and reused."""
    pytest.importorskip("huggingface_hub")
    pytest.importorskip("safetensors")
    state = ref.random_state(18, num_classes=1000, seed=5)
    write_hf_cache(offline / "hf", "timm/resnetv2_18.ra4_e3600_r224_in1k", state)
    model = create_model("imagenet_resnet18", weights="timm_ra4_in1k", input_shape=SIZE)
    assert model.backbone.stem == "imagenet_edge_pool" and model.output_shape == (None, 1000)
    assert (model.input_config.interpolation, model.input_config.mean, model.input_config.std) == (
        "bicubic", (127.5, 127.5, 127.5), (127.5, 127.5, 127.5))
    stats = create_model(timm_imagenet_statistics, weights="stats", input_shape=SIZE).input_config
    assert (stats.mean, stats.std, stats.interpolation) == (*IMAGENET_STATISTICS.values(), "bicubic")
    x = images(5)
    expected, _ = ref.forward(state, x)
    assert np.abs(logits(model, x) - expected).max() <= 1e-4
    # The 1,000 ImageNet-1k class names, shipped: decode_predictions names the classes of its predictions
    assert model.class_names == imagenet_class_names()
    best = np.argsort(-expected, axis=1)[:, :3]
    assert [[name for _, name, _ in row] for row in decode_predictions(expected, top=3, model=model)] == [
        [imagenet_class_names()[i] for i in row] for row in best]
    converted = list((offline / "keras" / "keras_preact").glob("imagenet_resnet18-timm_ra4_in1k-*.weights.h5"))
    assert len(converted) == 1
    stamp = converted[0].stat().st_mtime_ns
    create_model("imagenet_resnet18.timm_ra4_in1k", input_shape=SIZE)
    assert converted[0].stat().st_mtime_ns == stamp  # converted once


def test_fresh_hub_download_is_checked_against_the_hub_sha256(offline, tmp_path, monkeypatch):
    """A registered timm checkpoint not in the Hub cache is downloaded (huggingface_hub's download and file
    metadata faked: the Hub reachable, the "download" a copy of a file here) and checked against the Hub's
    published sha256 (its LFS etag): the genuine file loads, another file under the same etag is refused."""
    hf = pytest.importorskip("huggingface_hub")
    pytest.importorskip("safetensors")
    from safetensors.numpy import save_file

    state = ref.random_state(18, num_classes=1000, seed=9)
    genuine, tampered = tmp_path / "genuine.safetensors", tmp_path / "tampered.safetensors"
    save_file(state, str(genuine))
    save_file({**state, "head.fc.bias": state["head.fc.bias"] + 1}, str(tampered))
    served = []

    def hf_hub_download(repo_id, filename, *, local_files_only=False, **kwargs):
        if local_files_only:
            raise FileNotFoundError(f"{repo_id}/{filename} is not in the cache")
        target = offline / "hf" / "downloads" / repo_id / filename
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(served[-1].read_bytes())
        return str(target)

    etag = f'"{hashlib.sha256(genuine.read_bytes()).hexdigest()}"'  # the Hub's LFS etag: the file's sha256, quoted
    monkeypatch.setattr(hf, "hf_hub_download", hf_hub_download)
    monkeypatch.setattr(hf, "get_hf_file_metadata", lambda url, **kwargs: SimpleNamespace(etag=etag))
    monkeypatch.setattr(hf.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(sources, "reachable", lambda url, timeout=None: True)
    served.append(tampered)
    with pytest.raises(OSError, match=f"Invalid download of {HUB_REPO}: .* has not the Hub's sha256 {etag[1:-1]}"):
        create_model("imagenet_resnet18.timm_ra4_in1k", input_shape=SIZE)
    served.append(genuine)
    model = create_model("imagenet_resnet18.timm_ra4_in1k", input_shape=SIZE)
    x = images(9)
    assert np.abs(logits(model, x) - ref.forward(state, x)[0]).max() <= 1e-4


def test_evaluating_a_registered_checkpoint_uses_its_own_preprocessing(offline, timm_imagenet_statistics):
    """keras-preact-evaluate imagenet_resnet18 --weights timm_ra4_in1k (a random checkpoint in the Hub cache):
    evaluated with the checkpoint's view (timm's statistics, the shorter side to 248, bicubic) and its ImageNet-1k
    class names, not the network's default (the centre 224 of 256, bilinear); its mean and its std, also from an
    entry where they differ."""
    pytest.importorskip("huggingface_hub")
    pytest.importorskip("safetensors")
    from keras_preact_training.evaluate import resolve_model

    write_hf_cache(offline / "hf", "timm/resnetv2_18.ra4_e3600_r224_in1k", ref.random_state(18, num_classes=1000))
    target = resolve_model("imagenet_resnet18", "timm_ra4_in1k")
    config = target.input_config
    assert (config.mean, config.std, config.resize_size, config.interpolation) == (
        (127.5, 127.5, 127.5), (127.5, 127.5, 127.5), 248, "bicubic")
    assert tuple(target.class_names) == imagenet_class_names()
    stats = resolve_model(timm_imagenet_statistics, "stats").input_config
    assert (stats.mean, stats.std, stats.resize_size) == (*IMAGENET_STATISTICS.values(), 248)


def test_keras_applications_checkpoint_by_name_checked_by_md5(offline, tmp_path, monkeypatch):
    """A keras.applications ResNetV2 weights file in Keras' cache, registered with its md5: loaded through
    keras.utils.get_file, converted into the tf_slim layout, Keras' outputs; a file whose md5 is not the
    registered one is refused (Keras downloads it again, from a file:// copy here, and refuses that too)."""
    source = keras.applications.ResNet50V2(weights=None, input_shape=SIZE, classes=5, classifier_activation=None)
    rng = np.random.default_rng(6)
    for layer in source.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            g, b, m, v = layer.get_weights()
            layer.set_weights([rng.uniform(0.5, 1.5, g.shape), rng.normal(0, 0.2, b.shape),
                               rng.normal(0, 0.3, m.shape), rng.uniform(0.5, 2.0, v.shape)])
    cache = offline / "keras" / "models"
    cache.mkdir(parents=True)
    file = cache / "random_resnet50v2.h5"
    source.save(str(file))  # legacy HDF5: the format of keras-applications' weights files
    md5 = hashlib.md5(file.read_bytes()).hexdigest()
    register_model("test_keras_resnet50", family="imagenet", arguments={"depth": 50},
                   input_config=model_spec("imagenet_resnet50").input_config,
                   weights={"random": dict(origin="keras", checkpoint=file.name, checksum=f"md5:{md5}", num_classes=5,
                                           arguments={"layout": "tf_slim"}),
                            "tampered": dict(origin="keras", checkpoint="tampered.h5", checksum=f"md5:{md5}",
                                             num_classes=5, arguments={"layout": "tf_slim"})})
    try:
        model = create_model("test_keras_resnet50", weights="random", input_shape=SIZE, classifier_activation=None)
        x = images(6)
        assert np.abs(to_numpy(model(x)) - to_numpy(source(x))).max() <= 1e-4
        server = tmp_path / "server"
        server.mkdir()
        for folder in (cache, server):  # the cached copy and the one downloaded again: the file, one byte more
            (folder / "tampered.h5").write_bytes(file.read_bytes() + b"\0")
        monkeypatch.setattr(sources, "KERAS_WEIGHTS_URL", server.as_uri() + "/")
        with pytest.raises(ValueError, match=f"md5 file hash does not match the provided value of {md5}"):
            create_model("test_keras_resnet50", weights="tampered", input_shape=SIZE)
        assert not list((offline / "keras" / "keras_preact").glob("test_keras_resnet50-tampered-*"))  # nothing used
    finally:
        unregister_model("test_keras_resnet50")


def test_local_timm_folder_and_pth_by_path(offline, tmp_path):
    """weights=PATH: a timm folder (config.json + model.safetensors, its pretrained_cfg as the input config) and
    a PyTorch .pth state dict; a checkpoint of another depth is refused naming both."""
    pytest.importorskip("safetensors")
    from test_pretrained_convert import write_timm_folder

    state = ref.random_state(18, num_classes=5, seed=7)
    folder = write_timm_folder(tmp_path / "resnetv2_18", "resnetv2_18", state, mean=[0.485, 0.456, 0.406],
                               std=[0.229, 0.224, 0.225])  # timm's IMAGENET_DEFAULT_MEAN/STD: they differ
    model = create_model("imagenet_resnet18", weights=str(folder), input_shape=SIZE, classifier_activation=None)
    config = model.input_config
    assert (config.interpolation, config.input_size) == ("bicubic", SIZE)
    np.testing.assert_allclose(config.mean, IMAGENET_STATISTICS["mean"], rtol=1e-6)
    np.testing.assert_allclose(config.std, IMAGENET_STATISTICS["std"], rtol=1e-6)
    x = images(7)
    expected, _ = ref.forward(state, x)
    assert np.abs(to_numpy(model(x)) - expected).max() <= 1e-4
    with pytest.raises(ValueError, match="depth-18 checkpoint for a depth-50 network"):
        create_model("imagenet_resnet50", weights=str(folder))
    if keras.backend.backend() == "torch" or _has_torch():
        import torch

        path = tmp_path / "resnetv2_18.pth"
        torch.save({k: torch.from_numpy(np.array(v)) for k, v in state.items()}, str(path))
        from_pth = create_model("imagenet_resnet18", weights=str(path), input_shape=SIZE, classifier_activation=None)
        assert np.abs(to_numpy(from_pth(x)) - expected).max() <= 1e-4


def _has_torch():
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.hub
def test_keras_hub_preset_folder_by_path(tmp_path, offline):
    """weights=a keras-hub preset folder (a ResNetV2 built from keras-hub's config with random weights)."""
    keras_hub = pytest.importorskip("keras_hub")
    from test_pretrained_convert import randomize

    backbone = keras_hub.models.ResNetBackbone(
        stackwise_num_filters=[64, 128, 256, 512], stackwise_num_blocks=[2, 2, 2, 2],
        stackwise_num_strides=[1, 2, 2, 2], block_type="basic_block", use_pre_activation=True,
        input_conv_filters=[64], input_conv_kernel_sizes=[7], image_shape=(None, None, 3))
    classifier = keras_hub.models.ResNetImageClassifier(backbone=backbone, num_classes=3, activation=None)
    randomize(backbone, 8)
    classifier.save_to_preset(str(tmp_path / "preset"))
    model = create_model("imagenet_resnet18", weights=str(tmp_path / "preset"), input_shape=SIZE,
                         classifier_activation=None)
    x = images(8)
    assert model.output_shape == (None, 3)
    assert np.abs(to_numpy(model(x)) - to_numpy(classifier(x))).max() <= 1e-4


@pytest.mark.hub
def test_keras_hub_preset_carries_its_image_converter_into_the_input_config(tmp_path, offline):
    """A keras-hub preset saved by keras-hub with a preprocessor (ResNetImageConverter: 64 x 48, per-channel
    scale/offset of ImageNet's statistics, bicubic), by path and as a registered kaggle:// preset in kagglehub's
    cache: the model's input config is the converter's (mean = -offset / scale, std = 1 / scale, its size and
    interpolation, the crop_to_aspect_ratio view), and keras-hub's predict on raw 0-255 images equals ours on
    preprocess_input of the same images."""
    keras_hub = pytest.importorskip("keras_hub")
    from test_pretrained_convert import randomize

    from keras_preact.applications import preprocess_input
    from keras_preact.preprocessing import InputConfig

    mean, std = (123.675, 116.28, 103.53), (58.395, 57.12, 57.375)
    converter = keras_hub.layers.ResNetImageConverter(
        image_size=(64, 48), scale=[1 / s for s in std], offset=[-m / s for m, s in zip(mean, std)],
        interpolation="bicubic", antialias=True)
    backbone = keras_hub.models.ResNetBackbone(
        stackwise_num_filters=[64, 128, 256, 512], stackwise_num_blocks=[2, 2, 2, 2],
        stackwise_num_strides=[1, 2, 2, 2], block_type="basic_block", use_pre_activation=True,
        input_conv_filters=[64], input_conv_kernel_sizes=[7], image_shape=(None, None, 3))
    classifier = keras_hub.models.ResNetImageClassifier(
        backbone=backbone, num_classes=3, activation=None,
        preprocessor=keras_hub.models.ResNetImageClassifierPreprocessor(image_converter=converter))
    randomize(backbone, 9)
    handle = "kaggle://keras/test/keras/resnet_v2_18_test/1"
    preset = sources.kaggle_cache(handle)
    classifier.save_to_preset(str(preset))
    expected = InputConfig(input_size=(64, 48, 3), mean=mean, std=std, crop_fraction=1.0, interpolation="bicubic")
    x = np.random.default_rng(9).uniform(0, 255, (2, 64, 48, 3)).astype("float32")  # at the input size: no resize
    theirs = to_numpy(classifier.predict(x, verbose=0))  # keras-hub's preprocessor, then its network
    register_model("test_keras_hub_resnet18", family="imagenet", arguments={"depth": 18},
                   input_config=model_spec("imagenet_resnet18").input_config,
                   weights={"preset": dict(origin="keras_hub", checkpoint=handle, num_classes=3,
                                           arguments={"layout": "timm"})})
    try:
        for model in (create_model("imagenet_resnet18", weights=str(preset), classifier_activation=None),
                      create_model("test_keras_hub_resnet18", weights="preset", classifier_activation=None)):
            config = model.input_config
            assert (config.input_size, config.crop_fraction, config.interpolation) == ((64, 48, 3), 1.0, "bicubic")
            np.testing.assert_allclose(config.mean, expected.mean, rtol=1e-6)
            np.testing.assert_allclose(config.std, expected.std, rtol=1e-6)
            assert model.input_shape == (None, 64, 48, 3)
            assert np.abs(to_numpy(model(preprocess_input(x, model))) - theirs).max() <= 1e-4
    finally:
        unregister_model("test_keras_hub_resnet18")


def test_bad_local_weights_are_refused_by_name(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(
        ValueError,
        match="Invalid weights=.*notes.txt.*unknown file type.*\\(a keras.applications .h5, a timm "
        ".safetensors/.pth file or folder, a keras-hub preset folder",
    ):
        create_model("imagenet_resnet18", weights=str(tmp_path / "notes.txt"))
    with pytest.raises(ValueError, match="no such file or directory"):
        create_model("imagenet_resnet18", weights=str(tmp_path / "missing.safetensors"))
