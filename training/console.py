"""The console scripts' entry points (``pyproject.toml`` ``[project.scripts]``): each hides TensorFlow's C++
start-up lines (``keras_preact_training.machine.start_up``) before Keras loads, then imports its command and runs it.
``keras-preact-train`` starts in ``keras_preact_training.cli`` (it picks the backend first).

Standard library only until a function is called: importing this module loads no Keras.
"""

from .machine.start_up import quiet_tensorflow_start_up


def export(argv=None):
    """``keras-preact-export``."""
    quiet_tensorflow_start_up()
    from .export import main

    return main(argv)


def evaluate(argv=None):
    """``keras-preact-evaluate``."""
    quiet_tensorflow_start_up()
    from .evaluate import main

    return main(argv)

