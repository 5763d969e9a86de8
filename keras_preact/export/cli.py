"""``keras-preact-export RUN_DIR [--export-dir DIR] [--name NAME] [--version N]``."""

import argparse
import errno


def _positive_int(text):
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"invalid version {text!r}: expected a positive integer")
    return value


def build_parser():
    parser = argparse.ArgumentParser(
        prog="keras-preact-export",
        description="Export a training run as a SavedModel in TF Serving layout: EXPORT_DIR/NAME/VERSION/.",
    )
    parser.add_argument("run_dir", help="run directory with config.json and model.keras")
    parser.add_argument("--export-dir", default="saved_models", help="parent of the model directory (default: saved_models)")
    parser.add_argument("--name", default=None, help="model name (default: the run's config name)")
    parser.add_argument("--version", type=_positive_int, default=None, help="version number (default: next free)")
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    # Imported after parsing so that --help and argument errors do not wait for TensorFlow.
    try:
        from keras_preact.export import export_run
    except ImportError as error:
        parser.exit(2, f"keras-preact-export: error: {error}\n")

    try:
        path = export_run(args.run_dir, args.export_dir, name=args.name, version=args.version)
    except ValueError as error:
        parser.error(str(error))
    except OSError as error:
        if error.errno != errno.ENOSPC:  # disk full: one line, no traceback
            raise
        parser.exit(1, f"{parser.prog}: error: {error}\n")
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
