"""The 1,000 ImageNet-1k class names shipped as package data: the standard order, read on first use, carried by
every ImageNet-1k checkpoint of the registry (keras.applications, timm, keras-hub) into the models built with it,
so ``decode_predictions`` names the classes; the ImageNet-21k checkpoints carry none."""

import subprocess
import sys

import numpy as np
import pytest

from keras_preact.applications import decode_predictions
from keras_preact.models import imagenet_class_names, list_models, model_spec
from keras_preact.models.class_names import IMAGENET1K_FILE, ClassNames

pytestmark = [pytest.mark.notf]


@pytest.mark.any_backend
def test_the_shipped_file_holds_the_1000_names_in_the_standard_order():
    names = imagenet_class_names()
    assert len(names) == len(set(names)) == 1000
    assert names[:2] == ("tench, Tinca tinca", "goldfish, Carassius auratus")
    assert names[999] == "toilet tissue, toilet paper, bathroom tissue"
    assert (names[134], names[517]) == ("crane (bird)", "crane (machine)")  # the two "crane" synsets told apart
    assert "Apache License 2.0" in IMAGENET1K_FILE.read_text()  # source and licence in its header
    try:
        import keras_hub  # noqa: F401 - its ImageNet names (WordNet ID order): a second, independent list
    except ImportError:
        return
    from keras_hub.utils import imagenet_id_to_name

    differ = [i for i in range(1000)
              if imagenet_id_to_name(i).replace("_", " ") not in [n.strip() for n in names[i].split(",")]]
    assert differ == [134, 517]  # keras-hub names both "crane"


@pytest.mark.any_backend
def test_bad_names_files_are_refused_naming_them(tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("# header\na\nb\na\n")
    with pytest.raises(ValueError, match=r"Invalid test class names: .*short.txt holds 3 names \(2 unique\), 3 unique"):
        list(ClassNames(short, 3, "test"))
    with pytest.raises(ValueError, match="missing.txt is unreadable"):
        ClassNames(tmp_path / "missing.txt", 3, "test")[0]


@pytest.mark.once
def test_the_names_are_read_on_first_use_not_at_import():
    code = ("import keras_preact.applications, keras_preact.models as m; from keras_preact.models.class_names import "
            "IMAGENET1K_CLASSES as c; assert c._names is None; "
            "assert m.model_spec('imagenet_resnet50').weights['imagenet'].class_names is c; "
            "assert c._names is None; print(len(tuple(c)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "1000"


@pytest.mark.any_backend
def test_every_imagenet_1k_checkpoint_of_the_registry_carries_the_names():
    names = imagenet_class_names()
    for entry in list_models("imagenet_*", pretrained=True):
        network, weights = entry.split(".")
        spec = model_spec(network).weights[weights]
        if spec.num_classes == 1000:
            assert tuple(spec.class_names) == names, entry
        else:  # timm's BiT-M on ImageNet-21k: 21,843 classes, no names list shipped
            assert (spec.num_classes, spec.class_names) == (21843, None), entry
    origins = {model_spec(e.split(".")[0]).weights[e.split(".")[1]].origin for e in list_models(pretrained=True)
               if model_spec(e.split(".")[0]).weights[e.split(".")[1]].num_classes == 1000}
    assert origins == {"keras", "timm", "keras_hub"}
    top = decode_predictions(np.eye(1000)[[1, 999]], top=1, model="imagenet_resnet50")
    assert top == [
        [(1, "goldfish, Carassius auratus", 1.0)],
        [(999, "toilet tissue, toilet paper, bathroom tissue", 1.0)],
    ]


@pytest.mark.any_backend
def test_keras_applications_entry_points_with_imagenet_weights_carry_the_names(monkeypatch):
    """PreActResNet50(weights="imagenet") builds its classifier with the names (Keras' weights and the network
    stubbed: the wiring only; create_model's path builds real models in test_pretrained_registry)."""
    import importlib
    import types

    from keras_preact.applications import PreActResNet50

    preact_resnet = importlib.import_module("keras_preact.applications.preact_resnet")
    built = {}

    def network(depth, classes, **arguments):
        built.update(arguments, depth=depth, classes=classes)
        return types.SimpleNamespace()

    keras_weights = types.SimpleNamespace(  # the loader of imagenet_resnet50's registered "imagenet" weights
        num_classes=1000, class_names=imagenet_class_names(), input_config=None, arguments={"layout": "tf_slim"},
        load=lambda model: built.update(weights="keras weights"),
        load_backbone=lambda backbone: built.update(weights="keras backbone"))
    monkeypatch.setattr(preact_resnet, "imagenet_resnet", network)
    monkeypatch.setattr(preact_resnet, "_loader", lambda depth, weights: keras_weights)
    PreActResNet50(weights="imagenet")
    assert (built["depth"], built["classes"], built["weights"]) == (50, 1000, "keras weights")
    assert built["class_names"] == imagenet_class_names()
    built.clear()
    PreActResNet50(weights="imagenet", include_top=False, input_shape=(64, 64, 3))
    assert "class_names" not in built  # no head, no names
