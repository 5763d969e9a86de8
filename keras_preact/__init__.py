"""keras-preact: pre-activation residual networks (He et al., ECCV 2016) for Keras 3."""

__version__ = "0.1.0"
