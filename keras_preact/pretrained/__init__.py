"""Pretrained checkpoints: what a ``weights=`` argument names, read, checked and converted once.

The checkpoint files of the sources (timm's ``.safetensors`` and ``.pth``, Keras' ``.h5`` and ``.weights.h5``,
keras-hub's preset folders) are read here with the checks a file from elsewhere needs before any of it is used.
"""
