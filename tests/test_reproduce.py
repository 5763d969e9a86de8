"""keras_preact_training.reproduce: row selection, the summary table, and a tiny end-to-end reproduction."""

import json
import pathlib
import statistics

import pytest

from keras_preact_training import reproduce
from keras_preact_training.reproduce import FAIL, TABLES, markdown_table, select_rows, summarize
from support import TRAIN_JIT_COMPILE, misnamed_metrics


def test_tables_cover_the_paper():
    assert len(TABLES["1"]) == 16 and len(TABLES["2"]) == 10 and len(TABLES["3"]) == 12
    paper = {r.preset: r.paper_error for t in TABLES.values() for r in t}
    # The paper's test errors, as fractions (it prints 5.46%).
    assert paper["t2-resnet164-full-preact"] == 0.0546
    assert paper["t1-resnet110-dropout"] == FAIL
    assert paper["t3-cifar100-resnet1001-preact"] == 0.2271
    # Table 3's "ResNet-110 (1-layer skip)" rows, original and full pre-activation units.
    assert paper["t3-cifar10-resnet110-1layer-original"] == 0.099
    assert paper["t3-cifar10-resnet110-1layer-preact"] == 0.0891
    one_layer = [r for r in TABLES["3"] if r.block == "one_layer"]
    assert [r.label for r in one_layer] == ["cifar10 ResNet-110 (1-layer skip) original",
                                           "cifar10 ResNet-110 (1-layer skip) preact"]
    assert {r.paper_depth for r in one_layer} == {110}
    from keras_preact_training.recipe.configs import EXPERIMENTS, PRESETS

    assert all(r.preset in PRESETS for t in TABLES.values() for r in t)
    # One table: every row is an experiment of configs.EXPERIMENTS, with its label and paper number.
    experiments = {e.config.name: e for e in EXPERIMENTS}
    for table, rows in TABLES.items():
        for r in rows:
            e = experiments[r.preset]
            assert (e.table, e.label, e.paper_error, e.config.depth) == (table, r.label, r.paper_error, r.paper_depth)
    assert len(TABLES["3"]) == len([e for e in EXPERIMENTS if e.table == "3"])


@pytest.mark.parametrize("label", ["original", "preact"])
def test_the_one_layer_rows_train_the_registered_one_layer_network(label):
    """Table 3's "ResNet-110 (1-layer skip)" presets build the registry's network (same parameters)."""
    from keras_preact.models import create_model
    from keras_preact_training.recipe import model as model_lib
    from keras_preact_training.recipe.configs import PRESETS
    from support import trainable_params

    config = PRESETS[f"t3-cifar10-resnet110-1layer-{label}"]
    ours = model_lib.build_classifier(config, 10)
    units = [layer for layer in ours.backbone.layers if layer.name.startswith("stage")]
    assert len(units) == 108 and {unit.options.block for unit in units} == {"one_layer"}
    assert trainable_params(ours) == trainable_params(create_model("cifar_resnet110_1layer", num_classes=10))


def test_select_rows():
    scaled = select_rows("2", "scaled")
    assert [r.preset for r in scaled] == [
        "t2-resnet110-original", "t2-resnet110-bn-after-addition", "t2-resnet110-relu-before-addition",
        "t2-resnet110-relu-only-preact", "t2-resnet110-full-preact",
    ]
    assert [r.preset for r in select_rows("3", "scaled")] == [
        "t3-cifar10-resnet110-original", "t3-cifar10-resnet110-preact"]
    assert len(select_rows("2", "paper")) == 10
    assert len(select_rows("3", "paper")) == 12
    assert [r.preset for r in select_rows("3", "scaled", "resnet110-1layer-preact")] == [
        "t3-cifar10-resnet110-1layer-preact"]
    picked = select_rows("1", "scaled", "dropout, resnet110-original")
    assert [r.preset for r in picked] == ["t1-resnet110-dropout", "t1-resnet110-original"]
    with pytest.raises(ValueError, match="rows=.*'original'"):
        select_rows("2", "scaled", "original")  # ambiguous between ResNet-110 and ResNet-164


def test_summary_statistics_and_markdown():
    assert summarize([10.0, 12.0, 20.0]) == (12.0, 14.0, pytest.approx(28 ** 0.5))
    assert summarize([7.5]) == (7.5, 7.5, 0.0)
    results = [  # fractions, as metrics.json and table{N}.json hold them; percent in the markdown
        {"row": {"label": "a", "preset": "t1-x", "paper_error": 0.0661, "paper_depth": 110},
         "runs": [{"test_error": 0.10}, {"test_error": 0.12}, {"test_error": 0.20}]},
        {"row": {"label": "b", "preset": "t1-y", "paper_error": FAIL, "paper_depth": 110}, "runs": []},
    ]
    text = markdown_table("1", results, "scale note")
    assert "### Table 1 (scale note)" in text
    assert "| a | `t1-x` | 6.61 | 12.00 | 14.00 ± 5.29 | 3 |" in text
    assert "| b | `t1-y` | fail (>20%) | — | — | 0 |" in text
    assert "paper (ResNet-110)" in text


def test_help_lists_the_budgets_and_the_config_flags(capsys):
    with pytest.raises(SystemExit) as exit_info:
        reproduce.main(["--help"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 0 and "50% and 75%" in out and "--batch-size" in out and "--data-dir" in out


@pytest.mark.parametrize("argv, message", [
    (["--table", "4"], "argument --table: invalid choice: '4' (choose from '1', '2', '3')"),
    (["--table", "2", "--seeds", "0"], "argument --seeds: invalid value 0: a positive integer is required"),
])
def test_bad_arguments_exit_2_naming_the_argument(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        reproduce.main(argv)
    assert exit_info.value.code == 2
    assert (
        capsys.readouterr().err.strip().splitlines()[-1]
        == f"python -m keras_preact_training.reproduce: error: {message}"
    )


def test_bad_arguments():
    with pytest.raises(ValueError, match="budget"):
        reproduce.reproduce("2", "huge")
    with pytest.raises(ValueError, match="dataset='folder' needs data_dir"):
        reproduce.reproduce("2", "scaled", overrides={"dataset": "folder"})


def test_a_metrics_json_written_before_errors_were_fractions_is_read_as_fractions(tmp_path):
    """A finished run whose metrics.json holds test_error in percent (the committed ResNet-20 run) is reused
    with its error as a fraction, as a new run's."""
    committed = (
        pathlib.Path(__file__).resolve().parents[1] / "reproduction" / "cifar10-preact-resnet20" / "metrics.json"
    )
    old = json.loads(committed.read_text())
    assert old["test_error"] == pytest.approx(13.62, abs=1e-4)  # percent, as written then
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.json").write_text(committed.read_text())
    reused = reproduce._run_once(None, run_dir, "1/1")
    assert reused["test_error"] == 1 - old["test_accuracy"] == pytest.approx(0.1362, abs=1e-6)
    assert {k: v for k, v in reused.items() if k != "test_error"} == {k: v for k, v in old.items() if k != "test_error"}
    assert misnamed_metrics(reused) == []


@pytest.mark.notf
def test_end_to_end_synthetic(tmp_path, capsys):
    args = ["--table", "2", "--rows", "resnet110-full-preact", "--depth", "8", "--image-size", "16", "16",
            "--jit-compile", TRAIN_JIT_COMPILE, "--epochs", "2",
            "--seeds", "2", "--dataset", "synthetic", "--set", "synthetic_train_size=128",
            "--set", "synthetic_test_size=64", "--set", "batch_size=64", "--out", str(tmp_path)]
    assert reproduce.main(args) == 0
    data = json.loads((tmp_path / "table2.json").read_text())
    assert misnamed_metrics(data) == []  # every error and accuracy a fraction, the paper's included
    assert data["results"][0]["row"]["paper_error"] == 0.0637
    runs = data["results"][0]["runs"]
    assert [r["seed"] for r in runs] == [0, 1]
    assert all(r["steps"] == 4 and r["epochs"] == 2 for r in runs)
    table = (tmp_path / "table2.md").read_text()
    assert "| full_preact (ResNet-110) | `t2-resnet110-full-preact` | 6.37 |" in table  # the paper's table: percent
    median = statistics.median(run["test_error"] for run in runs)  # fractions, shown in percent
    assert f"| 6.37 | {100 * median:.2f} | " in table
    assert table in capsys.readouterr().out and "error % | ours median error % | ours mean ± std error %" in table
    assert (tmp_path / "table2_curves.png").read_bytes()[:4] == b"\x89PNG"
    # A finished run is reused, not retrained.
    capsys.readouterr()
    assert reproduce.main(args) == 0
    assert capsys.readouterr().out.count("reusing finished run") == 2
    assert json.loads((tmp_path / "table2.json").read_text())["results"][0]["runs"] == runs
