"""Export a classifier: SavedModel (TF Serving layout), ONNX, LiteRT and OpenVINO, in one version directory.

``export_model(model, "saved_models", formats=("saved_model", "onnx"))`` writes
``saved_models/<name>/<version>/`` (``keras_preact.export.formats``); ``load(version_dir, "onnx")`` runs
an export in its own runtime (``keras_preact.export.runtimes``). ``export_saved_model`` is
``export_model`` with the SavedModel alone. What every format serves is one ``ServingContract``
(``keras_preact.export.contract``: input, normalisation, top-k, output names and order). Importing this
package needs no TensorFlow; the SavedModel's own names (``OUTPUTS``, ``SIGNATURES``) raise one ImportError
saying so when TensorFlow is missing, and each format, the SavedModel's included, says what it needs.
"""

import importlib.util

from keras_preact.export.contract import INPUT_NAME, OUTPUT_NAMES, ServingContract
from keras_preact.export.formats import FORMATS, check_formats, export_model, export_saved_model, serving_model
from keras_preact.export.runtimes import RUNTIMES, load
from keras_preact.export.version_dir import next_version

_SAVED_MODEL = ["OUTPUTS", "SIGNATURES"]
__all__ = ["FORMATS", "INPUT_NAME", "OUTPUT_NAMES", "RUNTIMES", "ServingContract", "check_formats", "export_model", "load",
           "next_version", "serving_model", "OUTPUTS", "SIGNATURES", "export_saved_model"]
MISSING_TENSORFLOW = "keras_preact.export writes TensorFlow SavedModels and needs TensorFlow: pip install tensorflow"

if importlib.util.find_spec("tensorflow") is not None:
    from keras_preact.export.saved_model import OUTPUTS, SIGNATURES
else:

    def __getattr__(name):
        if name in _SAVED_MODEL:
            raise ImportError(MISSING_TENSORFLOW)
        raise AttributeError(f"module 'keras_preact.export' has no attribute {name!r}")
