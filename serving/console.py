"""The console scripts: TensorFlow's C++ start-up log lines hidden (``keras_preact_training.machine.start_up``), then the command."""

from keras_preact_serving import main, main_ray  # standard library only (``serving/__init__.py``): imports no Keras
from keras_preact_training.machine.start_up import quiet_tensorflow_start_up


def serve(argv=None):
    """``keras-preact-serve``."""
    quiet_tensorflow_start_up()
    return main(argv)


def serve_ray(argv=None):
    """``keras-preact-serve-ray``."""
    quiet_tensorflow_start_up()
    return main_ray(argv)
