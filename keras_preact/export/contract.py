"""The serving contract, stated once: what every export of a classifier takes and returns.

Every format (the SavedModel, ONNX, LiteRT, OpenVINO) serves one function, ``ServingContract.serve``:

- input ``images``: RGB pixels ``[N, H, W, 3]`` at the model resolution (uint8; the SavedModel also
  takes float pixels and encoded images, ``saved_model.SIGNATURES``), N dynamic;
- inside, ``(pixels - mean) / std`` with the export's ``InputConfig`` (the normalisation the network
  was trained with; ``mean`` may be a per-pixel mean image), so clients send plain pixels;
- outputs, in ``output_names`` order: ``probabilities`` float32 ``[N, C]``, then the top ``k``, best
  first: ``scores`` float32 ``[N, k]`` and ``classes`` int32 ``[N, k]``. Where the class names are
  served (the SavedModel, keras-preact-serve), ``class_names`` string ``[N, k]`` follows.

``serve`` is written once over an ops namespace: ``keras.ops`` in the Keras model that ONNX, LiteRT and
OpenVINO are exported from (``formats.serving_model``), TensorFlow's ops inside the SavedModel's
``tf.function`` (TensorFlow on every Keras backend, ``saved_model.TF_OPS``).
"""

import dataclasses
import typing

import numpy as np

INPUT_NAME = "images"
OUTPUT_NAMES = ("probabilities", "scores", "classes")  # what every format returns, in this order
CLASS_NAMES_OUTPUT = "class_names"  # the names of ``classes``, where they are served
# Each output's dtype (as TF Serving's metadata names it) and its width: the number of classes or top_k.
OUTPUT_SPECS = {"probabilities": ("DT_FLOAT", "num_classes"), "scores": ("DT_FLOAT", "top_k"),
                "classes": ("DT_INT32", "top_k"), CLASS_NAMES_OUTPUT: ("DT_STRING", "top_k")}


@dataclasses.dataclass(frozen=True)
class ServingContract:
    """The contract of one export: its normalisation (``input_config``: input size, mean, std), ``top_k``
    and the order of its outputs (a permutation of ``OUTPUT_NAMES``).

    Examples:
        >>> from keras_preact.export import ServingContract
        >>> from keras_preact.models import get_input_config
        >>> contract = ServingContract(get_input_config("cifar_resnet20"), top_k=3)
        >>> contract.image_size, contract.output_names
        ((32, 32), ('probabilities', 'scores', 'classes'))
        >>> contract.output_dims(num_classes=10)  # as TF Serving's metadata states them
        {'probabilities': ('DT_FLOAT', [-1, 10]), 'scores': ('DT_FLOAT', [-1, 3]), 'classes': ('DT_INT32', [-1, 3]),
         'class_names': ('DT_STRING', [-1, 3])}
    """

    input_config: typing.Any  # keras_preact.preprocessing.InputConfig
    top_k: int
    output_names: tuple = OUTPUT_NAMES
    input_name: typing.ClassVar[str] = INPUT_NAME
    class_names_output: typing.ClassVar[str] = CLASS_NAMES_OUTPUT

    def __post_init__(self):
        if sorted(self.output_names) != sorted(OUTPUT_NAMES):
            raise ValueError(f"Invalid output_names={self.output_names!r}: expected an order of {OUTPUT_NAMES}.")

    @property
    def image_size(self):
        """``(height, width)`` of the pixels served."""
        return tuple(self.input_config.crop_size)

    @property
    def served_names(self):
        """Every output where class names are served: ``output_names``, then ``class_names_output``."""
        return (*self.output_names, self.class_names_output)

    def serve(self, model_fn, pixels, ops):
        """``{name: tensor}`` in ``output_names`` order for ``pixels`` (uint8 or float, 0-255 units), with
        ``ops`` providing ``cast(x, dtype)`` and ``top_k(x, k) -> (values, indices)``."""
        mean = np.asarray(self.input_config.mean, "float32")
        std = np.asarray(self.input_config.std, "float32")
        probabilities = ops.cast(model_fn((ops.cast(pixels, "float32") - mean) / std), "float32")
        scores, classes = ops.top_k(probabilities, self.top_k)
        outputs = {"probabilities": probabilities, "scores": scores, "classes": ops.cast(classes, "int32")}
        return {name: outputs[name] for name in self.output_names}

    def output_dims(self, num_classes):
        """``{name: (dtype, [-1, width])}`` for ``served_names``, as TF Serving's metadata states them."""
        widths = {"num_classes": num_classes, "top_k": self.top_k}
        return {name: (OUTPUT_SPECS[name][0], [-1, widths[OUTPUT_SPECS[name][1]]]) for name in self.served_names}
