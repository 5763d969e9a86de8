"""The console scripts' entry points (``pyproject.toml`` ``[project.scripts]``): each checks its paths and values
(``check_export_args``, ``check_evaluate_args``), then hides TensorFlow's C++ start-up lines
(``keras_preact_training.machine.start_up``) before Keras loads, then imports its command and runs it.
``keras-preact-train`` starts in ``keras_preact_training.cli`` (it picks the backend first).

Standard library only until a command runs: importing this module loads no Keras, and a missing run directory or
data folder is said in one line before Keras loads.
"""

import pathlib
import sys

from .machine.start_up import start_command

RUN_FILE = "config.json"  # what keras-preact-train writes first in a run directory (run.manifest.FILENAME)


def check_export_args(args):
    """ValueError naming ``run_dir`` when it does not exist or is a folder without a run's config.json: said
    before Keras loads (a run directory's other checks need Keras).

    Examples:
        >>> check_export_args(argparse.Namespace(run_dir="runs/nope"))  # doctest: +SKIP
        ValueError: Invalid run_dir='runs/nope': no such file or directory; ...
    """
    run_dir = pathlib.Path(args.run_dir)
    if not run_dir.exists():
        raise ValueError(f"Invalid run_dir={args.run_dir!r}: no such file or directory; give a run directory "
                         "written by keras-preact-train (config.json and model.keras), e.g. runs/<preset>-...")
    if run_dir.is_dir() and not (run_dir / RUN_FILE).is_file():
        raise ValueError(f"Invalid run_dir={args.run_dir!r}: no {RUN_FILE} in it; a run directory written by "
                         "keras-preact-train holds config.json and model.keras")


def check_evaluate_args(args):
    """ValueError naming the argument: a model path (a ``.keras`` file or a path with a folder in it) that does
    not exist, ``--dataset folder`` without ``--data-dir``, a ``--data-dir`` that is not a folder, a ``--json``
    that is one. Said before Keras loads.

    Examples:
        >>> check_evaluate_args(argparse.Namespace(model="runs/r", dataset="folder", data_dir=None, json=None))
        ... # doctest: +SKIP
        ValueError: Invalid --data-dir: --dataset folder (the default) needs --data-dir DIR, ...
    """
    model = pathlib.Path(args.model)
    if (args.model.endswith(".keras") or len(model.parts) > 1) and not model.exists():
        raise ValueError(f"Invalid model={args.model!r}: no such file or directory; give a run directory, a "
                         ".keras file or a registry name (e.g. cifar_resnet20 --weights cifar10)")
    if args.dataset == "folder" and not args.data_dir:
        raise ValueError("Invalid --data-dir: --dataset folder (the default) needs --data-dir DIR, a folder with "
                         "test/ (or val/) class folders; or --dataset NAME for a prepared TFDS data set")
    if args.dataset == "folder" and not pathlib.Path(args.data_dir).is_dir():
        raise ValueError(f"Invalid --data-dir={args.data_dir!r}: {args.data_dir} is not a directory")
    if args.json is not None and pathlib.Path(args.json).is_dir():
        raise ValueError(f"Invalid --json={args.json!r}: a directory; give a file path")


def _start(prog, parser, check, argv):
    """The flags parsed (``--help``, a bad flag: argparse exits) and ``check``ed, then the command's start; all
    before Keras loads. None to go on, else the exit status."""
    args = parser.parse_args(argv)
    try:
        check(args)
    except ValueError as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 2
    return start_command(prog, argv)


def export(argv=None):
    """``keras-preact-export``: on the run's backend where TensorFlow is missing; ``--help``, a bad flag and a
    missing run directory before Keras loads."""
    from .export import build_parser  # standard library only

    status = _start("keras-preact-export", build_parser(), check_export_args, argv)
    if status is not None:
        return status
    from .export import main

    return main(argv)


def evaluate(argv=None):
    """``keras-preact-evaluate``: on the run's backend where TensorFlow is missing; ``--help``, a bad flag, a
    missing model path or data folder before Keras loads."""
    from .evaluate import build_parser  # its module loads Keras only where a model or data is resolved

    status = _start("keras-preact-evaluate", build_parser(), check_evaluate_args, argv)
    if status is not None:
        return status
    from .evaluate import main

    return main(argv)
