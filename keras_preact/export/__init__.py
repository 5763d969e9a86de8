"""SavedModel export in TF Serving layout (``saved_models/<name>/<version>/``), preprocessing inside.

``export_saved_model(model, ...)`` exports a Keras classifier; ``export_run(run_dir, ...)`` exports a
training run directory; the CLI is ``keras-preact-export RUN_DIR``.
"""

from keras_preact.export.run import export_run, read_run_config
from keras_preact.export.saved_model import OUTPUTS, SIGNATURES, export_saved_model, next_version

__all__ = ["OUTPUTS", "SIGNATURES", "export_run", "export_saved_model", "next_version", "read_run_config"]
