"""The console scripts: a missing extra, ``--help`` and a bad flag answered before Keras loads; then the launcher
(``keras_preact_serving.start_up``: TensorFlow's start-up settings), then the command."""

import sys

from keras_preact_serving import flags, main, main_ray, missing_extra  # standard library only: no Keras
from keras_preact_serving.start_up import start_command


def _start(prog, parser, argv):
    """A missing extra said in one line at once (exit 2), then the flags parsed (``--help``, a bad flag: argparse
    exits), all before Keras loads; else the command's start."""
    line = missing_extra(prog)
    if line:
        print(line, file=sys.stderr)
        return 2
    parser().parse_args(argv)
    return start_command(prog, argv)


def serve(argv=None):
    """``keras-preact-serve``."""
    return _start("keras-preact-serve", flags.serve_parser, argv) or main(argv)


def serve_ray(argv=None):
    """``keras-preact-serve-ray``."""
    return _start("keras-preact-serve-ray", flags.ray_parser, argv) or main_ray(argv)
