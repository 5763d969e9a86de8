"""Which Keras backend a command runs on, decided before Keras is imported: Keras' own choice.

Keras reads ``KERAS_BACKEND``, else ``backend`` in ``~/.keras/keras.json`` (``$KERAS_HOME``), else uses
TensorFlow; ``keras-preact-train`` follows it, and ``--backend NAME`` overrides it for one run. Nothing is
measured and no process is started to decide unless asked: ``keras-preact-train --measure-backends`` times the
installed backends on a run's model (``keras_preact_training.backend_probe``) and says how to set the fastest;
``--backend fastest`` times them, then trains on the fastest.
The commands that load a model (export, evaluate, serve) take, where TensorFlow is missing and nothing is
configured, the backend the run recorded (``for_command``). The library never changes the backend.
This module imports nothing but the standard library, so it runs before Keras loads.

Examples::

    keras-preact-train --depth 56        # [backend] tensorflow (Keras' default; ...)
    KERAS_BACKEND=jax keras-preact-train # [backend] jax (set by KERAS_BACKEND; ...)
    backends.choose(None, {"KERAS_BACKEND": "torch"})   # ("torch", "set by KERAS_BACKEND")
"""

import importlib.util
import json
import os
import pathlib
import sys

BACKENDS = ("tensorflow", "jax", "torch")
QUICKEST_IMPORT_FIRST = ("torch", "jax", "tensorflow")  # without TensorFlow and a choice: Keras starts fastest on these
HOW_TO_CHOOSE = ("set KERAS_BACKEND or \"backend\" in ~/.keras/keras.json to choose, or --backend for one run; "
                 "keras-preact-train --measure-backends times them")
ACCELERATOR_DEVICES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd", "/dev/accel0")
# XLA's CPU compiler undoes rematerialisation: it drops jax.checkpoint's optimization barriers, so its
# common-subexpression elimination merges the recomputation back into the forward pass, and its default
# (concurrency-optimized) schedule keeps the activations alive anyway. With CSE off and the memory-minimizing
# schedule, the compiled step keeps the recomputation and about half the memory (docs/training.md, "Training the
# deepest networks on one device"; BENCHMARKS.md, "Rematerialisation"). Both are flags of XLA's CPU compile only: not
# set where an accelerator is present, where remat works as compiled (CSE off would slow its step).
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


def _names_tensorflow(path):
    try:
        return json.loads(pathlib.Path(path).read_text()).get("backend") == "tensorflow"
    except (OSError, ValueError, AttributeError):
        return False


def keras_choice(environ=None):
    """(backend, reason): the backend Keras itself loads, read as Keras reads it (``KERAS_BACKEND``, else
    ``keras.json``'s ``backend``, else its default ``tensorflow``), nothing imported. Where nothing is
    configured and TensorFlow is not installed (Keras would fail to load), the first installed of
    ``QUICKEST_IMPORT_FIRST`` instead, said in the reason. ValueError when no backend is installed."""
    environ = os.environ if environ is None else environ
    backend, where = configured(environ)
    if backend:
        return backend, f"set by {where}"
    path = pathlib.Path(environ.get("KERAS_HOME") or pathlib.Path.home() / ".keras") / "keras.json"
    if installed("tensorflow"):
        return "tensorflow", f"set by {path}" if _names_tensorflow(path) else "Keras' default"
        return "tensorflow", "Keras' default"
    backend = next((b for b in QUICKEST_IMPORT_FIRST if installed(b)), None)
    if backend is None:
        raise ValueError("No Keras backend is installed: install one of tensorflow, jax, torch.")
    return backend, "installed; TensorFlow, Keras' default, is not"


def choose(requested=None, environ=None, reason="--backend"):
    """(backend, reason): ``requested`` (``--backend``) when given, else Keras' own choice (``keras_choice``).
    Nothing is measured (``keras-preact-train --measure-backends`` does, when asked). Raises ValueError
    naming ``--backend`` for a backend that cannot run here."""
    if requested is not None and requested not in BACKENDS:
        raise ValueError(f"Invalid --backend {requested!r}: allowed {', '.join(BACKENDS)}.")
    if "keras" in sys.modules:  # in-process use (tests, notebooks): Keras' backend is fixed already
        import keras

        current = keras.backend.backend()
        if requested not in (None, current):
            raise ValueError(f"--backend {requested}: Keras is already imported with backend {current} in this "
                             f"process; set KERAS_BACKEND={requested} before Python starts.")
        return current, "Keras already imported"
    if requested is not None:
        if not installed(requested):
            raise ValueError(f"--backend {requested}: {requested} is not installed ({INSTALL_HINT[requested]}).")
        return requested, reason
    return keras_choice(environ)


def select(requested=None, environ=None, reason="--backend"):
    """Choose (``choose``), set ``KERAS_BACKEND`` for Keras to read when it loads, print the choice in one
    line; the backend. ``reason``: what chose ``requested``. Example: ``select()`` (Keras' choice),
    ``select("jax")``."""
    backend, reason = choose(requested, environ, reason)
    (os.environ if environ is None else environ)["KERAS_BACKEND"] = backend
    print(f"[backend] {backend} ({reason}; {HOW_TO_CHOOSE})", flush=True)
    return backend


def recorded_backend(argv):
    """(backend, config.json path) a run records (``keras_backend``), for the first argument of ``argv`` that
    is a run directory or a ``.keras`` file in one; (None, None) when none is."""
    for word in argv:
        if word.startswith("-"):
            continue
        path = pathlib.Path(word)
        config = path / "config.json" if path.is_dir() else path.parent / "config.json"
        if path.suffix != ".keras" and not path.is_dir():
            continue
        try:
            backend = json.loads(config.read_text()).get("keras_backend")
        except (OSError, ValueError, AttributeError):
            continue
        if backend in BACKENDS:
            return backend, config
    return None, None


def for_command(prog, argv, environ=None):
    """The backend of a command that loads a model (export, evaluate, serve), set in ``KERAS_BACKEND``
    before Keras loads; returns the line saying so, or None when the user's choice (``KERAS_BACKEND``,
    ``keras.json``) or Keras' default (TensorFlow, installed) stands. Without TensorFlow, the run's own
    backend (``config.json``'s ``keras_backend``, when installed), else the first installed of
    ``QUICKEST_IMPORT_FIRST``. ValueError (one line: what to install) when no backend is installed."""
    environ = os.environ if environ is None else environ
    if configured(environ)[0] is not None or installed("tensorflow"):
        return None
    recorded, config = recorded_backend(argv)
    if recorded is not None and installed(recorded):
        backend, reason = recorded, f"the run's, recorded in {config}"
    else:
        backend = next((b for b in QUICKEST_IMPORT_FIRST if installed(b)), None)
        reason = "installed" + (f"; the run's {recorded} is not" if recorded else "")
    if backend is None:
        raise ValueError(f"{prog} needs a Keras backend and none is installed: pip install torch, "
                         'pip install "jax[cpu]" or pip install tensorflow')
    environ["KERAS_BACKEND"] = backend
    return (f"[backend] {backend} ({reason}; TensorFlow, Keras' default, is not installed; set KERAS_BACKEND to "
            "choose)")


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
