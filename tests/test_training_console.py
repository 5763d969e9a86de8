"""The command lines as a newcomer meets them: TensorFlow's start-up settings made by one launcher per app
(``TF_CPP_MIN_LOG_LEVEL``, ``TF_ENABLE_ONEDNN_OPTS``, the Python loggers; no file-descriptor surgery), ``--dry-run``
without data, and ``python -m keras_preact_training.train`` naming the command."""

import ast
import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from keras_preact_serving import start_up as serving_start_up
from keras_preact_training.machine import start_up

pytestmark = [pytest.mark.core, pytest.mark.notf, pytest.mark.any_backend]

REPO = pathlib.Path(__file__).resolve().parents[1]
HAS_TENSORFLOW = importlib.util.find_spec("tensorflow") is not None
# Without TensorFlow there are no C++ start-up lines to hide: checking for none could not fail there.
needs_tensorflow = pytest.mark.skipif(not HAS_TENSORFLOW, reason="no TensorFlow C++ start-up lines without it")
CPP_LINE = re.compile(r"^(?:[IWEF]\d{4} [\d:.]+\s+\d+ \S+:\d+\]|\d{4}-\d\d-\d\d [\d:.]+: [IWEF] \S+:\d+\])", re.M)
# What TensorFlow 2.19+ logs while its shared libraries load, before absl::InitializeLog(): written to stderr
# whatever TF_CPP_MIN_LOG_LEVEL says (tensorflow/tensorflow#100442), so no documented setting hides it.
BEFORE_ABSL_INIT = re.compile(r"^(?:WARNING: All log messages before absl::InitializeLog\(\) is called are written to "
                              r"STDERR|I\d{4} [\d:.]+\s+\d+ (?:cudart_stub|port)\.cc:\d+\] .*)$")


def start_up_lines(stderr):
    """TensorFlow's C++ log lines in ``stderr`` other than those logged before absl's start."""
    return [line for line in stderr.splitlines() if CPP_LINE.match(line) and not BEFORE_ABSL_INIT.match(line)]


def test_the_launchers_settings_are_defaults_the_user_overrides(monkeypatch):
    """Both apps' launchers set the same variables, each only where the user has not."""
    for launcher in (start_up, serving_start_up):
        environ = {}
        launcher.launch(environ)
        environ.pop("OMP_WAIT_POLICY", None)  # PyTorch's threads: the training app's (test_console_first_hour.py)
        assert environ == {"TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "1"}
        environ = {"TF_CPP_MIN_LOG_LEVEL": "0", "TF_ENABLE_ONEDNN_OPTS": "0"}
        launcher.launch(environ)
        environ.pop("OMP_WAIT_POLICY", None)
        assert environ == {"TF_CPP_MIN_LOG_LEVEL": "0", "TF_ENABLE_ONEDNN_OPTS": "0"}
    assert start_up.log_level({"TF_CPP_MIN_LOG_LEVEL": "two"}) == 0


def test_no_file_descriptor_surgery_no_blocks_above_imports_and_serving_imports_no_training():
    """The start is made with documented settings: no ``dup2`` in either app; no ``if __name__ == "__main__"`` block
    before a module's last import; the serving app imports nothing of the training app."""
    for folder in ("training", "serving"):
        for path in sorted((REPO / folder).rglob("*.py")):
            tree = ast.parse(path.read_text())
            calls = {node.func.attr for node in ast.walk(tree) if isinstance(node, ast.Call)
                     and isinstance(node.func, ast.Attribute)}
            assert not calls & {"dup2", "dup"}, path
            imports = [i for i, node in enumerate(tree.body) if isinstance(node, (ast.Import, ast.ImportFrom))]
            mains = [
                i
                for i, node in enumerate(tree.body)
                if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)
            ]
            assert not mains or not imports or min(mains) > max(imports), path
            if folder == "serving":
                names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
                names |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
                assert not [n for n in names if n.startswith("keras_preact_training")], path


@needs_tensorflow
@pytest.mark.parametrize("onednn, expected", [(None, "True"), ("0", "False")])
def test_the_launcher_turns_tensorflows_onednn_kernels_on_unless_the_user_says(onednn, expected):
    """TensorFlow turns oneDNN on by itself only on CPUs with AVX-512/VNNI/AMX; the launcher asks for it
    (``TF_ENABLE_ONEDNN_OPTS=1``) unless the user set the variable (``0``: TensorFlow's own choice, off here)."""
    code = ("from keras_preact_training.machine.start_up import launch; launch(); "
            "from tensorflow.python.util import _pywrap_util_port; print(_pywrap_util_port.IsMklEnabled())")
    environ = {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=REPO,
                          env=environ | ({"TF_ENABLE_ONEDNN_OPTS": onednn} if onednn else {}))
    assert done.returncode == 0 and done.stdout.split() == [expected], done.stderr[-2000:]


# Twenty 8 MiB blocks (a CIFAR ResNet-20's activations at batch 128) alive, then freed, ten times over, in a fresh
# process: the minor page faults a round, after the launcher (argv[1] == "launch") or without it.
FREED_BLOCKS = """
import resource, sys
import numpy as np
from keras_preact_training.machine import start_up
kept = start_up.launch() if sys.argv[1] == "launch" else None
def step():
    blocks = [np.ones(2 << 20, np.float32) for _ in range(20)]
    del blocks
step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    step()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) // 10)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc settings")
@pytest.mark.parametrize("launch, user_setting, reused", [
    ("launch", None, True),
    ("none", None, False),
    ("launch", {"MALLOC_TRIM_THRESHOLD_": "131072"}, False),  # the user's own setting wins
], ids=["launched", "not-launched", "user-setting"])
def test_the_launcher_keeps_freed_activations_for_the_next_step(launch, user_setting, reused):
    """glibc gives freed blocks back to the kernel and faults them in again page by page (20,000 faults an evaluation
    batch of ResNet-20 on PyTorch); after the launcher a step reuses the last step's memory."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k not in ("LD_PRELOAD",
                                                                                             "GLIBC_TUNABLES")}
    done = subprocess.run([sys.executable, "-c", FREED_BLOCKS, launch], capture_output=True, text=True, timeout=600,
                          cwd=REPO, env=environ | (user_setting or {}))
    assert done.returncode == 0, done.stderr[-2000:]
    faults = int(done.stdout.split()[-1])
    pages = 20 * (8 << 20) // 4096  # 40,960 a round when every block is faulted in again
    assert (faults < pages // 100) if reused else (faults > pages // 10), faults


def test_the_allocator_setting_is_left_to_the_users_own():
    for name in start_up.ALLOCATOR_VARIABLES:
        assert start_up.keep_freed_memory({name: "x"}) is False
    assert start_up.keep_freed_memory({}) is (sys.platform.startswith("linux"))


# A small network's predictions in a fresh process (oneDNN on or off): the same seeded weights, the same input.
PREDICT = """
import sys
import keras, numpy as np
from keras_preact.models import create_model
keras.utils.set_random_seed(0)
model = create_model("cifar_resnet20", depth=8, num_classes=10, input_shape=(16, 16, 3))
images = np.random.default_rng(0).normal(size=(8, 16, 16, 3)).astype("float32")
np.save(sys.argv[1], model.predict_on_batch(images))
"""


@needs_tensorflow
def test_onednn_kernels_predict_what_the_default_kernels_predict(tmp_path):
    """The same weights' predictions with TensorFlow's oneDNN kernels on and off agree to float32 round-off
    (measured on ResNet-20: 1.2e-6 absolute on softmax outputs; benchmarks/tf_onednn.py)."""
    outputs = {}
    for onednn in ("0", "1"):
        done = subprocess.run([sys.executable, "-c", PREDICT, str(tmp_path / f"{onednn}.npy")], capture_output=True,
                              text=True, timeout=600, cwd=REPO, env={**os.environ, "KERAS_BACKEND": "tensorflow",
                                                                     "TF_ENABLE_ONEDNN_OPTS": onednn})
        assert done.returncode == 0, done.stderr[-2000:]
        outputs[onednn] = np.load(tmp_path / f"{onednn}.npy")
    assert outputs["0"].shape == (8, 10)
    np.testing.assert_allclose(outputs["1"], outputs["0"], rtol=1e-5, atol=1e-6)


def run(args, level=None, **extra_env):
    env = {key: value for key, value in os.environ.items() if key != "TF_CPP_MIN_LOG_LEVEL"}
    env.update(PYTHONPATH=os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(REPO)) if p), **extra_env)
    if level is not None:
        env["TF_CPP_MIN_LOG_LEVEL"] = level
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=600, env=env, cwd=REPO)


def test_dry_run_needs_no_data_and_prints_no_tensorflow_lines_unless_asked(tmp_path):
    """The real entry point, in a fresh process: no --data-dir, no folder; C++ lines only with level 0."""
    argv = [
        "-m",
        "keras_preact_training.cli",
        "cifar10-folder-resnet20-short",
        "--dry-run",
        "--run-dir",
        str(tmp_path / "r"),
    ]
    quiet = run(argv)
    assert quiet.returncode == 0, quiet.stderr
    assert "50000 training images (assumed: the size of cifar10" in quiet.stdout and not (tmp_path / "r").exists()
    assert not start_up_lines(quiet.stderr) and "cpu_feature_guard" not in quiet.stderr, quiet.stderr
    if not HAS_TENSORFLOW:  # no C++ lines to ask for: a second start with level 0 could not fail here
        return
    asked = run(argv, level="0", TF_ENABLE_ONEDNN_OPTS="1")  # TensorFlow notes oneDNN as it loads
    assert asked.returncode == 0 and asked.stdout == quiet.stdout
    assert CPP_LINE.search(asked.stderr), asked.stderr


def console_scripts():
    """pyproject.toml's [project.scripts] (read by hand: tomllib is Python 3.11+)."""
    section = (REPO / "pyproject.toml").read_text().split("\n[project.scripts]\n")[1].split("\n[")[0]
    scripts = dict(re.fullmatch(r'([\w-]+) = "([\w.:]+)"', line).groups()
                   for line in section.splitlines() if line and not line.startswith("#"))
    return scripts


def test_every_console_script_starts_through_the_quiet_start():
    assert set(console_scripts()) == {"keras-preact-train", "keras-preact-export", "keras-preact-evaluate",
                                      "keras-preact-serve", "keras-preact-serve-ray"}
    for name, target in console_scripts().items():
        serving = name in ("keras-preact-serve", "keras-preact-serve-ray")
        console = "keras_preact_serving.console:" if serving else "keras_preact_training.console:"
        assert target.startswith(console) or target == "keras_preact_training.cli:main", (name, target)


# The scripts whose command loads TensorFlow on JAX too when it is installed (the serving app imports it for
# SavedModels): on JAX, only their quiet start stands between TensorFlow and stderr. The others load nothing of
# TensorFlow for --help on JAX unless the quiet start does (measured: their functions' commands, called without
# it on JAX, write no C++ line), so their JAX case could not fail; the pass's backend covers their quiet start.
LOAD_TENSORFLOW_ON_JAX = ("keras-preact-serve", "keras-preact-serve-ray")


@needs_tensorflow
@pytest.mark.parametrize("name, backend", [
    *[(name, "this pass's") for name in sorted(console_scripts())],
    *[(name, "jax") for name in LOAD_TENSORFLOW_ON_JAX if os.environ.get("KERAS_BACKEND") != "jax"]])
def test_console_script_help_has_no_tensorflow_lines(name, backend):
    """What the installed script runs: import its module, call its function (``--help`` here). On JAX too,
    for the scripts whose command loads TensorFlow whatever the backend."""
    module, function = console_scripts()[name].split(":")
    code = (f"import sys; sys.argv = [{name!r}, '--help']; from {module} import {function}; "
            f"sys.exit({function}())")
    done = run(["-c", code], **({"KERAS_BACKEND": backend} if backend == "jax" else {}))
    ray_missing = name == "keras-preact-serve-ray" and "pip install" in done.stderr
    assert done.returncode == (2 if ray_missing else 0), done.stderr
    assert ray_missing or "usage:" in done.stdout
    assert not start_up_lines(done.stderr) and "cpu_feature_guard" not in done.stderr, done.stderr


def test_the_library_module_names_the_command_line_in_one_line():
    done = run(["-m", "keras_preact_training.train"])
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.strip().splitlines()[-1:] == [  # after TensorFlow's lines: the module imports Keras first
        "keras_preact_training.train is the training library (train(config)); the command line is keras-preact-train "
        "(python -m keras_preact_training.cli), e.g.: keras-preact-train --preset synthetic-resnet8"]


@needs_tensorflow
def test_python_dash_m_export_starts_as_quietly_as_its_script():
    """``python -m keras_preact_training.export`` imports no Keras before ``main``: its ``__main__`` block (at the end)
    makes the console script's start. (The other commands' modules import Keras at the top: run as ``python -m``
    they start as any Keras program does; their console scripts or ``keras-preact-train`` are the quiet way.)"""
    done = run(["-m", "keras_preact_training.export", "--help"])
    assert done.returncode == 0 and "usage:" in done.stdout, done.stderr
    assert not start_up_lines(done.stderr) and "cpu_feature_guard" not in done.stderr, done.stderr


@pytest.mark.skipif(HAS_TENSORFLOW, reason="with TensorFlow, each command starts in its own process (above)")
def test_every_command_prints_its_usage_without_tensorflow():
    """Without TensorFlow: every console script and ``python -m keras_preact_training.<module>`` answers ``--help``, all
    in one interpreter (a process of its own per command matters only where TensorFlow writes C++ lines)."""
    modules = ["evaluate", "export", "reproduce", "publish"]
    commands = [(name, *target.split(":")) for name, target in sorted(console_scripts().items())]
    code = textwrap.dedent(f"""
        import contextlib, importlib, io, runpy, sys
        for name, module, function in {commands!r} + [("keras_preact_training." + m, None, None) for m in {modules!r}]:
            sys.argv, out, code = [name, "--help"], io.StringIO(), None
            with contextlib.redirect_stdout(out):
                try:
                    code = (getattr(importlib.import_module(module), function)() if module
                            else runpy.run_module(name, run_name="__main__"))
                except SystemExit as stop:
                    code = stop.code
            print(name, code, "usage:" in out.getvalue())
    """)
    done = run(["-c", code])
    assert done.returncode == 0, done.stderr
    ray_missing = importlib.util.find_spec("ray") is None
    expected = [f"{name} 2 False" if ray_missing and name == "keras-preact-serve-ray" else f"{name} 0 True"
                for name in [name for name, _, _ in commands] + [f"keras_preact_training.{m}" for m in modules]]
    assert done.stdout.splitlines() == expected, done.stdout + done.stderr


def test_a_missing_serve_extra_is_said_before_keras_loads():
    """keras-preact-serve without its [serve] extra says so in one line at once: nothing of Keras or
    TensorFlow is imported first (it took 14 s of start-up to say it)."""
    code = textwrap.dedent("""
        import importlib.abc, sys
        class NotInstalled(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "uvicorn":
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        sys.meta_path.insert(0, NotInstalled())
        from keras_preact_serving.console import serve
        code = serve(["saved_models/m"])
        print(code, "keras" in sys.modules, "tensorflow" in sys.modules)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.stdout.split() == ["2", "False", "False"], done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [
        'keras-preact-serve: error: serving needs Starlette and uvicorn: pip install "keras-preact[serve]"']


HEAVY = ("keras", "tensorflow", "jax", "torch")  # what a command's --help and a bad flag must not wait for


@pytest.mark.parametrize("argv", [["--help"], ["x", "--no-such-flag"]], ids=["help", "bad-flag"])
@pytest.mark.parametrize("name", sorted(console_scripts()))
def test_help_and_a_bad_flag_come_before_keras_loads(name, argv):
    """Every console script of pyproject.toml, called as the installed script calls it (its module's function, in a
    fresh process), answers ``--help`` (exit 0, its usage) and a bad flag (exit 2, one usage error) from its parser
    alone: nothing of Keras or a backend is imported (``--help`` took 11-16 s of Keras and TensorFlow start-up on
    a loaded 2-core machine, 1 s after). Without an extra a script needs, its one line comes first, as early."""
    module, function = console_scripts()[name].split(":")
    code = textwrap.dedent(f"""
        import contextlib, io, json, sys
        sys.argv = [{name!r}, *{argv!r}]
        from {module} import {function}
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            try:
                code = {function}()
            except SystemExit as stop:
                code = stop.code
        print(json.dumps({{"code": code, "out": out.getvalue(), "heavy": [m for m in {HEAVY!r} if m in sys.modules]}}))
    """)
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True,
                          timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.splitlines()[-1])
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert result["heavy"] == [] and not imported & set(HEAVY), (result["heavy"], sorted(imported & set(HEAVY)))
    errors = [line for line in done.stderr.splitlines() if not line.startswith("import time:")]
    if name == "keras-preact-serve-ray" and importlib.util.find_spec("ray") is None:
        assert result["code"] == 2 and errors == [
            'keras-preact-serve-ray: error: serving on Ray needs Ray Serve: pip install "keras-preact[ray]"']
    elif argv == ["--help"]:
        assert result["code"] == 0 and result["out"].startswith(f"usage: {name} "), done.stderr[-2000:]
        assert errors == [], errors
    else:
        assert result["code"] == 2 and errors[-1] == f"{name}: error: unrecognized arguments: --no-such-flag", errors
