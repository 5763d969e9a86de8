"""``RUN_DIR/config.json``: the one description of a run, written by ``train`` and read by everything else.

``RunManifest`` holds the training ``config`` (every ``Config`` field, enough to re-run it), what the
trained model expects and means (``class_names``; ``input_config``: input size, pixel mean/std and the
evaluation view, as ``keras_preact.preprocessing.InputConfig``), the resolved schedule and the Keras
it ran on. ``"normalization"`` is only ever the config's *name* of the pixel statistics; their values
are ``input_config["mean"]``/``["std"]``. Runs written before this format (no ``"format"`` key) are
still read.
"""

import dataclasses
import hashlib
import json
import pathlib

from keras_preact.models.presets import FAMILY_INPUTS
from keras_preact.preprocessing import InputConfig

from ..recipe import configs
from . import run_state

FORMAT = "keras-preact-run/2"
FILENAME = "config.json"
_LEGACY_REQUIRED = ("name", "class_names", "image_size", "normalization")


def _invalid(source, problem):
    return ValueError(f"Invalid run manifest {source}: {problem}")


def input_config_for(config, mean, std):
    """The ``InputConfig`` a run's model is evaluated (and served) with: its family's evaluation view
    (``presets.FAMILY_INPUTS``: CIFAR the whole image, ImageNet the centre 224 of 256, bilinear), or with
    ``init_weights`` the view those weights were trained for (a timm checkpoint's crop_pct and interpolation,
    ``recipe.model.init_input_config``); a larger test crop as ``at_test_size``."""
    view = FAMILY_INPUTS[config.architecture]
    if config.init_weights:
        from ..recipe.model import init_input_config

        view = init_input_config(config)
    train = InputConfig(
        input_size=(*config.image_size, 3),
        mean=mean,
        std=std,
        crop_fraction=view.crop_fraction,
        interpolation=view.interpolation,
        crop_mode=view.crop_mode,
        antialias=view.antialias,
    )
    if config.eval_image_size and tuple(config.eval_image_size) != tuple(config.image_size):
        return train.at_test_size(tuple(config.eval_image_size))
    return train


# Left out of a model's fingerprint: names, and ``remat`` (how training stores activations, not the model).
NOT_FINGERPRINTED = ("name", "remat")


def _fingerprinted(value):
    if isinstance(value, dict):
        return {k: _fingerprinted(v) for k, v in value.items() if k not in NOT_FINGERPRINTED}
    if isinstance(value, list):
        return [_fingerprinted(v) for v in value]
    return value


def _digest(value):
    text = json.dumps(value, sort_keys=True, default=lambda o: type(o).__name__)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def model_fingerprint(model):
    """What the run's model is: its class, parameter count, a digest of its variables' paths and shapes
    and one of its configuration (layer names and ``remat`` left out); the same for the trained model and its
    ``model.keras``. The export checks the model it is given against it."""
    import keras

    return {
        "class_name": type(model).__name__,
        "params": int(model.count_params()),
        "variables": _digest([[v.path, list(v.shape)] for v in model.weights]),
        "config": _digest(_fingerprinted(keras.saving.serialize_keras_object(model).get("config"))),
    }


@dataclasses.dataclass(frozen=True)
class RunManifest:
    name: str
    class_names: tuple
    input_config: InputConfig
    config: dict
    resolved_schedule: dict = dataclasses.field(default_factory=dict)
    keras_backend: str = ""
    keras_version: str = ""
    model: dict = dataclasses.field(default_factory=dict)  # model_fingerprint of the trained model

    @property
    def num_classes(self):
        return len(self.class_names)

    @property
    def image_size(self):
        return tuple(self.input_config.input_size[:2])

    def training_config(self, source=None):
        """The run's ``keras_preact_training.recipe.configs.Config`` (checked and validated), to re-run it; ``source``
        names the file in messages."""
        missing = [k for k in ("name", "normalization") if k not in self.config]
        if missing:
            raise ValueError(f"Invalid run manifest of {self.name!r}: its config lacks {', '.join(missing)}; "
                             "it cannot be re-run (pass a preset instead).")
        return configs.from_dict(self.config, f"config in {source}" if source else f"config of run {self.name!r}")

    # ------------------------------------------------------------------------------ serialization
    def to_dict(self):
        return {
            "format": FORMAT,
            "name": self.name,
            "class_names": list(self.class_names),
            "num_classes": self.num_classes,
            "input_config": self.input_config.to_dict(),
            "config": self.config,
            "resolved_schedule": self.resolved_schedule,
            "keras_backend": self.keras_backend,
            "keras_version": self.keras_version,
            "model": self.model,
        }

    def to_json(self):
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @classmethod
    def from_dict(cls, values, source="(dict)"):
        if not isinstance(values, dict):
            raise _invalid(source, f"a JSON object is required, not {type(values).__name__}.")
        if "format" not in values:
            return cls._from_legacy(values, source)
        if values["format"] != FORMAT:
            raise _invalid(source, f"format {values['format']!r} is not {FORMAT!r} (written by a newer version?).")
        missing = [k for k in ("name", "class_names", "input_config", "config") if k not in values]
        if missing:
            raise _invalid(source, f"missing key(s) {', '.join(missing)}.")
        if not isinstance(values["config"], dict):
            raise _invalid(
                source, f"config={json.dumps(values['config'])}: a JSON object of Config fields is required."
            )
        try:
            input_config = InputConfig.from_dict(values["input_config"])
        except (TypeError, ValueError) as error:
            raise _invalid(source, f"input_config: {error}") from None
        return cls(
            name=values["name"],
            class_names=tuple(values["class_names"]),
            input_config=input_config,
            config=dict(values["config"]),
            resolved_schedule=dict(values.get("resolved_schedule") or {}),
            keras_backend=values.get("keras_backend", ""),
            keras_version=values.get("keras_version", ""),
            model=dict(values.get("model") or {}),
        )

    @classmethod
    def _from_legacy(cls, values, source):
        """The first format: Config fields at the top level, ``normalization`` overwritten by the
        ``{"mean", "std"}`` values and the name moved to ``normalization_name``."""
        missing = [k for k in _LEGACY_REQUIRED if k not in values]
        stats = values.get("normalization")
        if missing or not isinstance(stats, dict) or not {"mean", "std"} <= set(stats):
            raise _invalid(
                source,
                f"it needs the keys {', '.join(_LEGACY_REQUIRED)} with normalization = "
                f"{{'mean': [r, g, b], 'std': [r, g, b]}} (or the {FORMAT!r} format); missing: "
                f"{', '.join(missing) or 'normalization mean/std'}.",
            )
        fields = {f.name for f in dataclasses.fields(configs.Config)}
        config = {k: v for k, v in values.items() if k in fields and k != "normalization"}
        if "normalization_name" in values:
            config["normalization"] = values["normalization_name"]
        architecture = values.get("architecture", "cifar")
        input_config = InputConfig(
            input_size=(*values["image_size"], 3),
            mean=stats["mean"],
            std=stats["std"],
            crop_fraction=FAMILY_INPUTS[architecture].crop_fraction,
        )
        return cls(
            name=values["name"],
            class_names=tuple(values["class_names"]),
            input_config=input_config,
            config=config,
            resolved_schedule=dict(values.get("resolved_schedule") or {}),
            keras_backend=values.get("keras_backend", ""),
            keras_version=values.get("keras_version", ""),
        )

    @classmethod
    def from_json(cls, text, source="(text)"):
        try:
            values = json.loads(text)
        except json.JSONDecodeError as error:
            raise _invalid(
                source, f"not valid JSON ({error.msg} at line {error.lineno}, column {error.colno})."
            ) from None
        return cls.from_dict(values, source)

    @classmethod
    def read(cls, path):
        """The manifest of a run directory (or of a ``config.json`` file)."""
        path = pathlib.Path(path)
        file = path / FILENAME if path.is_dir() else path
        if not file.is_file():
            raise ValueError(
                f"Invalid run_dir={str(path)!r}: {FILENAME} is missing (a run directory written by "
                "keras-preact-train holds config.json and model.keras)."
            )
        return cls.from_json(file.read_text(encoding="utf-8"), repr(str(file)))


def config_from_run(path):
    """The ``Config`` of a run directory's (or a file's) config.json, to re-run it. A file holding a
    bare ``Config`` object (``dataclasses.asdict``) is read too."""
    path = pathlib.Path(path)
    file = path / FILENAME if path.is_dir() else path
    values = run_state.read_config_json(file)
    if "format" in values or "class_names" in values:
        return RunManifest.from_dict(values, repr(str(file))).training_config(repr(str(file)))
    return configs.from_dict(values, f"config file {str(file)!r}")
