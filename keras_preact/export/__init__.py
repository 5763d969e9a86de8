"""SavedModel export in TF Serving layout (``saved_models/<name>/<version>/``), preprocessing inside.

``export_saved_model(model, ...)`` exports a Keras classifier (a training run directory is exported by
the training app: ``keras-preact-export RUN_DIR``). SavedModels need TensorFlow: without it, importing
this package works and using it raises one ImportError saying so.
"""

import importlib.util

__all__ = ["OUTPUTS", "SIGNATURES", "export_saved_model", "next_version"]
MISSING_TENSORFLOW = "keras_preact.export writes TensorFlow SavedModels and needs TensorFlow: pip install tensorflow"

if importlib.util.find_spec("tensorflow") is not None:
    from keras_preact.export.saved_model import OUTPUTS, SIGNATURES, export_saved_model, next_version
else:

    def __getattr__(name):
        if name in __all__:
            raise ImportError(MISSING_TENSORFLOW)
        raise AttributeError(f"module 'keras_preact.export' has no attribute {name!r}")
