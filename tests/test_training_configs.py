"""Presets, the schedule rule, the learning-rate schedules and the weight-decay term (backend-agnostic)."""

import ast
import math
import pathlib

import numpy as np
import pytest

from keras_preact_training.recipe import configs, schedules

pytestmark = [pytest.mark.core, pytest.mark.any_backend]


def test_presets_cover_every_table_of_the_paper():
    names = set(configs.PRESETS)
    # Table 1: every shortcut variant on ResNet-110 with the paper's gate-bias inits.
    for variant in ("original", "constant-scaling-0-1", "constant-scaling-0.5-1", "constant-scaling-0.5-0.5",
                    "exclusive-gating-bg0", "exclusive-gating-bg-6", "exclusive-gating-bg-7",
                    "shortcut-only-gating-bg0", "shortcut-only-gating-bg-6", "conv1x1", "dropout"):
        assert f"t1-resnet110-{variant}" in names
    assert configs.PRESETS["t1-resnet110-exclusive-gating-bg-6"].unit_options == {
        "ordering": "original", "shortcut": "exclusive_gating", "gate_bias_init": -6.0}
    # Table 2: five orderings x ResNet-110/164.
    table2 = [n for n in names if n.startswith("t2-")]
    assert len(table2) == 10
    assert {configs.PRESETS[n].unit_options["ordering"] for n in table2} == set(
        ["original", "bn_after_addition", "relu_before_addition", "relu_only_preact", "full_preact"])
    # Tables 3/4/5.
    for name in ("t3-cifar10-resnet1001-preact", "t3-cifar100-resnet164-original", "t5-resnet200-preact",
                 "t5-resnet152-original-test224"):
        assert name in names
    for label, ordering in (("original", "original"), ("preact", "full_preact")):
        one_layer = configs.PRESETS[f"t3-cifar10-resnet110-1layer-{label}"]
        assert (one_layer.depth, one_layer.dataset, one_layer.unit_options) == (
            110, "cifar10", {"ordering": ordering, "block": "one_layer"})
        # The same recipe as Table 3's other ResNet-110 rows.
        usual = configs.PRESETS[f"t3-cifar10-resnet110-{label}"]
        assert one_layer.replace(name=usual.name, unit_options=usual.unit_options) == usual
    t4 = configs.PRESETS["t4-cifar10-resnet1001-preact-batch64"]
    assert (t4.batch_size, t4.depth, t4.dataset) == (64, 1001, "cifar10")
    t5 = configs.PRESETS["t5-resnet200-preact"]
    assert (t5.architecture, t5.batch_size, t5.image_size, t5.eval_image_size) == (
        "imagenet",
        256,
        (224, 224),
        (320, 320),
    )


def test_every_preset_is_named_literally_in_configs_py():
    """Each preset and experiment is one entry of configs.py with its name spelled out (a grep finds it)."""
    source = pathlib.Path(configs.__file__).resolve()
    strings = {node.value for node in ast.walk(ast.parse(source.read_text()))
               if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    assert [e.config.name for e in configs.EXPERIMENTS if e.config.name not in strings] == []
    assert [name for name in configs.PRESETS if name not in strings] == []


def test_cifar_preset_is_the_paper_recipe():
    c = configs.get_config("t2-resnet110-full-preact")
    assert (c.batch_size, c.total_steps, c.warmup_steps, c.boundaries) == (128, 64000, 400, (32000, 48000))
    assert (c.base_lr, c.warmup_lr, c.momentum, c.weight_decay, c.augmentation) == (0.1, 0.01, 0.9, 1e-4, "cifar")


def test_iterations_scale_with_batch_size():
    r = schedules.resolve(configs.get_config("t4-cifar10-resnet1001-preact-batch64"), train_size=50000)
    # 64k iterations at batch 128 -> 128k at batch 64 (epochs of 781 steps, the last one partial).
    assert r.steps_per_epoch == 781
    assert r.epochs == math.ceil(128000 / 781) and r.total_steps == 128000
    assert r.boundaries == (64000, 96000) and r.warmup_steps == 800
    assert (r.base_lr, r.warmup_lr) == (0.1, 0.01)
    linear = schedules.resolve(configs.get_config("t4-cifar10-resnet1001-preact-batch64", lr_scaling="linear"), 50000)
    assert linear.base_lr == pytest.approx(0.05)


def test_paper_schedule_at_batch_128_is_exact():
    r = schedules.resolve(configs.get_config("t2-resnet164-full-preact", steps_per_epoch=400), 50000)
    assert (r.total_steps, r.warmup_steps, r.boundaries, r.epochs) == (64000, 400, (32000, 48000), 160)
    lr = schedules.make(configs.get_config("t2-resnet164-full-preact"), r)
    values = [float(lr(step)) for step in (0, 399, 400, 31999, 32000, 47999, 48000, 63999)]
    np.testing.assert_allclose(values, [0.01, 0.01, 0.1, 0.1, 0.01, 0.01, 0.001, 0.001], rtol=1e-6)


def test_epochs_override_shrinks_the_whole_schedule():
    r = schedules.resolve(configs.get_config("t2-resnet110-full-preact", epochs=2, steps_per_epoch=50), 50000)
    assert (r.total_steps, r.warmup_steps, r.boundaries) == (100, 1, (50, 75))


def test_cosine_schedule_warms_up_then_decays_to_zero():
    c = configs.get_config("cifar10-folder-resnet20-short", data_dir="/nonexistent")
    r = schedules.resolve(c, 50000)
    lr = schedules.make(c, r)
    assert float(lr(0)) == pytest.approx(0.01)
    assert float(lr(r.warmup_steps)) == pytest.approx(0.1)
    assert float(lr(r.total_steps)) == pytest.approx(0.0, abs=1e-7)


@pytest.mark.parametrize(
    "overrides, argument",
    [
        ({"distribute": "tpu"}, "distribute"),
        ({"precision": "float8"}, "precision"),
        ({"batch_size": 0}, "batch_size"),
        ({"schedule": "linear"}, "schedule"),
        ({"dataset": "folder"}, "data_dir"),
        ({"unit_options": {"ordering": "post"}}, "ordering"),
        ({"image_size": (32,)}, "image_size"),
        ({"warmup_steps": 70000}, "warmup_steps"),
    ],
)
def test_bad_config_names_the_argument(overrides, argument):
    with pytest.raises(ValueError, match=argument):
        configs.get_config("synthetic-resnet8", **overrides)


def test_unknown_preset_and_field():
    with pytest.raises(ValueError, match="Unknown preset='resnet9000'.*t2-resnet110-full-preact"):
        configs.get_config("resnet9000")
    with pytest.raises(ValueError, match="Unknown config field.*learning_rat"):
        configs.get_config("synthetic-resnet8", learning_rat=0.1)


def test_every_config_field_is_a_flag_of_both_commands():
    """The flags are generated from Config: a new field is a flag of keras-preact-train and reproduce."""
    import argparse
    import dataclasses

    from keras_preact_training import cli, reproduce
    from keras_preact_training.recipe import flags

    fields = {f.name for f in dataclasses.fields(configs.Config)} - set(flags.NOT_FLAGS)
    train_dests = {a.dest for a in cli.build_parser()._actions}  # noqa: SLF001 - argparse has no public list
    reproduce_dests = {a.dest for a in reproduce.build_parser()._actions}  # noqa: SLF001
    assert fields <= train_dests
    assert fields - set(reproduce.REPRODUCE_OWNS) <= reproduce_dests

    parser = cli.build_parser()
    args = parser.parse_args(["--lr", "0.05", "--image-size", "24", "24", "--boundaries", "--no-export",
                              "--unit-options", '{"ordering": "original"}', "--jit-compile", "false"])
    config = cli.config_from_args(args, parser)
    assert (config.base_lr, config.image_size, config.boundaries, config.export) == (0.05, (24, 24), (), False)
    assert config.unit_options == {"ordering": "original"} and config.jit_compile == "false"
    assert flags.parse_assignment("batch_size=64") == ("batch_size", 64)
    assert flags.parse_assignment("image_size=[24, 24]") == ("image_size", (24, 24))
    with pytest.raises(argparse.ArgumentTypeError, match="unknown config field 'batch'"):
        flags.parse_assignment("batch=64")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--schedule", "linear"], "argument --schedule: invalid choice: 'linear'"),
        (["--unit-options", "[1]"], "argument --unit-options: a JSON object is required"),
        (["--batch-size", "many"], "argument --batch-size: invalid int value: 'many'"),
        (["--image-size", "32"], "argument --image-size: expected 2 arguments"),
    ],
)
def test_bad_flags_name_the_flag(capsys, argv, message):
    from keras_preact_training import cli

    with pytest.raises(SystemExit) as exit_info:
        cli.build_parser().parse_args(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_the_light_tables_agree_with_the_library():
    """``configs`` holds the families' names and statistics as literals (its parsers are built before Keras loads):
    they are the registry's families and ``FAMILY_INPUTS``' statistics."""
    from keras_preact.models.presets import FAMILY_INPUTS
    from keras_preact.models.registry import FAMILIES

    assert configs.ARCHITECTURES == tuple(FAMILIES)
    assert configs.NORMALIZATIONS["cifar10"] == (FAMILY_INPUTS["cifar"].mean, FAMILY_INPUTS["cifar"].std)
    assert configs.NORMALIZATIONS["imagenet"] == (FAMILY_INPUTS["imagenet"].mean, FAMILY_INPUTS["imagenet"].std)
