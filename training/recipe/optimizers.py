"""``TorchSGD``: the optimizer of the official trainer, step for step.

fb.resnet.torch (``train.lua`` L20-29, which KaimingHe/resnet-1k-layers uses) calls torch/optim's
``optim.sgd`` (``sgd.lua`` L48-82) with ``{learningRate, momentum = 0.9, nesterov = true,
dampening = 0, weightDecay = 1e-4}`` on ``model:getParameters()``, the flat vector of every
parameter (BN gamma/beta and biases included). Per parameter x with gradient g:

    g = g + wd * x                      (coupled weight decay, before momentum)
    buf = g at the first step, else mom * buf + (1 - dampening) * g
    g = g + mom * buf (Nesterov), else g = buf
    x = x - lr * g

Keras' ``SGD`` differs: its velocity holds learning-rate-scaled steps (``v = mom * v - lr * g``), so
the two part ways whenever the learning rate changes (the warm-up's end, every decay), and its
``weight_decay`` is decoupled (``x -= lr * wd * x`` outside momentum).

On PyTorch the update runs as torch's own multi-tensor kernels (``torch._foreach_*``, what
``torch.optim.SGD(foreach=True)`` and Keras' torch ``SGD`` use): one call per operation over all
variables instead of one small eager op per variable and operation, the same arithmetic. TensorFlow and
JAX compile ``update_step`` into the training step, where per-variable ops cost nothing extra.
"""

import keras
from keras import ops

from ..machine import compat

WEIGHT_DECAY_SCOPES = ("all", "kernels")


@keras.saving.register_keras_serializable(package="keras_preact")
class TorchSGD(keras.optimizers.Optimizer):
    """SGD with momentum as torch/optim ``sgd.lua`` (see the module docstring).

    Args:
        learning_rate: a float or a ``keras.optimizers.schedules`` schedule.
        momentum, dampening, nesterov: as ``optim.sgd``; Nesterov needs momentum > 0, dampening 0.
        coupled_weight_decay: ``wd`` of ``g += wd * x``.
        weight_decay_scope: ``"all"`` (every trainable variable, the official code's) or ``"kernels"``
            (only variables named ``kernel``: conv and dense weights, the common modern practice).
    """

    def __init__(self, learning_rate=0.1, momentum=0.9, dampening=0.0, nesterov=True, coupled_weight_decay=0.0,
                 weight_decay_scope="all", name="torch_sgd", **kwargs):
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        if weight_decay_scope not in WEIGHT_DECAY_SCOPES:
            raise ValueError(f"Invalid weight_decay_scope={weight_decay_scope!r}. Allowed values: 'all', 'kernels'.")
        for argument, value in (("momentum", momentum), ("dampening", dampening),
                                ("coupled_weight_decay", coupled_weight_decay)):
            if not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"Invalid {argument}={value!r}: a non-negative number is required.")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError(f"Invalid nesterov=True with momentum={momentum}, dampening={dampening}: "
                             "Nesterov momentum needs momentum > 0 and dampening 0 (as optim.sgd).")
        self.momentum = float(momentum)
        self.dampening = float(dampening)
        self.nesterov = bool(nesterov)
        self.coupled_weight_decay = float(coupled_weight_decay)
        self.weight_decay_scope = weight_decay_scope

    def build(self, variables):
        if self.built:
            return
        super().build(variables)
        # Decided on the Keras variables here: update_step may get the backend's variable.
        self.decay_mask = [self.decays(v) for v in variables]
        self.momentum_buffers = []
        if self.momentum:
            self.momentum_buffers = [self.add_variable_from_reference(v, "momentum_buffer") for v in variables]

    def decays(self, variable):
        """Whether ``variable`` gets the coupled weight decay (by ``weight_decay_scope``)."""
        return self.coupled_weight_decay > 0 and (
            self.weight_decay_scope == "all" or variable.path.split("/")[-1] == "kernel"
        )

    def update_step(self, gradient, variable, learning_rate):
        learning_rate = ops.cast(learning_rate, variable.dtype)
        gradient = ops.cast(gradient, variable.dtype)
        index = compat.variable_index(self, variable)
        if self.decay_mask[index]:
            gradient = ops.add(gradient, ops.multiply(self.coupled_weight_decay, variable))
        if self.momentum:
            buffer = self.momentum_buffers[index]
            running = ops.add(ops.multiply(self.momentum, buffer), ops.multiply(1.0 - self.dampening, gradient))
            new_buffer = ops.where(ops.equal(self.iterations, 0), gradient, running)
            self.assign(buffer, new_buffer)
            gradient = ops.add(gradient, ops.multiply(self.momentum, new_buffer)) if self.nesterov else new_buffer
        self.assign_sub(variable, ops.multiply(learning_rate, gradient))

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        if keras.backend.backend() != "torch":
            return super()._backend_update_step(grads, trainable_variables, learning_rate)
        return _torch_foreach_step(self, grads, trainable_variables, learning_rate)

    def get_config(self):
        return {
            **super().get_config(),
            "momentum": self.momentum,
            "dampening": self.dampening,
            "nesterov": self.nesterov,
            "coupled_weight_decay": self.coupled_weight_decay,
            "weight_decay_scope": self.weight_decay_scope,
        }


def _torch_foreach_step(optimizer, grads, variables, learning_rate):
    """``update_step`` for every variable at once with ``torch._foreach_*`` (see the module docstring)."""
    import torch

    with torch.no_grad():
        params = [v.value for v in variables]
        grads = [g.to(p.dtype) for g, p in zip(grads, params)]
        indices = [compat.variable_index(optimizer, v) for v in variables]
        decayed = [i for i, index in enumerate(indices) if optimizer.decay_mask[index]]
        if decayed:
            grads = list(grads)
            for i, g in zip(decayed, torch._foreach_add([grads[i] for i in decayed], [params[i] for i in decayed],
                                                        alpha=optimizer.coupled_weight_decay)):
                grads[i] = g
        if optimizer.momentum:
            buffers = [optimizer.momentum_buffers[index].value for index in indices]
            # optim.sgd: the first buffer is the gradient (``iterations``: a tensor when gradients accumulate)
            if int(keras.ops.convert_to_numpy(optimizer.iterations)) == 0:
                torch._foreach_copy_(buffers, grads)
            else:
                torch._foreach_mul_(buffers, optimizer.momentum)
                torch._foreach_add_(buffers, grads, alpha=1.0 - optimizer.dampening)
            grads = torch._foreach_add(grads, buffers, alpha=optimizer.momentum) if optimizer.nesterov else buffers
        lr = float(learning_rate)
        torch._foreach_add_(params, grads, alpha=-lr)


def from_config(config, learning_rate, model=None):
    """The optimizer of a ``keras_preact_training.recipe.configs.Config``: ``TorchSGD`` with its momentum, Nesterov
    flag, weight decay and scope; Keras' weight EMA (``ema_momentum``) and gradient accumulation
    (``gradient_accumulation``) when on; one copy per stage of ``model`` at a decayed rate with ``layer_decay`` < 1
    (``keras_preact.models.levers.layerwise_decay``)."""
    levers = {}
    if config.ema_momentum:
        levers.update(use_ema=True, ema_momentum=config.ema_momentum)
    if config.gradient_accumulation > 1:
        levers.update(gradient_accumulation_steps=config.gradient_accumulation)
    optimizer = TorchSGD(learning_rate=learning_rate, momentum=config.momentum, nesterov=config.nesterov,
                         coupled_weight_decay=config.weight_decay, weight_decay_scope=config.weight_decay_scope,
                         **levers)
    if config.layer_decay == 1:
        return optimizer
    from keras_preact.models.levers import layerwise_decay

    return layerwise_decay(model, optimizer, config.layer_decay)


def parts(optimizer):
    """The optimizers that hold state: ``optimizer``, or a ``MultiOptimizer``'s own and its inner ones."""
    return [optimizer, *getattr(optimizer, "optimizers", ())]


def set_iterations(optimizer, step):
    """Set the batch counter of ``optimizer`` (and of each inner one of a ``MultiOptimizer``) to ``step``: the
    schedule's position. With gradient accumulation ``iterations`` is derived (counted batches // steps), so the
    counter itself is set (Keras' ``_iterations``: there is no public setter)."""
    for part in parts(optimizer):
        counter = part._iterations if part.gradient_accumulation_steps else part.iterations
        counter.assign(step)
