"""The serving app's console scripts (``[project.scripts]``): TensorFlow's C++ start-up log lines hidden
(``training.machine.start_up``, standard library only; ``keras_preact`` imports Keras eagerly), then the
command, imported only after it.
"""

from training.machine.start_up import quiet_tensorflow_start_up


def serve(argv=None):
    """``keras-preact-serve``."""
    quiet_tensorflow_start_up()
    from serving import main

    return main(argv)


def serve_ray(argv=None):
    """``keras-preact-serve-ray``."""
    quiet_tensorflow_start_up()
    from serving import main_ray

    return main_ray(argv)
