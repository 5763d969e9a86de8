"""Export a training run directory (``RUN_DIR/config.json`` + ``RUN_DIR/model.keras``)."""

import json
import pathlib
import zipfile

import keras

import keras_preact.layers  # noqa: F401  (registers ResidualUnit for safe_mode deserialization)
from keras_preact.export.saved_model import export_saved_model

REQUIRED_KEYS = ("name", "class_names", "image_size", "normalization")


def read_run_config(run_dir):
    """The run's ``config.json`` after checking the keys export needs (the run-directory contract)."""
    run_dir = pathlib.Path(run_dir)
    config_path, model_path = run_dir / "config.json", run_dir / "model.keras"
    for path in (config_path, model_path):
        if not path.is_file():
            raise ValueError(
                f"Invalid run_dir={str(run_dir)!r}: {path.name} is missing (a run directory written by "
                "keras-preact-train holds config.json and model.keras)."
            )
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"Invalid run_dir={str(run_dir)!r}: config.json is not valid JSON ({error}).") from None
    missing = [k for k in REQUIRED_KEYS if k not in config] if isinstance(config, dict) else list(REQUIRED_KEYS)
    normalization = config.get("normalization") if isinstance(config, dict) else None
    if missing or not isinstance(normalization, dict) or not {"mean", "std"} <= set(normalization):
        raise ValueError(
            f"Invalid run_dir={str(run_dir)!r}: config.json needs the keys {', '.join(REQUIRED_KEYS)} "
            f"with normalization = {{'mean': [r, g, b], 'std': [r, g, b]}}; missing: {missing or ['mean/std']}."
        )
    return config


def load_run_model(path):
    """``keras.saving.load_model`` (safe mode, uncompiled) with a corrupt file named as such."""
    path = pathlib.Path(path)
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


def export_run(run_dir, export_dir="saved_models", *, name=None, version=None):
    """Export ``RUN_DIR/model.keras`` with the run's class names, image size and normalization.

    Returns the version directory written, ``export_dir/<name>/<version>/`` (``name`` defaults to the
    run's ``config["name"]``).
    """
    config = read_run_config(run_dir)
    model = load_run_model(pathlib.Path(run_dir) / "model.keras")
    return export_saved_model(
        model,
        export_dir,
        name=config["name"] if name is None else name,
        version=version,
        class_names=config["class_names"],
        mean=config["normalization"]["mean"],
        std=config["normalization"]["std"],
        image_size=tuple(config["image_size"]),
    )
