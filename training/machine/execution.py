"""How many training steps one compiled call runs (Keras' ``steps_per_execution``), when the run does not say.

``model.fit`` costs the host a fixed time per call (the loop, the callbacks, the dispatch): on the 2-core AMD EPYC
of BENCHMARKS.md's ``host_cost`` rows, 1.2 ms/step on JAX at 1 step per call and 0.7 ms/step at 10. A network
whose step takes milliseconds on a GPU waits on that host time, so on a GPU or TPU the app runs several steps per
call. On the CPU the step's arithmetic dwarfs the host's share (the CIFAR ResNet-20 step takes hundreds of ms
there, so the half millisecond to few milliseconds saved is under 1% of it), and one step per call keeps backups
and the progress at every step: 1 there. Keras' PyTorch trainer runs one step per call: 1.

The choice is the largest divisor of the steps per epoch up to ``MAX_STEPS_PER_EXECUTION`` (every epoch splits into
whole calls: no second compiled function for a shorter last call) and ``checkpoint_every`` (backups are taken
between calls, so no further apart than asked). With health signals on (``health_every``) it is 1: they
measure one step's update, and count calls as steps.

Examples::

    choose_steps_per_execution(None, "jax", "gpu", 390, checkpoint_every=50)   # (30, "GPU: the largest ...")
    choose_steps_per_execution(None, "jax", "cpu", 390)                         # (1, "CPU: ...")
    choose_steps_per_execution(4, "jax", "gpu", 390)                            # (4, "--steps-per-execution")
"""

MAX_STEPS_PER_EXECUTION = 32  # Keras' TPU guides use 32-50; past a few tens the host's share is gone on a GPU


def device_kind(backend=None):
    """``"gpu"``, ``"tpu"`` or ``"cpu"``: the device Keras' ``backend`` computes on (imports only that backend)."""
    import keras

    backend = backend or keras.backend.backend()
    if backend == "jax":
        import jax

        platform = jax.default_backend()
        return platform if platform in ("gpu", "tpu") else "cpu"
    if backend == "tensorflow":
        import tensorflow as tf

        for kind in ("tpu", "gpu"):
            if tf.config.list_logical_devices(kind.upper()):
                return kind
        return "cpu"
    if backend == "torch":
        import torch

        return "gpu" if torch.cuda.is_available() else "cpu"
    return "cpu"


def choose_steps_per_execution(requested, backend, kind, steps_per_epoch, *, checkpoint_every=None,
                               health_every=0):
    """(steps per call, why): ``requested`` when given (the flag wins), else the app's choice (module docstring)."""
    if requested is not None:
        return requested, "--steps-per-execution"
    if backend == "torch":
        return 1, "Keras' PyTorch trainer runs one step per call"
    if kind not in ("gpu", "tpu"):
        return 1, "CPU: the host's share of a step is under 1%"
    if health_every:
        return 1, "health signals measure single steps"
    cap = min(c for c in (MAX_STEPS_PER_EXECUTION, checkpoint_every, steps_per_epoch) if c)
    chosen = max(n for n in range(1, cap + 1) if steps_per_epoch % n == 0)
    return chosen, (f"{kind.upper()}: the largest divisor of {steps_per_epoch} steps per epoch up to {cap}, "
                    "to take fit's host cost off the device's way")
