"""A command's start: TensorFlow's C++ start-up log lines hidden unless asked, then the command.

TensorFlow writes C++ log lines to stderr while it loads (the oneDNN note, "Could not find cuda drivers",
cuDNN/cuBLAS factory registration, "failed call to cuInit" on a machine without a GPU). They are not the
run's output. ``TF_CPP_MIN_LOG_LEVEL`` is their switch (0 all, 1 no INFO, 2 no WARNING, 3 no ERROR), but
TensorFlow 2.19+ writes the lines logged before ``absl::InitializeLog()`` regardless of it
(tensorflow/tensorflow#100442). So ``quiet_tensorflow_start_up`` sets the level unless the user has
(``os.environ.setdefault``: a user's own value wins, 0 shows everything), loads TensorFlow with stderr
caught, and writes back every caught line except C++ log lines below the level.

Standard library only, and it imports nothing of ``training``: the console scripts (``keras_preact_training.console``,
``keras_preact_training.cli``, the serving app's) and ``python -m training.<command>`` call it before anything loads
Keras, and import their command only after (``run_module``).
"""

import importlib
import importlib.util
import os
import re
import sys
import tempfile

DEFAULT_LOG_LEVEL = "3"  # hides INFO, WARNING and ERROR start-up lines; FATAL ones still show
SEVERITIES = "IWEF"  # absl's letters, in TF_CPP_MIN_LOG_LEVEL's order
_LOG_LINE = re.compile(
    rb"^(?:(?P<absl>[IWEF])\d{4} [\d:.]+\s+\d+ \S+:\d+\]"  # absl: I0000 00:00:1795.07 28727 port.cc:153]
    rb"|\d{4}-\d\d-\d\d [\d:.]+: (?P<tsl>[IWEF]) \S+:\d+\])"  # tsl: 2025-09-17 14:44:05.15: I a/b.cc:32]
)
_ABSL_NOTE = b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"


def log_level():
    """The ``TF_CPP_MIN_LOG_LEVEL`` in force (0 when unset or not a number, as TensorFlow reads it)."""
    value = os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0")
    return int(value) if value.isdigit() else 0


def drop_start_up_lines(text, level):
    """``text`` (bytes) without the C++ log lines below ``level`` (absl's note about them too, unless
    ``level`` is 0); every other line is kept as it was."""
    kept = []
    for line in text.splitlines(keepends=True):
        match = _LOG_LINE.match(line)
        if match:
            severity = SEVERITIES.index((match["absl"] or match["tsl"]).decode())
        elif line.rstrip() == _ABSL_NOTE:  # a note about the lines: shown with all of them only
            severity = 0
        else:
            severity = len(SEVERITIES)
        if severity >= level:
            kept.append(line)
    return b"".join(kept)


def quiet_tensorflow_start_up(load_tensorflow=True):
    """Set ``TF_CPP_MIN_LOG_LEVEL`` unless set, then load Keras (and TensorFlow when installed and
    ``load_tensorflow``; Keras loads it anyway on its TensorFlow backend) with stderr caught; the caught
    lines go back to stderr less TensorFlow's C++ lines below the level. Call it before anything imports
    Keras; once Keras is loaded it only sets the level."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", DEFAULT_LOG_LEVEL)
    if "keras" in sys.modules or "tensorflow" in sys.modules:
        return
    sys.stderr.flush()
    original = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            if load_tensorflow and importlib.util.find_spec("tensorflow") is not None:
                import tensorflow  # noqa: F401
            import keras  # noqa: F401
        finally:
            sys.stderr.flush()
            os.dup2(original, 2)
            os.close(original)
            caught.seek(0)
            sys.stderr.buffer.write(drop_start_up_lines(caught.read(), log_level()))
            sys.stderr.flush()


def start_command(prog, argv=None):
    """A model-loading command's start (export, evaluate, serve): its Keras backend chosen
    (``backends.for_command``: without TensorFlow, the run's) and said in one line, then the quiet start.
    None, or the exit status 2 after one line when no backend is installed."""
    from . import backends  # standard library only

    argv = sys.argv[1:] if argv is None else argv
    try:
        line = backends.for_command(prog, argv)
    except ValueError as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 2
    if line:
        print(line, file=sys.stderr, flush=True)
    quiet_tensorflow_start_up()
    return None


def run_module(name, argv=None):
    """``python -m training.<command>`` (evaluate, export, reproduce, publish): the same start as the
    console scripts, then ``main`` of the module ``name`` (its full name, e.g. ``"keras_preact_training.evaluate"``).
    Each command calls it first, in its ``if __name__ == "__main__"`` block, before it imports Keras."""
    status = start_command(f"python -m {name}", argv)
    if status is not None:
        return status
    return importlib.import_module(name).main(argv)
