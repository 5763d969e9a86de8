"""The serving app's launcher: the same start as the training app's (``keras_preact_training.machine.start_up``),
kept here so that serving imports nothing of the training app. Standard library only: the console scripts call
it before Keras loads.

``launch`` sets, each only where the user has not: ``TF_CPP_MIN_LOG_LEVEL=3`` (TensorFlow's C++ log below FATAL
not written), ``TF_ENABLE_ONEDNN_OPTS=1`` (TensorFlow's oneDNN CPU kernels, which it turns on by itself only on
CPUs with AVX-512/VNNI/AMX), and the ``tensorflow`` and ``absl`` Python loggers at ERROR unless the level is 0.
The Keras backend is Keras' own choice (``KERAS_BACKEND``, ``keras.json``); only where nothing is configured and
TensorFlow, Keras' default, is not installed does ``start_command`` pick an installed one and say so.
"""

import importlib.util
import json
import logging
import os
import pathlib
import sys

DEFAULTS = {"TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "1"}
QUICKEST_IMPORT_FIRST = ("torch", "jax")  # without TensorFlow and a choice: Keras starts fastest on these


def _installed(name):
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def launch(environ=None):
    """Set ``DEFAULTS`` in ``environ`` (``os.environ``) where unset, and TensorFlow's and absl's Python loggers to
    ERROR unless ``TF_CPP_MIN_LOG_LEVEL`` is 0. Example: ``launch(); import keras``."""
    environ = os.environ if environ is None else environ
    for name, value in DEFAULTS.items():
        environ.setdefault(name, value)
    level = environ["TF_CPP_MIN_LOG_LEVEL"]
    if not level.isdigit() or int(level) > 0:
        for name in ("tensorflow", "absl"):
            logging.getLogger(name).setLevel(logging.ERROR)


def _configured(environ):
    if environ.get("KERAS_BACKEND"):
        return environ["KERAS_BACKEND"]
    path = pathlib.Path(environ.get("KERAS_HOME") or pathlib.Path.home() / ".keras") / "keras.json"
    try:
        return json.loads(path.read_text()).get("backend")
    except (OSError, ValueError, AttributeError):
        return None


def start_command(prog, argv=None, environ=None):
    """The start of ``keras-preact-serve``/``-serve-ray``: where no backend is configured and TensorFlow is not
    installed, the first installed of ``QUICKEST_IMPORT_FIRST`` in ``KERAS_BACKEND`` (one line says so), then
    ``launch``. None, or the exit status 2 after one line when no backend is installed."""
    environ = os.environ if environ is None else environ
    if not _configured(environ) and not _installed("tensorflow"):
        backend = next((b for b in QUICKEST_IMPORT_FIRST if _installed(b)), None)
        if backend is None:
            print(f'{prog}: error: {prog} needs a Keras backend and none is installed: pip install torch, pip install '
                  '"jax[cpu]" or pip install tensorflow', file=sys.stderr)
            return 2
        environ["KERAS_BACKEND"] = backend
        print(f"[backend] {backend} (installed; TensorFlow, Keras' default, is not installed; set KERAS_BACKEND to "
              "choose)", file=sys.stderr, flush=True)
    launch(environ)
    return None
