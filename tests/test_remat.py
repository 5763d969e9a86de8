"""Rematerialisation: ``remat=`` changes memory, not math. Per policy, the loss and every gradient of
CIFAR ResNet-29 (bottleneck, 3 units per stage: every kind of unit, and every way a policy groups them)
equal the network's without remat, the recomputation really happens, BN moving statistics
move once per step, ``keras-preact-train --remat`` trains the same weights, and saved files and exports
do not depend on it. Runs on every backend, with or without TensorFlow."""

import contextlib
import functools
import importlib
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import types

import keras
import numpy as np
import pytest

from keras_preact import applications
from keras_preact.export import FORMATS, check_formats, export_model, load
from keras_preact.layers import ResidualUnit
from keras_preact.models import PreActResNetBackbone, cifar_resnet, create_model, imagenet_resnet
from keras_preact.models import remat as remat_lib
from keras_preact.models.remat import REMAT_POLICIES, parse_remat, unit_groups
from keras_preact_training import cli
from keras_preact_training.machine import backends
from keras_preact_training.recipe import configs
from keras_preact_training.run.manifest import model_fingerprint
from support import run_config_echo_test, to_numpy

# The math runs on every backend (core, notf); the argument plumbing, plain Python and the same on each,
# in the TensorFlow pass only (building ImageNet networks op by op is slow on JAX).
checkpointed = remat_lib.run_checkpointed
BACKEND = keras.backend.backend()
# CIFAR ResNet-29 (bottleneck, 9 units, 3 per stage): each stage's strided, projecting first unit and units on
# identity shortcuts; "units" checkpoints each, "stages" three of three, "segments:4" across stage boundaries with a
# shorter last one. ResNet-164's 54 units add only depth, the same checkpoints 18 times a stage (and took ~70 s of a
# CI core per backend; the JAX jit compile of its step alone, minutes).
DEPTH = 29
POLICIES = ["units", "stages", "segments:4"]  # 4 does not divide the units: a shorter last segment
TOLERANCE = 1e-5
REPO = pathlib.Path(__file__).resolve().parents[1]


def test_policies_group_the_units():
    assert set(REMAT_POLICIES) == {None, "units", "stages", "segments"}
    units = [3, 3, 2]
    assert unit_groups(None, units) == []
    assert unit_groups("units", units) == [[i] for i in range(8)]
    assert unit_groups("stages", units) == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert unit_groups("segments:3", units) == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert unit_groups("segments:5", units) == [[0, 1, 2, 3, 4], [5, 6, 7]]  # across a stage boundary
    assert unit_groups("segments:100", units) == [list(range(8))]
    assert parse_remat("segments:18") == ("segments", 18)


def test_bad_remat_is_refused_naming_it_and_the_allowed_values():
    for bad in ["unit", "Units", "segments", "segments:0", "segments:-2", "segments:x", "segments:04", "segments:2.5",
                "none", "", 3, True]:
        expected = f"Invalid remat={bad!r}. Allowed values: None, 'units', 'stages' or 'segments:<k>'"
        for build, arguments in ((cifar_resnet, dict(depth=8)),
                                 (applications.preact_resnet, dict(depth=18, input_shape=(32, 32, 3))),
                                 (configs.get_config, {})):
            with pytest.raises(ValueError) as error:
                build(**arguments, remat=bad)
            assert str(error.value).startswith(expected), error.value


def test_every_builder_takes_remat_and_keeps_it_in_its_config():
    backbones = [
        cifar_resnet(8, remat="units").backbone,
        cifar_resnet(11, remat="segments:2", include_top=False),  # 9n+2 bottleneck, the backbone itself
        imagenet_resnet(18, input_shape=(64, 64, 3), remat="stages").backbone,
        applications.PreActResNet18(input_shape=(64, 64, 3), remat="segments:3").backbone,
        create_model("cifar_resnet20", remat="units").backbone,
    ]
    assert [b.remat for b in backbones] == ["units", "segments:2", "stages", "segments:3", "units"]
    for backbone in backbones:
        assert backbone.get_config()["remat"] == backbone.remat
    run_config_echo_test(PreActResNetBackbone, backbones[1])
    assert PreActResNetBackbone.from_config(backbones[1].get_config()).remat == "segments:2"


def test_imagenet_weights_take_remat(monkeypatch):
    """``weights="imagenet"`` fixes the architecture and refuses unit options, but not ``remat``."""
    module = importlib.import_module("keras_preact.applications.preact_resnet")  # the package's name is a function

    seen = {}

    def loader(depth, weights):  # Keras' weights, stubbed: their loader puts them into the backbone built
        seen["depth"] = depth
        return types.SimpleNamespace(num_classes=1000, class_names=None, input_config=None,
                                     arguments={"layout": "tf_slim"}, load_backbone=lambda backbone: backbone)

    monkeypatch.setattr(module, "_loader", loader)
    model = applications.PreActResNet50(weights="imagenet", include_top=False, input_shape=(32, 32, 3),
                                        remat="stages")
    assert seen == {"depth": 50} and model.remat == "stages"


# ------------------------------------------------------------------------------ exactness
def _loss_and_grads(model, images, labels):
    """Cross-entropy of a training-mode step and its gradient for every trainable variable, computed as
    each backend's trainer does (TensorFlow: a tape; PyTorch: backward; JAX: jit of a stateless call);
    on JAX, the checkpoints in the traced step."""
    loss_fn = keras.losses.SparseCategoricalCrossentropy()
    variables = model.trainable_variables
    checkpoints = None
    if BACKEND == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        grads = tape.gradient(loss, variables)
    elif BACKEND == "torch":
        model.zero_grad()
        loss = loss_fn(labels, model(images, training=True))
        loss.backward()
        grads = [v.value.grad for v in variables]
        loss = loss.detach()
    else:
        import jax

        state = [v.value for v in model.non_trainable_variables]

        def objective(values):
            return loss_fn(labels, model.stateless_call(values, state, images, training=True)[0])

        traced = jax.jit(jax.value_and_grad(objective)).trace([v.value for v in variables])
        # The recomputation is compiled from the trace, not a second Python call of the units: count
        # the checkpoints the differentiated step recomputes.
        checkpoints = sum(eqn.primitive.name in ("checkpoint", "remat2") for eqn in traced.jaxpr.jaxpr.eqns)
        loss, grads = traced.lower().compile()([v.value for v in variables])
    return float(to_numpy(loss)), [to_numpy(g) for g in grads], checkpoints


@contextlib.contextmanager
def unit_calls():
    """The names of the residual units run inside the block, in order (their Python ``call``)."""
    calls = []
    call = ResidualUnit.call

    @functools.wraps(call)
    def counted(self, *args, **kwargs):
        calls.append(self.name)
        return call(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ResidualUnit, "call", counted)
        yield calls


def _step(model, images, labels):
    """(loss, gradients, how often the step ran the units: Python calls on TensorFlow and PyTorch, the
    checkpoints of the trace on JAX)."""
    with unit_calls() as calls:
        loss, grads, checkpoints = _loss_and_grads(model, images, labels)
    return loss, grads, checkpoints if BACKEND == "jax" else len(calls)


@pytest.fixture(scope="module")
def batch():
    rng = np.random.default_rng(0)
    return rng.normal(size=(2, 32, 32, 3)).astype("float32"), np.array([3, 7])


@pytest.fixture(scope="module")
def reference(batch):
    keras.utils.set_random_seed(1)
    model = cifar_resnet(DEPTH)
    return model, _step(model, *batch)


@pytest.mark.core
@pytest.mark.notf
def test_without_remat_every_unit_runs_once(reference):
    model, (_, _, runs) = reference
    assert runs == (0 if BACKEND == "jax" else sum(model.backbone.stackwise_units))


@pytest.mark.core
@pytest.mark.notf
@pytest.mark.parametrize("policy", POLICIES)
def test_loss_and_every_gradient_equal_without_remat(policy, batch, reference):
    plain, (loss, grads, _) = reference
    model = cifar_resnet(DEPTH, remat=policy)
    for target, source in zip(model.variables, plain.variables, strict=True):
        target.assign(to_numpy(source.value))
    remat_loss, remat_grads, runs = _step(model, *batch)
    assert abs(remat_loss - loss) <= TOLERANCE * max(1.0, abs(loss))
    assert len(remat_grads) == len(grads) == len(model.trainable_variables)
    for variable, g, expected in zip(model.trainable_variables, remat_grads, grads):
        assert np.any(expected), variable.path
        np.testing.assert_allclose(g, expected, rtol=TOLERANCE, atol=TOLERANCE, err_msg=variable.path)
    # The recomputation happens: every unit runs twice in the step (forward, then its checkpoint's
    # recomputation), or on JAX the differentiated step recomputes one checkpoint per group.
    units = model.backbone.stackwise_units
    assert runs == (len(unit_groups(policy, units)) if BACKEND == "jax" else 2 * sum(units))


# ------------------------------------------------------------------------------ BN statistics
@pytest.mark.core
@pytest.mark.notf
def test_bn_moving_statistics_move_once_per_step(batch):
    """One compiled ``train_on_batch`` step (the trainers of all three backends): the moving statistics
    and the weights equal the network's without remat, and the statistics did move."""
    models = []
    for remat in (None, "segments:2"):  # one checkpoint across a stage boundary, then a unit alone
        model = cifar_resnet(11, remat=remat)  # 9n+2 bottleneck, n=1: three units, one per stage
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
        for target, source in zip(model.variables, (models or [model])[0].variables, strict=True):
            target.assign(to_numpy(source.value))  # a copy: JAX's fit donates the arrays it updates
        models.append(model)
    before = [to_numpy(v.value).copy() for v in models[1].non_trainable_variables]
    for model in models:
        model.train_on_batch(*batch)
    plain, remat = models
    moving = [v for v in remat.non_trainable_variables if "moving_mean" in v.path]
    assert len(moving) == 3 * 3 + 1  # three BNs per bottleneck unit, and the final one
    moved = [i for i, v in enumerate(remat.non_trainable_variables) if not np.array_equal(to_numpy(v.value), before[i])]
    assert len(moved) >= 2 * len(moving)  # every moving mean and variance
    for a, b in zip(remat.variables, plain.variables, strict=True):
        np.testing.assert_allclose(to_numpy(a.value), to_numpy(b.value), rtol=0, atol=1e-6, err_msg=a.path)


# ------------------------------------------------------------------------------ saving and export
@pytest.mark.core
@pytest.mark.notf
def test_keras_file_and_weights_do_not_depend_on_remat(tmp_path, batch):
    images = batch[0]
    keras.utils.set_random_seed(3)
    model = cifar_resnet(11, remat="stages")
    model.save(tmp_path / "remat.keras")
    loaded = keras.saving.load_model(tmp_path / "remat.keras", safe_mode=True)
    assert loaded.backbone.remat == "stages"
    plain = cifar_resnet(11)
    model.save_weights(tmp_path / "remat.weights.h5")
    plain.load_weights(tmp_path / "remat.weights.h5")  # the same variable paths
    expected = to_numpy(model(images, training=False))
    for other in (loaded, plain):
        for a, b in zip(other.weights, model.weights, strict=True):
            assert a.path == b.path
            np.testing.assert_array_equal(to_numpy(a.value), to_numpy(b.value))
        np.testing.assert_array_equal(to_numpy(other(images, training=False)), expected)
    assert model_fingerprint(model) == model_fingerprint(plain)  # what exports and resumes check


WRITABLE = []
for _name in FORMATS:
    try:
        WRITABLE.append(check_formats([_name])[0])
    except (ValueError, ImportError):
        pass


@pytest.mark.core
@pytest.mark.notf
@pytest.mark.skipif(not WRITABLE, reason=f"no export format is writable from {BACKEND} here")
def test_export_does_not_depend_on_remat(tmp_path, batch):
    fmt = WRITABLE[0]
    keras.utils.set_random_seed(4)
    plain = cifar_resnet(11)
    model = cifar_resnet(11, remat="units")
    model.set_weights(plain.get_weights())
    pixels = np.random.default_rng(5).integers(0, 256, size=(2, 32, 32, 3)).astype("uint8")
    outputs = []
    for name, network in (("plain", plain), ("remat", model)):
        path = export_model(network, tmp_path, formats=[fmt], name=name)
        outputs.append(load(path, fmt).predict(pixels))
    assert outputs[0].keys() == outputs[1].keys()
    for key in outputs[0]:
        np.testing.assert_array_equal(outputs[0][key], outputs[1][key], err_msg=f"{fmt} {key}")


@pytest.mark.core
@pytest.mark.notf
# ------------------------------------------------------------------------------ training CLI
def test_keras_preact_train_remat_trains_the_same_weights(tmp_path, monkeypatch):
    """The real entry point, a few steps on the built-in synthetic data: ``--remat`` changes nothing
    the run trains or records but the setting itself."""
    flags = ["--depth", "11", "--image-size", "16", "16", "--batch-size", "8", "--synthetic-train-size", "32",
             "--synthetic-test-size", "16", "--epochs", "1", "--steps-per-epoch", "3", "--verbose", "0",
             "--no-export", "--jit-compile", "true" if BACKEND == "jax" else "false", "--seed", "7"]
    checkpoints = []
    monkeypatch.setattr(remat_lib, "run_checkpointed", lambda *args: checkpoints.append(1) or checkpointed(*args))
    runs = {}
    for remat in (None, "segments:2"):
        run = tmp_path / str(remat).replace(":", "")
        assert cli.main([*flags, "--run-dir", str(run), *(["--remat", remat] if remat else [])]) == 0
        assert bool(checkpoints) == bool(remat)  # the run went through the checkpoints
        manifest = json.loads((run / "config.json").read_text())
        assert manifest["config"]["remat"] == remat
        runs[remat] = manifest, keras.saving.load_model(run / "model.keras")
    (plain_manifest, plain), (remat_manifest, model) = runs.values()
    assert model.backbone.remat == "segments:2" and plain.backbone.remat is None
    assert remat_manifest["model"] == plain_manifest["model"]
    for a, b in zip(model.weights, plain.weights, strict=True):
        np.testing.assert_allclose(to_numpy(a.value), to_numpy(b.value), rtol=0, atol=1e-5, err_msg=a.path)


# ------------------------------------------------------------------------------ JAX's CPU schedule
@pytest.mark.notf
def test_remat_on_jax_cpu_sets_the_xla_flags_unless_the_user_did(monkeypatch):
    """keras-preact-train --remat on JAX without an accelerator adds the XLA flags without which XLA's CPU
    compile undoes remat; a user's own setting of a flag wins, other flags stay; other backends, no remat
    or an accelerator leave XLA_FLAGS as it was."""
    cse, scheduler = "--xla_disable_hlo_passes=cse", "--xla_cpu_enable_concurrency_optimized_scheduler=false"
    monkeypatch.setitem(sys.modules, "jax._src.xla_bridge", types.SimpleNamespace(_backends={}))
    environ = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    note = backends.xla_flags_for_remat("jax", "segments:18", environ, accelerator=False)
    assert note.startswith(f"[remat] XLA_FLAGS += {scheduler} {cse} ")
    assert environ["XLA_FLAGS"] == f"--xla_force_host_platform_device_count=2 {scheduler} {cse}"
    environ = {"XLA_FLAGS": "--xla_disable_hlo_passes=fusion"}
    assert backends.xla_flags_for_remat("jax", "units", environ, accelerator=False)
    assert environ["XLA_FLAGS"] == f"--xla_disable_hlo_passes=fusion {scheduler}"
    for backend, remat, accelerator, environ in (
            ("jax", None, False, {}), ("tensorflow", "units", False, {}), ("torch", "units", False, {}),
            ("jax", "units", True, {}), ("jax", "units", False, {"XLA_FLAGS": f"{cse} {scheduler[:-5]}true"})):
        before = dict(environ)
        assert backends.xla_flags_for_remat(backend, remat, environ, accelerator=accelerator) is None
        assert environ == before
    # JAX's CPU client started already (a notebook, a test process): too late; the line says how instead.
    monkeypatch.setitem(sys.modules, "jax._src.xla_bridge", types.SimpleNamespace(_backends={"cpu": object()}))
    environ = {}
    note = backends.xla_flags_for_remat("jax", "units", environ, accelerator=False)
    assert note.startswith("[remat] warning: JAX has started already") and f'XLA_FLAGS="{scheduler} {cse}"' in note
    assert environ == {}


# Its own JAX process: keras-preact-train's CPU remat flags (XLA_FLAGS) count only before JAX starts. Builds
# the step as keras-preact-train does (build_model: the preset's optimizer, loss, metrics), lowers the Keras
# JAX trainer's own step (train_step, donating the state) and prints XLA's compiled memory plan; nothing runs.
MEMORY_PLAN = """
import json, sys
from keras_preact_training.machine import backends
backends.xla_flags_for_remat("jax", "units", accelerator=False)
import jax, numpy as np
from keras_preact_training.recipe import configs, schedules
from keras_preact_training.recipe.model import build_model
rows = []
for policy in ("none", "units"):
    config = configs.get_config("synthetic-resnet8", needs_data=False, batch_size=32, depth=20, image_size=(16, 16),
                                remat=None if policy == "none" else policy)
    _, model = build_model(config, 10, schedules.resolve(config, 32))
    images, labels = np.zeros((32, *model.input_shape[1:]), "float32"), np.zeros((32,), "int32")
    model.optimizer.build(model.trainable_variables)
    model._symbolic_build(data_batch=(images, labels))
    state = model._get_jax_state(trainable_variables=True, non_trainable_variables=True,
                                 optimizer_variables=True, metrics_variables=True)
    specs = jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a), a.dtype), (state, (images, labels)))
    plan = jax.jit(model.train_step, donate_argnums=0).lower(*specs).compile().memory_analysis()
    rows.append({"policy": policy, "input_shape": list(model.input_shape[1:]), "backend": jax.default_backend(),
                 **{name: int(getattr(plan, f"{name}_size_in_bytes")) for name in ("argument", "output", "alias", "temp")}})
    jax.clear_caches()
print(json.dumps(rows))
"""


@pytest.mark.notf
@pytest.mark.skipif(BACKEND != "jax", reason="XLA's plan, its own JAX process: run once, in the JAX pass")
def test_jax_memory_plan_keeps_less_with_remat():
    """XLA's compiled plan of keras-preact-train's step (CIFAR ResNet-20, batch 32 of 16x16 images, with the CPU
    flags keras-preact-train sets for remat) keeps under 0.9x the temporaries with ``units`` than without
    (0.86x with JAX 0.10.2; ResNet-8 keeps as many: too few units), the same weights and optimizer state, and
    so needs less device memory at its peak."""
    done = subprocess.run([sys.executable, "-c", MEMORY_PLAN], capture_output=True, text=True, timeout=300,
                          env={k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | {"KERAS_BACKEND": "jax"})
    assert done.returncode == 0, done.stderr[-2000:]
    none, units = json.loads(done.stdout.strip().splitlines()[-1])
    assert (none["policy"], units["policy"], none["backend"], none["input_shape"]) == (
        "none",
        "units",
        "cpu",
        [16, 16, 3],
    )
    assert (
        none["argument"] == units["argument"] and none["output"] == units["output"] and none["alias"] == units["alias"]
    )
    assert units["temp"] < 0.9 * none["temp"], (none, units)
    # The device memory the step needs: arguments + outputs - what the donated arguments alias + temporaries.
    peak = {row["policy"]: row["argument"] + row["output"] - row["alias"] + row["temp"] for row in (none, units)}
    assert peak["units"] - peak["none"] == units["temp"] - none["temp"] < 0
