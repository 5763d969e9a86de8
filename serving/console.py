"""The console scripts: a missing extra, ``--help``, a bad flag and a model path that is not a folder answered
before Keras loads; then the launcher (``keras_preact_serving.start_up``: TensorFlow's start-up settings), then the
command."""

import pathlib
import sys

from keras_preact_serving import (  # standard library only: no Keras
    flags,
    main,
    main_ray,
    missing_extra,
    missing_grpc,
)
from keras_preact_serving.start_up import start_command


def _start(prog, parser, argv):
    """A missing extra said in one line at once (exit 2), then the flags parsed (``--help``, a bad flag: argparse
    exits), ``--grpc-port`` without grpcio or tritonclient and a ``model_base_path`` that is not a folder each said
    in one line (exit 2), all before Keras loads; else the command's start."""
    line = missing_extra(prog)
    if line:
        print(line, file=sys.stderr)
        return 2
    args = parser().parse_args(argv)
    if getattr(args, "grpc_port", None) is not None and missing_grpc():
        print(f"{prog}: error: {missing_grpc()}", file=sys.stderr)
        return 2
    if not pathlib.Path(args.model_base_path).is_dir():
        print(f"{prog}: error: Invalid model_base_path={args.model_base_path!r}: not a directory; give the model "
              "directory holding numeric version folders, e.g. saved_models/<name> (keras-preact-export writes it)",
              file=sys.stderr)
        return 2
    return start_command(prog, argv)


def serve(argv=None):
    """``keras-preact-serve``."""
    return _start("keras-preact-serve", flags.serve_parser, argv) or main(argv)


def serve_ray(argv=None):
    """``keras-preact-serve-ray``."""
    return _start("keras-preact-serve-ray", flags.ray_parser, argv) or main_ray(argv)
