"""The serving app's console scripts (``pyproject.toml`` ``[project.scripts]`` names these functions):
TensorFlow's C++ start-up log lines hidden unless asked, then the command.

The quiet start is the training app's ``training.machine.start_up.quiet_tensorflow_start_up`` (standard
library only; the ``training`` package's ``__init__`` files import nothing, so importing it loads no Keras):
this module depends on the ``training`` package for it. It cannot live in ``keras_preact``, whose ``__init__`` imports Keras eagerly,
and it must run before anything loads Keras. Each entry point imports its command only after it.
"""

from training.machine.start_up import quiet_tensorflow_start_up


def serve(argv=None):
    """``keras-preact-serve`` (starts without TensorFlow where none is installed; where it is, the export
    module loads it on any backend, so it loads here, quietly)."""
    quiet_tensorflow_start_up()
    from serving import main

    return main(argv)


def serve_ray(argv=None):
    """``keras-preact-serve-ray``."""
    quiet_tensorflow_start_up()
    from serving import main_ray

    return main_ray(argv)
