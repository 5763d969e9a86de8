"""``UnitConfig`` is the one statement of a unit's options: ``ResidualUnit``, the backbone's stem and
final norms, and the builders read it; ``build`` compiles it into a plan of ``Step`` records."""

import dataclasses
import inspect

import keras
import pytest

from keras_preact.layers import ResidualUnit, UnitConfig
from keras_preact.models import PreActResNetBackbone, cifar_resnet

pytestmark = [pytest.mark.core, pytest.mark.notf]


def test_the_unit_echoes_every_option_and_reads_it_from_its_config():
    unit = ResidualUnit(16, ordering="original", dropout_rate=0.1)
    config = unit.get_config()
    assert {f.name for f in dataclasses.fields(UnitConfig)} <= set(config)
    assert UnitConfig(**{n: config[n] for n in UnitConfig.names()}) == unit.options
    parameters = inspect.signature(ResidualUnit.__init__).parameters  # what the config-echo test checks
    assert [p for p in parameters if p in UnitConfig.names()] == list(UnitConfig.names())
    assert (unit.options.ordering, unit.options.dropout_rate, unit.options.block) == ("original", 0.1, "basic")
    with pytest.raises(AttributeError):
        unit.options.ordering = "full_preact"  # read-only: the options are set once


def test_the_units_written_signature_is_unit_configs_fields_with_their_defaults():
    """``ResidualUnit.__init__`` names every option (written out, not made at run time) with ``UnitConfig``'s
    default, keyword-only, between ``strides`` and ``data_format``."""
    parameters = inspect.signature(ResidualUnit.__init__).parameters
    assert list(parameters) == ["self", "filters", "strides", *UnitConfig.names(), "data_format", "kwargs"]
    for field in dataclasses.fields(UnitConfig):
        assert parameters[field.name].kind is inspect.Parameter.KEYWORD_ONLY, field.name
        assert parameters[field.name].default == field.default, field.name
    assert ResidualUnit(16).options == UnitConfig()


def test_defaults_and_shortcut_options_are_resolved_once():
    assert UnitConfig().shortcut_options == {}
    assert UnitConfig(shortcut="constant_scaling").shortcut_options == {"shortcut_scale": 0.5, "residual_scale": 1.0}
    assert UnitConfig(shortcut="exclusive_gating", gate_bias_init=-2.0).shortcut_options == {"gate_bias_init": -2.0}
    assert UnitConfig(block="bottleneck").widths(64) == [16, 16, 64]
    with pytest.raises(ValueError, match="gate_bias_init=-2.0 is only used with shortcut='exclusive_gating'"):
        UnitConfig(gate_bias_init=-2.0)
    with pytest.raises(ValueError, match="shortcut_dropout_rate"):
        UnitConfig(shortcut="dropout", shortcut_dropout_rate=1.5)


def test_unknown_options_are_refused_by_name():
    with pytest.raises(ValueError, match="Unknown unit option.*odering"):
        UnitConfig.from_options({"odering": "original"})
    with pytest.raises(ValueError, match="Unknown unit option.*odering"):
        PreActResNetBackbone([1], [8], [1], unit_options={"odering": "original"}, input_shape=(8, 8, 3))
    with pytest.raises((TypeError, ValueError), match="odering"):
        ResidualUnit(16, odering="original")


@pytest.mark.parametrize("ordering, plan", [
    ("full_preact", [("norm", "before", 0), ("act", "before", 0), ("conv", "branch", 0),
                     ("norm", "before", 1), ("act", "before", 1), ("conv", "branch", 1)]),
    ("original", [("conv", "branch", 0), ("norm", "after", 0), ("act", "after", 0), ("conv", "branch", 1),
                  ("norm", "after", 1), ("act", "addition", None)]),
    ("relu_only_preact", [("act", "before", 0), ("conv", "branch", 0), ("norm", "after", 0),
                          ("act", "before", 1), ("conv", "branch", 1), ("norm", "after", 1)]),
])
def test_the_plan_is_the_ordering_of_table_2(ordering, plan):
    unit = ResidualUnit(16, ordering=ordering)
    unit.build((None, 8, 8, 16))
    assert [(step.kind, step.place, step.conv) for step in unit.steps()] == plan
    assert [conv.name for conv in unit.convs()] == ["conv1", "conv2"]
    assert unit.projection() is None and unit.gate() is None


def test_a_shared_pre_activation_feeds_branch_and_projection():
    unit = ResidualUnit(32, strides=2, ordering="relu_only_preact")
    unit.build((None, 8, 8, 16))
    assert [(s.kind, s.conv) for s in unit.plan().preactivation] == [("act", 0)]
    assert unit.projection().name == "projection" and unit.norm("shortcut").name == "projection_norm"
    assert unit.norm("before", 0) is None and unit.norm("after", 1).name == "postact2_norm"


def test_the_stem_and_final_norms_are_the_units_norms():
    model = cifar_resnet(8, normalization="group", norm_epsilon=1e-3, norm_groups=4)
    final = model.backbone.get_layer("final_norm")
    assert isinstance(final, keras.layers.GroupNormalization) and (final.epsilon, final.groups) == (1e-3, 4)
