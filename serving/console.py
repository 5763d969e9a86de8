"""The console scripts: TensorFlow's C++ start-up log lines hidden (``keras_preact_training.machine.start_up``), then the command."""

from keras_preact_serving import main, main_ray  # standard library only (``serving/__init__.py``): imports no Keras
from keras_preact_training.machine.start_up import start_command


def serve(argv=None):
    """``keras-preact-serve``."""
    return start_command("keras-preact-serve", argv) or main(argv)


def serve_ray(argv=None):
    """``keras-preact-serve-ray``."""
    return start_command("keras-preact-serve-ray", argv) or main_ray(argv)
