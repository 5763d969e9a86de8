"""What the family builders (``cifar_resnet``, ``imagenet_resnet``) share: the input, head and
regularisation arguments, stated once here, and the build from a family's backbone plan.

A family builder works out its stages and unit options (paper Sec. 4-5, Table 5) and hands them to
``build_network`` with the shared arguments it was given; ``network_arguments`` splits those from its
``**unit_options``, and ``shows_network_arguments`` puts them in the builder's signature (help(), IDEs).
"""

import inspect

from keras_preact.models.backbone import PreActResNetBackbone
from keras_preact.models.classifier import check_head, with_head


def build_network(backbone_arguments, *, default_name, num_classes, input_shape, input_tensor=None,
                  include_top=True, pooling=None, classifier_activation="softmax", dropout=0.0,
                  drop_path_rate=0.0, data_format=None, remat=None, name=None):
    """``PreActResNetBackbone(**backbone_arguments)`` under keras.applications' head semantics:
    ``include_top`` the classifier (``dropout`` before its dense layer, ``classifier_activation``),
    else the backbone (``pooling=None``) or its pooled features; ``input_tensor`` wraps it on that
    tensor. ``drop_path_rate``: stochastic depth, 0 to the rate over the units. ``remat``: the
    backbone's rematerialisation in training (``remat.REMAT_POLICIES``)."""
    check_head(include_top, pooling, num_classes)
    name = name or default_name
    backbone = PreActResNetBackbone(**backbone_arguments, drop_path_rate=drop_path_rate, input_shape=input_shape,
                                    data_format=data_format, remat=remat, name=f"{name}_backbone")
    return with_head(backbone, include_top=include_top, pooling=pooling, num_classes=num_classes,
                     classifier_activation=classifier_activation, dropout=dropout, input_tensor=input_tensor,
                     name=name)


# The shared keyword arguments every family builder takes (after its own ``input_shape``).
SHARED = [p for p in inspect.signature(build_network).parameters.values()
          if p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is not inspect.Parameter.empty
          and p.name != "input_shape"]


def network_arguments(options):
    """(the shared arguments in ``options``, the rest: the unit options)."""
    shared = {p.name for p in SHARED}
    return ({k: v for k, v in options.items() if k in shared},
            {k: v for k, v in options.items() if k not in shared})


def shows_network_arguments(builder):
    """Decorator: ``builder(depth, num_classes, *, <own>, **unit_options)`` shown with the shared
    arguments before its ``**unit_options``, as ``ResidualUnit`` shows its options."""
    *own, unit_options = inspect.signature(builder).parameters.values()
    builder.__signature__ = inspect.signature(builder).replace(parameters=[*own, *SHARED, unit_options])
    return builder
