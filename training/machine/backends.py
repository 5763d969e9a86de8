"""Which Keras backend ``keras-preact-train`` runs on (``--backend``), decided before Keras is imported.

``--backend auto`` (the default) keeps the user's choice where there is one (``KERAS_BACKEND``, or a
backend other than Keras' default written in ``keras.json``); otherwise, on a machine without an
accelerator, it takes the first installed backend of ``CPU_FASTEST_FIRST``, the order measured by
``benchmarks/train_speed_vs_pytorch.py`` (BENCHMARKS.md, "Training speed"). With an accelerator, where
nothing was measured here, it takes the first installed of ``BACKENDS`` (Keras' own default first).
The library never changes the backend: only the command line does, and it prints its choice.
This module imports nothing but the standard library, so it runs before Keras loads.
"""

import importlib.util
import json
import os
import pathlib
import sys

BACKENDS = ("tensorflow", "jax", "torch")
CPU_FASTEST_FIRST = ("tensorflow", "torch", "jax")
ACCELERATOR_DEVICES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd", "/dev/accel0")
# XLA's CPU compiler undoes rematerialisation: it drops jax.checkpoint's optimization barriers, so its
# common-subexpression elimination merges the recomputation back into the forward pass, and its default
# (concurrency-optimized) schedule keeps the activations alive anyway. With CSE off and the memory-minimizing
# schedule, the compiled step keeps the recomputation and about half the memory (README, "Training the
# deepest networks on one device"; BENCHMARKS.md, "Rematerialisation"). Both are flags of XLA's CPU compile only: not set where an
# accelerator is present, where remat works as compiled (CSE off would slow its step).
XLA_CPU_REMAT_FLAGS = {"--xla_cpu_enable_concurrency_optimized_scheduler": "false", "--xla_disable_hlo_passes": "cse"}
INSTALL_HINT = {"tensorflow": "pip install tensorflow", "jax": 'pip install "jax[cpu]"  (or jax[cuda12])',
                "torch": "pip install torch  (CPU build: pip install torch --index-url "
                         "https://download.pytorch.org/whl/cpu)"}


def installed(backend):
    return importlib.util.find_spec(backend) is not None


def has_accelerator():
    return any(pathlib.Path(p).exists() for p in ACCELERATOR_DEVICES)


def configured(environ=None):
    """(backend, where) the user chose: ``KERAS_BACKEND``, or ``keras.json`` naming a backend other than
    Keras' default ``tensorflow`` (Keras writes that file itself on first import); else (None, None)."""
    environ = os.environ if environ is None else environ
    if environ.get("KERAS_BACKEND"):
        return environ["KERAS_BACKEND"], "KERAS_BACKEND"
    path = pathlib.Path(environ.get("KERAS_HOME") or pathlib.Path.home() / ".keras") / "keras.json"
    try:
        backend = json.loads(path.read_text()).get("backend")
    except (OSError, ValueError, AttributeError):
        return None, None
    return (backend, str(path)) if backend and backend != "tensorflow" else (None, None)


def choose(requested="auto", environ=None):
    """(backend, reason). Raises ValueError naming ``--backend`` for a backend that cannot run here."""
    if requested != "auto" and requested not in BACKENDS:
        raise ValueError(f"Invalid --backend {requested!r}: allowed auto, {', '.join(BACKENDS)}.")
    if "keras" in sys.modules:  # in-process use (tests, notebooks): Keras' backend is fixed already
        import keras

        current = keras.backend.backend()
        if requested not in ("auto", current):
            raise ValueError(f"--backend {requested}: Keras is already imported with backend {current} in this "
                             f"process; set KERAS_BACKEND={requested} before Python starts.")
        return current, "Keras already imported"
    if requested != "auto":
        if not installed(requested):
            raise ValueError(f"--backend {requested}: {requested} is not installed ({INSTALL_HINT[requested]}).")
        return requested, "--backend"
    backend, where = configured(environ)
    if backend:
        return backend, f"set by {where}"
    accelerator = has_accelerator()
    for backend in BACKENDS if accelerator else CPU_FASTEST_FIRST:
        if installed(backend):
            return backend, ("accelerator found: Keras' default order (speed measured on CPU only)" if accelerator
                             else "fastest installed on this CPU (BENCHMARKS.md, Training speed)")
    raise ValueError("No Keras backend is installed: install one of tensorflow, jax, torch.")


def select(requested="auto", environ=None):
    """Choose, set ``KERAS_BACKEND`` for Keras to read when it loads, print the choice; the backend."""
    backend, reason = choose(requested, environ)
    (os.environ if environ is None else environ)["KERAS_BACKEND"] = backend
    print(f"[backend] {backend} ({reason}; --backend or KERAS_BACKEND to choose)", flush=True)
    return backend


def xla_flags_for_remat(backend, remat, environ=None, *, accelerator=None):
    """On JAX with ``remat`` and no accelerator: add ``XLA_CPU_REMAT_FLAGS`` to ``XLA_FLAGS``, each unless the
    user set that flag (theirs wins), so that remat saves memory on the CPU. The line to print, or None. XLA
    reads them when JAX starts its CPU client: where that happened already, the line says how to set them."""
    environ = os.environ if environ is None else environ
    accelerator = has_accelerator() if accelerator is None else accelerator
    flags = environ.get("XLA_FLAGS", "")
    added = [f"{name}={value}" for name, value in XLA_CPU_REMAT_FLAGS.items() if name not in flags]
    if backend != "jax" or not remat or accelerator or not added:
        return None
    bridge = sys.modules.get("jax._src.xla_bridge")
    if bridge is not None and getattr(bridge, "_backends", None):
        return (f"[remat] warning: JAX has started already, so XLA's CPU compile undoes remat (no memory saved); set "
                f"XLA_FLAGS=\"{' '.join(added)}\" before Python starts")
    environ["XLA_FLAGS"] = " ".join([flags, *added]).strip()
    return (f"[remat] XLA_FLAGS += {' '.join(added)} (XLA's CPU compile would merge the recomputation back into the "
            f"forward pass and keep the activations; set these flags yourself to choose)")
