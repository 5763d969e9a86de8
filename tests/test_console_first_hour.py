"""The console scripts in a newcomer's first hour: a wrong path or a missing value answered in one line before Keras
loads, no flag taken for another by its prefix, every ``--help`` entry described; the training launcher's thread
setting for PyTorch; ``--backend fastest`` saying what it times before it times it."""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
import tomllib

from keras_preact_serving import flags as serving_flags
from keras_preact_training import cli, evaluate, export

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
