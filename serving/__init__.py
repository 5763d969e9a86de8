"""The serving app beside the model library, as ``training`` is: TF Serving's REST and gRPC APIs and
KServe's Open Inference Protocol for the exports ``keras_preact.export`` writes (``keras-preact-serve``,
``keras-preact-serve-ray``; extras ``[serve]``, ``[grpc]``, ``[ray]``). Nothing in ``keras_preact`` imports it.
"""

import sys

# What each console script says, in one line, when a package it needs is missing.
_SERVE_HINT = 'serving needs Starlette and uvicorn: pip install "keras-preact[serve]"'
_METRICS_HINT = 'serving needs prometheus_client for its metrics: pip install "keras-preact[serve]"'
_RAY_HINT = 'serving on Ray needs Ray Serve: pip install "keras-preact[ray]"'
_INSTALL_HINTS = {
    "keras-preact-serve": {"starlette": _SERVE_HINT, "uvicorn": _SERVE_HINT, "h11": _SERVE_HINT,
                           "prometheus_client": _METRICS_HINT,
                           "yaml": 'serving needs PyYAML for its OpenAPI document: pip install "keras-preact[serve]"'},
    "keras-preact-serve-ray": {"ray": _RAY_HINT, "starlette": _RAY_HINT, "prometheus_client": _RAY_HINT},
}


def _missing(prog, error):
    """The install hint for the package ``error`` (an ImportError) names, printed; None if unknown."""
    hint = _INSTALL_HINTS[prog].get((error.name or "").split(".")[0])
    if hint is not None:
        print(f"{prog}: error: {hint}", file=sys.stderr)
    return hint


def main(argv=None):
    """The ``keras-preact-serve`` console script; without Starlette or uvicorn, one line says what to install."""
    try:
        from serving import server
    except ImportError as error:
        if _missing("keras-preact-serve", error) is None:
            raise
        return 2
    return server.main(argv)


def main_ray(argv=None):
    """The ``keras-preact-serve-ray`` console script; without Ray Serve, one line says what to install."""
    try:
        from serving import ray_serve
    except ImportError as error:
        if _missing("keras-preact-serve-ray", error) is None:
            raise
        return 2
    return ray_serve.main(argv)
