"""SavedModel export in TF Serving layout (``saved_models/<name>/<version>/``), preprocessing inside.

``export_saved_model(model, ...)`` exports a Keras classifier; ``export_run(run_dir, ...)`` exports a
training run directory; the CLI is ``keras-preact-export RUN_DIR``.
"""

import importlib.util

if importlib.util.find_spec("tensorflow") is None:
    raise ImportError(
        "keras_preact.export writes TensorFlow SavedModels and needs TensorFlow: pip install tensorflow"
    )

from keras_preact.export.run import export_run, read_run_config  # noqa: E402
from keras_preact.export.saved_model import OUTPUTS  # noqa: E402, SIGNATURES, export_saved_model, next_version

__all__ = ["OUTPUTS", "SIGNATURES", "export_run", "export_saved_model", "next_version", "read_run_config"]
