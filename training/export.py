"""Export a run directory (``config.json`` + ``model.keras``): SavedModel in TF Serving layout, ONNX,
LiteRT, OpenVINO, side by side in one version directory.

``export_run(run_dir, export_dir, formats=...)`` reads the run's manifest (class names; input config:
size, pixel statistics, evaluation view) and calls ``keras_preact.export.export_model``, so every format
normalizes as the run did and the SavedModel's ``serving_bytes`` view is the one the run's accuracy was
measured on. The CLI::

    keras-preact-export RUN_DIR [--export-dir DIR] [--name NAME] [--version N] [--format saved_model,onnx,...]
                        [--top-k K] [--quantize int8 --calibration-data FOLDER [--calibration-images 300]
                        [--max-accuracy-drop 0.5]]

The formats are checked (known, writable from the Keras backend, installed) before anything is loaded, and so are
the quantization flags (``keras_preact.export.quantize``: the folder's class folders are the run's classes).
``export_in_tensorflow(run_dir, export_dir)`` runs this command in a child process on Keras' TensorFlow
backend: how ``keras-preact-train`` writes the SavedModel of a run trained on PyTorch, whose backend writes none.
"""

import argparse
import errno
import importlib.util
import os
import pathlib
import subprocess
import sys
import zipfile

from .run import run_lock, run_state  # standard library only: --help loads no Keras (RunManifest's module does)

# keras_preact.export.quantize's choices and defaults, restated for --help (importing the library loads Keras).
QUANTIZE_CHOICES = ("int8",)
DEFAULT_CALIBRATION_IMAGES = 300
DEFAULT_MAX_ACCURACY_DROP = 0.5

# Presets for one's own data: each of their runs is a model of its own, named after its run directory (all
# fine-tuning runs exported as ``finetune-folder`` made two projects versions of one served model).
NAMED_BY_RUN_DIR = ("finetune-folder",)


def export_name(config_name, run_dir):
    """The model name a run exports as: its config's ``name``, or for a ``NAMED_BY_RUN_DIR`` preset the run
    directory's name (``keras-preact-train finetune-folder --run-dir runs/my-photos`` -> ``my-photos``).

    Examples:
        >>> from keras_preact_training.export import export_name
        >>> export_name("finetune-folder", "runs/my-photos"), export_name("synthetic-resnet8", "runs/demo")
        ('my-photos', 'synthetic-resnet8')
    """
    return pathlib.Path(run_dir).resolve().name if config_name in NAMED_BY_RUN_DIR else config_name


def exported_by_run(run_dir, export_dir, name):
    """The version directory the run's own export wrote under ``export_dir/name`` (its ``metrics.json``'s
    ``export_dir``), when it is still there; else None."""
    try:
        done = run_state.read_metrics(pathlib.Path(run_dir) / "metrics.json").get("export_dir")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(done, str) or not (pathlib.Path(done) / "saved_model.pb").is_file():
        return None
    same = pathlib.Path(done).resolve().parent == (pathlib.Path(export_dir) / name).resolve()
    return pathlib.Path(done) if same else None


def load_run_model(path):
    """``keras.saving.load_model`` (safe mode, uncompiled) with a corrupt file named as such."""
    import keras

    import keras_preact.layers  # noqa: F401  (registers the package's layers for safe_mode)
    import keras_preact.models  # noqa: F401

    path = pathlib.Path(path)
    if not path.is_file():
        raise ValueError(
            f"Invalid run_dir={str(path.parent)!r}: model.keras is missing (a run directory written by "
            "keras-preact-train holds config.json and model.keras)."
        )
    corrupt = ValueError(
        f"Invalid model file {str(path)!r}: it is corrupt or truncated ({path.stat().st_size} bytes, not a "
        "complete .keras zip archive). Re-create it: re-run the training command with the same --run-dir."
    )
    if not zipfile.is_zipfile(path):
        raise corrupt
    try:
        return keras.saving.load_model(path, safe_mode=True, compile=False)
    except (zipfile.BadZipFile, EOFError, OSError) as error:
        raise corrupt from error
    except (KeyError, ValueError) as error:  # a zip holding a damaged or foreign model.weights.h5
        first = (str(error).strip().splitlines() or [""])[0][:200]
        raise ValueError(
            f"Invalid model file {str(path)!r}: its model cannot be loaded ({type(error).__name__}: {first}); the "
            "file is damaged. Re-create it: re-run the training command with the same --run-dir."
        ) from None


def check_model(manifest, model, path):
    """ValueError when ``model`` (loaded from ``path``) is not the model the run's manifest records. The
    configuration digest is compared under the Keras that trained it (another may add config keys)."""
    import keras

    from .run.manifest import model_fingerprint

    expected, found = manifest.model, model_fingerprint(model)
    keys = ("class_name", "params", "variables") + (("config",) if manifest.keras_version == keras.__version__ else ())
    if not expected or all(found[k] == expected.get(k) for k in keys):  # older runs record none
        return
    raise ValueError(
        f"Invalid model file {str(path)!r}: it is not the model this run trained (config.json records a "
        f"{expected.get('class_name')} of {expected.get('params', 0):,} parameters, fingerprint "
        f"{_fingerprint(expected)}; the file holds a {found['class_name']} of {found['params']:,}, fingerprint "
        f"{_fingerprint(found)}). Remove it and re-run the training command with the same --run-dir: it is "
        "written again from the last backup."
    )


def _fingerprint(values):
    return f"{values.get('variables')}/{values.get('config')}"


def _disk_full(error):
    return getattr(error, "errno", None) == errno.ENOSPC or "No space left on device" in str(error)


def _no_space(model_dir, model, copies):
    """DiskFullError (one line) for an export that filled the disk while writing."""
    needed = copies * (run_state.weight_bytes(model) + 2**21)
    return run_state.DiskFullError(errno.ENOSPC, run_state.no_space_message(model_dir, needed, "--export-dir"))


def export_run(run_dir, export_dir="saved_models", *, name=None, version=None, formats=("saved_model",), top_k=None,
               quantize=None, calibration_data=None, calibration_images=DEFAULT_CALIBRATION_IMAGES,
               max_accuracy_drop=DEFAULT_MAX_ACCURACY_DROP):
    """Export ``RUN_DIR/model.keras`` in ``formats``; returns the version directory
    ``export_dir/<name>/<version>/`` (``name`` defaults to the run's, ``export_name``; ``top_k`` to
    ``min(5, classes)``; ``quantize="int8"`` with ``calibration_data``: ``export_model``'s int8 models, checked on
    the folder's held-out images). The SavedModel the run exported itself there is not written again: its directory
    is returned, said in one line (``version`` writes another)."""
    from keras_preact.export import check_formats, export_model
    from keras_preact.export import quantize as quantization
    from keras_preact.export.version_dir import check_top_k

    from .run.manifest import RunManifest

    quantized = quantization.check_quantization(quantize, formats, calibration_data, calibration_images,
                                                max_accuracy_drop, flags=True)
    check_formats(formats)
    run_dir = pathlib.Path(run_dir)
    if run_dir.is_file():
        parent = run_dir.parent if (run_dir.parent / "config.json").is_file() else None
        raise ValueError(
            f"Invalid run_dir={str(run_dir)!r}: a file; keras-preact-export takes a run directory written by "
            "keras-preact-train (config.json and model.keras)"
            + (
                f": keras-preact-export {parent}"
                if parent
                else "; a .keras file of your own exports with "
                "keras_preact.export.export_model(keras.saving.load_model(path))"
            )
        )
    manifest = RunManifest.read(run_dir)
    name = export_name(manifest.name, run_dir) if name is None else name
    done = exported_by_run(run_dir, export_dir, name) if version is None and tuple(formats) == ("saved_model",) \
        else None
    if done is not None:
        _say(f"{run_dir} was exported by its run to {done}: nothing written (--version N writes another version; "
             "--format onnx,litert,openvino the other formats)")
        return done
    top_k = check_top_k(top_k, manifest.num_classes)
    if quantized:  # the folder's class folders are the run's classes, and some images are left to hold out
        quantization.calibration_split(calibration_data, list(manifest.class_names), calibration_images, flags=True)
    # One export of a run at a time: a second one waits, then takes the next version.
    with run_lock.waited(run_dir / run_lock.EXPORT_LOCK, f"exporting {run_dir}", _say):
        model = load_run_model(run_dir / "model.keras")
        check_model(manifest, model, run_dir / "model.keras")
        try:
            return export_model(model, export_dir, formats=formats, name=name, version=version,
                                class_names=list(manifest.class_names), input_config=manifest.input_config,
                                image_size=manifest.image_size, top_k=top_k, quantize=quantize,
                                calibration_data=calibration_data, calibration_images=calibration_images,
                                max_accuracy_drop=max_accuracy_drop)
        except Exception as error:  # noqa: BLE001 - TensorFlow's ResourceExhaustedError is no OSError
            if not _disk_full(error):
                raise
            raise _no_space(pathlib.Path(export_dir) / name, model, len(formats)) from None


def _say(line):
    print(f"[export] {line}", file=sys.stderr, flush=True)


def has_tensorflow():
    return importlib.util.find_spec("tensorflow") is not None


def export_in_tensorflow(run_dir, export_dir, formats=("saved_model",)):
    """Export a run from a child process on Keras' TensorFlow backend (``python -m keras_preact_training.export``);
    returns the version directory. The child loads the run's ``model.keras`` (the trained weights as saved, in
    float32), so the SavedModel answers as the model that trained; the export's own check runs there. For a run
    trained on PyTorch, whose backend writes no SavedModel (``keras_preact.export.FORMATS``). RuntimeError with
    the child's last line when it fails.

    Examples::

        export_in_tensorflow("runs/synthetic-resnet8", "saved_models")  # PosixPath('saved_models/synthetic-resnet8/1')
    """
    command = [sys.executable, "-m", "keras_preact_training.export", str(run_dir), "--export-dir", str(export_dir),
               "--format", ",".join(formats)]
    done = subprocess.run(command, env={**os.environ, "KERAS_BACKEND": "tensorflow"}, capture_output=True, text=True)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise RuntimeError(f"the export on TensorFlow (keras-preact-export {run_dir} --export-dir {export_dir}, "
                           f"KERAS_BACKEND=tensorflow) failed with exit {done.returncode}: {last}")
    return pathlib.Path(lines[-1])


def _positive_int(text):
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: expected a positive integer")
    return value


def _format_list(text):
    names = [n.strip() for n in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"invalid format list {text!r}: expected comma-separated format names, "
                                         "e.g. saved_model,onnx")
    return names


def build_parser():
    parser = argparse.ArgumentParser(
        allow_abbrev=False,  # --form is an error, not --format
        prog="keras-preact-export",
        description="Export a training run to EXPORT_DIR/NAME/VERSION/: a SavedModel in TF Serving layout and/or "
                    "ONNX, LiteRT, OpenVINO side by side.",
    )
    parser.add_argument("run_dir", help="run directory with config.json and model.keras")
    parser.add_argument("--export-dir", default="saved_models",
                        help="parent of the model directory (default: saved_models)")
    parser.add_argument("--name", default=None, help="model name (default: the run's config name; a finetune-folder "
                        "run's directory name)")
    parser.add_argument("--version", type=_positive_int, default=None, help="version number (default: next free)")
    parser.add_argument(
        "--format",
        type=_format_list,
        default=["saved_model"],
        dest="formats",
        help="comma-separated formats: saved_model (default), onnx (model.onnx), litert (model.tflite), "
        "openvino (openvino/model.xml)",
    )
    parser.add_argument("--top-k", type=_positive_int, default=None, dest="top_k",
                        help="how many classes the scores/classes/class_names outputs hold, 1 to the number of "
                             "classes (default: 5, or the number of classes when fewer)")
    quantizing = parser.add_argument_group(
        "int8 quantization", "an int8 model beside each onnx and openvino model (ONNX Runtime's quantize_static, "
        "NNCF), calibrated on some images of a folder and checked on the others")
    quantizing.add_argument("--quantize", choices=QUANTIZE_CHOICES, default=None,
                            help="also write an int8 model of each onnx and openvino export (default: none)")
    quantizing.add_argument("--calibration-data", default=None, metavar="FOLDER",
                            help="a folder of images, one sub-folder per class named as the run's classes")
    quantizing.add_argument("--calibration-images", type=_positive_int,
                            default=DEFAULT_CALIBRATION_IMAGES,
                            help="images of the folder that calibrate, drawn with a fixed seed; every other one is "
                                 "held out to compare the float and int8 models (default %(default)s)")
    quantizing.add_argument("--max-accuracy-drop", type=float, default=DEFAULT_MAX_ACCURACY_DROP,
                            help="the most top-1 points the int8 model may lose on the held-out images; past it "
                                 "nothing is written (default %(default)s)")
    return parser


def say_quantization(version_dir):
    """The int8 models' line per format, from the version's ``quantization.json``."""
    import json

    from keras_preact.export import quantize as quantization

    path = pathlib.Path(version_dir) / quantization.REPORT
    if not path.is_file():
        return

    report = json.loads(path.read_text(encoding="utf-8"))
    for fmt, result in report["formats"].items():
        _say(f"int8 {fmt} ({result['file']}): top-1 {result['int8_top1']:.2f}% (float {result['float_top1']:.2f}%) "
             f"on {report['held_out_images']} held-out images, {result['differing']} predictions differ; "
             f"calibrated on {report['calibration_images']} images ({quantization.REPORT})")


def check_export_dir(export_dir):
    """Refuse, before any work, an ``--export-dir`` under a file or on a read-only file system (or without
    permission): the nearest existing folder on its path must be a writable directory."""
    path = pathlib.Path(export_dir).absolute()
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"Invalid --export-dir={str(export_dir)!r}: {existing} is a file, not a directory.")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"Invalid --export-dir={str(export_dir)!r}: {existing} is not writable (a read-only file "
                         "system or no permission); export somewhere writable.")


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    try:  # export_run checks the formats before anything is read or loaded
        check_export_dir(args.export_dir)
        path = export_run(args.run_dir, args.export_dir, name=args.name, version=args.version, formats=args.formats,
                          top_k=args.top_k, quantize=args.quantize, calibration_data=args.calibration_data,
                          calibration_images=args.calibration_images, max_accuracy_drop=args.max_accuracy_drop)
    except ValueError as error:
        parser.error(str(error))
    except RuntimeError as error:
        from keras_preact.export.quantize import AccuracyDropError

        if not isinstance(error, AccuracyDropError):  # the int8 model lost too much accuracy: nothing was written
            raise
        parser.exit(1, f"{parser.prog}: error: {error}\n")
    except ImportError as error:  # a format's exporter or runtime, or Keras' backend, is not installed
        message = str(error).splitlines()[0] if str(error) else repr(error)
        parser.exit(2, f"{parser.prog}: error: {message}\n")
    except OSError as error:
        if error.errno == errno.ENOSPC:  # disk full: one line, no traceback
            parser.exit(1, f"{parser.prog}: error: {error}\n")
        if error.errno not in (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EEXIST):
            raise
        parser.exit(2, f"{parser.prog}: error: cannot write under --export-dir={args.export_dir!r}: {error}\n")
    say_quantization(path)
    print(path)
    return 0


if __name__ == "__main__":  # python -m keras_preact_training.export: the console script's start (Keras loads in main)
    from .machine.start_up import start_command

    raise SystemExit(start_command("python -m keras_preact_training.export") or main())
