"""The training app's launcher: TensorFlow's start-up settings, made before Keras loads, by every console script.

``launch`` sets, each only where the user has not (``os.environ.setdefault``: a user's own value wins):

- ``TF_CPP_MIN_LOG_LEVEL=3``: TensorFlow's C++ log below FATAL is not written (0 writes everything);
- ``TF_ENABLE_ONEDNN_OPTS=1``: TensorFlow's oneDNN CPU kernels on. TensorFlow turns them on by itself only on
  CPUs with AVX-512/VNNI/AMX; on an AVX2-only CPU they make a CIFAR ResNet-20 training step about 1.6x faster
  with results equal to float32 round-off (``benchmarks/tf_onednn.py``; docs/training.md);
  ``TF_ENABLE_ONEDNN_OPTS=0`` keeps TensorFlow's default;
- the Python loggers ``tensorflow`` (``tf.get_logger()``) and ``absl`` at ERROR, unless
  ``TF_CPP_MIN_LOG_LEVEL`` is 0.

Nothing else is hidden: a few lines TensorFlow 2.19+ logs while its shared libraries load, before
``absl::InitializeLog()`` (the note saying so, ``cudart_stub.cc`` "Could not find cuda drivers", and with oneDNN on
``port.cc`` "oneDNN custom operations are on"), ignore ``TF_CPP_MIN_LOG_LEVEL`` (tensorflow/tensorflow#100442)
and still reach stderr. Standard library only, importing nothing of the app: the console scripts call it first.
"""

import logging
import os
import sys

DEFAULT_LOG_LEVEL = "3"  # TF_CPP_MIN_LOG_LEVEL: INFO, WARNING and ERROR start-up lines not written; FATAL ones are
DEFAULTS = {"TF_CPP_MIN_LOG_LEVEL": DEFAULT_LOG_LEVEL, "TF_ENABLE_ONEDNN_OPTS": "1"}


def log_level(environ=None):
    """The ``TF_CPP_MIN_LOG_LEVEL`` in force (0 when unset or not a number, as TensorFlow reads it)."""
    value = (os.environ if environ is None else environ).get("TF_CPP_MIN_LOG_LEVEL", "0")
    return int(value) if value.isdigit() else 0


def launch(environ=None):
    """Set ``DEFAULTS`` in ``environ`` (``os.environ``) where unset, and TensorFlow's and absl's Python loggers to
    ERROR unless the level is 0. Call it before Keras loads: TensorFlow reads the variables when it loads.

    Example: ``launch(); import keras`` (TensorFlow's INFO start-up lines after absl's start are not written)."""
    environ = os.environ if environ is None else environ
    for name, value in DEFAULTS.items():
        environ.setdefault(name, value)
    if log_level(environ) > 0:
        for name in ("tensorflow", "absl"):
            logging.getLogger(name).setLevel(logging.ERROR)


def start_command(prog, argv=None):
    """A model-loading command's start (export, evaluate): its Keras backend chosen (``backends.for_command``:
    without TensorFlow, the run's) and said in one line, then ``launch``. None, or the exit status 2 after one
    line when no backend is installed."""
    from . import backends  # standard library only

    argv = sys.argv[1:] if argv is None else argv
    try:
        line = backends.for_command(prog, argv)
    except ValueError as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 2
    if line:
        print(line, file=sys.stderr, flush=True)
    launch()
    return None
