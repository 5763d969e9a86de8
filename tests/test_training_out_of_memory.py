"""An out-of-memory error inside ``model.fit`` ends keras-preact-train with one line naming it and what to try.

Each backend says "out of memory" its own way (``keras_preact_training.train.OUT_OF_MEMORY_TYPES``/``_MESSAGES``);
the line is the one naming the allocation, not the error's first line (TensorFlow's is "Graph execution
error:"), and other errors get no memory hint.
"""

import importlib.util

import pytest

from keras_preact_training import train as train_lib

pytestmark = [pytest.mark.core, pytest.mark.notf]

TF_OOM = ("Graph execution error:\n\nDetected at node StatefulPartitionedCall defined at ...\n"
          "OOM when allocating tensor with shape[2048,16,32,32] and type float on /job:localhost/replica:0/"
          "task:0/device:CPU:0 by allocator mklcpu\n\t [[{{node StatefulPartitionedCall}}]]")
XLA_OOM = "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 25769803776 bytes."
TORCH_OOM = "[enforce fail at alloc_cpu.cpp:118] data. DefaultCPUAllocator: not enough memory: you tried to allocate 1"


class ResourceExhaustedError(Exception):  # TensorFlow's name, without TensorFlow
    pass


def failure(error):
    with pytest.raises(train_lib.TrainingFailed) as caught, train_lib._reported("model.fit"):
        raise error
    return str(caught.value)


@pytest.mark.parametrize("error, line", [
    (ResourceExhaustedError(TF_OOM), "OOM when allocating tensor with shape[2048,16,32,32]"),
    (RuntimeError(XLA_OOM), XLA_OOM),
    (RuntimeError(TORCH_OOM), TORCH_OOM),
    (MemoryError("Unable to allocate 24.0 GiB for an array"), "Unable to allocate 24.0 GiB"),
], ids=["tensorflow", "xla", "torch-cpu", "python"])
def test_out_of_memory_names_the_allocation_and_the_remedies(error, line):
    message = failure(error)
    assert message.startswith(f"model.fit failed: {type(error).__name__}: ")
    assert line in message and "Graph execution error" not in message
    assert message.endswith(train_lib.OUT_OF_MEMORY_HINT) and "--remat" in message and "--batch-size" in message
    assert "\n" not in message


def test_other_errors_get_their_first_line_and_no_memory_hint():
    message = failure(ValueError("Input 0 is incompatible with the layer\nexpected shape=(None, 32, 32, 3)"))
    assert message == "model.fit failed: ValueError: Input 0 is incompatible with the layer"
    assert not train_lib.is_out_of_memory(ValueError("shape mismatch"))


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="PyTorch not installed")
def test_torch_out_of_memory_error_is_recognised():
    import torch

    assert train_lib.is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="TensorFlow not installed")
def test_tensorflow_resource_exhausted_error_is_recognised():
    import tensorflow as tf

    assert train_lib.is_out_of_memory(tf.errors.ResourceExhaustedError(None, None, TF_OOM))
