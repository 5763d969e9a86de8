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

    def build(self, weights=None, trainable_from=None, **overrides):
        """``builder(**arguments, **overrides)``, with the input shape (``input_config.input_size``) and the
        ``input_config`` the builder's classifier carries (at its input size) defaulting to the registry's.
        ``weights``: a name of ``self.weights`` or a local file or run directory (``finetune.local_source``),
        checked before anything is built, or None. With the weights' classes the model is their classifier
        and carries their ``class_names``; with other ``num_classes``/``class_names`` it is their backbone
        under a new head. ``trainable_from``: ``finetune.set_trainable`` on the model built."""
        source = self._source(weights)
        if source is None:
            model = self._builder(**overrides)
        else:
            model = self._build_from(source, overrides)
        if trainable_from is not None:
            finetune.set_trainable(model, trainable_from)
        return model

    def _builder(self, **overrides):
        return self.builder(**{"input_shape": tuple(self.input_config.input_size), "input_config": self.input_config,
                               **self.arguments, **overrides})

    def _source(self, weights):
        """The ``finetune.Source`` of ``weights`` (None: none), checked before anything is built."""
        if finetune.is_local(weights):
            return finetune.local_source(weights, self.name)
        spec = weights_lib.choose(self.name, self.weights, weights)
        return None if spec is None else finetune.registered_source(spec, spec.checked_path(self.name))

    def _build_from(self, source, overrides):
        """The source's classifier (its classes), or its backbone under a new head (other classes)."""
        if not overrides.get("include_top", True) or "input_tensor" in overrides:
            raise ValueError(f"Invalid include_top/input_tensor with weights={source.label}: the weights are a whole "
                             "classifier's; build it with its head and use model.backbone.")
        num_classes, new_head = finetune.head_plan(source, overrides)
        if source.input_config is not None:
            overrides = {"input_config": source.input_config, **overrides}
        if not new_head:
            overrides = {**overrides, "num_classes": num_classes,
                         "class_names": overrides.get("class_names", source.class_names)}
        model = self._builder(**{**overrides, "num_classes": num_classes})
        if new_head:
            trained = finetune.source_model(source, self._builder, overrides, self.name)
            finetune.copy_weights(model.backbone, trained.backbone, source.label, self.name)
        elif source.model is not None:
            finetune.copy_weights(model, source.model, source.label, self.name)
        else:
            finetune.load_file(model, source, self.name)
        return model


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


def list_models(pattern="*"):
    """Registered names matching the shell-style ``pattern``, sorted.

    Examples:
        >>> from keras_preact.models import list_models
        >>> list_models("imagenet_*")
        ['imagenet_resnet101', 'imagenet_resnet152', 'imagenet_resnet18', 'imagenet_resnet200', 'imagenet_resnet34', 'imagenet_resnet50']
    """
    return sorted(n for n in _REGISTRY if fnmatch.fnmatchcase(n, pattern))


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


def create_model(name, weights=None, trainable_from=None, **overrides):
    """A registered network (He et al. 2016's pre-activation ResNets): its family builder
    (``cifar_resnet``/``imagenet_resnet``) called with its registered arguments and ``overrides`` (any
    argument of that builder: ``num_classes``, ``input_shape``, ``dtype``, unit options, ...).

    ``weights``: the name of its registered trained weights (``model_spec(name).weights``), checked by
    sha256, or a local ``.weights.h5`` file (a keras-preact classifier's ``save_weights``), ``.keras`` file
    or ``keras-preact-train`` run directory (its ``model.keras``). With the weights' classes the model is
    their classifier and carries their ``class_names``; with another ``num_classes`` (or other
    ``class_names``) it is their backbone under a freshly initialised head, for fine-tuning
    (``keras_preact.models.finetune``). The classifier carries the weights' input config (a ``.keras``
    file's or run's own, else the registry's) at its input size. ``trainable_from``: freeze the backbone
    before that point (``set_trainable``: ``"head"`` trains the head only, ``"stage3"`` from stage 3 on).

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
    """
    return model_spec(name).build(weights=weights, trainable_from=trainable_from, **overrides)


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
