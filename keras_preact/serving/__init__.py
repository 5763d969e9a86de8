"""A local server with TF Serving's REST API for exported SavedModels (``keras-preact-serve``), and the
same API from Ray Serve replicas (``keras-preact-serve-ray``)."""

import sys

# What each serving command says, in one line, when a package it needs is missing.
_INSTALL_HINTS = {
    "tensorflow": "serving SavedModels needs TensorFlow: pip install tensorflow",
    "ray": 'serving on Ray needs Ray Serve: pip install "keras-preact[ray]"',
    "starlette": 'serving on Ray needs Ray Serve: pip install "keras-preact[ray]"',
}


def main(argv=None):
    """The ``keras-preact-serve`` console script: without TensorFlow, one line says what to install."""
    try:
        from keras_preact.serving import server
    except ImportError as error:
        if "tensorflow" not in str(error).lower():
            raise
        print(f"keras-preact-serve: error: {_INSTALL_HINTS['tensorflow']}", file=sys.stderr)
        return 2
    return server.main(argv)


def main_ray(argv=None):
    """The ``keras-preact-serve-ray`` console script: without Ray Serve or TensorFlow, one line says what
    to install."""
    try:
        from keras_preact.serving import ray_serve
    except ImportError as error:
        hint = _INSTALL_HINTS.get((error.name or "").split(".")[0])
        if hint is None:
            raise
        print(f"keras-preact-serve-ray: error: {hint}", file=sys.stderr)
        return 2
    return ray_serve.main(argv)
