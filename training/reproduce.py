"""Reproduce a table of the paper: run its experiments, then put our numbers next to the paper's.

    python -m keras_preact_training.reproduce --table 2 --budget scaled --dataset folder --data-dir DIR
    python -m keras_preact_training.reproduce --table 1 --budget scaled --rows original,dropout --depth 56 ...
    python -m keras_preact_training.reproduce --table 3 --budget paper --seeds 5 --dataset cifar10 --data-dir DIR

For every row of the table and every seed it calls the training Python API
(``keras_preact_training.train.train(keras_preact_training.recipe.configs.get_config(preset, **overrides))``), one run
directory per run under ``OUT/runs/`` (a finished run, i.e. one with ``metrics.json``, is reused, so an interrupted
reproduction resumes). It then writes ``OUT/table{N}.md`` (our median, mean +- std and the paper's
number side by side), ``OUT/table{N}.json`` (every run's metrics) and ``OUT/table{N}_curves.png``
(test error solid and training error dashed against iterations, as the paper's Fig. 1 / 4 / 6).

Units: in ``table{N}.json``, as in every run's ``metrics.json``, errors and accuracies are fractions in
[0, 1] (``test_error``, ``paper_error``); the markdown table and the curves show them as the paper prints
them, in percent, with % in their headers and axis labels.

Budgets (``BUDGETS``): ``paper`` runs the presets unchanged (the paper's 64k iterations, its depths,
5 seeds: days on GPUs); ``scaled`` runs the table's smallest paper network at ``--depth`` (default
ResNet-20) for ``--epochs`` (default 3) on the whole schedule compressed proportionally, 1 seed.
"""

import argparse
import dataclasses
import json
import pathlib
import statistics

from keras_preact.analysis.plots import save_figure

from .recipe import configs, flags
from .recipe.configs import FAIL
from .run.plots import read_history
from .run.run_dir import write_text
from .run.run_state import read_metrics

# Set per row or by the budget (--depth, --epochs, --seeds), not by a config flag.
REPRODUCE_OWNS = ("depth", "epochs", "seed", "run_dir", "unit_options")


@dataclasses.dataclass(frozen=True)
class Row:
    """One row of a paper table: the label, the training preset that runs it, the paper's error (a
    fraction, or ``FAIL``), the paper network's depth and its unit block (None: the depth's default)."""

    label: str
    preset: str
    paper_error: object
    paper_depth: int
    block: object = None


def _rows(table):
    """The rows of a table, from ``configs.EXPERIMENTS`` (the presets and the paper's numbers)."""
    return [Row(e.label, e.config.name, e.paper_error, e.config.depth, e.config.unit_options.get("block"))
            for e in configs.EXPERIMENTS if e.table == table]


TABLES = {table: _rows(table) for table in ("1", "2", "3")}
FIGURES = {"1": "Fig. 1 / Table 1", "2": "Fig. 4 / Table 2", "3": "Fig. 6 / Table 3"}


@dataclasses.dataclass(frozen=True)
class Budget:
    """How much of the paper's run to do. ``None`` keeps the preset's value."""

    seeds: int
    depth: object = None  # replaces the paper depth
    epochs: object = None
    smallest_network_only: bool = False  # run only the rows of the table's smallest paper network
    note: str = ""


BUDGETS = {
    "paper": Budget(seeds=5, note="the paper's schedule (64k iterations at batch 128), depths and 5 seeds"),
    "scaled": Budget(
        seeds=1,
        depth=20,
        epochs=3,
        smallest_network_only=True,
        note="CPU scale: the table's smallest network replaced by a shallower one, the whole "
        "schedule (warm-up, /10 at 50% and 75%) compressed into a few epochs",
    ),
}


# --------------------------------------------------------------------------------- selection
def select_rows(table, budget, rows=None):
    """The rows of ``table`` to run: ``rows`` (labels or preset suffixes, comma-separated) or,
    with a scaled budget, those of the smallest paper network."""
    all_rows = TABLES[table]
    if rows:
        wanted = [r.strip() for r in rows.split(",") if r.strip()]
        short = [r.preset.split("-", 2)[-1] for r in all_rows]  # "dropout", "full-preact"
        by_key = {}
        for row, key in zip(all_rows, short):
            if short.count(key) == 1:
                by_key[key] = row
        for row in all_rows:
            by_key[row.label] = row
            by_key[row.preset] = row
            by_key[row.preset.split("-", 1)[-1]] = row  # "resnet110-dropout", "resnet164-original"
        unknown = [w for w in wanted if w not in by_key]
        if unknown:
            raise ValueError(
                f"Invalid rows={rows!r}: unknown {', '.join(map(repr, unknown))}. Allowed values: "
                + ", ".join(repr(r.preset.split("-", 1)[-1]) for r in all_rows)
            )
        return list(dict.fromkeys(by_key[w] for w in wanted))
    if BUDGETS[budget].smallest_network_only:  # the smallest network of the usual unit block
        smallest = min(r.paper_depth for r in all_rows)
        first_dataset = all_rows[0].preset.split("-")[1] if table == "3" else None
        return [
            r for r in all_rows
            if r.paper_depth == smallest and r.block is None
            and (first_dataset is None or first_dataset in r.preset)
        ]
    return all_rows


def run_overrides(budget, *, seed, depth=None, epochs=None, extra=None):
    b = BUDGETS[budget]
    overrides = {"seed": seed}
    depth = depth if depth is not None else b.depth
    epochs = epochs if epochs is not None else b.epochs
    if depth is not None:
        overrides["depth"] = depth
    if epochs is not None:
        overrides["epochs"] = epochs
    overrides.update(extra or {})
    return overrides


# ------------------------------------------------------------------------------------ summary
def _percent(error):
    """A fraction as the paper prints it, in percent with two decimals."""
    return f"{100 * error:.2f}"


def _format_paper(error):
    return "fail (>20%)" if error == FAIL else _percent(error)


def summarize(errors):
    """(median, mean, std) of a list of test errors (fractions); std is the sample std (0 for one run)."""
    if not errors:
        return None
    std = statistics.stdev(errors) if len(errors) > 1 else 0.0
    return statistics.median(errors), statistics.fmean(errors), std


def markdown_table(table, results, header_note=""):
    """Markdown: one line per row, our median and mean +- std next to the paper's error, in percent."""
    lines = [
        f"### Table {table}" + (f" ({header_note})" if header_note else ""),
        "",
        "| case | preset | paper (ResNet-{d}) error % | ours median error % | ours mean ± std error % | runs |",
        "|---|---|---|---|---|---|",
    ]
    depths = sorted({r["row"]["paper_depth"] for r in results})
    lines[2] = lines[2].replace("{d}", "/".join(map(str, depths)))
    for entry in results:
        row, errors = entry["row"], [m["test_error"] for m in entry["runs"]]
        stats = summarize(errors)
        ours = (
            ("—", "—") if stats is None else (_percent(stats[0]), f"{_percent(stats[1])} ± {_percent(stats[2])}")
        )
        lines.append(
            f"| {row['label']} | `{row['preset']}` | {_format_paper(row['paper_error'])} | {ours[0]} | "
            f"{ours[1]} | {len(errors)} |"
        )
    return "\n".join(lines) + "\n"


def plot_curves(results, png_path, title):
    """Test error (solid) and training error (dashed) against iterations, one colour per row
    (first seed), as the paper's Fig. 1 / 4 / 6."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for i, entry in enumerate(results):
        if not entry["runs"]:
            continue
        run = entry["runs"][0]
        history = read_history(pathlib.Path(run["run_dir"]) / "history.csv")
        if not history:
            continue
        per_epoch = run["steps"] / max(len(history), 1)
        its = [(int(h["epoch"]) + 1) * per_epoch for h in history]
        color = f"C{i % 10}"
        ax.plot(its, [100 * (1 - float(h["val_accuracy"])) for h in history], "-o", ms=3, color=color,
                label=f"{entry['row']['label']} test")
        ax.plot(its, [100 * (1 - float(h["accuracy"])) for h in history], "--", color=color, alpha=0.6)
    ax.set_xlabel("iterations")
    ax.set_ylabel("error (%) — solid: test, dashed: training")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, png_path)


# ---------------------------------------------------------------------------------------- run
def _run_once(config, run_dir, position):
    """One row's run: its finished ``metrics.json`` reused (``read_metrics``: one written before errors
    were fractions too), or trained; a diverged run is a result (a test error of 0.9), not a crash."""
    from .train import TrainingDiverged, train

    metrics_path = run_dir / "metrics.json"
    if metrics_path.exists():
        print(f"[reproduce] {position} {run_dir.name}: reusing finished run", flush=True)
        return read_metrics(metrics_path)
    print(f"[reproduce] {position} {run_dir.name}: training", flush=True)
    try:
        return train(config)
    except TrainingDiverged as e:
        return {"test_error": 0.9, "diverged": str(e), "run_dir": str(run_dir), "steps": 0}


def reproduce(table, budget="scaled", *, out_dir="reproduction", rows=None, seeds=None, depth=None,
              epochs=None, overrides=None):
    """Run the rows of ``table`` for ``seeds`` seeds and write the table, JSON and curves.

    ``overrides``: extra ``keras_preact_training.recipe.configs.Config`` fields for every run (``dataset``,
    ``data_dir``, ``subset``, ``batch_size``...). Every config is built and validated before the
    first run starts. Returns ``{"table": path, "json": path, "curves": path, "results": [...]}``.
    """
    from .recipe.configs import get_config

    if str(table) not in TABLES:
        raise ValueError(f"Invalid table={table!r}. Allowed values: {', '.join(map(repr, TABLES))}.")
    table = str(table)
    if budget not in BUDGETS:
        raise ValueError(f"Invalid budget={budget!r}. Allowed values: {', '.join(map(repr, BUDGETS))}.")
    seeds = BUDGETS[budget].seeds if seeds is None else seeds
    if not isinstance(seeds, int) or seeds < 1:
        raise ValueError(f"Invalid seeds={seeds!r}: a positive integer is required.")
    selected = select_rows(table, budget, rows)
    out_dir = pathlib.Path(out_dir)
    plan = []
    for row in selected:
        for seed in range(seeds):
            run_dir = out_dir / "runs" / f"{row.preset}-seed{seed}"
            config = get_config(
                row.preset,
                **run_overrides(budget, seed=seed, depth=depth, epochs=epochs, extra=overrides),
                run_dir=str(run_dir),
            )
            plan.append((row, run_dir, config))
    out_dir.mkdir(parents=True, exist_ok=True)

    results = {row.preset: {"row": dataclasses.asdict(row), "runs": []} for row in selected}
    for i, (row, run_dir, config) in enumerate(plan):
        metrics = _run_once(config, run_dir, f"{i + 1}/{len(plan)}")
        metrics["seed"] = config.seed
        results[row.preset]["runs"].append(metrics)

    ordered = list(results.values())
    first = plan[0][2]
    scale = (
        f"ResNet-{first.depth}, {first.epochs or 'preset'} epochs, {seeds} seed(s), "
        f"dataset {first.dataset}, budget {budget}"
    )
    stem = out_dir / f"table{table}"
    write_text(f"{stem}.md", markdown_table(table, ordered, scale))
    write_text(f"{stem}.json", json.dumps({"table": table, "budget": budget, "scale": scale,
                                              "results": ordered}, indent=2, default=str) + "\n")
    plot_curves(ordered, f"{stem}_curves.png", f"{FIGURES[table]}: {scale}")
    return {"table": f"{stem}.md", "json": f"{stem}.json", "curves": f"{stem}_curves.png",
            "results": ordered}


def build_parser():
    p = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="python -m keras_preact_training.reproduce",
        description="Run the experiments of one table of He et al. 2016 and write our numbers next "
        "to the paper's (markdown table, JSON, training-curve figure).",
    )
    p.add_argument("--table", required=True, choices=sorted(TABLES), help="paper table to reproduce")
    p.add_argument("--budget", default="scaled", choices=sorted(BUDGETS),
                   help="; ".join(f"{k}: {b.note}" for k, b in BUDGETS.items()).replace("%", "%%"))
    p.add_argument("--rows", help="comma-separated subset of the table's rows (preset suffixes, e.g. "
                   "'original,dropout' for Table 1)")
    p.add_argument("--seeds", type=int, help="runs per row (default: the budget's)")
    p.add_argument("--depth", type=int, help="network depth for every row (scaled default 20)")
    p.add_argument("--epochs", type=int, help="epochs per run (scaled default 3)")
    p.add_argument("--set", dest="sets", action="append", type=flags.parse_assignment, default=[],
                   metavar="FIELD=VALUE", help="a training config field, e.g. batch_size=64 (as its flag)")
    flags.add_config_flags(p, exclude=REPRODUCE_OWNS)
    p.add_argument("--out", default="reproduction", help="output directory (default ./reproduction)")
    return p


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    overrides = {**dict(args.sets), **flags.overrides_from_args(args, exclude=REPRODUCE_OWNS)}
    if args.seeds is not None and args.seeds < 1:
        parser.error(f"argument --seeds: invalid value {args.seeds}: a positive integer is required")
    overrides.setdefault("verbose", 2)
    try:
        written = reproduce(args.table, args.budget, out_dir=args.out, rows=args.rows, seeds=args.seeds,
                            depth=args.depth, epochs=args.epochs, overrides=overrides)
    except ValueError as e:
        parser.error(str(e))
    print(pathlib.Path(written["table"]).read_text())
    print(f"[reproduce] wrote {written['table']}, {written['json']}, {written['curves']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
