"""The serving app (import name ``keras_preact_serving``, from the folder ``serving/``) beside the model library, as
the training app is; nothing in ``keras_preact`` imports it."""

import importlib
import sys

# What each console script says, in one line, when a package it needs is missing.
_SERVE_HINT = 'serving needs Starlette and uvicorn: pip install "keras-preact[serve]"'
_METRICS_HINT = 'serving needs prometheus_client for its metrics: pip install "keras-preact[serve]"'
_RAY_HINT = 'serving on Ray needs Ray Serve: pip install "keras-preact[ray]"'
_INSTALL_HINTS = {
    "keras-preact-serve": {"starlette": _SERVE_HINT, "uvicorn": _SERVE_HINT, "h11": _SERVE_HINT,
                           "prometheus_client": _METRICS_HINT,
                           "yaml": 'serving needs PyYAML for its OpenAPI document: pip install "keras-preact[serve]"'},
    "keras-preact-serve-ray": {"ray": _RAY_HINT, "starlette": _RAY_HINT, "prometheus_client": _RAY_HINT}}


def missing_extra(prog):
    """The one line naming what to install when a package ``prog`` needs is missing (None when all are
    there), found without importing anything: before Keras and TensorFlow load."""
    import importlib.util

    for module, hint in _INSTALL_HINTS[prog].items():
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            return f"{prog}: error: {hint}"
    return None


GRPC_MODULES = ("grpc", "tritonclient")  # what --grpc-port needs (TF Serving's API: TensorFlow too)


def missing_grpc():
    """What ``--grpc-port`` lacks, in one line (None when grpcio and tritonclient are installed), found without
    importing anything."""
    import importlib.util

    missing = [name for name in GRPC_MODULES if importlib.util.find_spec(name) is None]
    if not missing:
        return None
    return (f"--grpc-port (Triton's gRPC API; TF Serving's too with TensorFlow) needs grpcio and tritonclient; not "
            f"installed: {', '.join(missing)}. Install them with: pip install 'keras-preact[grpc]' (without "
            "TensorFlow: 'keras-preact[triton-grpc]')")


def _run(prog, module, argv):
    """``keras_preact_serving.<module>.main(argv)``; exit status 2 and one line naming what to install if it cannot
    import."""
    try:
        command = importlib.import_module(f"keras_preact_serving.{module}")
    except ImportError as error:
        hint = _INSTALL_HINTS[prog].get((error.name or "").split(".")[0])
        if hint is None:
            raise
        print(f"{prog}: error: {hint}", file=sys.stderr)
        return 2
    return command.main(argv)


def main(argv=None):
    """The ``keras-preact-serve`` console script."""
    return _run("keras-preact-serve", "server", argv)


def main_ray(argv=None):
    """The ``keras-preact-serve-ray`` console script."""
    return _run("keras-preact-serve-ray", "ray_serve", argv)
