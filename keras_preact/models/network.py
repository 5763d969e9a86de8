"""What the family builders (``cifar_resnet``, ``imagenet_resnet``) share: the build from a family's
backbone plan under keras.applications' head semantics, carrying the family's input config.

A family builder works out its stages and unit options (paper Sec. 4-5, Table 5) and hands them to
``build_network`` with the input, head and regularisation arguments of its own signature.
"""

from keras_preact.models.backbone import PreActResNetBackbone
from keras_preact.models.classifier import FAMILY, check_head, with_head


def build_network(backbone_arguments, *, default_name, num_classes, input_shape, input_tensor=None,
                  include_top=True, pooling=None, classifier_activation="softmax", dropout=0.0,
                  drop_path_rate=0.0, data_format=None, dtype=None, remat=None, input_config=FAMILY,
                  class_names=None, name=None):
    """``PreActResNetBackbone(**backbone_arguments)`` under keras.applications' head semantics:
    ``include_top`` the classifier (``dropout`` before its dense layer, ``classifier_activation``),
    else the backbone (``pooling=None``) or its pooled features; ``input_tensor`` wraps it on that
    tensor. ``drop_path_rate``: stochastic depth, 0 to the rate over the units. ``dtype``: every layer's
    dtype policy. ``remat``: the backbone's rematerialisation in training (``remat.REMAT_POLICIES``).
    ``input_config`` (default the family's) and ``class_names``: what the classifier carries, the input
    config at the model's input size."""
    check_head(include_top, pooling, num_classes)
    name = name or default_name
    backbone = PreActResNetBackbone(**backbone_arguments, drop_path_rate=drop_path_rate, input_shape=input_shape,
                                    data_format=data_format, dtype=dtype, remat=remat, name=f"{name}_backbone")
    return with_head(backbone, include_top=include_top, pooling=pooling, num_classes=num_classes,
                     classifier_activation=classifier_activation, dropout=dropout, input_tensor=input_tensor,
                     input_config=input_config, class_names=class_names, name=name)
