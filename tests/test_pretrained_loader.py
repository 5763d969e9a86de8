"""One loader per ``weights=`` (``keras_preact.pretrained.loader.get_loader``): decided once, the network built once,
a fine-tune's head dropped rather than a second model built; the names of registered weights against folders; a
bare timm file with its architecture's input config; keras.applications' ``.h5`` through ``PreActResNet50``."""

import keras
import numpy as np
import pretrained_reference as ref
import pytest

from keras_preact.applications import PreActResNet50
from keras_preact.models import backbone as backbone_module
from keras_preact.models import create_model, model_spec
from support import to_numpy

pytestmark = [pytest.mark.core, pytest.mark.notf]
SIZE = (64, 64, 3)


@pytest.fixture
def home(monkeypatch, tmp_path):
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras"))
    return tmp_path / "keras"


@pytest.fixture
def builds(monkeypatch):
    """How many PreActResNetBackbone networks were built (every build of a network makes one)."""
    count = []
    init = backbone_module.PreActResNetBackbone.__init__

    def counted(self, *args, **kwargs):
        count.append(1)
        init(self, *args, **kwargs)

    monkeypatch.setattr(backbone_module.PreActResNetBackbone, "__init__", counted)
    return count


def images(seed=0):
    return np.random.default_rng(seed).uniform(-2, 2, (2, *SIZE)).astype("float32")


def same(a, b):
    return all(np.array_equal(to_numpy(x), to_numpy(y)) for x, y in zip(a.weights, b.weights, strict=True))


def test_a_keras_preact_weights_file_fine_tuned_builds_one_network(tmp_path, builds):
    """A classifier's .weights.h5 under a new head (other classes): one network built, its backbone the file's,
    its head fresh; with the file's classes, the whole classifier."""
    source = create_model("cifar_resnet20", num_classes=10)
    path = tmp_path / "source.weights.h5"
    source.save_weights(path)
    builds.clear()
    tuned = create_model("cifar_resnet20", weights=str(path), num_classes=3)
    assert len(builds) == 1
    assert same(tuned.backbone, source.backbone) and tuned.output_shape == (None, 3)
    builds.clear()
    whole = create_model("cifar_resnet20", weights=str(path))
    assert len(builds) == 1 and same(whole, source)


def test_a_converted_checkpoint_loads_into_one_network(home, tmp_path, builds):
    """A timm folder, once converted: a load builds one network; a fine-tune (3 classes) builds one network and
    keeps the checkpoint's backbone (timm's forward up to the pooled features)."""
    pytest.importorskip("safetensors")
    from test_pretrained_convert import write_timm_folder

    state = ref.random_state(18, num_classes=5, seed=11)
    folder = write_timm_folder(tmp_path / "resnetv2_18", "resnetv2_18", state)
    whole = create_model("imagenet_resnet18", weights=str(folder), input_shape=SIZE, classifier_activation=None)
    x = images()
    assert np.abs(to_numpy(whole(x)) - ref.forward(state, x)[0]).max() <= 1e-4
    builds.clear()
    create_model("imagenet_resnet18", weights=str(folder), input_shape=SIZE)
    assert len(builds) == 1
    builds.clear()
    tuned = create_model("imagenet_resnet18", weights=str(folder), input_shape=SIZE, num_classes=3)
    assert len(builds) == 1 and tuned.output_shape == (None, 3)
    assert same(tuned.backbone, whole.backbone)


def test_a_loader_is_got_once_and_reused(tmp_path):
    """get_loader's Loader is what create_model takes again: the weights are looked at (checked) once."""
    from keras_preact.pretrained.loader import get_loader

    loader = get_loader("cifar_resnet20", "cifar10")
    assert loader.num_classes == 10 and loader.class_names[0] == "airplane"
    assert get_loader("cifar_resnet20", loader) is loader
    model = create_model("cifar_resnet20", weights=loader)
    assert model.class_names == loader.class_names


def test_a_registered_name_wins_over_a_same_named_folder_unless_written_as_a_path(tmp_path, monkeypatch):
    """A folder cifar10/ (with any config.json) in the working directory: weights="cifar10" is still the registered
    name (one warning line names the clash); "./cifar10" is the folder, which is no run."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cifar10").mkdir()
    (tmp_path / "cifar10" / "config.json").write_text("{}")
    with pytest.warns(UserWarning, match="registered weights name; the cifar10 in the working directory is "
                                         "weights='./cifar10'") as caught:
        model = create_model("cifar_resnet20", weights="cifar10")
    assert model.class_names[:2] == ("airplane", "automobile")
    assert ["\n" in str(w.message) for w in caught if "registered" in str(w.message)] == [False]
    with pytest.raises(ValueError, match=r"^Invalid weights='./cifar10' of cifar_resnet20: .* is no run directory"):
        create_model("cifar_resnet20", weights="./cifar10")


def test_a_bare_timm_file_takes_its_architectures_input_config(home, tmp_path):
    """model.safetensors alone (no config.json): the input config of the registered timm checkpoint of its
    architecture (resnetv2_18: timm's ra4 cfg, bicubic, crop 0.9), not generic defaults (bilinear, 0.875)."""
    pytest.importorskip("safetensors")
    from safetensors.numpy import save_file

    state = ref.random_state(18, num_classes=1000, seed=12)
    path = tmp_path / "model.safetensors"
    save_file({k: np.ascontiguousarray(v) for k, v in state.items()}, str(path))
    expected = model_spec("imagenet_resnet18").weights["timm_ra4_in1k"].input_config
    assert (expected.interpolation, expected.resize_size) == ("bicubic", 248)
    model = create_model("imagenet_resnet18", weights=str(path), input_shape=SIZE, classifier_activation=None)
    assert model.input_config == expected.replace(input_size=SIZE)
    x = images(1)
    assert np.abs(to_numpy(model(x)) - ref.forward(state, x)[0]).max() <= 1e-4


def keras_applications_h5(tmp_path, seed):
    """(a keras.applications ResNet50V2 of 5 classes with random weights and batch statistics, its legacy .h5)."""
    source = keras.applications.ResNet50V2(weights=None, input_shape=SIZE, classes=5, classifier_activation=None)
    rng = np.random.default_rng(seed)
    for layer in source.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            g, b, m, v = layer.get_weights()
            layer.set_weights([rng.uniform(0.5, 1.5, g.shape), rng.normal(0, 0.2, b.shape),
                               rng.normal(0, 0.3, m.shape), rng.uniform(0.5, 2.0, v.shape)])
    file = tmp_path / "resnet50v2.h5"
    source.save(str(file))  # legacy HDF5: the format of keras-applications' weights files
    return source, file


def first_loads_build_one_network(name, weights, builds, home):
    """(the fine-tuned model, the whole classifier) of a checkpoint not in the cache: a fine-tune first (3
    classes: one network built, the backbone converted, nothing cached), then the whole classifier (one network
    built, converted into it, the cache written from it), then the whole classifier again (one network, from the
    cache: the same weights)."""
    from keras_preact.pretrained import cache

    builds.clear()
    tuned = create_model(name, weights=weights, input_shape=SIZE, num_classes=3)
    assert len(builds) == 1 and tuned.output_shape == (None, 3)
    assert not list((home / "keras_preact").glob("*.weights.h5"))
    builds.clear()
    whole = create_model(name, weights=weights, input_shape=SIZE, classifier_activation=None)
    assert len(builds) == 1
    (entry,) = (home / "keras_preact").glob("*.weights.h5")
    assert cache.read_record(entry)["sha256"] == cache.sha256_of(entry)
    builds.clear()
    again = create_model(name, weights=weights, input_shape=SIZE, classifier_activation=None)
    assert len(builds) == 1 and same(again, whole)
    assert same(tuned.backbone, whole.backbone)
    return tuned, whole


def test_the_first_load_of_a_timm_folder_builds_one_network(home, tmp_path, builds):
    """A timm folder never converted: its first fine-tune and its first whole load each build one network (the
    checkpoint converted into it), with timm's logits."""
    pytest.importorskip("safetensors")
    from test_pretrained_convert import write_timm_folder

    state = ref.random_state(18, num_classes=5, seed=14)
    folder = write_timm_folder(tmp_path / "resnetv2_18", "resnetv2_18", state)
    _, whole = first_loads_build_one_network("imagenet_resnet18", str(folder), builds, home)
    x = images(3)
    assert np.abs(to_numpy(whole(x)) - ref.forward(state, x)[0]).max() <= 1e-4


def test_the_first_load_of_a_keras_applications_h5_builds_one_network(home, tmp_path, builds):
    """A keras.applications .h5 never converted: its first fine-tune and its first whole load each build one
    network of ours (keras.applications' own network is the source read), with Keras' logits."""
    source, file = keras_applications_h5(tmp_path, seed=15)
    _, whole = first_loads_build_one_network("imagenet_resnet50", str(file), builds, home)
    x = images(4)
    assert np.abs(to_numpy(whole(x)) - to_numpy(source(x))).max() <= 1e-4


@pytest.mark.hub
def test_the_first_load_of_a_keras_hub_preset_folder_builds_one_network(home, tmp_path, builds):
    """A keras-hub preset folder never converted: its first fine-tune and its first whole load each build one
    network of ours (keras-hub's own classifier is the source read), with keras-hub's logits."""
    keras_hub = pytest.importorskip("keras_hub")
    from test_pretrained_convert import randomize

    backbone = keras_hub.models.ResNetBackbone(
        stackwise_num_filters=[64, 128, 256, 512], stackwise_num_blocks=[2, 2, 2, 2],
        stackwise_num_strides=[1, 2, 2, 2], block_type="basic_block", use_pre_activation=True,
        input_conv_filters=[64], input_conv_kernel_sizes=[7], image_shape=(None, None, 3))
    classifier = keras_hub.models.ResNetImageClassifier(backbone=backbone, num_classes=5, activation=None)
    randomize(backbone, 16)
    classifier.save_to_preset(str(tmp_path / "preset"))
    _, whole = first_loads_build_one_network("imagenet_resnet18", str(tmp_path / "preset"), builds, home)
    x = images(5)
    assert np.abs(to_numpy(whole(x)) - to_numpy(classifier(x))).max() <= 1e-4


def test_preact_resnet50_loads_a_keras_applications_h5(home, tmp_path):
    """PreActResNet50(weights=<keras.applications ResNet50V2 legacy .h5>) converts it as create_model does (the
    TF-slim layout, Keras' outputs), instead of Keras' raw 'Layer count mismatch'."""
    source, file = keras_applications_h5(tmp_path, seed=13)
    model = PreActResNet50(weights=str(file), input_shape=SIZE, classes=5, classifier_activation=None)
    x = images(2)
    assert model.input_config.mean == (127.5, 127.5, 127.5)  # Keras' [-1, 1] pixels: the weights' input config
    assert np.abs(to_numpy(model(x)) - to_numpy(source(x))).max() <= 1e-4
