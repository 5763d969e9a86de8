"""Smoke tests of benchmarks/core_speed.py and its plain Keras reference models.

The reference must be the same network as ours (same trainable parameters, and with our weights
copied in, the same outputs), or the speed comparison means nothing. Only the cheap checks are
``core`` (also run under JAX): the output comparisons and the tiny run take minutes on JAX's
CPU backend (eager calls, XLA compiles), so CI runs them under TensorFlow only (< 60 s).
"""

import dataclasses
import json
import re
import shutil
import subprocess
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


def _old_frontend_available():
    """git and the commit holding the http.server front end (benchmarks/serving_frontends.py's --old-ref)."""
    from benchmarks import serving_frontends

    if shutil.which("git") is None:
        return False
    found = subprocess.run(["git", "-C", str(serving_frontends.REPO), "cat-file", "-e",
                            f"{serving_frontends.OLD_REF}^{{commit}}"], capture_output=True, check=False)
    return found.returncode == 0


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--models", "resnet18"], r"argument --models: invalid model 'resnet18'"),
        (["--models", "cifar_resnet20:png"], r"argument --models: invalid input 'png' for cifar_resnet20"),
        (["--models", "cifar_resnet20", "cifar_resnet20:jpeg"], r"argument --models: a model named twice"),
        (["--clients", "0"], r"argument --clients: 0 is not a positive int"),
        (["--duration", "-1"], r"argument --duration: -1 is not a positive float"),
        (["--batching-timeout-ms", "-2"], r"argument --batching-timeout-ms: -2 is not a number >= 0"),
        (["--frontends", "old", "--protocols", "grpc"], r"argument --protocols: grpc is served by the new front end only"),
        (["--protocols", "soap"], r"argument --protocols: invalid choice: 'soap'"),
        (["--out", "."], r"argument --out: \. is a directory"),
    ],
)
def test_serving_frontends_refuses_bad_arguments_naming_them(argv, message, capsys):
    from benchmarks import serving_frontends

    assert_refused(serving_frontends.parse_args, argv, message, capsys)


def test_serving_frontends_refuses_an_old_ref_without_the_http_server_front_end(capsys):
    """Before any work: a ref git does not know, and one whose server is not http.server, each in one line."""
    from benchmarks import serving_frontends

    if not _old_frontend_available():
        pytest.skip("needs git and this checkout's history")
    for ref, message in (("no-such-ref", r"--old-ref no-such-ref: git archive failed in .*: fatal: "),
                         ("HEAD", r"--old-ref HEAD: its keras_preact/serving/server.py is not the http.server")):
        with pytest.raises(SystemExit) as exit_info:
            serving_frontends.main(["--old-ref", ref])
        assert exit_info.value.code == 2
        assert re.search(message, capsys.readouterr().err)


def test_serving_frontends_summary_takes_the_median_round_and_per_round_ratios():
    """Three rounds of one cell, old and new: images/s, p50, p99 from the median round by images/s;
    efficiency and new/old the medians of the ratios within each round."""
    from benchmarks import serving_frontends

    def row(frontend, round_index, ips, p50, reference):
        return {"model": "m", "input": "jpeg", "protocol": "rest", "frontend": frontend, "batching": "on",
                "clients": 16, "round": round_index, "images_per_s": ips, "p50_ms": p50, "p99_ms": 2 * p50,
                "errors": 0, "batch_per_call": None, "reference_batch": 16, "reference_images_per_s": reference,
                "efficiency": ips / reference}

    served = [row("old", 1, 100, 10, 200), row("new", 1, 150, 8, 200),
              row("old", 2, 50, 30, 100), row("new", 2, 90, 20, 100),
              row("old", 3, 80, 12, 160), row("new", 3, 160, 7, 160)]
    reference = [{"model": "m", "input": "jpeg", "batch": 16, "round": r, "images_per_s": ips, "ms_per_call": 1}
                 for r, ips in ((1, 200), (2, 100), (3, 160))]
    old, new = serving_frontends.summary(served, reference, max_clients=16)
    assert (old["images_per_s"], old["p50_ms"], old["images_per_s_range"]) == (80, 12, [50, 100])
    assert (new["images_per_s"], new["p50_ms"], new["p99_ms"]) == (150, 8, 16)
    assert old["efficiency"] == 0.5 and new["efficiency"] == 0.9  # medians of 0.5/0.5/0.5 and 0.75/0.9/1.0
    assert old["new_over_old"] is None and new["new_over_old"] == 1.8  # median of 1.5, 1.8, 2.0
    assert old["reference_images_per_s"] == 160 and old["goal_row"] and new["goal_row"]
    text = serving_frontends.markdown(
        {"machine": "x", "load_average_start": "1", "load_average_end": "1", "tensorflow": "t", "python": "p",
         "old": "c09ad94 x", "new": "abc (working tree)", "batching_flags": ["--enable-batching"], "rounds": 3,
         "warmup": 1, "duration": 2, "max_clients": 16}, [old, new], reference)
    assert "| m | jpeg | rest | new | on | 16 | 150.0 (90-160) | 8.0 | 16.0 | 0 | - | 160.0 (16) | 0.90 | 1.80 | met (>= 0.9) |" in text
    assert "| m | jpeg | rest | old | on | 16 | 80.0 (50-100) | 12.0 | 24.0 | 0 | - | 160.0 (16) | 0.50 | - | missed (>= 0.9) |" in text


def test_serving_frontends_counts_requests_at_the_window_edges_in_part():
    """A request in flight at an edge of the timed window counts for its share of time inside it; p50/p99
    and errors are over the replies completed in the window."""
    from benchmarks import serving_frontends

    records = [(9.0, 11.0, "200"), (11.0, 11.5, "200"), (11.5, 13.0, "OK"), (10.5, 11.0, "503"), (7.0, 8.0, "200")]
    figures = serving_frontends.summarize(records, 10.0, 12.0)
    assert figures["images_per_s"] == pytest.approx((0.5 + 1 + 1 / 3) / 2)
    assert (figures["replies"], figures["errors"]) == (3, 1)
    assert figures["p50_ms"] == pytest.approx(1250) and figures["p99_ms"] == pytest.approx(1985)


def test_serving_frontends_runs_old_against_new_end_to_end(tmp_path):
    """benchmarks/serving_frontends.py at its tiniest (ResNet-20, JPEG bytes, batching on, 1 and 2 clients,
    one round of 1 s cells): the http.server front end from git against today's, REST and gRPC, every
    request answered, and the tables written. 40 s on the 2-core VM at load ~2-3 (73 s at load ~8)."""
    for module in ("tensorflow", "grpc", "tensorflow_serving"):
        pytest.importorskip(module)
    from benchmarks import serving_frontends

    if not _old_frontend_available():
        pytest.skip(f"needs git and commit {serving_frontends.OLD_REF} (the old front end) in this checkout")
    out = tmp_path / "frontends"
    assert serving_frontends.main(["--models", "cifar_resnet20:jpeg", "--batching", "on", "--clients", "1", "2",
                                   "--rounds", "1", "--duration", "1", "--warmup", "0.3", "--out", str(out)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["frontends.json", "frontends.md"]
    report = json.loads(out.with_name("frontends.json").read_text())
    rows = report["summary"]
    assert [(r["protocol"], r["frontend"], r["clients"]) for r in rows] == [
        ("rest", "old", 1), ("rest", "old", 2), ("rest", "new", 1), ("grpc", "new", 1), ("rest", "new", 2),
        ("grpc", "new", 2)]
    for r in rows:
        assert r["errors"] == 0 and r["images_per_s"] > 0 and 0 < r["p50_ms"] <= r["p99_ms"], r
        assert r["reference_batch"] == r["clients"] and 0 < r["efficiency"] == pytest.approx(
            r["images_per_s"] / r["reference_images_per_s"]), r
    assert [r["goal_row"] for r in rows] == [False, True, False, False, True, True]
    assert [r["new_over_old"] is not None for r in rows] == [False, False, True, False, True, False]
    assert report["meta"]["old"].startswith(serving_frontends.OLD_REF)
    assert [(r["batch"], r["input"]) for r in report["in_process"]] == [(1, "jpeg"), (2, "jpeg")]
    text = out.with_name("frontends.md").read_text()
    assert "| cifar_resnet20 | jpeg | grpc | new | on | 2 |" in text and "(>= 0.9) |" in text
