"""``PreActResNetClassifier``: a backbone with a thin head (pooling, dropout, dense, float32 output)."""

import keras

from keras_preact.layers import options as opt
from keras_preact.models.backbone import check_model_kwargs
from keras_preact.models.class_names import class_name_problem
from keras_preact.models.presets import FAMILY_INPUTS
from keras_preact.preprocessing import InputConfig

POOLINGS = {"avg": keras.layers.GlobalAveragePooling2D, "max": keras.layers.GlobalMaxPooling2D}
BACKBONE_SUFFIX = "_backbone"  # a builder names the backbone of network NAME "NAME_backbone"
FAMILY = "family"  # input_config's default: the backbone family's (its stem's) input config


@keras.saving.register_keras_serializable(package="keras_preact")
class PreActResNetClassifier(keras.Model):
    """``backbone`` -> global pooling -> dropout -> dense ``num_classes`` -> ``activation`` (in
    float32 under mixed precision), as keras-hub's ``ImageClassifier``.

    Args:
        backbone: a ``PreActResNetBackbone`` (``.backbone`` of the classifier).
        num_classes: classes of the dense layer; ``None``: ``len(class_names)`` when ``class_names`` is given,
            else no dense layer (the pooled features).
        pooling: ``"avg"`` (the paper's) or ``"max"``.
        dropout: rate before the dense layer (0: none, the paper's).
        activation: of the output, ``"softmax"`` (default) or ``None``/``"linear"`` for logits.
        input_config: what the model expects (``keras_preact.preprocessing.InputConfig`` or its
            ``to_dict()``): size, pixel mean/std, evaluation crop; export, ``keras-preact-evaluate`` and
            ``applications.preprocess_input`` use it. Default ``"family"``: the input config of the
            backbone's family (its ``stem``, ``presets.FAMILY_INPUTS``) at the backbone's input size, as
            every builder attaches it; ``None``: none. Kept in ``get_config`` (``.keras`` files).
        class_names: one name per class (index = label), e.g. the trained weights' or a folder dataset's
            (``keras.utils.image_dataset_from_directory(...).class_names``); kept likewise, and exported.
        dtype: dtype policy of every layer but the float32 output, as keras-hub's; default the backbone's.
            A backbone in another policy is replaced by a copy in this one (its config and weights).
        name: the model's name (the export's served name); default the backbone's without its
            ``_backbone`` suffix (``preact_resnet20_cifar``).

    Examples:
        >>> from keras_preact.models import PreActResNetClassifier, cifar_resnet
        >>> backbone = cifar_resnet(20, include_top=False)  # a PreActResNetBackbone
        >>> model = PreActResNetClassifier(backbone, 100, dropout=0.2)
        >>> [layer.name for layer in model.head_layers], model.output_shape
        (['avg_pool', 'head_dropout', 'logits', 'predictions'], (None, 100))
        >>> model.input_config.input_size  # its family's (CIFAR's), at the backbone's input size
        (32, 32, 3)

        Fine-tuning on a folder of two classes: the class names give the head its size and reach the export.

        >>> model = PreActResNetClassifier(backbone, class_names=["cat", "dog"])
        >>> model.name, model.num_classes, model.class_names
        ('preact_resnet20_cifar', 2, ('cat', 'dog'))
    """

    def __init__(self, backbone, num_classes=None, *, pooling="avg", dropout=0.0, activation="softmax",
                 input_config=FAMILY, class_names=None, dtype=None, name=None, **kwargs):
        check_model_kwargs(type(self).__name__, kwargs)
        if not isinstance(backbone, keras.Model) or not hasattr(backbone, "pyramid_outputs"):
            raise ValueError(f"Invalid backbone={backbone!r}: a keras_preact PreActResNetBackbone is required.")
        if num_classes is None and isinstance(class_names, (list, tuple)) and class_names:
            num_classes = len(class_names)  # the head the class names need
        if name is None and backbone.name.endswith(BACKBONE_SUFFIX) and len(backbone.name) > len(BACKBONE_SUFFIX):
            name = backbone.name[:-len(BACKBONE_SUFFIX)]  # the network's name, not Keras' class-derived one
        if num_classes is not None and (not isinstance(num_classes, int) or isinstance(num_classes, bool)
                                        or num_classes < 1):
            raise ValueError(f"Invalid num_classes={num_classes!r}: a positive integer (or None: no dense layer).")
        if num_classes == 1 and activation == "softmax":
            raise ValueError("Invalid num_classes=1 with classifier_activation='softmax': a one-unit softmax is "
                             "always 1; two or more classes are required (or a 'sigmoid' unit for one score).")
        opt.check_choice("pooling", pooling, POOLINGS)
        opt.check_rate("dropout", dropout)
        backbone = backbone_in_policy(backbone, dtype)
        dtype = backbone.dtype_policy
        head = [POOLINGS[pooling](data_format=backbone.data_format, name=f"{pooling}_pool", dtype=dtype)]
        if num_classes is not None:
            if dropout:
                head.append(keras.layers.Dropout(dropout, name="head_dropout", dtype=dtype))
            head.append(keras.layers.Dense(num_classes, name="logits", dtype=dtype))
            head.append(keras.layers.Activation(activation or "linear", dtype="float32", name="predictions"))
        inputs = keras.Input(shape=backbone.image_shape, name="images")
        x = backbone(inputs)
        for layer in head:
            x = layer(x)
        super().__init__(inputs=inputs, outputs=x, name=name, **kwargs)
        self.dtype_policy = dtype  # a functional model drops dtype=; set as keras-hub's Backbone does
        self.backbone = backbone
        self.head_layers = head
        self.num_classes, self.pooling, self.dropout, self.activation = num_classes, pooling, dropout, activation
        self.input_config = family_input_config(backbone) if input_config == FAMILY else input_config
        self.class_names = class_names

    @property
    def input_config(self):
        """The model's ``InputConfig`` (None when not set): size, pixel mean/std, evaluation crop."""
        return self._input_config

    @input_config.setter
    def input_config(self, value):
        if isinstance(value, dict):
            value = InputConfig.from_dict(value)
        if value is not None and not isinstance(value, InputConfig):
            raise ValueError(f"Invalid input_config={value!r:.200}: a keras_preact.preprocessing.InputConfig "
                             "(or its to_dict()) or None is required.")
        shape = channels_last_shape(self.backbone)
        if value is not None and None not in shape and value.input_size != shape:
            raise ValueError(f"Invalid input_config: its input_size {value.input_size} is not the model "
                             f"input {shape}.")
        self._input_config = value

    @property
    def class_names(self):
        """One name per class, a tuple (None when not set)."""
        return self._class_names

    @class_names.setter
    def class_names(self, value):
        if value is not None:
            value = tuple(value) if isinstance(value, (list, tuple)) else value
            if not isinstance(value, tuple) or len(value) != self.num_classes:
                raise ValueError(f"Invalid class_names={value!r:.200}: {self.num_classes} one-line strings "
                                 "(one per class) or None are required.")
            problem = class_name_problem(value)
            if problem:
                raise ValueError(f"Invalid class_names: {problem}; {self.num_classes} unique one-line strings "
                                 "(one per class) or None are required.")
        self._class_names = value

    def head(self, features, training=None):
        """The head on backbone features (for analysis that cuts the network at its units)."""
        for layer in self.head_layers:
            dropout = isinstance(layer, keras.layers.Dropout)
            features = layer(features, training=training) if dropout else layer(features)
        return features

    def reset_classifier(self, num_classes, *, class_names=None, dropout=None):
        """This classifier's backbone (the same layers and weights, not a copy) under a new, freshly initialised
        head of ``num_classes`` (``None``: the pooled features), as timm's ``reset_classifier``; a Keras functional
        model's graph is fixed, so the new classifier is returned and this one keeps its head. Pooling,
        activation and input config are this one's; ``dropout`` too unless given.

        Examples:
            >>> from keras_preact.models import create_model
            >>> model = create_model("cifar_resnet20")
            >>> five = model.reset_classifier(5, class_names=["a", "b", "c", "d", "e"])
            >>> five.output_shape, five.backbone is model.backbone, model.output_shape
            ((None, 5), True, (None, 10))
        """
        return PreActResNetClassifier(self.backbone, num_classes, pooling=self.pooling,
                                      dropout=self.dropout if dropout is None else dropout,
                                      activation=self.activation, input_config=self.input_config,
                                      class_names=class_names, name=self.name)

    def get_config(self):
        return {
            "name": self.name,
            "trainable": self.trainable,
            "backbone": keras.layers.serialize(self.backbone),
            "num_classes": self.num_classes,
            "pooling": self.pooling,
            "dropout": self.dropout,
            "activation": self.activation,
            "input_config": None if self.input_config is None else self.input_config.to_dict(),
            "class_names": None if self.class_names is None else list(self.class_names),
            "dtype": keras.dtype_policies.serialize(self.dtype_policy),
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if not isinstance(config.get("backbone"), dict):
            raise ValueError(f"Invalid {cls.__name__} config: 'backbone' (the serialized backbone it classifies) is "
                             f"{'missing' if 'backbone' not in config else repr(config['backbone'])[:60]}; its keys: "
                             f"{', '.join(sorted(config)) or 'none'}.")
        config["backbone"] = keras.layers.deserialize(config["backbone"])
        return cls(**config)


def backbone_in_policy(backbone, dtype):
    """``backbone`` with every layer in the ``dtype`` policy (None: its own): itself, or a copy built from
    its config in that policy carrying its weights (cast to the copy's variable dtype)."""
    if dtype is None or keras.dtype_policies.get(dtype).name == backbone.dtype_policy.name:
        return backbone
    config = {**backbone.get_config(), "dtype": keras.dtype_policies.serialize(keras.dtype_policies.get(dtype))}
    copy = type(backbone).from_config(config)
    for target, source in zip(copy.weights, backbone.weights, strict=True):
        target.assign(keras.ops.cast(source, target.dtype))
    return copy


def input_config_at(config, backbone):
    """``config`` at the backbone's input size (unchanged where that size is dynamic)."""
    shape = channels_last_shape(backbone)
    if None in shape or shape == config.input_size:
        return config
    return config.replace(input_size=shape)


def family_input_config(backbone):
    """The input config of the backbone's family (``presets.FAMILY_INPUTS`` of its ``stem``: CIFAR's whole
    image or ImageNet's centre 224 of 256, with their pixel statistics) at its input size; None for an
    input whose channel count is not the family's."""
    config = FAMILY_INPUTS[backbone.stem]
    if channels_last_shape(backbone)[-1] != config.input_size[-1]:
        return None
    return input_config_at(config, backbone)


def channels_last_shape(backbone):
    """The backbone's image shape as ``(height, width, channels)`` (an InputConfig's ``input_size``)."""
    shape = tuple(backbone.image_shape)
    return (*shape[1:], shape[0]) if backbone.data_format == "channels_first" else shape


def check_head(include_top, pooling, num_classes, argument="num_classes"):
    opt.check_choice("pooling", pooling, (None, *POOLINGS))
    if include_top and (not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes < 1):
        raise ValueError(f"Invalid {argument}={num_classes!r}: a positive integer is required.")


def with_head(backbone, *, include_top, pooling, num_classes, classifier_activation, dropout=0.0,
              input_tensor=None, input_config=FAMILY, class_names=None, name=None):
    """keras.applications' semantics on a backbone: the classifier with ``include_top``, else the
    backbone itself (``pooling=None``) or pooled features; ``input_tensor`` wraps it on that tensor.
    The classifier carries ``input_config`` at the backbone's input size (default its family's)."""
    if input_config not in (FAMILY, None):
        if isinstance(input_config, dict):
            input_config = InputConfig.from_dict(input_config)
        if isinstance(input_config, InputConfig):
            input_config = input_config_at(input_config, backbone)
    if include_top:
        model = PreActResNetClassifier(backbone, num_classes, pooling="avg", dropout=dropout,
                                       activation=classifier_activation, input_config=input_config,
                                       class_names=class_names, name=name)
    elif pooling is not None:
        if class_names is not None:
            raise ValueError(f"Invalid class_names={class_names!r:.200} with include_top=False: the model has no "
                             "classes.")
        model = PreActResNetClassifier(backbone, None, pooling=pooling, input_config=input_config, name=name)
    else:
        model = backbone
    if input_tensor is None:
        return model
    inputs = input_tensor
    if not keras.backend.is_keras_tensor(input_tensor):
        inputs = keras.Input(tensor=input_tensor, shape=backbone.image_shape, name="images")
    return keras.Model(inputs, model(inputs), name=f"{model.name}_on_input_tensor")
