"""Rematerialisation (gradient checkpointing) of a backbone's residual units: ``remat=``.

A policy groups the residual units into checkpoints. A group's input is kept for the backward pass;
its inner activations are dropped after the forward pass and recomputed from that input when the
gradient needs them (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost"). The math is
unchanged: the loss, every gradient and the weights are those of the same network without remat, so
remat is a training setting, not part of the model (saved files and exports do not depend on it).

The group runs through Keras' own ``keras.remat`` (``jax.checkpoint``, ``tf.recompute_grad``,
``torch.utils.checkpoint``) as a pure function of the group's input and its non-trainable state
(BN moving statistics, dropout seeds): the forward pass returns the updated state, assigned once
after the checkpoint, while the recomputation's updates stay inside a ``keras.StatelessScope`` and
are dropped. So BN moving statistics move once per step, and a recomputed dropout draws the same
mask from the same seed.

Why not ``keras.RematScope(mode="list_of_layers")``: it checkpoints one layer's call, so it cannot
make a stage or a run of units one checkpoint; and it recomputes that call as it is, so on PyTorch a
unit's BN moving statistics are updated twice per step (measured: 0.107 off after one step on a
16-channel unit), and on TensorFlow a ``training=`` keyword in a traced step is refused by
``tf.custom_gradient``. No backend primitive is needed: ``keras.remat`` and ``keras.StatelessScope``
are enough on all three backends.
"""

import dataclasses

import keras


@dataclasses.dataclass(frozen=True)
class RematPolicy:
    """How a policy groups the units: ``groups(units per stage, k)`` -> lists of flat unit indices,
    each list one checkpoint; ``stores`` what is kept for the backward pass (docs/training.md's table)."""

    groups: object
    stores: str


def _runs(count, k):
    return [list(range(start, min(start + k, count))) for start in range(0, count, k)]


def _stages(units, k):
    starts = [sum(units[:s]) for s in range(len(units))]
    return [list(range(start, start + n)) for start, n in zip(starts, units)]


REMAT_POLICIES = {
    None: RematPolicy(lambda units, k: [], "every activation (no recomputation)"),
    "units": RematPolicy(lambda units, k: _runs(sum(units), 1), "each residual unit's input"),
    "stages": RematPolicy(_stages, "each stage's input"),
    "segments": RematPolicy(lambda units, k: _runs(sum(units), k),
                            "the input of every run of k consecutive units (across stages)"),
}
ALLOWED = "None, 'units', 'stages' or 'segments:<k>' (k a positive integer, e.g. 'segments:18')"


def parse_remat(remat):
    """``(policy name, k)`` of a ``remat`` value; anything else refused by name, listing what is allowed."""
    if remat is None or remat in ("units", "stages"):
        return remat, 1
    if isinstance(remat, str) and remat.startswith("segments:"):
        k = remat.split(":", 1)[1]
        if k.isdigit() and int(k) > 0 and k == str(int(k)):
            return "segments", int(k)
    raise ValueError(f"Invalid remat={remat!r}. Allowed values: {ALLOWED}.")


def unit_groups(remat, stackwise_units):
    """The checkpoints of ``remat`` over a network of ``stackwise_units``: lists of flat unit indices."""
    name, k = parse_remat(remat)
    return REMAT_POLICIES[name].groups(list(stackwise_units), k)


def _state(layers):
    """The non-trainable variables of ``layers`` (BN moving statistics, dropout seed states)."""
    return [v for layer in layers for v in layer.non_trainable_variables]


def run_checkpointed(layers, x, training):
    """``layers`` applied in turn to ``x`` as one checkpoint (``keras.remat``), their state updated once."""
    weights = [v for layer in layers for v in layer.trainable_variables]
    state = _state(layers)

    def group(x, *values):
        # Every variable is an explicit input, none a closure: tf.recompute_grad differentiates its
        # inputs and the variables it sees read, not tensors captured from outside (a stateless call's
        # weights), and the state comes back as outputs, not as assigns made inside the checkpoint.
        with keras.StatelessScope(state_mapping=list(zip(weights + state, values))) as scope:
            for layer in layers:
                x = layer(x, training=training)
        old = values[len(weights):]
        return (x, *[value if new is None else new for value, new in zip(old, map(scope.get_current_value, state))])

    values = [keras.ops.convert_to_tensor(v.value) for v in weights]
    # Copies: torch's checkpoint keeps its inputs by reference, and the assigns below are in place.
    values += [keras.ops.copy(v.value) for v in state]
    y, *updated = keras.remat(group)(x, *values)
    for variable, value in zip(state, updated):
        variable.assign(value)
    return y


def run_chain(chain, groups, x, training):
    """A linear ``chain`` of layers applied to ``x``; the layer index lists in ``groups`` as checkpoints."""
    starts = {group[0]: group for group in groups}
    index = 0
    while index < len(chain):
        group = starts.get(index)
        if group is None:
            x = chain[index](x, training=training)
            index += 1
        else:
            x = run_checkpointed([chain[i] for i in group], x, training)
            index = group[-1] + 1
    return x
