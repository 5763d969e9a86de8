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

from keras_preact import layers, models

__version__ = "0.1.0"

__all__ = ["layers", "models", "__version__"]
