"""One registry of named networks (timm's ``@register_model`` with its ``pretrained_cfg``).

``register_model`` adds a named network; ``list_models``/``create_model``/``model_spec`` read them.
The package's own networks are declared as data in ``presets.MODEL_PRESETS``.
"""

import dataclasses
import fnmatch
import functools
from collections.abc import Callable

from keras_preact.models.cifar import cifar_resnet
from keras_preact.models.imagenet import imagenet_resnet
from keras_preact.models.presets import MODEL_PRESETS
from keras_preact.preprocessing import InputConfig

FAMILIES = {"cifar": cifar_resnet, "imagenet": imagenet_resnet}


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """A registered network: ``builder(**arguments, **overrides)`` builds it; ``input_config`` is what it
    expects (size, pixel statistics, evaluation crop); ``paper`` where the paper uses it."""

    name: str
    family: str
    builder: Callable
    arguments: dict
    input_config: InputConfig
    paper: str = ""

    def build(self, **overrides):
        """The network; its input shape defaults to ``input_config.input_size``."""
        return self.builder(**{"input_shape": tuple(self.input_config.input_size), **self.arguments, **overrides})


_REGISTRY = {}


def register_model(name, *, family, arguments, input_config, paper=""):
    """Register a network built by ``family``'s builder (``"cifar"``/``"imagenet"``) with ``arguments``."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"Invalid name={name!r}: a Python identifier is required (it names a function).")
    if name in _REGISTRY:
        raise ValueError(f"Invalid name={name!r}: a model of that name is already registered.")
    if family not in FAMILIES:
        raise ValueError(f"Invalid family={family!r}. Allowed values: {', '.join(map(repr, FAMILIES))}.")
    if not isinstance(input_config, InputConfig):
        raise ValueError(
            f"Invalid input_config={input_config!r}: a keras_preact.preprocessing.InputConfig is required."
        )
    spec = ModelSpec(name, family, FAMILIES[family], dict(arguments), input_config, paper)
    _REGISTRY[name] = spec
    return spec


def unregister_model(name):
    """Remove a registered network (for tests and interactive sessions)."""
    model_spec(name)
    del _REGISTRY[name]


def list_models(pattern="*"):
    """Registered names matching the shell-style ``pattern``, sorted."""
    return sorted(n for n in _REGISTRY if fnmatch.fnmatchcase(n, pattern))


def model_spec(name):
    if name not in _REGISTRY:
        raise ValueError(f"Unknown model name={name!r}. Available: {', '.join(list_models())}.")
    return _REGISTRY[name]


def create_model(name, **kwargs):
    """Build a named network, e.g. ``create_model("cifar_resnet164", num_classes=100)``."""
    return model_spec(name).build(**kwargs)


def get_input_config(name):
    """The ``InputConfig`` of a named network (input size, pixel statistics, evaluation crop)."""
    return model_spec(name).input_config


def model_function(name):
    """``create_model`` bound to ``name``, with its own ``__name__`` and docstring."""
    spec = model_spec(name)
    builder = functools.partial(create_model, name)
    builder.__name__ = builder.__qualname__ = name
    builder.__doc__ = f"{name}: {spec.family} network {spec.arguments} ({spec.paper}); see ``{spec.builder.__name__}``."
    return builder


for _name, _entry in MODEL_PRESETS.items():
    register_model(_name, **_entry)
