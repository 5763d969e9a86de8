"""The console scripts: the launcher (``keras_preact_serving.start_up``: TensorFlow's start-up settings), then the command."""

import sys

from keras_preact_serving import main, main_ray, missing_extra  # standard library only (``serving/__init__.py``): no Keras
from keras_preact_serving.start_up import start_command


def _start(prog, argv):
    """A missing extra said in one line at once (exit 2), before Keras loads; else the command's start."""
    line = missing_extra(prog)
    if line:
        print(line, file=sys.stderr)
        return 2
    return start_command(prog, argv)


def serve(argv=None):
    """``keras-preact-serve``."""
    return _start("keras-preact-serve", argv) or main(argv)


def serve_ray(argv=None):
    """``keras-preact-serve-ray``."""
    return _start("keras-preact-serve-ray", argv) or main_ray(argv)
