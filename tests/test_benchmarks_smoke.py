"""Smoke tests of benchmarks/core_speed.py and its plain Keras reference models.

The reference must be the same network as ours (same trainable parameters, and with our weights
copied in, the same outputs), or the speed comparison means nothing. Only the cheap checks are
``core`` (also run under JAX): the output comparisons and the tiny run take minutes on JAX's
CPU backend (eager calls, XLA compiles), so CI runs them under TensorFlow only (< 60 s).
"""

import dataclasses
import json
import re
import sys
from pathlib import Path

import keras
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is not installed

from benchmarks import core_speed  # noqa: E402
from benchmarks import reference_models as rm  # noqa: E402
from keras_preact.models import cifar_resnet, imagenet_resnet  # noqa: E402
from support import trainable_params  # noqa: E402

# name: (ours, plain reference) at a small input; one per shortcut/stride path of the references.
PAIRS = {
    "cifar8_basic_option_A": lambda: (
        cifar_resnet(8, input_shape=(16, 16, 3)),
        rm.cifar_preact_resnet(8, input_shape=(16, 16, 3)),
    ),
    "cifar11_bottleneck_stride_on_first_1x1": lambda: (
        cifar_resnet(11, input_shape=(16, 16, 3)),
        rm.cifar_preact_resnet(11, input_shape=(16, 16, 3)),
    ),
    "imagenet18_basic": lambda: (
        imagenet_resnet(18, input_shape=(32, 32, 3)),
        rm.imagenet_preact_resnet(18, input_shape=(32, 32, 3)),
    ),
    "imagenet50_bottleneck": lambda: (
        imagenet_resnet(50, input_shape=(32, 32, 3)),
        rm.imagenet_preact_resnet(50, input_shape=(32, 32, 3)),
    ),
}


def logits(model, images, training):
    """Output of the dense layer, before the (saturating) softmax."""
    head = keras.Model(model.input, model.get_layer("logits").output)
    return keras.ops.convert_to_numpy(head(images, training=training))


@pytest.mark.parametrize("pair", PAIRS)
def test_reference_computes_the_same_function_as_ours(pair, rng):
    ours, plain = PAIRS[pair]()
    assert trainable_params(plain) == trainable_params(ours)
    assert len(plain.weights) == len(ours.weights)
    images = rng.normal(size=(4, *ours.input_shape[1:])).astype("float32")
    before = logits(plain, images, training=False)
    rm.copy_weights_by_path(ours, plain)
    for training in (False, True):  # moving statistics and batch statistics
        expected = logits(ours, images, training)
        np.testing.assert_allclose(logits(plain, images, training), expected, rtol=1e-5, atol=1e-5)
    # The comparison can fail: independently initialised weights give other logits.
    assert np.abs(before - logits(ours, images, False)).max() > 1e-2


@pytest.mark.core
@pytest.mark.parametrize(
    "builder, depth, expected",
    [  # PAPER.md, reference parameter counts (trainable weights)
        (rm.cifar_preact_resnet, 110, 1_727_962),
        (rm.cifar_preact_resnet, 164, 1_703_258),
        (rm.imagenet_preact_resnet, 50, 25_549_352),
    ],
)
def test_reference_has_the_official_parameter_count(builder, depth, expected):
    assert trainable_params(builder(depth)) == expected


@pytest.mark.core
def test_copy_weights_rejects_another_architecture():
    ours = cifar_resnet(8, input_shape=(16, 16, 3))
    with pytest.raises(ValueError, match=r"'stage1_unit1_conv1/kernel' has shape \(3, 3, 16, 16\)"):
        rm.copy_weights_by_path(cifar_resnet(11, input_shape=(16, 16, 3)),
                                rm.cifar_preact_resnet(8, input_shape=(16, 16, 3)))
    with pytest.raises(ValueError, match="stage3_unit2_conv1/kernel.*lacks"):
        rm.copy_weights_by_path(ours, rm.cifar_preact_resnet(14, input_shape=(16, 16, 3)))


@pytest.mark.core
def test_benchmark_refuses_a_reference_with_other_parameters():
    wrong = dataclasses.replace(
        core_speed.FAMILIES["cifar"],
        reference=lambda depth, shape: rm.cifar_preact_resnet(depth + 6, input_shape=shape),
    )
    spec = core_speed.ModelSpec("cifar8", wrong, 8)
    with pytest.raises(RuntimeError, match="75,290.*comparison is void"):
        core_speed.build_contenders(spec, (16, 16, 3), with_applications=False)


@pytest.mark.core
@pytest.mark.parametrize(
    "argv, message",
    [
        (["--models", "cifar21"], r"--models: invalid model 'cifar21'"),
        (["--models", "imagenet42"], r"--models: invalid model 'imagenet42'.*18, 34, 50"),
        (["--models", "resnet50"], r"--models: invalid model 'resnet50'"),
        (["--modes", "forward,backward"], r"--modes: invalid backward; choose from forward, train"),
        (["--models", "imagenet18", "--imagenet-size", "16"], r"--imagenet-size: 16 is below 32"),
        (["--repeats", "0"], r"--repeats: .*positive integer"),
        (["--jit-compile", "yes"], r"--jit-compile: invalid choice"),
    ],
)
def test_bad_arguments_are_refused_before_any_work(argv, message, capsys):
    assert_refused(core_speed.parse_args, argv, message, capsys)


def assert_refused(parse_args, argv, message, capsys):
    """``parse_args(argv)`` exits 2 with ``message`` (a regular expression) on stderr."""
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv)
    assert exit_info.value.code == 2
    assert re.search(message, capsys.readouterr().err)


def test_tiny_benchmark_prints_the_table(capsys):
    assert core_speed.main(["--tiny"]) == 0
    out = capsys.readouterr().out
    assert f"backend **{keras.backend.backend()}**" in out
    rows = [line.split(" | ") for line in out.splitlines() if re.match(r"\| \w+\d+ \| \d+x\d+", line)]
    assert [(r[0], r[1], r[2], r[3]) for r in rows] == [
        ("| cifar8", "16x16", "4", "forward"),
        ("| cifar8", "16x16", "4", "train"),
        ("| cifar11", "16x16", "4", "forward"),
        ("| cifar11", "16x16", "4", "train"),
        ("| imagenet18", "32x32", "2", "forward"),
        ("| imagenet18", "32x32", "2", "train"),
    ]
    for row in rows:  # images/s positive; ratio = median of paired ratios, within its min-max
        assert float(row[4]) > 0 and float(row[5]) > 0
        ratio, low, high = map(float, re.fullmatch(r"([\d.]+) \(([\d.]+)-([\d.]+)\) \|", row[6]).groups())
        assert low - 0.005 <= ratio <= high + 0.005
    assert "| cifar8 | 75,290 / 75,290 | 0.0e+00 |" in out
    assert "| imagenet18 | 11,687,720 / 11,687,720 | 0.0e+00 |" in out
    assert "goal ours >= 0.97x plain:" in out


def test_export_runtimes_times_every_installed_format_on_equal_outputs(capsys):
    """benchmarks/export_runtimes.py: one row per runtime and batch, each runtime's probabilities equal
    to the SavedModel's (the first format, the ratio's base)."""
    pytest.importorskip("tensorflow")
    from benchmarks import export_runtimes

    formats = export_runtimes.installed_formats()
    assert formats[0] == "saved_model"
    export_runtimes.main(["--models", "cifar_resnet20:16", "--batches", "1", "2", "--rounds", "1",
                          "--min-seconds", "0", "--min-calls", "1"])
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines()[2:]]
    assert [(r[1].strip(), r[2].strip()) for r in rows] == [(b, f) for b in ("1", "2") for f in formats]
    assert all(float(r[-1]) <= 1e-5 and float(r[3].replace(",", "")) > 0 for r in rows)
    assert [r[6].strip() for r in rows if r[2].strip() == "saved_model"] == ["1.00x", "1.00x"]


def test_export_runtimes_times_each_int8_model_after_its_float_one(capsys):
    """benchmarks/export_runtimes.py --int8: the CPU named, then each ONNX and OpenVINO runtime followed by its int8
    model, the "vs float" column 1.00x for the float rows."""
    if keras.backend.backend() == "jax":
        pytest.skip("ONNX and OpenVINO are written from the tensorflow and torch backends")
    for module in ("onnxruntime", "openvino", "nncf"):
        pytest.importorskip(module)
    from benchmarks import export_runtimes

    export_runtimes.main(["--models", "cifar_resnet20:16", "--formats", "openvino", "onnx", "--int8", "--batches",
                          "2", "--rounds", "1", "--min-seconds", "0", "--min-calls", "1"])
    lines = capsys.readouterr().out.splitlines()
    assert re.match(r"CPU: .+; AVX-512 VNNI: (yes|no); AVX-VNNI: (yes|no)$", lines[0]), lines[0]
    rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in lines[3:]]
    assert [r[2] for r in rows] == ["openvino", "openvino-int8", "onnx", "onnx-int8"]
    assert [r[7] for r in rows if not r[2].endswith("-int8")] == ["1.00x", "1.00x"]
    assert all(float(r[3].replace(",", "")) > 0 for r in rows)


def test_int8_profile_splits_each_runtime_models_time_by_kind(capsys):
    """benchmarks/int8_profile.py: a row per (batch, runtime) whose kinds and time outside the nodes add up to the
    call; the int8 models run (de)quantization nodes, the float ones none."""
    if keras.backend.backend() == "jax":
        pytest.skip("ONNX and OpenVINO are written from the tensorflow and torch backends")
    for module in ("onnxruntime", "openvino", "nncf"):
        pytest.importorskip(module)
    from benchmarks import int8_profile

    int8_profile.main(["--model", "cifar_resnet20:16", "--batches", "2", "--calls", "4", "--min-calls", "2"])
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| model | batch | runtime | ms per call"))
    rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in lines[header + 2:]]
    assert [(r[1], r[2]) for r in rows] == [("2", r) for r in ("onnx", "onnx-int8", "openvino", "openvino-int8")]
    for row in rows:
        per_call, *parts = map(float, row[3:])
        assert per_call > 0 and parts[0] > 0 and sum(parts) == pytest.approx(per_call, abs=0.01)
        assert (parts[1] > 0) is row[2].endswith("-int8")  # (de)quantize


def test_remat_memory_reports_a_refused_policy_with_its_message(tmp_path, capsys):
    """benchmarks/remat_memory.py runs the real keras-preact-train per policy; one that ends badly is a row
    with its exit status and the line that says why, and the table's ratios are to the no-remat run."""
    from benchmarks import remat_memory

    out = tmp_path / "remat"
    assert remat_memory.main(["--preset", "synthetic-resnet8", "--batch-size", "4", "--epochs", "1",
                              "--steps-per-epoch", "1", "--policies", "segments:0", "--out", str(out)]) == 0
    (row,) = json.loads(out.with_name("remat.json").read_text())
    assert row["policy"] == "segments:0" and row["exit_status"] == 2 and row["peak_rss_gib"] > 0
    assert row["failure"].startswith("keras-preact-train: error: Invalid remat='segments:0'")
    assert "| segments:0 |" in out.with_name("remat.md").read_text()
    base = {"policy": "none", "exit_status": 0, "peak_rss_gib": 2.0, "seconds_per_step": 1.0}
    units = {"policy": "units", "exit_status": 0, "peak_rss_gib": 0.5, "seconds_per_step": 1.3, "wall_seconds": 9}
    floor = {"policy": "none", "batch_size": 1, "exit_status": 0, "peak_rss_gib": 0.25, "wall_seconds": 5}
    text = remat_memory.table([floor, {**base, "batch_size": 64, "wall_seconds": 8}, {**units, "batch_size": 64}])
    assert "| none (baseline) | 1 | 0.25 | - | - | - | - | - | 5 | ok |" in text
    assert "| units | 64 | 0.5 | 0.25x | 0.25 | 0.14x | 1.3 | 1.30x | 9 | ok |" in text

