"""SavedModel export in TF Serving layout (``saved_models/<name>/<version>/``), preprocessing inside.

``export_saved_model(model, ...)`` exports a Keras classifier; ``export_run(run_dir, ...)`` exports a
training run directory; the CLI is ``keras-preact-export RUN_DIR``. SavedModels need TensorFlow: without
it, importing this package works and using it raises one ImportError saying so.
"""

import importlib.util

__all__ = ["OUTPUTS", "SIGNATURES", "export_run", "export_saved_model", "next_version", "read_run_config"]
MISSING_TENSORFLOW = "keras_preact.export writes TensorFlow SavedModels and needs TensorFlow: pip install tensorflow"

if importlib.util.find_spec("tensorflow") is not None:
    from keras_preact.export.run import export_run, read_run_config
    from keras_preact.export.saved_model import OUTPUTS, SIGNATURES, export_saved_model, next_version
else:

    def __getattr__(name):
        if name in __all__:
            raise ImportError(MISSING_TENSORFLOW)
        raise AttributeError(f"module 'keras_preact.export' has no attribute {name!r}")
