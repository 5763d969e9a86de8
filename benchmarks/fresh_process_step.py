"""The step the fresh-process benchmarks (``tf_onednn``, ``jax_xla_flags``) time under each setting: every process
builds ``create_model(model)`` with the same weights (the first saves them, the others load them) and the same
seeded batch, so their outputs and updated weights compare exactly, setting against setting."""

import pathlib
import statistics
import time


def same_model_and_batch(model_name, batch_size, work):
    """(compiled model, images, labels): SGD with momentum, weights shared through ``work/initial.weights.h5``."""
    import keras
    import numpy as np

    from keras_preact.models import create_model

    keras.utils.set_random_seed(0)
    model = create_model(model_name)
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="sparse_categorical_crossentropy")
    weights = pathlib.Path(work) / "initial.weights.h5"
    if weights.exists():
        model.load_weights(weights)
    else:
        model.save_weights(weights)
    rng = np.random.default_rng(0)
    images = rng.normal(size=(batch_size, *model.input_shape[1:])).astype("float32")
    labels = rng.integers(0, model.output_shape[-1], (batch_size,)).astype("int32")
    return model, images, labels


def median_ms(step, warmup, steps):
    """The median ms of ``steps`` timed calls of ``step`` after ``warmup`` untimed ones."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)
