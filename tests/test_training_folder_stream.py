"""A ``--resize-images`` image folder whose decoded set is over the memory budget (``--decoded-budget-mib``) streams
without TensorFlow: ``pipelines.FolderBatches`` (a ``keras.utils.PyDataset``) decodes each batch from the files,
with the batches, pixels and labels of the in-memory path; the start-up line says which is used and why."""

import json

import keras
import numpy as np
import pytest

from keras_preact.models import create_model
from keras_preact_training import cli
from keras_preact_training.data import pipelines, sources
from keras_preact_training.recipe import configs
from support import FLOWER_CLASSES, TRAIN_JIT_COMPILE, to_numpy, write_flower_folder

CLASSES = FLOWER_CLASSES
SIZE = (16, 16)
DECODED = 24 * 16 * 16 * 3  # bytes of the folder's 24 images at 16 x 16, uint8


@pytest.fixture
def flowers(tmp_path):
    """3 classes x 8 images of 20 x 30 pixels (PNG and JPEG), one folder per class and no test split."""
    return write_flower_folder(tmp_path / "flowers", (20, 30))


def _config(flowers, tmp_path, **fields):
    fields = {"pipeline": "device", "init_weights": None, "normalization": "cifar10", "batch_size": 8, **fields}
    return configs.PRESETS["finetune-folder"].replace(data_dir=str(flowers), image_size=SIZE,
                                                      cache_dir=str(tmp_path / "cache"), **fields)


@pytest.mark.any_backend
@pytest.mark.notf
def test_the_folder_is_decoded_into_memory_at_the_budget_and_streamed_past_it(flowers, tmp_path, capsys):
    at_limit = sources.load(_config(flowers, tmp_path, decoded_budget_mib=DECODED / 2**20))
    assert isinstance(at_limit, sources.ArrayData)
    assert capsys.readouterr().out.startswith(
        "[data] folder decoded into memory: 24 images at 16x16: 0.0 MiB decoded (18,432 bytes), within the budget "
        "0.0 MiB (18,432 bytes) (--decoded-budget-mib)")
    past = sources.load(_config(flowers, tmp_path, decoded_budget_mib=(DECODED - 1) / 2**20))
    assert isinstance(past, sources.FolderFiles) and past.train_size == 21 and len(past.test_labels) == 3
    assert capsys.readouterr().out.startswith(
        "[data] folder streamed: 24 images at 16x16: 0.0 MiB decoded (18,432 bytes), over the budget 0.0 MiB "
        "(18,431 bytes) (--decoded-budget-mib); each batch decoded from the files with Pillow on ")
    # tf.data's pipeline cannot take it: refused before any work, with the remedies.
    with pytest.raises(sources.DataError, match=r"would not fit in memory \(over the budget 0.0 MiB \(18,431 bytes\) "
                       r"\(--decoded-budget-mib\)\): pass --pipeline device to stream it batch by batch"):
        sources.load(_config(flowers, tmp_path, decoded_budget_mib=(DECODED - 1) / 2**20, pipeline="tf_data"))


@pytest.mark.notf
def test_streamed_batches_are_the_in_memory_ones_from_any_step(flowers, tmp_path):
    """Device (uint8) and numpy (normalised, augmented on the host) pipelines: the same training batches over three
    epochs (21 images, batch 8), from step 0 and resumed at step 4, and the same test batches; then through
    ``model.fit`` (whose first call peeks a batch to build its metrics): the same weights after 2 x 2 steps."""
    config = _config(flowers, tmp_path)
    in_memory = sources.load(config.replace(decoded_budget_mib=1.0))
    streamed = sources.load(config.replace(decoded_budget_mib=0))
    assert isinstance(in_memory, sources.ArrayData) and isinstance(streamed, sources.FolderFiles)
    for pipeline in ("device", "numpy"):
        for start in (0, 4):
            run = config.replace(pipeline=pipeline)
            expected, expected_test = pipelines.pipelines(in_memory, run, 8, start_step=start)
            train, test = pipelines.pipelines(streamed, run, 8, start_step=start)
            for k in range(8):
                x, y = next(expected)
                np.testing.assert_array_equal(train[k][0], x, err_msg=f"{pipeline} step {start + k}")
                np.testing.assert_array_equal(train[k][1], y)
            assert len(test) == len(expected_test) == 1
            np.testing.assert_array_equal(test[0][0], expected_test[0][0])
            np.testing.assert_array_equal(test[0][1], expected_test[0][1])

    def fitted_weights(data):
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((*SIZE, 3)), keras.layers.Rescaling(1 / 255), keras.layers.Flatten(),
                                  keras.layers.Dense(3)])
        model.compile(keras.optimizers.SGD(0.1), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
        train, test = pipelines.pipelines(data, config, 8)
        model.fit(train, epochs=2, steps_per_epoch=2, validation_data=test, verbose=0, shuffle=False)
        return [to_numpy(w) for w in model.weights]

    for a, b in zip(fitted_weights(streamed), fitted_weights(in_memory)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.core
@pytest.mark.notf
@pytest.mark.skipif(keras.backend.backend() != "torch", reason="the streamed batches are backend-neutral (checked on "
                    "each backend above); the command's run on one backend is enough: 5 s on PyTorch, 65-80 s of "
                    "compiling on TensorFlow and JAX")
def test_finetune_folder_streamed_through_the_command_line(flowers, tmp_path, capsys):
    """``keras-preact-train finetune-folder --decoded-budget-mib 0``: the folder streams, one epoch trains, the run
    is written (``--pipeline device``: the default on JAX and PyTorch; TensorFlow's tf.data would refuse it)."""
    keras.utils.set_random_seed(3)
    weights = tmp_path / "source.weights.h5"
    create_model("cifar_resnet20", depth=8, num_classes=10, input_shape=(*SIZE, 3)).save_weights(weights)
    run = tmp_path / "run"
    argv = ["finetune-folder", "--init-weights", str(weights), "--depth", "8", "--image-size", "16", "16",
            "--data-dir", str(flowers), "--epochs", "1", "--batch-size", "8", "--head-fraction", "0",
            "--decoded-budget-mib", "0", "--pipeline", "device", "--run-dir", str(run), "--no-export", "--verbose", "0",
            "--jit-compile", TRAIN_JIT_COMPILE]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "[data] folder streamed: 24 images at 16x16: 0.0 MiB decoded (18,432 bytes), over the budget 0.0 MiB " \
           "(0 bytes) (--decoded-budget-mib); each batch decoded from the files with Pillow" in out
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["steps"] == 2 and 0 <= metrics["test_accuracy"] <= 1  # 21 train images, 3 held out
    model = keras.saving.load_model(run / "model.keras")
    assert model.class_names == tuple(CLASSES) and model.output_shape == (None, 3)
    assert json.loads((run / "config.json").read_text())["config"]["decoded_budget_mib"] == 0


@pytest.mark.notf
@pytest.mark.parametrize("pipeline", ["device", "numpy"])
def test_each_process_streams_its_slice_of_the_in_memory_global_batches(tmp_path, pipeline):
    """Multi-process data parallelism (2 processes) on a streamed folder: each process's training batches from any
    step and its test batches (its slice of every whole global batch) are those of the in-memory path's shards
    (``train.input_streams``, as a data-parallel run calls it)."""
    import types

    from keras_preact_training import train

    flowers = write_flower_folder(tmp_path / "flowers", (20, 30), per_class=24)  # 66 train, 6 held-out images
    config = _config(flowers, tmp_path, pipeline=pipeline, batch_size=4)
    in_memory = sources.load(config.replace(decoded_budget_mib=1.0))
    streamed = sources.load(config.replace(decoded_budget_mib=0))
    assert isinstance(streamed, sources.FolderFiles) and len(streamed.test_labels) == 6
    for index in (0, 1):
        streams = {}
        for name, data in (("in memory", in_memory), ("streamed", streamed)):
            run = types.SimpleNamespace(config=config, data=data, sharded=True, pipeline=pipeline,
                                        dist=types.SimpleNamespace(process_index=index, process_count=2))
            streams[name] = train.input_streams(run)
        (train_a, test_a), (train_b, test_b) = streams["in memory"], streams["streamed"]
        for start in (0, 14):
            expected, got = train_a(start), train_b(start)
            for k in range(8):  # 66 images: the first epoch ends inside global batch 16
                x, y = next(expected)
                assert x.shape[0] == y.shape[0] == 2
                np.testing.assert_array_equal(got[k][0], x, err_msg=f"process {index}, step {start + k}")
                np.testing.assert_array_equal(got[k][1], y)
        assert len(test_a) == len(test_b) == 1  # the one whole global batch of 4: 2 images each
        np.testing.assert_array_equal(test_b[0][0], test_a[0][0])
        np.testing.assert_array_equal(test_b[0][1], test_a[0][1])
        assert len(test_b[0][1]) == 2


@pytest.mark.any_backend
@pytest.mark.notf
def test_multi_process_evaluation_needs_one_whole_global_batch_of_test_images(tmp_path):
    """6 held-out images: a global batch of 6 is accepted, 7 refused before any work, naming the argument."""
    flowers = write_flower_folder(tmp_path / "flowers", (20, 30), per_class=24)  # 66 train, 6 held-out images
    streamed = sources.load(_config(flowers, tmp_path, decoded_budget_mib=0))
    pipelines.check_sharded_eval(streamed, _config(flowers, tmp_path, batch_size=6))
    with pytest.raises(sources.DataError, match=r"^Invalid batch_size=7: multi-process data parallelism evaluates "
                       r"whole global batches and the test split holds 6 images; at most 6\.$"):
        pipelines.check_sharded_eval(streamed, _config(flowers, tmp_path, batch_size=7))
