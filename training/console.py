"""The console scripts' entry points (``pyproject.toml`` ``[project.scripts]``): each hides TensorFlow's C++
start-up lines (``keras_preact_training.machine.start_up``) before Keras loads, then imports its command and runs it.
``keras-preact-train`` starts in ``keras_preact_training.cli`` (it picks the backend first).

Standard library only until a function is called: importing this module loads no Keras.
"""

from .machine.start_up import start_command


def export(argv=None):
    """``keras-preact-export``: on the run's backend where TensorFlow is missing; ``--help`` and a bad flag
    before Keras loads."""
    from .export import build_parser  # standard library only

    build_parser().parse_args(argv)
    status = start_command("keras-preact-export", argv)
    if status is not None:
        return status
    from .export import main

    return main(argv)


def evaluate(argv=None):
    """``keras-preact-evaluate``: on the run's backend where TensorFlow is missing; ``--help`` and a bad flag
    before Keras loads."""
    from .evaluate import build_parser  # its module loads Keras only where a model or data is resolved

    build_parser().parse_args(argv)
    status = start_command("keras-preact-evaluate", argv)
    if status is not None:
        return status
    from .evaluate import main

    return main(argv)

