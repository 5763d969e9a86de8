"""A local server with TF Serving's REST API for exported models (``keras-preact-serve``), and the
same API from Ray Serve replicas (``keras-preact-serve-ray``)."""

import sys

# What keras-preact-serve-ray says, in one line, when a package it needs is missing.
_INSTALL_HINTS = {
    "ray": 'serving on Ray needs Ray Serve: pip install "keras-preact[ray]"',
    "starlette": 'serving on Ray needs Ray Serve: pip install "keras-preact[ray]"',
}


def main(argv=None):
    """The ``keras-preact-serve`` console script. It needs no TensorFlow to start: a version whose
    exports have no runtime installed is refused in one line naming what to install."""
    from keras_preact.serving import server

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
