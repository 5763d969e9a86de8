"""One GPU session's work, in one process that starts every run as its own child: the throughput table and the
resumable paper-length run. Started by ``benchmarks/gpu/run.sh`` (which installs what the machine lacks, puts this
checkout's packages on the path and unpacks the data); ``--tiny`` rehearses it all on a CPU in about a minute.

``throughput``: training images/s at batch 128 for each depth (ResNet-20, 110, 164 by default) and candidate:

- ``kp-jax-float32``, ``kp-jax-mixed_bfloat16``: ``keras-preact-train`` on Keras' JAX backend (``--pipeline
  device``, ``--steps-per-execution 10``), float32 and ``--precision mixed_bfloat16``;
- ``kp-torch-float32``: ``keras-preact-train`` on Keras' PyTorch backend;
- ``strong-float32``, ``strong-bf16``, ``strong-bf16-compile``: ``benchmarks/reference_torch_strong.py`` (data and
  augmentation on the device, ``channels_last``; bf16 autocast; ``torch.compile``).

Every run is one process of the real entry point on the same data folder, network depth, recipe (the paper's,
``--preset cifar10-folder-resnet20-paper --depth D``) and run length (``--epochs`` x ``--steps-per-epoch``); the
backend is named in the child's environment (``KERAS_BACKEND``) before Keras loads. Rounds run the candidates in
rotating order. Images/s come from each run's ``history.csv`` (``train_seconds``, epochs after the first, which
holds compilation); the ratio to ``--baseline`` is the median of per-round ratios. GPU utilisation is sampled with
``nvidia-smi`` every 200 ms where it exists; a run's figure is the mean over its last timed epochs (the process's
end minus those epochs' training and evaluation seconds). JAX's and Inductor's compilation caches are shared by
the runs, so a later round compiles less. ``--budget-s`` ends the table early, with what is measured, rather than
overrun the call.

``paper-run``: the paper's ResNet-110 (``--preset t2-resnet110-full-preact``; ``--ordering original`` for Table 2's
first row) for 64,000 iterations on the folder, JAX, float32, ``--steps-per-execution 10``, a backup every epoch.
It stops at ``--time-limit-s`` (or after ``--epochs-this-call`` more epochs), then carries the last backup
(``keras_preact_training.carry``: parts of 1 MiB, committable) with the history, log and curves as one
``paper-<name>.tar.gz`` under ``--out``; ``--resume-from`` that archive (or its extracted ``carry`` folder)
continues the run where it stopped.

``all``: the table, then the paper run in the time left.

Everything goes under ``--out`` as at most 8 files, none in a sub-folder (easy to copy off):
``summary.md`` (the table, the paper runs' state and the command that continues each), ``results.json`` (every
run's figures, the machine), ``gpu-util.csv`` (the samples), ``session.log`` (every child's output) and, per paper
run, ``paper-<name>.tar.gz`` and ``paper-<name>-curves.png``.
"""

import argparse
import contextlib
import csv
import datetime
import json
import os
import pathlib
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
STRONG = REPO / "benchmarks" / "reference_torch_strong.py"
CANDIDATES = ("kp-jax-float32", "kp-jax-mixed_bfloat16", "kp-torch-float32", "strong-float32", "strong-bf16",
              "strong-bf16-compile")
TINY_CANDIDATES = ("kp-jax-float32", "kp-jax-mixed_bfloat16", "kp-torch-float32", "strong-float32", "strong-bf16")
ORDERINGS = ("full_preact", "original")
PAPER_STEPS_PER_EPOCH = 390
MAX_OUT_FILES = 8


# ------------------------------------------------------------------------------------------------ helpers
class Log:
    """``session.log`` under ``--out``: every child's output, each line also echoed to this process's stdout."""

    def __init__(self, path):
        self.path = path
        self.lock = threading.Lock()

    def write(self, text, echo=True):
        with self.lock, open(self.path, "a") as f:
            f.write(text)
        if echo:
            sys.stdout.write(text)
            sys.stdout.flush()

    def line(self, text):
        self.write(f"[session {time.strftime('%H:%M:%S')}] {text}\n")


class GpuSampler:
    """``nvidia-smi`` utilisation and memory every ``interval_ms`` into ``gpu-util.csv``; absent where the machine
    has no ``nvidia-smi`` (then ``available`` is False and every mean is None)."""

    def __init__(self, csv_path, interval_ms=200):
        self.samples, self.csv_path = [], csv_path
        self.available = shutil.which("nvidia-smi") is not None
        self.process = None
        if self.available:
            self.process = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits",
                 f"-lms={interval_ms}"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            self.thread = threading.Thread(target=self._read, daemon=True)
            self.thread.start()
        with open(csv_path, "w") as f:
            f.write("unix_time,utilization_percent,memory_used_mib\n" if self.available
                    else "# no nvidia-smi on this machine: no GPU utilisation sampled\n")

    def _read(self):
        with open(self.csv_path, "a") as f:
            for line in self.process.stdout:
                try:
                    util, memory = (float(v) for v in line.split(","))
                except ValueError:
                    continue
                now = time.time()
                self.samples.append((now, util, memory))
                f.write(f"{now:.3f},{util:g},{memory:g}\n")
                f.flush()

    def mean(self, start, end):
        values = [u for t, u, _ in list(self.samples) if start <= t <= end]
        return round(statistics.fmean(values), 1) if values else None

    def stop(self):
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)


def run_child(argv, env, log, name, timeout=None, cwd=REPO):
    """Run ``argv`` with ``env`` added, its output into the log; (return code or 'timeout', start, end)."""
    log.line(f"{name}: {' '.join(argv)}")
    start = time.time()
    child = subprocess.Popen(argv, env={**os.environ, **env}, cwd=cwd, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
    reader = threading.Thread(target=lambda: [log.write(f"  {line}", echo=False) for line in child.stdout], daemon=True)
    reader.start()
    try:
        rc = child.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_child(child)
        rc = "timeout"
    reader.join(timeout=10)
    end = time.time()
    log.line(f"{name}: exit {rc} after {end - start:.1f} s")
    return rc, start, end


def stop_child(child, grace_s=20):
    """SIGTERM to the child's process group, SIGKILL after ``grace_s``."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGTERM)
    try:
        child.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()


def read_history(path):
    try:
        with open(path, newline="") as f:
            rows = {int(r["epoch"]): r for r in csv.DictReader(f)}
    except FileNotFoundError:
        return []
    return [rows[k] for k in sorted(rows)]


def write_atomic(path, text):
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def machine():
    """What ran it: GPU (nvidia-smi), host, Python and the frameworks' versions (each from its own process)."""
    info = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                host=platform.node(), cpu_count=os.cpu_count(), python=platform.python_version())
    if shutil.which("nvidia-smi"):
        query = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                               capture_output=True, text=True)
        info["gpu"] = query.stdout.strip() or query.stderr.strip()
    else:
        info["gpu"] = None
    probe = ("import importlib.metadata as m, json\nout = {}\n"
             "for name in ('keras', 'jax', 'jaxlib', 'torch', 'numpy', 'optree', 'namex'):\n"
             "    try: out[name] = m.version(name)\n    except m.PackageNotFoundError: out[name] = None\n"
             "print(json.dumps(out))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    info["versions"] = json.loads(done.stdout) if done.returncode == 0 else done.stderr.strip()[-300:]
    return info


# --------------------------------------------------------------------------------------------- throughput
def candidate_argv(name, depth, args, run_dir):
    """(argv, extra environment) of one candidate's run."""
    common_env = dict(JAX_COMPILATION_CACHE_DIR=str(args.work_dir / "jax-cache"),
                      JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                      TORCHINDUCTOR_CACHE_DIR=str(args.work_dir / "inductor-cache"))
    if name.startswith("kp-"):
        _, backend, precision = name.split("-", 2)
        argv = [sys.executable, "-m", "keras_preact_training.cli", "--preset", "cifar10-folder-resnet20-paper",
                "--depth", str(depth), "--data-dir", str(args.data_dir), "--cache-dir", str(args.work_dir / "cache"),
                "--backend", backend, "--precision", precision, "--pipeline", "device",
                "--batch-size", str(args.batch_size), "--epochs", str(args.epochs),
                "--steps-per-epoch", str(args.steps_per_epoch), "--run-dir", str(run_dir), "--no-export",
                "--verbose", "2", "--checkpoint-every", str(args.epochs * args.steps_per_epoch)]
        if backend == "jax":
            argv += ["--steps-per-execution", str(min(10, args.steps_per_epoch))]
        if args.image_size != 32:
            argv += ["--image-size", str(args.image_size), str(args.image_size)]
        return argv, {**common_env, "KERAS_BACKEND": backend}
    parts = name.split("-")
    argv = [sys.executable, str(STRONG), "--data-dir", str(args.data_dir), "--cache-dir", str(args.work_dir / "cache"),
            "--depth", str(depth), "--batch-size", str(args.batch_size), "--epochs", str(args.epochs),
            "--steps-per-epoch", str(args.steps_per_epoch), "--schedule-steps", "64000",
            "--precision", parts[1], "--out", str(run_dir)]
    if "compile" in parts:
        argv += ["--compile", "default"]
    return argv, common_env


def throughput(args, log, sampler, deadline):
    """Every (depth, round, candidate) run that fits before ``deadline``; the records."""
    records, walls = [], {}
    for depth in args.depths:
        for round_index in range(args.rounds):
            shift = round_index % len(args.candidates)
            for name in args.candidates[shift:] + args.candidates[:shift]:
                estimate = walls.get((depth, name), 0)  # a first run is tried, stopped at the deadline
                record = dict(depth=depth, round=round_index + 1, candidate=name)
                records.append(record)
                left = deadline - time.time()
                if left < max(estimate * 1.2, 5):
                    record["status"] = "skipped: budget"
                    log.line(f"ResNet-{depth} round {round_index + 1} {name}: skipped ({max(left, 0):.0f} s left, "
                             f"its last run took {estimate:.0f} s)")
                    continue
                run_dir = args.work_dir / "throughput" / f"resnet{depth}-{name}-round{round_index + 1}"
                shutil.rmtree(run_dir, ignore_errors=True)
                argv, env = candidate_argv(name, depth, args, run_dir)
                rc, start, end = run_child(argv, env, log, f"ResNet-{depth} round {round_index + 1} {name}",
                                           timeout=left)
                walls[(depth, name)] = end - start
                epochs = per_epoch(run_dir, args)
                record.update(wall_s=round(end - start, 1), returncode=rc, images_per_s=[e[0] for e in epochs])
                if rc != 0 or not epochs:
                    record["status"] = f"failed (exit {rc}): session.log"
                    continue
                timed = sum(e[1] for e in epochs)
                record.update(status="ok", images_per_s_median=round(statistics.median(e[0] for e in epochs), 1),
                              gpu_util_percent=sampler.mean(end - timed - 1.0, end))
                util = record["gpu_util_percent"]
                log.line(f"ResNet-{depth} round {round_index + 1} {name}: {record['images_per_s_median']:.1f} "
                         f"images/s, GPU {'n/a' if util is None else util}%")
    return records


def per_epoch(run_dir, args):
    """[(images/s, seconds)] of the timed epochs (after the first) of one run."""
    out = []
    for row in read_history(run_dir / "history.csv")[1:]:
        train = float(row["train_seconds"])
        out.append((args.steps_per_epoch * args.batch_size / train, train + float(row.get("eval_seconds") or 0)))
    return out


def throughput_table(records, args):
    """Markdown: per depth and candidate, images/s median (min-max over rounds), the ratio to the baseline
    (median of per-round ratios), GPU utilisation."""
    lines = [f"Training images/s at batch {args.batch_size}: median over rounds (min-max) of each run's median epoch "
             f"after the first ({args.epochs} epochs x {args.steps_per_epoch} steps per run, {args.rounds} rounds, "
             f"order rotated); ratio: median of per-round ratios to `{args.baseline}`; GPU: mean `nvidia-smi` "
             "utilisation over the timed epochs.", "",
             "| network | candidate | images/s | vs baseline | GPU % | runs |", "|---|---|---|---|---|---|"]
    for depth in args.depths:
        ok = [r for r in records if r["depth"] == depth and r.get("status") == "ok"]
        base = {r["round"]: r["images_per_s_median"] for r in ok if r["candidate"] == args.baseline}
        for name in args.candidates:
            mine = [r for r in ok if r["candidate"] == name]
            tried = [r for r in records if r["depth"] == depth and r["candidate"] == name]
            if not mine:
                status = tried[0].get("status", "not run") if tried else "not run"
                lines.append(f"| ResNet-{depth} | {name} | {status} | | | 0/{len(tried)} |")
                continue
            speeds = [r["images_per_s_median"] for r in mine]
            ratios = [r["images_per_s_median"] / base[r["round"]] for r in mine if r["round"] in base]
            utils = [r["gpu_util_percent"] for r in mine if r.get("gpu_util_percent") is not None]
            ratio = f"{statistics.median(ratios):.2f}x" if ratios else "n/a"
            util = f"{statistics.fmean(utils):.0f}" if utils else "n/a"
            lines.append(f"| ResNet-{depth} | {name} | {statistics.median(speeds):,.1f} ({min(speeds):,.1f}-"
                         f"{max(speeds):,.1f}) | {ratio} | {util} | {len(mine)}/{len(tried)} |")
    return "\n".join(lines) + "\n"


# -------------------------------------------------------------------------------------------- paper run
def paper_name(args):
    return f"resnet{args.paper_depth}-{args.ordering}"


def unpack_resume(source, run_dir, train_log):
    """The carried state (``paper-<name>.tar.gz`` or its extracted folder, or the ``carry`` folder in it) into an
    empty ``run_dir``; the earlier calls' ``train.log`` into ``train_log``, which this call's output extends."""
    source = pathlib.Path(source)
    shutil.rmtree(run_dir, ignore_errors=True)
    if source.is_dir():
        carried = source / "carry" if (source / "carry").is_dir() else source
        shutil.copytree(carried, run_dir)
        if (carried.parent / "train.log").is_file():
            shutil.copy2(carried.parent / "train.log", train_log)
        return
    if not tarfile.is_tarfile(source):
        raise SystemExit(f"session: --resume-from {source} is neither a paper-<name>.tar.gz nor a carry folder")
    with tempfile.TemporaryDirectory(dir=run_dir.parent) as tmp, tarfile.open(source) as tar:
        tar.extractall(tmp, filter="data")
        found = [p for p in pathlib.Path(tmp).rglob("config.json") if p.parent.name == "carry"]
        if not found:
            raise SystemExit(f"session: --resume-from {source} holds no carry/config.json")
        shutil.copytree(found[0].parent, run_dir)
        if (found[0].parent.parent / "train.log").is_file():
            shutil.copy2(found[0].parent.parent / "train.log", train_log)


def paper_run(args, log, deadline):
    """Train (or continue) the paper's run until it ends, ``deadline`` or ``--epochs-this-call``; carry it out."""
    from keras_preact_training import carry

    name = paper_name(args)
    run_dir = args.work_dir / f"paper-{name}"
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    train_log = args.work_dir / f"paper-{name}.log"
    if args.resume_from:
        train_log.unlink(missing_ok=True)
        unpack_resume(args.resume_from, run_dir, train_log)
    resumed = (run_dir / "config.json").is_file()
    flags = ["--backend", "jax", "--data-dir", str(args.data_dir), "--cache-dir", str(args.work_dir / "cache"),
             "--steps-per-execution", str(args.paper_steps_per_execution), "--checkpoint-every",
             str(args.paper_steps_per_epoch), "--run-dir", str(run_dir), "--no-export", "--verbose", "2"]
    if resumed:
        argv = [sys.executable, "-m", "keras_preact_training.cli", "--config", str(run_dir / "config.json"), *flags]
    else:
        shutil.rmtree(run_dir, ignore_errors=True)
        train_log.unlink(missing_ok=True)
        argv = [sys.executable, "-m", "keras_preact_training.cli", "--preset",
                f"t2-resnet110-{args.ordering.replace('_', '-')}", "--depth", str(args.paper_depth), "--dataset",
                "folder", "--normalization", "cifar10", *flags]
        if args.paper_steps != 64000:
            argv += ["--steps", str(args.paper_steps), "--steps-per-epoch", str(args.paper_steps_per_epoch)]
        if args.tiny:
            argv += ["--image-size", str(args.image_size), str(args.image_size), "--batch-size", str(args.batch_size)]
    epochs_before = len(read_history(run_dir / "history.csv"))
    log.line(f"paper run {name}: {'resuming' if resumed else 'starting'} at epoch {epochs_before}")
    env = dict(KERAS_BACKEND="jax", JAX_COMPILATION_CACHE_DIR=str(args.work_dir / "jax-cache"),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    start = time.time()
    child = subprocess.Popen(argv, env={**os.environ, **env}, cwd=REPO, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
    log.line(f"paper run {name}: {' '.join(argv)}")
    with open(train_log, "a") as f:
        f.write(f"=== {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')} "
                f"{' '.join(argv)}\n")
    reader = threading.Thread(target=_tee, args=(child, log, train_log), daemon=True)
    reader.start()
    stop_reason = None
    while child.poll() is None:
        time.sleep(0.5)
        if time.time() >= deadline:
            stop_reason = "the time limit"
        elif args.epochs_this_call and _backup_step(run_dir) >= (
            epochs_before + args.epochs_this_call
        ) * _steps_per_epoch(run_dir):
            stop_reason = f"--epochs-this-call {args.epochs_this_call}"
        if stop_reason:
            log.line(f"paper run {name}: stopping at {stop_reason}")
            stop_child(child)
            break
    reader.join(timeout=10)
    rc = child.returncode
    finished = (run_dir / "metrics.json").is_file() and rc == 0
    record = dict(name=name, returncode=rc, stopped_by=stop_reason, finished=finished,
                  seconds=round(time.time() - start, 1), epochs_before=epochs_before)
    try:
        pointer = carry.carry(run_dir, args.work_dir / f"paper-{name}-carry", part_bytes=2**20)  # parts of 1 MiB
    except ValueError as e:
        record.update(status=f"nothing to carry: {e}")
        log.line(f"paper run {name}: {record['status']}")
        shutil.copy2(train_log, args.out / f"paper-{name}.log")
        return record
    history = read_history(run_dir / "history.csv")
    record.update(status="finished" if finished else "carried", step=pointer["step"], epoch=pointer["epoch"],
                  epochs_in_history=len(history),
                  last=({k: round(float(history[-1][k]), 4) for k in ("loss", "accuracy", "val_loss", "val_accuracy")
                         if k in history[-1]} if history else None))
    archive = args.out / f"paper-{name}.tar.gz"
    tmp = archive.with_name(f".{archive.name}.tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        tar.add(args.work_dir / f"paper-{name}-carry", arcname=f"paper-{name}/carry")
        tar.add(train_log, arcname=f"paper-{name}/train.log")
        for extra in ("history.csv", "metrics.json", "model.keras"):
            if (run_dir / extra).is_file():
                tar.add(run_dir / extra, arcname=f"paper-{name}/{extra}")
    os.replace(tmp, archive)
    record["archive_mib"] = round(archive.stat().st_size / 2**20, 2)
    if history:
        record["curves"] = _curves(run_dir, args.out / f"paper-{name}-curves.png", log)
    log.line(f"paper run {name}: {record['status']} at step {record['step']} (epoch {record['epoch']}), "
             f"{archive.name} {record['archive_mib']} MiB")
    return record


def _tee(child, log, path):
    with open(path, "a") as f:
        for line in child.stdout:
            f.write(line)
            log.write(f"  {line}", echo=False)


def _backup_step(run_dir):
    """The step of the run's last complete backup (-1 before the first)."""
    try:
        return int(json.loads((run_dir / "checkpoints" / "backup" / "latest.json").read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return -1


def _steps_per_epoch(run_dir):
    try:
        return int(json.loads((run_dir / "config.json").read_text())["resolved_schedule"]["steps_per_epoch"])
    except (OSError, ValueError, KeyError, TypeError):
        return float("inf")  # no manifest yet: no backup either


def _curves(run_dir, png, log):
    """Training loss and test error against iterations (``keras_preact_training.run.plots``); None on failure."""
    try:
        from keras_preact_training.run import plots

        steps = json.loads((run_dir / "config.json").read_text())["resolved_schedule"]["steps_per_epoch"]
        plots.plot_curves(run_dir / "history.csv", png, steps, title=f"{run_dir.name} (this session)")
        return png.name
    except Exception as e:  # a figure is worth no lost run state
        log.line(f"curves not drawn: {type(e).__name__}: {e}")
        return None


# ------------------------------------------------------------------------------------------------- summary
def summary(args, info, table, paper):
    lines = [f"# GPU session {info['date']}", "",
             f"GPU: {info['gpu'] or 'none (a CPU rehearsal)'}; host {info['cpu_count']} CPUs; Python "
             f"{info['python']}; " + ", ".join(f"{k} {v}" for k, v in (info.get("versions") or {}).items() if v)
             + ("; **tiny rehearsal settings**" if args.tiny else ""), ""]
    if table is not None:
        lines += ["## Throughput", "", table]
    if paper is not None:
        resume = (f"bash benchmarks/gpu/run.sh paper-run{' --tiny' * args.tiny} --ordering {args.ordering} "
                  f"--resume-from PATH/paper-{paper['name']}.tar.gz")
        lines += ["## Paper run", "", "```", json.dumps(paper, indent=2), "```", "",
                  "Continue it (the archive committed, e.g. under reproduction/, then on the next GPU):", "",
                  f"    {resume}", ""]
    return "\n".join(lines)


def check_out(out):
    """``--out`` is copied off as at most 8 plain files, none deeper than two folders: say so loudly here."""
    files = [p for p in out.rglob("*") if p.is_file()]
    problems = [f"{len(files)} files under --out, the machine returns {MAX_OUT_FILES}"] * (len(files) > MAX_OUT_FILES)
    problems += [
        f"{p.name}: {p.stat().st_size / 2**20:.1f} MiB, over 16 MiB" for p in files if p.stat().st_size > 16 * 2**20
    ]
    return problems


# ------------------------------------------------------------------------------------------------ the CLI
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("task", choices=["throughput", "paper-run", "all"])
    p.add_argument("--data-dir", type=pathlib.Path, required=True, help="the image folder (train/, test/)")
    p.add_argument("--out", type=pathlib.Path, required=True, help="every file to keep (run.sh: $OUT)")
    p.add_argument("--work-dir", type=pathlib.Path, default=pathlib.Path(tempfile.gettempdir()) / "keras-preact-gpu",
                   help="run folders and caches (not kept)")
    p.add_argument("--tiny", action="store_true",
                   help="rehearsal on a CPU: ResNet-8 and 11 on 16x16 images, 2 epochs of 2 steps of 16, 2 rounds, "
                   "no torch.compile; a paper run of ResNet-8, 4 epochs of 2 steps")
    p.add_argument("--budget-s", type=float, default=None,
                   help="wall-clock seconds for this whole command (default 540: a 600-s call; tiny 1800)")
    t = p.add_argument_group("throughput")
    t.add_argument("--depths", type=int, nargs="+", default=None, help="default 20 110 164 (tiny: 8 11)")
    t.add_argument("--candidates", nargs="+", choices=CANDIDATES, default=None, help="default: all (tiny: no compile)")
    t.add_argument("--baseline", choices=CANDIDATES, default="strong-float32")
    t.add_argument("--rounds", type=int, default=2)
    t.add_argument("--epochs", type=int, default=None, help="per run; the first is not timed (default 3; tiny 2)")
    t.add_argument("--steps-per-epoch", type=int, default=None, help="default 100 (tiny 2)")
    t.add_argument("--batch-size", type=int, default=None, help="default 128 (tiny 16)")
    t.add_argument("--throughput-share", type=float, default=0.5,
                   help="task all: the share of --budget-s the table may take (the paper run gets the rest)")
    r = p.add_argument_group("paper run")
    r.add_argument("--ordering", choices=ORDERINGS, default="full_preact", help="Table 2's unit ordering")
    r.add_argument("--time-limit-s", type=float, default=None, help="stop the run after this (default: the budget)")
    r.add_argument("--epochs-this-call", type=int, default=None, help="stop after this many more epochs")
    r.add_argument("--resume-from", type=pathlib.Path, default=None, help="a paper-<name>.tar.gz or its carry folder")
    args = p.parse_args(argv)
    tiny = args.tiny
    args.budget_s = (1800 if tiny else 540) if args.budget_s is None else args.budget_s
    args.depths = args.depths or ([8, 11] if tiny else [20, 110, 164])
    args.candidates = list(args.candidates or (TINY_CANDIDATES if tiny else CANDIDATES))
    args.epochs = args.epochs or (2 if tiny else 3)
    args.steps_per_epoch = args.steps_per_epoch or (2 if tiny else 100)
    args.batch_size = args.batch_size or (16 if tiny else 128)
    args.image_size = 16 if tiny else 32
    args.paper_depth = 8 if tiny else 110
    args.paper_steps_per_epoch = 2 if tiny else PAPER_STEPS_PER_EPOCH
    args.paper_steps = 8 if tiny else 64000
    args.paper_steps_per_execution = 1 if tiny else 10
    for name in ("rounds", "epochs", "steps_per_epoch", "batch_size", "epochs_this_call"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if args.epochs < 2:
        p.error(f"--epochs must be >= 2 (the first holds compilation and is not timed), got {args.epochs}")
    if any(d < 8 for d in args.depths):
        p.error(f"--depths must be CIFAR depths (6n+2 or 9n+2, >= 8), got {args.depths}")
    if not 0 < args.throughput_share < 1:
        p.error(f"--throughput-share must be between 0 and 1, got {args.throughput_share}")
    if args.budget_s <= 0:
        p.error(f"--budget-s must be > 0, got {args.budget_s}")
    if args.baseline not in args.candidates:
        args.baseline = args.candidates[0]
    if not (args.data_dir / "train").is_dir() or not (args.data_dir / "test").is_dir():
        p.error(f"--data-dir {args.data_dir} needs train/ and test/ class folders")
    if args.resume_from is not None and not args.resume_from.exists():
        p.error(f"--resume-from {args.resume_from} does not exist")
    return args


def main(argv=None):
    args = parse_args(argv)
    started = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    log = Log(args.out / "session.log")
    info = machine()
    log.line(f"machine: {json.dumps(info)}")
    sampler = GpuSampler(args.out / "gpu-util.csv")
    if not sampler.available:
        log.line("no nvidia-smi: GPU utilisation not sampled")
    table = records = paper = None
    results = dict(machine=info, args={k: str(v) for k, v in vars(args).items()})
    try:
        if args.task in ("throughput", "all"):
            share = args.throughput_share if args.task == "all" else 1.0
            records = throughput(args, log, sampler, started + args.budget_s * share)
            table = throughput_table(records, args)
            results["throughput"] = records
            write_atomic(args.out / "summary.md", summary(args, info, table, None))
        if args.task in ("paper-run", "all"):
            deadline = started + args.budget_s - 30  # the carry and the archive
            if args.time_limit_s:
                deadline = min(deadline, time.time() + args.time_limit_s)
            paper = paper_run(args, log, deadline)
            results["paper_run"] = paper
    finally:
        sampler.stop()
        results["seconds"] = round(time.time() - started, 1)
        write_atomic(args.out / "results.json", json.dumps(results, indent=2) + "\n")
        write_atomic(args.out / "summary.md", summary(args, info, table, paper))
    problems = check_out(args.out)
    for problem in problems:
        log.line(f"WARNING: {problem}")
    sys.stdout.write(summary(args, info, table, paper))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
