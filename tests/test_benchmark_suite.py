"""The benchmark suite: one entry point (``python -m benchmarks``) runs a tiny benchmark end to end and writes a
complete row; every file under benchmarks/ is reachable from that entry point; BENCHMARKS.md's summary table is
the renderer's output of the committed rows; bad arguments are refused naming them, before any work."""

import datetime
import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys

import keras
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # benchmarks/ is not installed
pytestmark = pytest.mark.notf
BENCHMARKS = REPO / "benchmarks"
RESULTS = BENCHMARKS / "results.jsonl"
BEGIN, END = "<!-- rendered by: python -m benchmarks render benchmarks/results.jsonl -->", "<!-- end rendered -->"


def suite(*argv, env=None):
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
               **(env or {})}
    return subprocess.run([sys.executable, "-m", "benchmarks", *argv], cwd=REPO, env=environ, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.any_backend
def test_entry_point_runs_the_host_cost_benchmark_and_writes_a_complete_row(tmp_path):
    from benchmarks import rows

    backend = keras.backend.backend()
    out = tmp_path / "rows.jsonl"
    argv = [
        "run",
        "host_cost",
        "--backends",
        backend,
        "--rounds",
        "2",
        "--host-steps",
        "2",
        "--steps-per-execution",
        "1",
        "--out",
        str(out),
    ]
    done = suite(*argv, env={"OMP_NUM_THREADS": "1", "TF_NUM_INTRAOP_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    row, app = rows.read(out)  # plain fit, then fit with keras-preact-train's callbacks
    assert (app["case"], app["unit"], app["backend"]) == ("steps_per_execution 1, app callbacks", "ms/step", backend)
    assert app["figure"] > 0
    assert set(rows.FIELDS) <= set(row)
    assert (row["benchmark"], row["case"], row["unit"], row["backend"]) == (
        "host_cost", "steps_per_execution 1", "ms/step", backend)
    assert row["command"] == "python -m benchmarks " + " ".join(argv)
    assert row["rounds"] == 2 and row["spread"][0] <= row["figure"] <= row["spread"][1] and row["figure"] > 0
    assert row["machine"]["cores"] >= 1 and row["machine"]["cpu"] and isinstance(row["machine"]["flags"], list)
    assert {"python", "keras", "numpy", backend if backend != "tensorflow" else "tensorflow"} <= set(row["versions"])
    assert datetime.datetime.strptime(row["date"], "%Y-%m-%dT%H:%MZ")
    if importlib.util.find_spec("torch") is not None:  # side by side: plain PyTorch in the same process
        assert row["reference"] == "plain PyTorch" and row["reference_figure"] > 0
        assert (
            row["ratio"] == pytest.approx(row["ratio"])
            and row["ratio_spread"][0] <= row["ratio"] <= row["ratio_spread"][1]
        )
    else:
        assert row["reference"] is None and row["ratio"] is None
    assert "| host_cost | " + backend + " | steps_per_execution 1 |" in done.stdout  # the rows, rendered


@pytest.mark.any_backend
@pytest.mark.parametrize("argv, message", [
    (["run", "nonesuch"], "unknown benchmark nonesuch; allowed: all, training, host_cost"),
    (["run", "host_cost", "--rounds", "0"], "--rounds must be >= 1, got 0"),
    (["run", "host_cost", "--host-steps", "6", "--steps-per-execution", "4"],
     "--steps-per-execution must divide --host-steps (6)"),
    (["run", "host_cost", "--vs", "numpy"], "argument --vs: invalid choice: 'numpy'"),
])
def test_bad_arguments_are_refused_naming_them(argv, message, capsys):
    from benchmarks import run

    with pytest.raises(SystemExit) as exit_:
        run.parse_args(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def referenced(path, text, files):
    """The files under benchmarks/ that ``text`` (the file ``path``) names: by repository path, as a module
    (``benchmarks.x``, ``from benchmarks import x``), or, within its own folder, by file name."""
    imported = set()
    for names in re.findall(r"from benchmarks import ([\w, ]+)", text):
        imported |= {n.split(" as ")[0].strip() for n in names.split(",")}
    found = set()
    for f in files:
        relative = f.relative_to(REPO).as_posix()
        module = relative[:-3].replace("/", ".") if f.suffix == ".py" else None
        if relative in text or (module and (re.search(rf"\b{re.escape(module)}\b", text) or
                                            (f.parent == BENCHMARKS and f.stem in imported))):
            found.add(f)
        elif f.parent == path.parent and f != path and re.search(rf"\b{re.escape(f.name)}\b", text):
            found.add(f)
    return found


@pytest.mark.any_backend
def test_no_file_under_benchmarks_is_an_orphan():
    """Every file is the entry point, a benchmark it runs, a module one of them imports, or a file they name
    (the GPU session's scripts, the committed rows): nothing kept alive beside the suite."""
    from benchmarks import run

    files = {f for f in BENCHMARKS.rglob("*") if f.is_file() and "__pycache__" not in f.parts}
    start = {BENCHMARKS / "__main__.py", BENCHMARKS / "__init__.py", BENCHMARKS / "run.py"}
    start |= {BENCHMARKS / f"{spec.module}.py" for spec in run.SCRIPTS.values()}
    reached, todo = set(), list(start)
    while todo:
        f = todo.pop()
        if f in reached:
            continue
        reached.add(f)
        try:
            text = f.read_text()
        except UnicodeDecodeError:
            continue
        todo += referenced(f, text, files) - reached
    assert sorted(str(f.relative_to(REPO)) for f in files - reached) == []


@pytest.mark.any_backend
def test_benchmarks_md_summary_is_the_rendered_rows():
    """BENCHMARKS.md's summary table is exactly what ``python -m benchmarks render`` makes of the committed rows,
    and each row carries the command, the machine and the date."""
    from benchmarks import rows

    committed = rows.read(RESULTS)
    assert committed and all(set(rows.FIELDS) <= set(r) for r in committed)
    page = (REPO / "BENCHMARKS.md").read_text()
    assert page.count(BEGIN) == 1 and page.count(END) == 1
    table = page.split(BEGIN)[1].split(END)[0].strip("\n") + "\n"
    assert table == rows.render(committed)
    done = suite("render", str(RESULTS.relative_to(REPO)))
    assert done.returncode == 0 and done.stdout == rows.render(committed)


@pytest.mark.any_backend
def test_script_figures_are_read_from_the_table_they_print():
    from benchmarks import run

    printed = (
        "backend jax\n\n| model | batch | runtime | img/s (median) | min |\n|---|---|---|---|---|\n"
        "| cifar_resnet20 | 1 | SavedModel | 1,234 | 1,000 |\n| cifar_resnet20 | 64 | ONNX | 5,678.5 | 5,000 |\n"
    )
    assert run.table_rows(printed, "img/s") == [("cifar_resnet20, 1, SavedModel", 1234.0),
                                                ("cifar_resnet20, 64, ONNX", 5678.5)]
    assert run.table_rows(printed, "p99") == []
    spec = run.SCRIPTS["conv_kernels"]
    printed = ("torch 2.13\n(32, 32) -> 16, same:\n  keras             7.25 ms (min 7.00, max 8.00)\n"
               "sum of medians: keras 7.2 ms\n")
    assert run.script_rows(spec, printed) == [("(32, 32) -> 16, same, keras", 7.25)]
    spec = run.SCRIPTS["batch_norm_kernels"]
    assert run.script_rows(spec, "  (128, 16): fused 1.25 (1.10-1.40), keras 2.50 (2.00-3.00)\n") == [
        ("(128, 16), fused", 1.25), ("(128, 16), keras", 2.5)]
    spec = run.SCRIPTS["served_accuracy"]
    assert run.script_rows(spec, "[served] onnx rest: top-1 91.20% (+0.00 points, 0 differ)\n") == [
        ("[served] onnx rest", 91.2)]
    spec = run.SCRIPTS["remat_memory"]
    line = json.dumps({"policy": "units", "batch_size": 64, "peak_rss_gib": 0.5})
    assert run.script_rows(spec, line + "\n") == [("policy units, batch_size 64", 0.5)]
    spec = run.SCRIPTS["jax_xla_flags"]  # one row per setting and measure; the per-round lines are not rows
    printed = "\n".join(json.dumps(r) for r in (
        {"load_average": [5.0, 4.0, 3.0], "cores": 2},
        {"setting": "onednn", "round": 0, "backend": "jax", "train_on_batch": 900.0, "predict_on_batch": 90.0},
        {"setting": "intra_op_threads_1", "flags": "--intra_op_parallelism_threads=1", "rejected": "exit 1"},
        {"setting": "onednn", "flags": "--xla_cpu_use_onednn=true", "measure": "train_on_batch", "ms": 900.0,
         "ratio_vs_default": 1.01, "max_abs_diff_logits": 0.0, "vs_default": "ratio 1.01"}))
    assert run.script_rows(spec, printed + "\n") == [
        ("setting onednn, flags --xla_cpu_use_onednn=true, measure train_on_batch, vs_default ratio 1.01", 900.0)]
