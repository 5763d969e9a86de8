"""Forward signals and backward gradients at every residual unit (paper Sec. 3, Eq. 4-5).

With identity shortcuts ``x_L = x_l + sum_i F(x_i)`` and ``dE/dx_l = dE/dx_L (1 + d/dx_l sum F)``:
the gradient of the output side reaches every unit directly. ``unit_signals`` returns the tensors,
``gradient_norms`` their norms, both ordered from the input side to the output side.
"""

import dataclasses

import keras
import numpy as np

from keras_preact.analysis.autodiff import get_autodiff
from keras_preact.layers import ResidualUnit
from keras_preact.models import PreActResNetBackbone, PreActResNetClassifier


def network_parts(model):
    """(backbone, head) of a network of this package: its ``PreActResNetBackbone`` and a function
    from the backbone's features to the model's output (the identity for a bare backbone)."""
    if isinstance(model, PreActResNetBackbone):
        return model, lambda features, training=None: features
    if isinstance(model, PreActResNetClassifier):
        return model.backbone, model.head
    raise ValueError(
        f"Invalid model={getattr(model, 'name', model)!r}: a PreActResNetBackbone or PreActResNetClassifier "
        "is required (build it with keras_preact.models, e.g. cifar_resnet(20))."
    )


def residual_units(model):
    """The network's ``ResidualUnit`` layers, input side first: a backbone's or classifier's, or
    those at the top level of any other functional model (``model.layers`` is topological).

    Examples:
        >>> from keras_preact.analysis import residual_units
        >>> from keras_preact.models import cifar_resnet
        >>> [unit.name for unit in residual_units(cifar_resnet(14, input_shape=(8, 8, 3)))]
        ['stage1_unit1', 'stage1_unit2', 'stage2_unit1', 'stage2_unit2', 'stage3_unit1', 'stage3_unit2']
    """
    if isinstance(model, (PreActResNetBackbone, PreActResNetClassifier)):
        backbone, _ = network_parts(model)
        return [unit for stage in backbone.residual_units for unit in stage]
    if not isinstance(model, keras.Model):
        raise ValueError(f"Invalid model={model!r}: a keras.Model is required.")
    units = [layer for layer in model.layers if isinstance(layer, ResidualUnit)]
    if not units:
        raise ValueError(
            f"Invalid model={model.name!r}: it has no ResidualUnit layers at its top level "
            "(build it with keras_preact.models, e.g. cifar_resnet(20))."
        )
    return units


@dataclasses.dataclass(frozen=True)
class _Segments:
    """A network cut at every unit input: ``stem`` (images -> first unit input), ``links[i]``
    (unit i output -> unit i+1 input; ``None`` where they are the same tensor), ``head``."""

    units: list
    stem: keras.Model
    links: list
    head: keras.Model


def _segments(model):
    units = residual_units(model)
    links = [
        None if nxt.input is prev.output else keras.Model(prev.output, nxt.input)
        for prev, nxt in zip(units, units[1:])
    ]
    if isinstance(model, (PreActResNetBackbone, PreActResNetClassifier)):
        backbone, head = network_parts(model)
        tail = keras.Model(units[-1].output, backbone.output)
        features = keras.Input(shape=tuple(units[-1].output.shape[1:]), dtype=units[-1].output.dtype)
        images, head = backbone.inputs[0], keras.Model(features, head(tail(features)))
    else:  # a functional chain of units (each called once: their input/output tensors are unique)
        images, head = model.inputs[0], keras.Model(units[-1].output, model.outputs[0])
    return _Segments(units=units, stem=keras.Model(images, units[0].input), links=links, head=head)


def _probed_forward(segments, images, probes, training):
    """The model's forward pass with a zero ``probe`` added at every unit input and at the last
    unit's output: the gradient w.r.t. a probe is the gradient w.r.t. that tensor."""
    h = segments.stem(images, training=training)
    seen = []
    for i, unit in enumerate(segments.units):
        if i and segments.links[i - 1] is not None:
            h = segments.links[i - 1](h, training=training)
        h = h + probes[i]
        seen.append(h)
        h = unit(h, training=training)
    h = h + probes[-1]
    seen.append(h)
    return segments.head(h, training=training), seen


@dataclasses.dataclass(frozen=True)
class UnitSignals:
    """Tensors (numpy) at the residual units of one batch, input side first.

    ``inputs[l]`` is unit l's input x_l for l < L and ``inputs[L]`` the last unit's output;
    ``input_grads[l]`` is dE/d inputs[l]; ``weight_grads[l]`` the gradients of unit l's trainable
    weights (in ``unit.trainable_weights`` order); ``loss`` is E on the batch.

    Examples:
        >>> import numpy as np
        >>> from keras_preact.analysis import unit_signals
        >>> from keras_preact.models import cifar_resnet
        >>> signals = unit_signals(cifar_resnet(8, input_shape=(8, 8, 3)), np.ones((2, 8, 8, 3)), np.array([0, 1]))
        >>> [x.shape for x in signals.inputs]  # each unit's input x_l, then the last unit's output x_L
        [(2, 8, 8, 16), (2, 8, 8, 16), (2, 4, 4, 32), (2, 2, 2, 64)]
        >>> [g.shape for g in signals.input_grads] == [x.shape for x in signals.inputs]  # dE/dx_l
        True
    """

    units: tuple
    inputs: list
    input_grads: list
    weight_grads: list
    loss: float


def _check_batch(images, labels, model):
    images = np.asarray(images)
    labels = np.asarray(labels)
    expected = tuple(model.inputs[0].shape[1:])
    if images.ndim != 4 or any(e is not None and e != s for e, s in zip(expected, images.shape[1:])):
        raise ValueError(
            f"Invalid images of shape {images.shape}: expected (batch, {', '.join(map(str, expected))})."
        )
    if labels.shape[:1] != images.shape[:1]:
        raise ValueError(
            f"Invalid labels of shape {labels.shape}: expected one label per image ({images.shape[0]})."
        )
    return images.astype(model.inputs[0].dtype), labels


def unit_signals(model, images, labels, *, loss=None, training=False):
    """Forward signals and backward gradients at every ``ResidualUnit`` of ``model``.

    Args:
        model: a functional model whose residual units form a chain (every model of this package).
        images, labels: one batch; ``labels`` are what ``loss`` takes (integer classes by default).
        loss: a Keras loss; default sparse categorical cross-entropy on the model's (softmax) output.
        training: run normalization and dropout in training mode (batch statistics; moving
            statistics are not updated).

    Examples:
        >>> import numpy as np
        >>> from keras_preact.analysis import unit_signals
        >>> from keras_preact.models import cifar_resnet
        >>> model = cifar_resnet(8, input_shape=(8, 8, 3))
        >>> signals = unit_signals(model, np.ones((2, 8, 8, 3)), np.array([0, 1]), training=True)
        >>> signals.units, [len(grads) for grads in signals.weight_grads]  # per unit, its weights' gradients
        (('stage1_unit1', 'stage2_unit1', 'stage3_unit1'), [6, 6, 6])
    """
    segments = _segments(model)
    images, labels = _check_batch(images, labels, model)
    loss_fn = keras.losses.get(loss) if loss is not None else keras.losses.SparseCategoricalCrossentropy()
    variables = model.trainable_variables
    batch = images.shape[0]
    probe_shapes = [(batch,) + tuple(u.input.shape[1:]) for u in segments.units]
    probe_shapes.append((batch,) + tuple(segments.units[-1].output.shape[1:]))
    probes = [np.zeros(s, dtype=segments.units[0].compute_dtype) for s in probe_shapes]
    values = [keras.ops.convert_to_tensor(v.value) for v in variables]

    def objective(weight_values, probe_values):
        with keras.StatelessScope(state_mapping=list(zip(variables, weight_values))):
            outputs, seen = _probed_forward(segments, images, probe_values, training)
            return keras.ops.cast(loss_fn(labels, outputs), "float32"), seen

    value, seen, (weight_grads, probe_grads) = get_autodiff().value_and_grad(
        objective, [values, probes]
    )
    to_numpy = keras.ops.convert_to_numpy
    index = {id(v): i for i, v in enumerate(variables)}
    return UnitSignals(
        units=tuple(u.name for u in segments.units),
        inputs=[to_numpy(x) for x in seen],
        input_grads=[to_numpy(g) for g in probe_grads],
        weight_grads=[
            [to_numpy(weight_grads[index[id(v)]]) for v in u.trainable_variables]
            for u in segments.units
        ],
        loss=float(to_numpy(value)),
    )


def _norm(array):
    return float(np.linalg.norm(np.asarray(array, dtype=np.float64).ravel()))


@dataclasses.dataclass(frozen=True)
class GradientNorms:
    """Norms per residual unit, input side first (the paper's Eq. 4-5 view).

    ``signal[l]`` = ||x_l||, the unit's input over the whole batch (Frobenius norm);
    ``input_grad[l]`` = ||dE/dx_l||; ``weight_grad[l]`` = ||dE/dW_l|| over all trainable weights of
    unit l. ``output_signal`` / ``output_grad``: the same at the last unit's output x_L.

    Examples:
        >>> import numpy as np
        >>> from keras_preact.analysis import GradientNorms
        >>> norms = GradientNorms(units=("stage1_unit1", "stage1_unit2"), signal=np.array([4.0, 5.0]),
        ...                       input_grad=np.array([0.5, 0.25]), weight_grad=np.array([0.1, 0.2]),
        ...                       output_signal=6.0, output_grad=0.125, loss=2.3)
        >>> row = norms.rows()[1]  # one dict per unit, for CSV or pandas
        >>> row["unit"], row["depth"], float(row["input_grad"])
        ('stage1_unit2', 2, 0.25)
    """

    units: tuple
    signal: np.ndarray
    input_grad: np.ndarray
    weight_grad: np.ndarray
    output_signal: float
    output_grad: float
    loss: float

    def rows(self):
        """One dict per unit (for CSV / pandas)."""
        return [
            {"unit": n, "depth": i + 1, "signal": s, "input_grad": g, "weight_grad": w}
            for i, (n, s, g, w) in enumerate(
                zip(self.units, self.signal, self.input_grad, self.weight_grad)
            )
        ]


def gradient_norms(model, images, labels, *, loss=None, training=False):
    """Per-unit forward signal norms and backward gradient norms (w.r.t. each unit's input and its
    weights), ordered from the input side to the output side. Arguments as ``unit_signals``.

    Examples:
        >>> import numpy as np
        >>> from keras_preact.analysis import gradient_norms
        >>> from keras_preact.models import cifar_resnet
        >>> norms = gradient_norms(cifar_resnet(8, input_shape=(8, 8, 3)), np.ones((2, 8, 8, 3)), np.array([0, 1]))
        >>> norms.signal.shape, norms.weight_grad.shape, [row["depth"] for row in norms.rows()]
        ((3,), (3,), [1, 2, 3])
    """
    s = unit_signals(model, images, labels, loss=loss, training=training)
    return GradientNorms(
        units=s.units,
        signal=np.array([_norm(x) for x in s.inputs[:-1]]),
        input_grad=np.array([_norm(g) for g in s.input_grads[:-1]]),
        weight_grad=np.array(
            [float(np.sqrt(sum(_norm(g) ** 2 for g in grads))) for grads in s.weight_grads]
        ),
        output_signal=_norm(s.inputs[-1]),
        output_grad=_norm(s.input_grads[-1]),
        loss=s.loss,
    )
