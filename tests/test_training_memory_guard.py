"""The host-memory guard (issue 26): a run that outgrows memory ends with one line, not by the OOM killer.

``keras_preact_training.machine.memory_guard`` reads the cgroup's or the machine's memory (here from fake /proc and /sys
trees), trips at ``ceil(fraction * limit)`` bytes in use, and ``keras-preact-train --memory-limit`` drives it around
``model.fit`` and ``model.evaluate``.
"""

import os
import pathlib
import subprocess
import sys
import threading

import pytest

from keras_preact_training import cli
from keras_preact_training import train as train_lib
from keras_preact_training.machine import memory_guard
from keras_preact_training.recipe import configs
from support import TRAIN_JIT_COMPILE

pytestmark = [pytest.mark.core, pytest.mark.notf]

REPO = pathlib.Path(__file__).resolve().parents[1]
GIB = 2**30
V1_NO_LIMIT = 9223372036854771712  # what cgroup v1 writes when no limit is set


def write(root, relative, text):
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def meminfo(root, total_kb, available_kb):
    write(root, "proc/meminfo", f"MemTotal:       {total_kb} kB\nMemFree:          1000 kB\n"
                                f"MemAvailable:   {available_kb} kB\nBuffers:          2000 kB\n")


def cgroup_v2(root, own="/", **files):
    """A unified hierarchy; ``files``: {"dir/name": text} under /sys/fs/cgroup (dots as underscores)."""
    write(root, "proc/self/cgroup", f"0::{own}\n")
    write(root, "sys/fs/cgroup/cgroup.controllers", "cpu memory pids\n")
    for name, text in files.items():
        write(root, "sys/fs/cgroup/" + name.replace("__", "/").replace("_", "."), text)


# ------------------------------------------------------------------------------------- the reader
def test_meminfo_is_total_less_available(tmp_path):
    meminfo(tmp_path, 16 * 2**20, 4 * 2**20)  # 16 GiB, 4 GiB available
    memory = memory_guard.read_memory(tmp_path)
    assert (memory.used, memory.limit, memory.left) == (12 * GIB, 16 * GIB, 4 * GIB)
    assert memory.source == "this machine's memory"


def test_no_files_no_reading(tmp_path):
    """Not Linux (no /proc/meminfo, no cgroup files): nothing to read, and the guard says it is off once."""
    assert memory_guard.read_memory(tmp_path) is None and memory_guard.memory_reader(tmp_path) is None
    write(tmp_path, "proc/meminfo", "MemTotal: 1000 kB\n")  # no MemAvailable: unreadable too
    assert memory_guard.read_memory(tmp_path) is None


def test_no_reading_says_once_the_guard_is_off(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(memory_guard, "_said_off", False)
    for what in ("model.fit", "model.evaluate"):
        with memory_guard.watch(what, 0.95, root=tmp_path) as guard:
            assert guard is None
    err = capsys.readouterr().err
    assert err.count("memory guard off") == 1 and "not Linux" in err
    assert not [t for t in threading.enumerate() if t.name == memory_guard.THREAD_NAME]


def test_cgroup_v2_limit_less_reclaimable_cache(tmp_path):
    meminfo(tmp_path, 64 * 2**20, 60 * 2**20)
    cgroup_v2(tmp_path, memory_max=f"{8 * GIB}\n", memory_current=f"{6 * GIB}\n",
              memory_stat=f"anon {4 * GIB}\nfile {2 * GIB}\ninactive_file {GIB}\nactive_file {GIB}\n")
    memory = memory_guard.read_memory(tmp_path)
    assert (memory.used, memory.limit) == (5 * GIB, 8 * GIB) and "memory.max" in memory.source


def test_cgroup_v2_max_is_no_limit_and_the_machine_counts(tmp_path):
    meminfo(tmp_path, 16 * 2**20, 4 * 2**20)
    cgroup_v2(tmp_path, memory_max="max\n", memory_current=f"{GIB}\n")
    assert memory_guard.read_memory(tmp_path).limit == 16 * GIB
    cgroup_v2(tmp_path, memory_max=f"{32 * GIB}\n")  # above the machine's memory: the machine binds first
    assert memory_guard.read_memory(tmp_path).source == "this machine's memory"


def test_cgroup_v2_the_process_own_cgroup_and_the_fullest_ancestor(tmp_path):
    """Outside a cgroup namespace the limit is on the process's own cgroup or an ancestor: the fullest wins."""
    meminfo(tmp_path, 64 * 2**20, 60 * 2**20)
    cgroup_v2(tmp_path, own="/slice/job",
              slice__memory_max=f"{10 * GIB}\n", slice__memory_current=f"{9 * GIB}\n",  # 90% full
              slice__job__memory_max=f"{4 * GIB}\n", slice__job__memory_current=f"{2 * GIB}\n")  # 50%
    memory = memory_guard.read_memory(tmp_path)
    assert (memory.used, memory.limit) == (9 * GIB, 10 * GIB)
    write(tmp_path, "sys/fs/cgroup/slice/job/memory.current", f"{4 * GIB - 1}\n")  # now the fuller one
    assert memory_guard.read_memory(tmp_path).limit == 4 * GIB


def test_cgroup_v2_limit_without_usage_file_falls_back(tmp_path):
    meminfo(tmp_path, 16 * 2**20, 8 * 2**20)
    cgroup_v2(tmp_path, memory_max=f"{4 * GIB}\n")  # no memory.current: the machine's memory instead
    assert memory_guard.read_memory(tmp_path).limit == 16 * GIB
    (tmp_path / "sys/fs/cgroup/memory.max").unlink()  # no limit file at all: the machine's memory
    assert memory_guard.read_memory(tmp_path).limit == 16 * GIB


def test_cgroup_v1_limit_and_no_limit(tmp_path):
    meminfo(tmp_path, 32 * 2**20, 30 * 2**20)
    write(tmp_path, "proc/self/cgroup", "5:cpu,cpuacct:/\n4:memory:/docker/abc\n0::/\n")
    v1 = "sys/fs/cgroup/memory/docker/abc/"
    write(tmp_path, v1 + "memory.limit_in_bytes", f"{2 * GIB}\n")
    write(tmp_path, v1 + "memory.usage_in_bytes", f"{GIB + 2**20}\n")
    write(tmp_path, v1 + "memory.stat", f"cache 4096\ninactive_file 1\ntotal_inactive_file {2**20}\n")
    write(tmp_path, "sys/fs/cgroup/memory/memory.limit_in_bytes", f"{V1_NO_LIMIT}\n")
    memory = memory_guard.read_memory(tmp_path)
    assert (memory.used, memory.limit) == (GIB, 2 * GIB) and "memory.limit_in_bytes" in memory.source
    write(tmp_path, v1 + "memory.limit_in_bytes", f"{V1_NO_LIMIT}\n")
    assert memory_guard.read_memory(tmp_path).source == "this machine's memory"


def test_the_process_rss(tmp_path):
    write(tmp_path, "proc/self/status", "Name:\tpython\nVmPeak:\t  9 kB\nVmRSS:\t 3145728 kB\n")
    assert memory_guard.process_rss(tmp_path) == 3 * GIB and memory_guard.process_rss(tmp_path / "none") is None
    if os.path.exists("/proc/self/status"):
        assert memory_guard.process_rss() > 0


# ----------------------------------------------------------------------------------- the decision
def test_trips_at_the_threshold_to_the_byte(tmp_path):
    limit = 8 * GIB
    threshold = memory_guard.threshold_bytes(limit, 0.95)
    assert threshold == 8160437863  # ceil(0.95 * 8589934592 = 8160437862.4)
    just_under = memory_guard.Memory(threshold - 1, limit, "x")
    assert not memory_guard.trips(just_under, 0.95)
    assert memory_guard.trips(memory_guard.Memory(threshold, limit, "x"), 0.95)
    assert memory_guard.trips(memory_guard.Memory(limit + 1, limit, "x"), 0.95)
    assert memory_guard.trips(memory_guard.Memory(limit, limit, "x"), 1.0)
    assert not memory_guard.trips(memory_guard.Memory(limit - 1, limit, "x"), 1.0)

    # A poll reads the files, decides, and calls exit with the line only at the threshold.
    lines = []
    meminfo(tmp_path, 1000, 501)  # 499 kB of 1000 in use; the threshold at 0.5 is 500 kB
    guard = memory_guard.MemoryGuard("model.fit", 0.5, root=tmp_path, exit=lines.append)
    assert not guard.poll() and lines == []
    meminfo(tmp_path, 1000, 500)
    assert guard.poll() and len(lines) == 1 and "out of host memory during model.fit" in lines[0]


# ------------------------------------------------------------------------------------------ the line
def test_the_line_says_what_how_much_and_what_to_do():
    memory = memory_guard.Memory(used=int(22.8 * GIB), limit=24 * GIB, source="this machine's memory")
    line = memory_guard.message("model.evaluate", memory, 0.95, rss=int(20.5 * GIB))
    assert "\n" not in line
    assert line.startswith("[train] error: out of host memory during model.evaluate: 1.20 GiB left of 24.00 GiB "
                           "(this machine's memory; 95% in use reached --memory-limit 0.95)")
    assert "this process's RSS 20.50 GiB" in line
    assert "stopped before the kernel's OOM killer would end the run without a word" in line
    assert train_lib.OUT_OF_MEMORY_HINT in line  # --remat segments:<k> / units, a smaller --batch-size
    assert "--memory-limit FRACTION changes the threshold (default 0.95), --memory-limit 0 switches this guard off" \
        in line
    assert "RSS unknown" in memory_guard.message("model.fit", memory, 0.95, rss=None)


# ------------------------------------------------------------------------------- the flag and the run
def test_memory_limit_is_a_config_field_checked_before_any_work():
    assert configs.get_config("synthetic-resnet8").memory_limit == memory_guard.DEFAULT_FRACTION == 0.95
    for ok in (0, 0.01, 0.5, 1):
        assert configs.get_config("synthetic-resnet8", memory_limit=ok).memory_limit == ok
    for bad in (-1, 1.5, float("nan"), float("inf"), True, "0.9"):
        with pytest.raises(ValueError, match=r"memory_limit=.*\(--memory-limit\): 0 \(the memory guard off\) or a "
                                             r"fraction 0 < f <= 1"):
            configs.get_config("synthetic-resnet8", memory_limit=bad)
    from keras_preact_training.run import resume

    assert "memory_limit" in resume.MAY_CHANGE  # a resume may change it


def test_the_guard_thread_runs_during_fit_and_stops_after(tmp_path, monkeypatch):
    """``model.fit`` (its epochs' test evaluation included) runs watched; the end of training reuses the last
    epoch's test figures, so no separate ``model.evaluate`` runs (the guard watches it when one does)."""
    polled = []
    poll = memory_guard.MemoryGuard.poll

    def recording_poll(self):
        polled.append((self.what, threading.current_thread().name))
        return poll(self)

    monkeypatch.setattr(memory_guard.MemoryGuard, "poll", recording_poll)
    config = configs.get_config(
        "synthetic-resnet8", run_dir=str(tmp_path / "run"), depth=8, image_size=(16, 16), synthetic_train_size=32,
        synthetic_test_size=16, batch_size=16, epochs=1, steps_per_epoch=2, verbose="0", export=False,
        jit_compile=TRAIN_JIT_COMPILE)
    train_lib.train(config)
    if memory_guard.read_memory() is None:
        pytest.skip("no memory readable here: the guard is off")
    assert {what for what, _ in polled} == {"model.fit"}
    assert {name for _, name in polled} == {memory_guard.THREAD_NAME}
    assert not [t for t in threading.enumerate() if t.name == memory_guard.THREAD_NAME]


def run_cli(*args):
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.run(
        [sys.executable, "-m", "keras_preact_training.cli", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.skipif(memory_guard.read_memory() is None, reason="no memory readable here (not Linux)")
def test_keras_preact_train_stops_with_one_line_in_model_fit(tmp_path):
    """The real entry point, with a limit this machine is already over: one line, exit 1, nothing half-written."""
    run_dir = tmp_path / "run"
    result = run_cli(
        "--depth",
        "8",
        "--image-size",
        "16",
        "16",
        "--synthetic-train-size",
        "32",
        "--synthetic-test-size",
        "16",
        "--batch-size",
        "16",
        "--epochs",
        "1",
        "--verbose",
        "0",
        "--jit-compile",
        TRAIN_JIT_COMPILE,
        "--no-export",
        "--run-dir",
        str(run_dir),
        "--memory-limit",
        "0.01",
    )
    assert result.returncode == 1, result.stderr
    lines = [line for line in result.stderr.splitlines() if "out of host memory" in line]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("[train] error: out of host memory during model.fit: ")
    assert "--memory-limit 0.01" in lines[0] and "--remat segments:<k>" in lines[0]
    assert "Traceback" not in result.stderr
    assert "[train] synthetic-resnet8" in result.stdout  # what was printed before came out (flushed)
    # Every file is complete or absent: no temporary (.tmp-<name>-pid<PID>) is left, config.json is whole.
    assert not [p for p in run_dir.rglob("*") if p.name.startswith(".tmp-")]
    import json

    assert json.loads((run_dir / "config.json").read_text())["config"]["memory_limit"] == 0.01
    assert not (run_dir / "metrics.json").exists()


@pytest.mark.parametrize("value, in_process", [("1.5", False), ("-1", True)], ids=["1.5", "-1-in-process"])
def test_keras_preact_train_refuses_a_bad_memory_limit_before_any_work(tmp_path, capsys, value, in_process):
    """The console script in a process of its own (1.5); its ``main`` in this process (-1: argparse takes it
    as the flag's value, not as a flag)."""
    argv = ["--run-dir", str(tmp_path / "run"), "--memory-limit", value]
    if in_process:
        try:
            returncode = cli.main(argv)
        except SystemExit as e:
            returncode = e.code
        stderr = capsys.readouterr().err
    else:
        result = run_cli(*argv)
        returncode, stderr = result.returncode, result.stderr
    assert returncode == 2
    assert f"keras-preact-train: error: Invalid memory_limit={float(value)!r} (--memory-limit): 0 (the memory guard " \
           "off) or a fraction 0 < f <= 1" in stderr
    assert not (tmp_path / "run").exists()
