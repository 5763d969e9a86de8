"""Fine-tuning in the library: ``create_model(name, weights=W, num_classes=K)`` keeps W's backbone under a new
head (W registered, a ``.weights.h5``/``.keras`` file or a run directory), ``set_trainable``/``trainable_from``
freeze the backbone up to a point with BatchNormalization in inference mode, and the two-phase recipe
(head, then every layer at a lower rate) trains with plain ``model.fit`` on every backend."""

import json

import keras
import numpy as np
import pytest

from keras_preact.models import create_model, get_input_config, register_model, set_trainable
from keras_preact.models.registry import unregister_model
from keras_preact.models.weights import sha256_of
from support import randomize_statistics, to_numpy

pytestmark = [pytest.mark.core, pytest.mark.notf]

INPUT = get_input_config("cifar_resnet20").replace(input_size=(16, 16, 3))
CLASSES = ["ant", "bee", "cat"]
NAME = "test_finetune_resnet8"


@pytest.fixture
def trained(tmp_path):
    """A registered ResNet-8 (16 x 16) whose weights ``"toy"`` (3 classes, random statistics) are a file
    written here; yields the reference classifier."""
    keras.utils.set_random_seed(1)
    reference = randomize_statistics(create_model("cifar_resnet20", num_classes=3, input_shape=(16, 16, 3),
                                                  depth=8), seed=1)
    path = tmp_path / "toy.weights.h5"
    reference.save_weights(path)
    entry = dict(file=str(path), sha256=sha256_of(path), class_names=CLASSES, dataset="toy")
    register_model(NAME, family="cifar", arguments={"depth": 8}, input_config=INPUT, weights={"toy": entry})
    yield reference
    unregister_model(NAME)


def _images(n=8, seed=0):
    return np.random.default_rng(seed).uniform(-2, 2, (n, 16, 16, 3)).astype("float32")


def _values(variables):
    return [to_numpy(v).copy() for v in variables]


def _assert_same(actual, expected):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        np.testing.assert_array_equal(to_numpy(a), to_numpy(e))


def _head_kernel(model):
    return to_numpy(model.get_layer("logits").kernel)


def test_registered_weights_with_other_classes_keep_the_backbone_under_a_new_head(trained):
    model = create_model(NAME, weights="toy", num_classes=5, class_names=list("vwxyz"))
    _assert_same(model.backbone.weights, trained.backbone.weights)  # moving statistics included
    assert model.output_shape == (None, 5) and _head_kernel(model).shape == (64, 5)
    assert model.class_names == tuple("vwxyz") and model.input_config == INPUT
    # The head is freshly initialised: Keras' default, zero bias, a Glorot-uniform kernel within its bound.
    np.testing.assert_array_equal(to_numpy(model.get_layer("logits").bias), np.zeros(5))
    assert 0 < np.abs(_head_kernel(model)).max() <= np.sqrt(6 / (64 + 5))
    # num_classes defaults to the class names' count; no class names: none carried.
    assert create_model(NAME, weights="toy", class_names=["a", "b"]).output_shape == (None, 2)
    assert create_model(NAME, weights="toy", num_classes=7).class_names is None


def test_the_same_classes_keep_the_head_other_names_replace_it(trained):
    kept = create_model(NAME, weights="toy", num_classes=3, class_names=CLASSES)
    _assert_same(kept.weights, trained.weights)
    assert kept.class_names == tuple(CLASSES)
    renamed = create_model(NAME, weights="toy", class_names=["dog", "eel", "fox"])  # other classes, same count
    _assert_same(renamed.backbone.weights, trained.backbone.weights)
    assert not np.array_equal(_head_kernel(renamed), _head_kernel(trained))
    assert renamed.class_names == ("dog", "eel", "fox")


def test_local_weights_file_keras_file_and_run_directory(trained, tmp_path):
    weights_file = tmp_path / "mine.weights.h5"
    trained.save_weights(weights_file)
    carried = INPUT.replace(mean=(1.0, 2.0, 3.0), std=(4.0, 5.0, 6.0))
    trained.class_names, trained.input_config = CLASSES, carried
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    trained.save(run_dir / "model.keras")
    (run_dir / "config.json").write_text(json.dumps({"class_names": CLASSES}))
    for source, config in ((weights_file, INPUT), (str(run_dir / "model.keras"), carried), (run_dir, carried)):
        model = create_model(NAME, weights=source, num_classes=4)
        _assert_same(model.backbone.weights, trained.backbone.weights)
        assert model.output_shape == (None, 4) and model.input_config == config, source
        whole = create_model(NAME, weights=source)  # its own classes: the whole classifier
        np.testing.assert_array_equal(to_numpy(whole(_images())), to_numpy(trained(_images())))
        assert whole.class_names == (None if source == weights_file else tuple(CLASSES))
    # A registered network of the same architecture takes them as well, at its own input size.
    larger = create_model("cifar_resnet20", depth=8, weights=run_dir, num_classes=2)
    _assert_same(larger.backbone.weights, trained.backbone.weights)
    assert larger.input_config == carried.replace(input_size=(32, 32, 3))


def test_bad_local_weights_are_refused_naming_them(trained, tmp_path):
    (tmp_path / "empty").mkdir()
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    (unfinished / "config.json").write_text('{"format": "keras-preact-run/2"}')  # a run's, written at its start
    not_a_run = tmp_path / "not_a_run"  # any other config.json: not called a run
    not_a_run.mkdir()
    (not_a_run / "config.json").write_text('{"model_type": "vit"}')
    (tmp_path / "notes.txt").write_text("x")
    other = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    other.save(tmp_path / "other.keras")
    trained.save_weights(tmp_path / "mine.weights.h5")
    cases = [
        (tmp_path / "missing.weights.h5", "no such file or directory"),
        (tmp_path / "empty", "is no run directory \\(no model.keras\\)"),
        (unfinished, "is an unfinished run \\(resume it to write model.keras\\)"),
        (not_a_run, "is no run directory \\(no model.keras\\)"),
        (tmp_path / "notes.txt", "unknown file type"),
        (tmp_path / "other.keras", "not a keras-preact classifier"),
    ]
    for weights, message in cases:
        with pytest.raises(ValueError, match=f"^Invalid weights='{weights}' of {NAME}: .*{message}"):
            create_model(NAME, weights=str(weights), num_classes=2)
    with pytest.raises(ValueError, match="does not fit the model built \\(were its architecture arguments overridden"):
        create_model(NAME, weights=tmp_path / "mine.weights.h5", num_classes=2, depth=14)


def test_a_frozen_backbone_runs_batch_normalization_in_inference_mode(trained):
    model = create_model(NAME, weights="toy", num_classes=2)
    model.backbone.trainable = False
    images = _images()
    np.testing.assert_array_equal(to_numpy(model(images, training=True)), to_numpy(model(images, training=False)))
    assert [v.path for v in model.trainable_weights] == [model.get_layer("logits").kernel.path,
                                                         model.get_layer("logits").bias.path]
    backbone = _values(model.backbone.weights)
    model.compile(keras.optimizers.SGD(0.5), "sparse_categorical_crossentropy")
    head = _head_kernel(model).copy()
    model.fit(images, np.arange(8) % 2, batch_size=4, epochs=1, verbose=0)
    _assert_same(model.backbone.weights, backbone)  # moving statistics included: inference mode
    assert not np.array_equal(_head_kernel(model), head)


def test_trainable_from_a_stage_freezes_what_comes_before_it(trained):
    model = create_model(NAME, weights="toy", num_classes=2, trainable_from="stage3")
    backbone = model.backbone
    frozen = [layer for layer in backbone.layers if not layer.trainable]
    assert [layer.name for layer in frozen][-2:] == ["stage1_unit1", "stage2_unit1"]
    assert backbone.get_layer("stage3_unit1").trainable and backbone.get_layer("final_norm").trainable
    before = {v.path: to_numpy(v).copy() for v in backbone.weights}
    model.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy")
    model.fit(_images(), np.arange(8) % 2, batch_size=4, epochs=1, verbose=0)
    changed = {v.path for v in backbone.weights if not np.array_equal(to_numpy(v), before[v.path])}
    stage3 = {v.path for v in backbone.get_layer("stage3_unit1").weights} | {
        v.path for v in backbone.get_layer("final_norm").weights}
    assert changed == stage3  # every weight of stage 3 and the final BN (statistics too), nothing before
    set_trainable(model, "stem")
    assert all(layer.trainable for layer in backbone.layers)
    set_trainable(model, "stem", freeze_norm=True)
    assert backbone.get_layer("stem_conv").trainable and not backbone.get_layer("final_norm").trainable
    norms = [v for v in model.trainable_weights if "gamma" in v.path or "beta" in v.path]
    assert norms == [] and len(model.trainable_weights) == len([v for v in model.weights if "kernel" in v.path or
                                                                 "bias" in v.path])
    with pytest.raises(ValueError, match="Invalid trainable_from='stage4'. Allowed values: 'stem', 'stage1', "
                                         "'stage2', 'stage3', 'final', 'head'"):
        set_trainable(model, "stage4")


def test_set_trainable_freezes_by_the_backbones_group_matcher(monkeypatch):
    """set_trainable reads the backbone's public groups (``group_matcher``, timm's): a backbone whose stage 2 group
    starts a unit later keeps that unit frozen with the stages before."""
    model = create_model("cifar_resnet20", num_classes=2)  # three units per stage
    backbone = model.backbone
    groups = backbone.group_matcher()
    assert groups["stage2"] == ("stage2_unit1", "stage2_unit2", "stage2_unit3")
    regrouped = {**groups, "stage1": groups["stage1"] + groups["stage2"][:1], "stage2": groups["stage2"][1:]}
    monkeypatch.setattr(type(backbone), "group_matcher", lambda self: regrouped)
    set_trainable(model, "stage2")
    assert [backbone.get_layer(n).trainable for n in ("stage1_unit3", "stage2_unit1", "stage2_unit2")] == [
        False, False, True]


def test_the_two_phase_recipe_trains_with_plain_fit(tmp_path):
    """Keras' transfer-learning recipe, as the fine-tuning guide writes it: the new head on a frozen backbone,
    then every layer at a 100x lower rate."""
    keras.utils.set_random_seed(0)
    source = create_model("cifar_resnet20", depth=8, input_shape=(16, 16, 3), num_classes=10)
    source.save_weights(tmp_path / "source.weights.h5")
    model = create_model("cifar_resnet20", depth=8, input_shape=(16, 16, 3), weights=tmp_path / "source.weights.h5",
                         num_classes=3, trainable_from="head")
    rng = np.random.default_rng(0)
    labels = np.arange(24) % 3
    images = rng.normal(0, 1, (24, 16, 16, 3)).astype("float32") + labels[:, None, None, None]
    backbone = _values(model.backbone.weights)
    model.compile(keras.optimizers.Adam(1e-2), "sparse_categorical_crossentropy", metrics=["accuracy"])
    first = model.fit(images, labels, batch_size=8, epochs=3, verbose=0).history
    _assert_same(model.backbone.weights, backbone)
    assert first["loss"][-1] < first["loss"][0]
    set_trainable(model, "stem")
    model.compile(keras.optimizers.Adam(1e-4), "sparse_categorical_crossentropy", metrics=["accuracy"])
    second = model.fit(images, labels, batch_size=8, epochs=2, verbose=0).history
    moved = [not np.array_equal(to_numpy(v), b) for v, b in zip(model.backbone.weights, backbone)]
    assert all(moved)  # every kernel, BN scale and offset and moving statistic trained in phase 2
    assert np.isfinite(second["loss"]).all()

