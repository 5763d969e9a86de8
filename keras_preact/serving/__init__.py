"""A local server with TF Serving's REST API for exported SavedModels (``keras-preact-serve``)."""

import sys


def main(argv=None):
    """The ``keras-preact-serve`` console script: without TensorFlow, one line says what to install."""
    try:
        from keras_preact.serving import server
    except ImportError as error:
        if "tensorflow" not in str(error).lower():
            raise
        print("keras-preact-serve: error: serving SavedModels needs TensorFlow: pip install tensorflow",
              file=sys.stderr)
        return 2
    return server.main(argv)
