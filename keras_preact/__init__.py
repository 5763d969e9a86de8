"""keras-preact: pre-activation residual networks (He et al., ECCV 2016) for Keras 3.

``layers`` (the residual unit and the paper's design tables) -> ``models`` (backbone, classifier,
registry) -> ``applications`` (keras.applications-style entry points) -> ``export``. The apps beside
the library, ``keras_preact_training`` and ``keras_preact_serving`` (which serves what ``export`` writes),
import it; it imports neither.

Examples:
    >>> import keras_preact
    >>> model = keras_preact.models.create_model("cifar_resnet20")  # the paper's ResNet-20 for CIFAR-10
    >>> model.count_params()
    271098
"""

try:
    import keras  # noqa: F401  (Keras imports its backend here)
except ModuleNotFoundError as error:
    if error.name not in ("tensorflow", "jax", "torch"):
        raise
    import importlib.util

    def _installed(name):
        try:
            return importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            return False

    others = [name for name in ("jax", "torch", "tensorflow") if _installed(name)]
    raise ImportError(
        f"keras-preact needs a Keras backend: Keras is set to {error.name} (KERAS_BACKEND, else keras.json, else "
        f"TensorFlow), which is not installed: "
        + (f"set KERAS_BACKEND={others[0]} (installed)" if others else
           'install one: pip install torch, pip install "jax[cpu]" or pip install tensorflow')
    ) from None

from keras_preact import layers, models  # noqa: E402

__version__ = "0.1.0"

__all__ = ["layers", "models", "__version__"]
