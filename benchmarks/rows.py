"""The suite's one result format: rows of JSON, one object a line, and the markdown table rendered from them.

Every row has the fields in ``FIELDS``: what was measured (``benchmark``, ``case``), the figure and its unit, the
reference's figure and the ratio when the benchmark ran side by side (else null), the rounds' spread, the exact
command, the machine (CPU model, the vector-extension flags, cores, memory, load at the start), the Keras backend,
the versions and the date (UTC). Side by side, rounds alternate between ours and the reference in one run, and
``ratio`` is the median of the per-round ratios (ours against the reference's figure, so above 1.0 is faster for a
rate, below 1.0 faster for a time: ``better`` says which).
"""

import datetime
import importlib.metadata
import json
import os
import pathlib
import platform
import statistics
import sys

FIELDS = ("benchmark", "case", "figure", "unit", "better", "spread", "reference", "reference_figure", "ratio",
          "ratio_spread", "rounds", "command", "machine", "backend", "versions", "date")
CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile")
PACKAGES = ("keras", "numpy", "tensorflow", "jax", "torch")


def machine():
    """The CPU model, its vector-extension flags, the cores this process may use, memory and load at the start."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        memory = None
    return {"cpu": model, "flags": [f for f in CPU_FLAGS if f in flags], "cores": len(os.sched_getaffinity(0)),
            "memory_gib": None if memory is None else round(memory, 1), "load": round(os.getloadavg()[0], 2)}


def versions():
    """The versions of Python and of the packages a figure depends on that this interpreter has."""
    found = {"python": platform.python_version()}
    for package in PACKAGES:
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    return found


def command(argv=None):
    """The command that reproduces this run, as typed from the repository root."""
    return " ".join(["python -m benchmarks", *(sys.argv[1:] if argv is None else argv)])


def compare(ours, reference=None, better="lower"):
    """Median, min and max of ``ours`` (one figure per round), and against ``reference`` (the same rounds,
    alternating) the median of the per-round ratios, oriented so that above 1.0 means ours is better.

    Examples:
        >>> compare([10.0, 12.0, 11.0], [20.0, 24.0, 22.0])["ratio"]
        2.0
        >>> compare([10.0], None)["ratio"] is None
        True
    """
    if better not in ("lower", "higher"):
        raise ValueError(f"better must be 'lower' or 'higher', got {better!r}")
    out = {"figure": statistics.median(ours), "spread": [min(ours), max(ours)], "rounds": len(ours),
           "reference_figure": None, "ratio": None, "ratio_spread": None, "better": better}
    if reference:
        if len(reference) != len(ours):
            raise ValueError(f"ours has {len(ours)} rounds, the reference {len(reference)}: they must alternate")
        ratios = [(r / o) if better == "lower" else (o / r) for o, r in zip(ours, reference)]
        out.update(reference_figure=statistics.median(reference), ratio=statistics.median(ratios),
                   ratio_spread=[min(ratios), max(ratios)])
    return out


def row(benchmark, case, unit, figures, *, backend, reference=None, argv=None, versions=None, **fields):
    """One complete row: ``figures`` is ``compare``'s answer; ``versions`` those of the process that measured
    (default: this one's); machine and date are this process's."""
    made = {"benchmark": benchmark, "case": case, "unit": unit, "reference": reference, "command": command(argv),
            "machine": machine(), "backend": backend, "versions": versions or globals()["versions"](),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"), **figures, **fields}
    missing = [f for f in FIELDS if f not in made]
    if missing:
        raise ValueError(f"a row needs {', '.join(missing)}")
    return made


def append(path, rows):
    """Add ``rows`` to the JSON-lines file ``path``: the whole file is written beside it, then renamed, so a run
    cut short leaves the previous rows whole."""
    path = pathlib.Path(path)
    old = path.read_text() if path.exists() else ""
    temporary = path.with_name(path.name + ".partial")
    temporary.write_text(old + "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    os.replace(temporary, path)


def read(path):
    """The rows of a JSON-lines file."""
    return [json.loads(line) for line in pathlib.Path(path).read_text().splitlines() if line.strip()]


def number(value):
    if value is None:
        return "—"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def render(rows):
    """The markdown table of ``rows``: one line per row, the figure as median (min-max), the reference's figure
    and the ratio when side by side, and each row's machine and date; the commands follow the table.

    Examples:
        >>> r = {"benchmark": "step", "backend": "torch", "case": "keras-preact", "figure": 401.0, "unit": "ms/step",
        ...      "spread": [390.0, 420.0], "reference": "plain PyTorch", "reference_figure": 364.0, "ratio": 0.91,
        ...      "ratio_spread": [0.85, 0.95], "rounds": 3, "command": "python -m benchmarks run step",
        ...      "machine": {"cpu": "AMD EPYC", "flags": ["avx2"], "cores": 2, "load": 0.5},
        ...      "date": "2026-11-27T23:00Z"}
        >>> print(render([r]).splitlines()[2])  # doctest: +NORMALIZE_WHITESPACE
        | step | torch | keras-preact | 401 (390-420) ms/step | 364 | 0.91x (0.85-0.95) |
        AMD EPYC (avx2), 2 cores, load 0.5 | 2026-11-27 |
    """
    lines = ["| benchmark | backend | case | figure, median (min-max) | reference | vs reference | machine | date |",
             "|---|---|---|---|---|---|---|---|"]
    commands = []
    for r in rows:
        lo, hi = r["spread"]
        ratio = (
            "—"
            if r["ratio"] is None
            else f"{r['ratio']:.3g}x ({r['ratio_spread'][0]:.3g}-{r['ratio_spread'][1]:.3g})"
        )
        m = r["machine"]
        where = f"{m['cpu']} ({', '.join(m['flags']) or 'no AVX2'}), {m['cores']} cores, load {m['load']}"
        lines.append(
            f"| {r['benchmark']} | {r['backend']} | {r['case']} | "
            f"{number(r['figure'])} ({number(lo)}-{number(hi)}) {r['unit']} | "
            f"{number(r['reference_figure'])} | {ratio} | {where} | {r['date'][:10]} |"
        )
        if r["command"] not in commands:
            commands.append(r["command"])
    return "\n".join(lines + [""] + [f"Command: `{c}`" for c in commands]) + "\n"
