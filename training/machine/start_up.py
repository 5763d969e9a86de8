"""The training app's launcher: TensorFlow's start-up settings and the host allocator's, made before Keras loads,
by every console script.

``launch`` sets, each only where the user has not (``os.environ.setdefault``: a user's own value wins):

- ``TF_CPP_MIN_LOG_LEVEL=3``: TensorFlow's C++ log below FATAL is not written (0 writes everything);
- ``TF_ENABLE_ONEDNN_OPTS=1``: TensorFlow's oneDNN CPU kernels on. TensorFlow turns them on by itself only on
  CPUs with AVX-512/VNNI/AMX; on an AVX2-only CPU they make a CIFAR ResNet-20 training step about 1.6x faster
  with results equal to float32 round-off (``benchmarks/tf_onednn.py``; docs/training.md);
  ``TF_ENABLE_ONEDNN_OPTS=0`` keeps TensorFlow's default;
- the Python loggers ``tensorflow`` (``tf.get_logger()``) and ``absl`` at ERROR, unless
  ``TF_CPP_MIN_LOG_LEVEL`` is 0;
- ``OMP_WAIT_POLICY=PASSIVE`` (``waiting_threads``): PyTorch's OpenMP threads sleep when they run out of work
  instead of spinning for it. Spinning threads take the cores from each other (and from everything else) on a
  busy machine: a ResNet-8 PyTorch step took 2.6 s against 0.9 s passive beside four busy processes on 2 cores,
  and 0.8 s against 0.12 s on the quiet machine shared with others (docs/training.md, "PyTorch's threads"). Not
  made where the user set OpenMP's waiting (``OMP_WAIT_POLICY``, ``GOMP_SPINCOUNT``, ``KMP_BLOCKTIME``);
- glibc's ``malloc`` keeps freed activations for the next step (``keep_freed_memory``): ``M_MMAP_THRESHOLD`` 32 MiB
  (glibc's own ceiling for it) and ``M_TRIM_THRESHOLD`` 1 GiB. With glibc's defaults, a PyTorch step on the CPU
  gives its activations (a CIFAR ResNet-20's are up to 8 MiB each at batch 128) back to the kernel as they are
  freed and takes them again in the next step, page by page: about 20,000 page faults an evaluation batch, which
  then took 65-70 ms against 40 ms without them (AMD EPYC, 2 cores; BENCHMARKS.md). PyTorch's CPU tuning guide
  fixes the same with jemalloc or tcmalloc preloaded; this is glibc's own setting, made in the running process. Not
  made where the user set glibc's malloc variables (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``,
  ``GLIBC_TUNABLES``), preloads another allocator (``LD_PRELOAD``), or the C library is not glibc.

Nothing else is hidden: a few lines TensorFlow 2.19+ logs while its shared libraries load, before
``absl::InitializeLog()`` (the note saying so, ``cudart_stub.cc`` "Could not find cuda drivers", and with oneDNN on
``port.cc`` "oneDNN custom operations are on"), ignore ``TF_CPP_MIN_LOG_LEVEL`` (tensorflow/tensorflow#100442)
and still reach stderr, twice with TensorFlow 2.21 (two of its shared libraries log them). Standard library only,
importing nothing of the app: the console scripts call it first.
"""

import ctypes
import ctypes.util
import logging
import os
import sys

DEFAULT_LOG_LEVEL = "3"  # TF_CPP_MIN_LOG_LEVEL: INFO, WARNING and ERROR start-up lines not written; FATAL ones are
DEFAULTS = {"TF_CPP_MIN_LOG_LEVEL": DEFAULT_LOG_LEVEL, "TF_ENABLE_ONEDNN_OPTS": "1"}
# glibc mallopt() parameters (malloc.h) and the values keep_freed_memory sets.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MALLOC_SETTINGS = {M_MMAP_THRESHOLD: 32 << 20, M_TRIM_THRESHOLD: 1 << 30}
# The user's own allocator settings, which keep_freed_memory leaves alone.
ALLOCATOR_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES", "LD_PRELOAD")
# OpenMP's waiting (PyTorch's CPU threads): the standard variable, GNU's and Intel's own; a user's wins.
WAIT_POLICY_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")


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
    waiting_threads(environ)
    keep_freed_memory(environ)


def waiting_threads(environ=None):
    """``OMP_WAIT_POLICY=PASSIVE`` in ``environ`` (``os.environ``) unless the user set any of
    ``WAIT_POLICY_VARIABLES``: PyTorch's OpenMP threads sleep between parallel regions instead of spinning
    (module docstring). OpenMP reads it when PyTorch loads, so call it before. True where set.

    Example: ``waiting_threads(); import torch``."""
    environ = os.environ if environ is None else environ
    if any(environ.get(name) for name in WAIT_POLICY_VARIABLES):
        return False
    environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return True


def keep_freed_memory(environ=None):
    """Set glibc's ``MALLOC_SETTINGS`` in this process (module docstring): freed blocks under 32 MiB stay in the
    heap for the next allocation, and the heap's free top is kept up to 1 GiB. True where set; False where the
    user's ``ALLOCATOR_VARIABLES`` are set or the C library is not glibc (nothing changed).

    Example: ``keep_freed_memory()`` before a PyTorch training loop on the CPU."""
    environ = os.environ if environ is None else environ
    if any(environ.get(name) for name in ALLOCATOR_VARIABLES) or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return False
    if not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "mallopt"):  # glibc's own: musl has neither
        return False
    mallopt = libc.mallopt
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return all(mallopt(parameter, value) == 1 for parameter, value in MALLOC_SETTINGS.items())


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
