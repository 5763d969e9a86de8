"""One registry of named networks (timm's ``@register_model`` with its ``pretrained_cfg``).

``register_model`` adds a named network; ``list_models``/``create_model``/``model_spec`` read them.
The package's own networks are declared as data in ``presets.MODEL_PRESETS``. A classifier built by
``create_model`` carries its ``input_config`` (and, with trained ``weights``, its ``class_names``), as
its family builder's does: ``create_model(name, **overrides)`` is ``builder(**arguments, **overrides)``.

Examples:
    >>> from keras_preact.models import create_model, list_models
    >>> list_models("cifar_resnet1*")
    ['cifar_resnet1001', 'cifar_resnet110', 'cifar_resnet110_1layer', 'cifar_resnet1202', 'cifar_resnet164']
    >>> model = create_model("cifar_resnet20", num_classes=100, dtype="mixed_bfloat16")
    >>> model.dtype_policy.name, model.output.dtype  # a float32 softmax under mixed precision
    ('mixed_bfloat16', 'float32')
"""

import dataclasses
import fnmatch
from collections.abc import Callable

from keras_preact.models import finetune
from keras_preact.models import weights as weights_lib
from keras_preact.models.cifar import cifar_resnet
from keras_preact.models.imagenet import imagenet_resnet
from keras_preact.models.presets import MODEL_PRESETS
from keras_preact.preprocessing import InputConfig

FAMILIES = {"cifar": cifar_resnet, "imagenet": imagenet_resnet}


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """A registered network: ``builder(**arguments, **overrides)`` builds it; ``input_config`` is what it
    expects (size, pixel statistics, evaluation crop); ``paper`` where the paper uses it; ``weights``
    its trained weights, ``{name: weights.WeightsSpec}``. For test suites (as timm's cfgs): the small
    ``test_input_size`` to check it at, and ``slow`` for the networks too large for every test run.

    Examples:
        >>> from keras_preact.models import model_spec
        >>> spec = model_spec("cifar_resnet110")
        >>> spec.family, spec.arguments, spec.paper
        ('cifar', {'depth': 110}, 'Tables 1-3')
        >>> spec.input_config.input_size, spec.test_input_size
        ((32, 32, 3), (16, 16, 3))
    """

    name: str
    family: str
    builder: Callable
    arguments: dict
    input_config: InputConfig
    paper: str = ""
    weights: dict = dataclasses.field(default_factory=dict)
    test_input_size: tuple = None
    slow: bool = False

    def build(self, weights=None, trainable_from=None, allow_non_finite_weights=False, **overrides):
        """``builder(**arguments, **overrides)``, with the input shape (``input_config.input_size``) and the
        ``input_config`` the builder's classifier carries (at its input size) defaulting to the registry's.
        ``weights``: what ``keras_preact.pretrained.loader.get_loader`` takes (a registered weights name, a
        keras-preact file or run directory, another library's checkpoint), decided and checked before the network is
        built, then built once as the checkpoint needs (its layout); a checkpoint not converted yet is converted
        into that network (and cached from it when it is the whole classifier). With the weights'
        classes the model is their classifier and carries their ``class_names``; with other
        ``num_classes``/``class_names`` it is their backbone under a new head (the head's tensors dropped).
        ``trainable_from``: ``finetune.set_trainable`` on the model built. ``allow_non_finite_weights``: another
        library's checkpoint holding NaN or infinite values is loaded, not refused."""
        # The one lazy import of the library: the loader sits above the models it builds and loads into.
        from keras_preact.pretrained.loader import get_loader

        loader = get_loader(self, weights, allow_non_finite=allow_non_finite_weights)
        model = self._builder(**overrides) if loader is None else self._build_from(loader, overrides)
        if trainable_from is not None:
            finetune.set_trainable(model, trainable_from)
        return model

    def _builder(self, **overrides):
        return self.builder(**{"input_shape": tuple(self.input_config.input_size), "input_config": self.input_config,
                               **self.arguments, **overrides})

    def _build_from(self, loader, overrides):
        """The loader's classifier (its classes), or its backbone under a new head (other classes): built once."""
        if not overrides.get("include_top", True) or "input_tensor" in overrides:
            raise ValueError(f"Invalid include_top/input_tensor with weights={loader.label}: the weights are a whole "
                             "classifier's; build it with its head and use model.backbone.")
        needs = dict(loader.arguments)
        if loader.input_config is not None:
            needs["input_config"] = loader.input_config
        overrides = {**needs, **overrides}
        num_classes, new_head = finetune.head_plan(loader, overrides)
        if not new_head:
            overrides["class_names"] = overrides.get("class_names", loader.class_names)
        model = self._builder(**{**overrides, "num_classes": num_classes})
        return loader.load(model, head=not new_head)


_REGISTRY = {}


def register_model(name, *, family, arguments, input_config, paper="", weights=None, test_input_size=None,
                   slow=False):
    """Register a network built by ``family``'s builder (``"cifar"``/``"imagenet"``) with ``arguments``;
    from then on ``create_model(name)`` builds it.

    ``weights``: its trained weights, ``{name: {"file", "sha256", "class_names", "dataset", "top1", ...}}``
    (``weights.WeightsSpec``'s fields; ``file`` relative to ``keras_preact/weights/`` or absolute).
    ``test_input_size`` (default ``input_config.input_size``) and ``slow``: how test suites check it.

    Examples:
        >>> from keras_preact.models import create_model, get_input_config, register_model
        >>> from keras_preact.models.registry import unregister_model
        >>> spec = register_model("my_resnet14", family="cifar", arguments={"depth": 14},
        ...                       input_config=get_input_config("cifar_resnet20"))
        >>> create_model("my_resnet14", num_classes=100).count_params()
        179284
        >>> unregister_model("my_resnet14")
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"Invalid name={name!r}: a Python identifier is required.")
    if name in _REGISTRY:
        raise ValueError(f"Invalid name={name!r}: a model of that name is already registered.")
    if family not in FAMILIES:
        raise ValueError(f"Invalid family={family!r}. Allowed values: {', '.join(map(repr, FAMILIES))}.")
    if not isinstance(input_config, InputConfig):
        raise ValueError(
            f"Invalid input_config={input_config!r}: a keras_preact.preprocessing.InputConfig is required."
        )
    test_input_size = tuple(test_input_size or input_config.input_size)
    if len(test_input_size) != 3 or not all(isinstance(v, int) and v > 0 for v in test_input_size):
        raise ValueError(f"Invalid test_input_size={test_input_size!r}: (height, width, channels) is required.")
    trained = weights_lib.parse_weights(name, weights)
    spec = ModelSpec(name, family, FAMILIES[family], dict(arguments), input_config, paper, trained, test_input_size,
                     bool(slow))
    _REGISTRY[name] = spec
    return spec


def unregister_model(name):
    """Remove a registered network (for tests and interactive sessions)."""
    model_spec(name)
    del _REGISTRY[name]


def list_models(pattern="*", pretrained=False):
    """Registered names matching the shell-style ``pattern``, sorted. ``pretrained=True`` (as timm's): one
    ``"name.weights"`` per registered set of weights instead (``create_model`` takes that form too); each
    one's source, licence and published accuracy are ``model_spec(name).weights[weights]``'s.

    Examples:
        >>> from keras_preact.models import list_models
        >>> list_models("imagenet_*")
        ['imagenet_resnet101', 'imagenet_resnet152', 'imagenet_resnet18', 'imagenet_resnet200', 'imagenet_resnet34',
         'imagenet_resnet50']
        >>> list_models("imagenet_resnet50", pretrained=True)  # doctest: +NORMALIZE_WHITESPACE
        ['imagenet_resnet50.imagenet', 'imagenet_resnet50.keras_hub_imagenet', 'imagenet_resnet50.timm_a1h_in1k',
         'imagenet_resnet50.timm_bit_in21k', 'imagenet_resnet50.timm_bit_in21k_ft_in1k']
    """
    names = sorted(n for n in _REGISTRY if fnmatch.fnmatchcase(n, pattern))
    return [f"{n}.{w}" for n in names for w in sorted(_REGISTRY[n].weights)] if pretrained else names


def model_spec(name):
    """The ``ModelSpec`` of a registered network; ValueError, listing the registered names, otherwise.

    Examples:
        >>> from keras_preact.models import model_spec
        >>> trained = model_spec("cifar_resnet20").weights["cifar10"]
        >>> trained.top1, trained.top5  # test accuracy of the shipped weights, fractions
        (0.8715, 0.9952)
        >>> model_spec("resnet20")
        Traceback (most recent call last):
        ...
        ValueError: Unknown model name='resnet20'. Available: cifar_resnet1001, ...
    """
    if name not in _REGISTRY:
        raise ValueError(f"Unknown model name={name!r}. Available: {', '.join(list_models())}.")
    return _REGISTRY[name]


def create_model(name, weights=None, trainable_from=None, allow_non_finite_weights=False, **overrides):
    """A registered network (He et al. 2016's pre-activation ResNets): its family builder
    (``cifar_resnet``/``imagenet_resnet``) called with its registered arguments and ``overrides`` (any
    argument of that builder: ``num_classes``, ``input_shape``, ``dtype``, unit options, ...).

    ``weights``: the name of its registered trained weights (``model_spec(name).weights``: the package's own,
    checked by sha256, or a published checkpoint, fetched through its ecosystem's loader, checked by its
    published checksum and converted once; ``"name.weights"`` names both at once), the path of a local
    checkpoint of another library (a timm ``.safetensors``/``.pth`` or folder, a keras.applications ResNetV2's
    ``.h5``, ``.weights.h5`` or ``.keras``, a keras-hub preset folder; a bad file is one ``CheckpointError``
    line naming it, before anything is built), or a keras-preact ``.weights.h5`` file (a classifier's ``save_weights``),
    ``.keras`` file or ``keras-preact-train`` run directory (its ``model.keras``). The model is built as the
    checkpoint needs (its layout). With the weights' classes the model is their classifier and carries their
    ``class_names``; with another ``num_classes`` (or other ``class_names``) it is their backbone under a
    freshly initialised head, for fine-tuning (``keras_preact.models.finetune``). The classifier carries the
    weights' input config (preprocessing), else the registry's, at its input size. ``trainable_from``: freeze
    the backbone before that point (``set_trainable``: ``"head"`` trains the head only, ``"stage3"`` from
    stage 3 on). ``allow_non_finite_weights``: load another library's checkpoint (timm, keras.applications) that
    holds NaN or infinite values, refused by default in one line (the network would output NaN).

    Examples:
        >>> from keras_preact.models import create_model
        >>> model = create_model("cifar_resnet20", num_classes=100, drop_path_rate=0.1)
        >>> model.name, model.count_params()
        ('preact_resnet20_cifar', 276948)
        >>> trained = create_model("cifar_resnet20", weights="cifar10")  # checked by sha256, then loaded
        >>> trained.class_names[:3]
        ('airplane', 'automobile', 'bird')
        >>> tuned = create_model("cifar_resnet20", weights="cifar10", class_names=["cat", "dog"], trainable_from="head")
        >>> tuned.output_shape, tuned.class_names, len(tuned.trainable_weights)  # a new head; only it trains
        ((None, 2), ('cat', 'dog'), 2)
        >>> bit = create_model(  # timm's BiT-M, via huggingface_hub
        ...     "imagenet_resnet50.timm_bit_in21k")  # doctest: +SKIP
    """
    if isinstance(name, str) and "." in name and weights is None:  # list_models(pretrained=True)'s "name.weights"
        name, weights = name.split(".", 1)
    return model_spec(name).build(weights=weights, trainable_from=trainable_from,
                                  allow_non_finite_weights=allow_non_finite_weights, **overrides)


def get_input_config(name):
    """The ``InputConfig`` of a named network (input size, pixel statistics, evaluation crop).

    Examples:
        >>> from keras_preact.models import get_input_config
        >>> config = get_input_config("imagenet_resnet50")
        >>> config.resize_size, config.crop_size  # the shorter side to 256, the centre 224 x 224
        (256, (224, 224))
    """
    return model_spec(name).input_config


for _name, _entry in MODEL_PRESETS.items():
    register_model(_name, **_entry)
