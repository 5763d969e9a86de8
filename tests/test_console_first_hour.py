"""The console scripts in a newcomer's first hour: a wrong path or a missing value answered in one line before Keras
loads, no flag taken for another by its prefix, every ``--help`` entry described; the training launcher's thread
setting for PyTorch; ``--backend fastest`` saying what it times before it times it."""

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest
import tomllib

from keras_preact_serving import flags as serving_flags
from keras_preact_training import backend_probe, cli, evaluate, export
from keras_preact_training.machine import backends, start_up
from keras_preact_training.recipe import configs

pytestmark = [pytest.mark.notf, pytest.mark.any_backend]

REPO = pathlib.Path(__file__).resolve().parents[1]
SCRIPTS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
HEAVY = ("keras", "tensorflow", "torch", "jax")
PARSERS = {"keras-preact-train": cli.build_parser, "keras-preact-export": export.build_parser,
           "keras-preact-evaluate": evaluate.build_parser, "keras-preact-serve": serving_flags.serve_parser,
           "keras-preact-serve-ray": serving_flags.ray_parser}
# Runs an entry point of [project.scripts] in a fresh interpreter, then says its status and the packages loaded.
ENTRY = textwrap.dedent("""
    import importlib, json, sys
    module, function = sys.argv[1].split(":")
    try:
        status = getattr(importlib.import_module(module), function)(sys.argv[2:])
    except SystemExit as exit:
        status = exit.code
    sys.stdout.write(json.dumps({"status": status, "loaded": sorted({m.split(".")[0] for m in sys.modules})}))
""")


def run_entry_point(script, *argv, cwd):
    """(status, modules of HEAVY loaded, stderr) of the console script ``script`` run with ``argv``."""
    done = subprocess.run([sys.executable, "-c", ENTRY, SCRIPTS[script], *argv], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    result = json.loads(done.stdout)
    return result["status"], [name for name in HEAVY if name in result["loaded"]], done.stderr


def test_every_console_script_has_its_parser_here():
    assert set(PARSERS) == set(SCRIPTS)


@pytest.mark.parametrize("script, argv, named", [
    ("keras-preact-export", ["runs/nope"], "run_dir='runs/nope'"),
    ("keras-preact-export", ["."], "no config.json"),
    ("keras-preact-serve", ["saved_models/nope"], "model_base_path='saved_models/nope'"),
    ("keras-preact-serve-ray", ["saved_models/nope"], "model_base_path='saved_models/nope'"),
    ("keras-preact-train", ["finetune-folder"], "--data-dir"),
    ("keras-preact-train", ["finetune-folder", "--data-dir", "nope"], "--data-dir='nope'"),
    ("keras-preact-train", ["--config", "runs/nope/config.json"], "--config='runs/nope/config.json'"),
    ("keras-preact-evaluate", ["cifar_resnet20", "--weights", "cifar10"], "--data-dir"),
    ("keras-preact-evaluate", ["runs/nope", "--data-dir", "."], "model='runs/nope'"),
    ("keras-preact-evaluate", ["cifar_resnet20", "--data-dir", "nope"], "--data-dir='nope'"),
])
def test_a_wrong_path_or_missing_value_is_one_line_before_keras_loads(tmp_path, script, argv, named):
    """Each is said in one line naming the argument, exit 2, with none of Keras and its backends imported (so in
    well under 2 s where the machine is quiet, against 30 s and more once TensorFlow loads)."""
    if script.startswith("keras-preact-serve"):
        from keras_preact_serving import missing_extra

        if missing_extra(script):
            pytest.skip(missing_extra(script))
    status, loaded, stderr = run_entry_point(script, *argv, cwd=tmp_path)
    lines = stderr.strip().splitlines()
    assert (status, loaded, len(lines)) == (2, [], 1), stderr
    assert lines[0].startswith(f"{script}: error: ") and named in lines[0], lines[0]
    assert "'None'" not in lines[0]


@pytest.mark.parametrize("script", sorted(PARSERS))
def test_no_flag_is_taken_for_another_by_its_prefix(script, capsys):
    """argparse's prefix matching is off: ``--epoch 1`` is an error, not ``--epochs 1``."""
    parser = PARSERS[script]()
    assert parser.allow_abbrev is False
    longest = max((o for a in parser._actions for o in a.option_strings if o.startswith("--") and "=" not in o),
                  key=len)
    with pytest.raises(SystemExit) as exit:
        parser.parse_args(["x", longest[:-1], "1"])
    assert exit.value.code == 2
    assert f"unrecognized arguments: {longest[:-1]}" in capsys.readouterr().err


def test_epoch_is_not_epochs(capsys):
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["--epoch", "1"])
    assert "unrecognized arguments: --epoch" in capsys.readouterr().err


@pytest.mark.parametrize("script", sorted(PARSERS))
def test_every_help_entry_is_described(script):
    """Every flag and argument of every console script says what it is in ``--help``."""
    parser = PARSERS[script]()
    undescribed = [action.option_strings or action.dest for action in parser._actions
                   if action.help != argparse.SUPPRESS and not (action.help or "").strip()]
    assert undescribed == []


def test_the_training_launcher_lets_openmp_threads_sleep_unless_the_user_chose(monkeypatch):
    """PyTorch's OpenMP threads wait passively (``OMP_WAIT_POLICY=PASSIVE``): spinning ones took a busy 2-core
    machine's cores from each other (docs/training.md, "PyTorch's threads"). A user's own OpenMP waiting setting
    stands."""
    environ = {}
    start_up.launch(environ)
    assert environ["OMP_WAIT_POLICY"] == "PASSIVE"
    for name, value in (("OMP_WAIT_POLICY", "ACTIVE"), ("GOMP_SPINCOUNT", "300000"), ("KMP_BLOCKTIME", "200")):
        environ = {name: value}
        start_up.launch(environ)
        assert environ[name] == value and environ.get("OMP_WAIT_POLICY", value) == value


def test_keras_preact_train_launches_before_the_measurement_starts_its_children(monkeypatch):
    """The launcher's settings are made before ``--backend fastest`` starts the children that time each backend,
    which inherit them (PyTorch's threads were timed spinning, then trained passive)."""
    calls = []
    monkeypatch.setattr(start_up, "launch", lambda: calls.append("launch"))
    monkeypatch.setattr(cli, "choose_fastest", lambda args, parser: calls.append("measure"))
    assert cli.main(["--backend", "fastest"]) == 1
    assert calls == ["launch", "measure"]


def test_backend_fastest_with_one_backend_installed_says_so_not_the_fastest_measured(monkeypatch, capsys):
    monkeypatch.setattr(backends, "installed", lambda name: name == "torch")
    monkeypatch.setattr(start_up, "launch", lambda: None)
    chosen = {}

    def select(requested, reason):
        chosen.update(backend=requested, reason=reason)
        raise ValueError("stop here")

    monkeypatch.setattr(backends, "select", select)
    assert cli.main(["--backend", "fastest"]) == 2
    assert chosen == {"backend": "torch", "reason": "--backend fastest: the one installed"}
    assert "nothing to time" in capsys.readouterr().out


ROUNDS = {"torch": [41.0, 48.0], "jax": [45.0, 52.0], "tensorflow": [90.0, 95.0]}


def fake_measurement(monkeypatch, figures):
    """``measure_in_children`` on ``figures`` ({backend: ms of each round}), recording what it says and which
    backend it times, in order."""
    monkeypatch.setattr(backends, "installed", lambda name: name in figures)
    events = []

    def child(backend, config, steps, warmup):
        events.append(backend)
        return figures[backend][events.count(backend) - 1], None

    config = configs.get_config("synthetic-resnet8", needs_data=False)
    return backend_probe.measure_in_children(config, 3, 1, child, say=events.append), events


def test_backend_fastest_says_what_it_times_before_it_times_it_and_takes_the_rounds_in_turn(monkeypatch):
    result, events = fake_measurement(monkeypatch, ROUNDS)
    plan = events[0]
    assert plan.startswith("[measure] timing torch, jax, tensorflow on cifar ResNet-8 (image 32x32, batch 64)"), plan
    assert "2 rounds of 3 timed steps taken in turn (torch jax tensorflow | torch jax tensorflow)" in plan
    assert re.search(r"about \d+ s on a quiet machine$", plan), plan
    assert events[1:4] == events[5:8] == ["torch", "jax", "tensorflow"]
    assert events[4].startswith("[measure] round 1/2: torch 41, jax 45, tensorflow 90 ms/step (")
    assert events[8].startswith("[measure] round 2/2: torch 48, jax 52, tensorflow 95 ms/step (")
    assert events[9] == ("[measure] torch and jax are within the noise of each other (torch 41-48 ms/step over the "
                         "rounds, jax 45-52): either trains about as fast here; taking torch")
    assert result == ({"torch": 41.0, "jax": 45.0, "tensorflow": 90.0}, {})


def test_backend_fastest_says_nothing_of_noise_where_the_rounds_are_apart(monkeypatch):
    result, events = fake_measurement(monkeypatch, {"torch": [41.0, 43.0], "tensorflow": [60.0, 62.0]})
    assert not [e for e in events if "noise" in e] and result == ({"torch": 41.0, "tensorflow": 60.0}, {})


@pytest.mark.parametrize("times, expected", [
    ({"torch": [41.0, 48.0], "jax": [45.0, 52.0]}, True),  # the rounds overlap
    ({"torch": [41.0], "jax": [44.0]}, True),  # under NOISE_FRACTION apart
    ({"torch": [41.0, 42.0], "tensorflow": [60.0, 61.0]}, False),
    ({"torch": [41.0]}, False),
])
def test_within_noise(times, expected):
    assert backend_probe.within_noise(times) is expected


def test_the_closing_export_suggestion_carries_the_install_lines_it_needs(monkeypatch):
    """Without TensorFlow the run ends suggesting an ONNX and OpenVINO export here: with the extras' install
    lines where they are missing, so that the line pasted works."""
    from keras_preact.export import formats
    from keras_preact_training import train

    here = train.export_here_line("runs/r")
    if here is None:
        pytest.skip(f"the {keras_backend()} backend writes neither ONNX nor OpenVINO")
    command = here.split(" && ")[-1]
    names = command.split("--format ")[1].split(",")
    monkeypatch.setattr(formats, "_installed", lambda module: False)
    assert train.export_here_line("runs/r") == " && ".join([formats.FORMATS[n].install for n in names] + [command])
    monkeypatch.setattr(formats, "_installed", lambda module: True)
    assert train.export_here_line("runs/r") == command


def keras_backend():
    import keras

    return keras.backend.backend()


@pytest.mark.parametrize("page", ["README.md", "docs/index.md"])
def test_the_main_command_comes_after_what_to_install_first_and_installs_the_server_the_guides_use(page):
    """A reader pastes the first command block: PyTorch's CPU build is named before it, and its extras hold
    ``[serve]``, since the guides go straight on to ``keras-preact-serve``."""
    text = (REPO / page).read_text(encoding="utf-8")
    main = re.search(r'```bash\npip install -e "\.\[([a-z,]+)\]" && keras-preact-train --backend fastest\n```', text)
    assert main, page
    assert set(main.group(1).split(",")) >= {"tensorflow", "torch", "train", "serve"}
    cpu_build = text.find('pip install "torch<2.14" --index-url https://download.pytorch.org/whl/cpu')
    assert 0 <= cpu_build < main.start(), page
    # .ci/run installs the TensorFlow environment into the first python on PATH: the page says so, and runs it in a
    # virtual environment of the reader's own
    assert "python -m venv .venv && . .venv/bin/activate && bash .ci/run" in text and "`PYTHON`" in text


def test_the_readme_says_backend_fastest_chooses_by_measuring_and_ci_honours_python():
    readme = " ".join((REPO / "README.md").read_text(encoding="utf-8").split())
    assert "which chose PyTorch" not in readme and "`--backend fastest`, which chooses by measuring" in readme
    assert re.search(r"^PYTHON=\$\{PYTHON:-python\}", (REPO / ".ci/run").read_text(), re.M)


def test_the_fine_tuning_figures_name_the_machine_they_were_measured_on():
    """The transfer experiment ran on the 2-core Intel Xeon with AVX-512 VNNI (its README says so): the guide names
    the same machine, not one of the EPYCs of other figures."""
    record = " ".join((REPO / "reproduction/cifar10-transfer/README.md").read_text(encoding="utf-8").split())
    guide = " ".join((REPO / "docs/fine-tuning.md").read_text(encoding="utf-8").split())
    assert "2-core Intel Xeon Processor (lscpu's name; AVX-512 with VNNI" in record
    assert "2-core Intel Xeon Processor (lscpu's name; AVX-512 with VNNI, no GPU)" in guide


def test_the_ray_proxy_hook_makes_new_event_loops_guarded_without_a_policy(monkeypatch):
    """Ray's workers make their loops with ``asyncio.new_event_loop()``: after the hook each is a
    ``GuardedEventLoop`` with the request timeout the job's environment carries."""
    import asyncio

    from keras_preact_serving import connections

    monkeypatch.setattr(asyncio, "new_event_loop", asyncio.new_event_loop)  # restored after the test
    monkeypatch.setenv(connections.TIMEOUT_ENV, "2.5")
    connections.ray_proxy_setup_hook()
    loop = asyncio.new_event_loop()
    try:
        assert isinstance(loop, connections.GuardedEventLoop) and loop.timeout == 2.5 and loop.max_connections is None
    finally:
        loop.close()
