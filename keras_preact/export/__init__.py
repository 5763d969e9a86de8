"""Export a classifier: SavedModel (TF Serving layout), ONNX, LiteRT and OpenVINO, in one version directory.

``export_model(model, "saved_models", formats=("saved_model", "onnx"))`` writes
``saved_models/<name>/<version>/`` (``keras_preact.export.formats``); ``load(version_dir, "onnx")`` runs
an export in its own runtime (``keras_preact.export.runtimes``). ``export_saved_model`` is
``export_model`` with the SavedModel alone. What every format serves is one ``ServingContract``
(``keras_preact.export.contract``: input, normalisation, top-k, output names and order). Importing this
package needs no TensorFlow; each format, the SavedModel's included, says in one line what it needs
(``keras_preact.export.saved_model``, the SavedModel's signatures, imports TensorFlow itself).

Examples:
    >>> from keras_preact.export import FORMATS, OUTPUT_NAMES
    >>> list(FORMATS), OUTPUT_NAMES
    (['saved_model', 'onnx', 'litert', 'openvino'], ('probabilities', 'scores', 'classes'))
    >>> FORMATS["onnx"].install  # what each format needs installed
    'pip install "keras-preact[onnx]"'
"""

from keras_preact.export.contract import INPUT_NAME, OUTPUT_NAMES, ServingContract
from keras_preact.export.exporting import export_model, export_saved_model
from keras_preact.export.formats import FORMATS, check_formats, serving_model
from keras_preact.export.runtimes import RUNTIMES, load
from keras_preact.export.version_dir import next_version

__all__ = [
    "FORMATS",
    "INPUT_NAME",
    "OUTPUT_NAMES",
    "RUNTIMES",
    "ServingContract",
    "check_formats",
    "export_model",
    "load",
    "next_version",
    "serving_model",
    "export_saved_model",
]
