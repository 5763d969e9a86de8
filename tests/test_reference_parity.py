"""The two trainers of the 50-epoch comparison, setting by setting (issue "Weights at the data's ceiling", item 3):
``keras-preact-train``'s recipe and the plain PyTorch reference (``benchmarks/reference_torch_cifar.py``) see the
same pixels, normalise and pad them alike, and from the same weights and batch take the same training steps
(loss, Nesterov SGD as ``torch.optim.SGD``, coupled weight decay on every parameter, BN in training mode with
eps 1e-5 and momentum 0.1, the warm-up and the decay). What differs, and is asserted as such: the BN moving
variance (Keras keeps the biased batch variance, PyTorch the unbiased one: a factor n / (n - 1)), the data order
and the crop/flip draws (each trainer's own generator; their distributions are the same)."""

import importlib.util
import pathlib
import sys

import keras
import numpy as np
import pytest

from keras_preact_training.data import pipelines, sources
from keras_preact_training.recipe import configs, schedules
from keras_preact_training.recipe import model as model_lib

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # benchmarks/ is not installed
pytestmark = [pytest.mark.notf, pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                                   reason="the PyTorch reference needs torch")]
PRESET = "cifar10-folder-resnet20-converged"
# After three steps from equal weights: TensorFlow's CPU convolution gradients round differently from PyTorch's
# (AMD EPYC, AVX2: up to 6.4e-5 on the stem's kernel, whose entries are ~0.1), more so with its deterministic
# kernels, which an earlier test's in-process training (deterministic=True) leaves on in a pytest worker
# (TensorFlow cannot turn them off): 1.2e-4 and 1.4e-4 on an AMD EPYC with AVX-512. JAX and PyTorch stay within 2e-5.
WEIGHT_ATOL = {"tensorflow": 2e-4}


def write_folder(root, per_class=3, classes=("a", "b")):
    from PIL import Image

    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for c in classes:
            (root / split / c).mkdir(parents=True)
            for i in range(per_class):
                pixels = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(root / split / c / f"{i:04d}.jpg", quality=75)
    return root


def copy_weights_into_reference(ours, theirs):
    """Our variables into the reference's state, by creation order (``test_train_speed``'s mapping)."""
    import torch

    state = [(k, v) for k, v in theirs.state_dict().items() if not k.endswith("num_batches_tracked")]
    assert len(state) == len(ours.weights)
    with torch.no_grad():
        for (_key, tensor), weight in zip(state, ours.weights):
            value = keras.ops.convert_to_numpy(weight)
            value = value.transpose(3, 2, 0, 1) if value.ndim == 4 else value.T if value.ndim == 2 else value
            tensor.copy_(torch.from_numpy(np.ascontiguousarray(value)))
    return state


def test_both_trainers_decode_the_same_pixels_and_normalise_them_alike(tmp_path):
    from benchmarks import reference_torch_cifar as ref

    folder = write_folder(tmp_path / "data")
    config = configs.get_config(PRESET, data_dir=str(folder), cache_dir=str(tmp_path / "ours"))
    ours = sources.load(config)
    images, labels = ref.load_split(folder / "train", str(tmp_path / "theirs"))
    np.testing.assert_array_equal(ours.train_images, images)  # JPEG decoded alike (Pillow's IDCT)
    np.testing.assert_array_equal(ours.train_labels, labels)
    mean, std = pipelines.pixel_stats(config, ours)
    np.testing.assert_allclose(mean, ref.MEAN, rtol=1e-6)
    np.testing.assert_allclose(std, ref.STD, rtol=1e-6)


def test_three_steps_of_ours_equal_the_references_from_the_same_weights_and_batch():
    """Warm-up, the base rate and a decay in three steps (the learning rate changes at each), batch 16,
    pre-activation ResNet-8; ours through the recipe's own build and compile (compiled as training runs)."""
    import torch
    import torch.nn.functional as F

    from benchmarks import reference_torch_cifar as ref

    config = configs.get_config(PRESET, depth=8, epochs=None, total_steps=3, warmup_steps=1, boundaries=(2,),
                                base_lr=0.03, steps_per_epoch=3, batch_size=16, reference_batch_size=16,
                                needs_data=False)
    resolved = schedules.resolve(config, train_size=48)
    ours = model_lib.compile_model(model_lib.build_classifier(config, 10), config, resolved, num_classes=10)
    theirs = ref.PreActResNet(8, 10)
    state = copy_weights_into_reference(ours, theirs)
    optimizer = torch.optim.SGD(theirs.parameters(), lr=0.01, momentum=0.9, nesterov=True, weight_decay=1e-4)
    rng = np.random.default_rng(0)
    rates = [0.01, 0.03, 0.003]  # not 0.1: on random batches a few BN channels collapse and amplify rounding
    schedule = schedules.make(config, resolved)
    assert [float(schedule(step)) for step in range(3)] == pytest.approx(rates)
    assert [ref.piecewise_learning_rate(s, 4, 1, base_lr=0.03) for s in range(3)] == pytest.approx(rates)
    for lr in rates:
        x = rng.normal(size=(16, 32, 32, 3)).astype("float32")  # a normalised, augmented batch
        y = rng.integers(0, 10, 16)
        ours.train_on_batch(x, y)
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss = F.cross_entropy(theirs(torch.from_numpy(x).permute(0, 3, 1, 2)), torch.from_numpy(y))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    for (key, tensor), weight in zip(state, ours.weights):
        value = keras.ops.convert_to_numpy(weight)
        value = value.transpose(3, 2, 0, 1) if value.ndim == 4 else value.T if value.ndim == 2 else value
        expected = tensor.detach().numpy()
        if key.endswith("running_var"):  # Keras: biased batch variance; PyTorch: unbiased (n / (n - 1) apart)
            np.testing.assert_allclose(value, expected, rtol=5e-3, err_msg=key)
            assert not np.allclose(value, expected, rtol=1e-7, atol=0), key
        else:
            np.testing.assert_allclose(value, expected, rtol=2e-4, atol=WEIGHT_ATOL.get(keras.backend.backend(), 2e-5),
                                       err_msg=key)


def test_pad_value_and_crop_offsets_have_the_same_distribution():
    """Both pad after normalisation with zeros (the mean pixel), crop at offsets -4..4 each way and mirror, each
    draw uniform (every draw identified from an image of distinct pixels); the draws themselves come from each
    trainer's own generator."""
    import torch

    from benchmarks import reference_torch_cifar as ref
    from keras_preact_training.recipe import augment
    from support import assert_uniform_crop_draws, crop_draws

    n = 4000
    ones = np.ones((n, 4, 4, 1), "float32")
    ours = keras.ops.convert_to_numpy(augment.PadCropFlip(4, seed=0)(ones, training=True))
    theirs = ref.augment(torch.ones((n, 1, 4, 4)), torch.Generator().manual_seed(0), channels_last=False)
    theirs = theirs.permute(0, 2, 3, 1).numpy()
    for images in (ours, theirs):
        assert set(np.unique(images)) == {0.0, 1.0}  # the padding is zero: the mean pixel after normalisation
    image = np.arange(1, 101, dtype="float32").reshape(10, 10, 1)
    ours = keras.ops.convert_to_numpy(augment.PadCropFlip(4, seed=0)(np.broadcast_to(image, (n, 10, 10, 1)),
                                                                     training=True))
    theirs = ref.augment(torch.from_numpy(np.ascontiguousarray(np.broadcast_to(image.transpose(2, 0, 1),
                                                                               (n, 1, 10, 10)))),
                         torch.Generator().manual_seed(0), channels_last=False).permute(0, 2, 3, 1).numpy()
    for images in (ours, theirs):
        assert_uniform_crop_draws(crop_draws(images, image, 4), 4)


@pytest.mark.parametrize("pipeline", ["device", "numpy"])
def test_both_trainers_evaluate_in_inference_mode_on_the_same_normalised_test_images(tmp_path, pipeline):
    """The per-epoch test figures: ours through the recipe's own model, test stream and ``model.evaluate`` (the
    ``device`` pipeline normalises in the compiled model, ``numpy`` before it), the reference through its
    ``evaluate``; from the same weights and moving statistics both score the same loss and the same images."""
    import torch

    from benchmarks import reference_torch_cifar as ref

    folder = write_folder(tmp_path / "data", per_class=10)
    config = configs.get_config(PRESET, depth=8, data_dir=str(folder), cache_dir=str(tmp_path / "ours"),
                                batch_size=8, pipeline=pipeline, epochs=1)
    data = sources.load(config)
    resolved = schedules.resolve(config, data.train_size)
    mean, std = pipelines.pixel_stats(config, data)
    classifier, ours = model_lib.build_model(config, data.num_classes, resolved, pipeline=pipeline, mean=mean, std=std)
    rng = np.random.default_rng(1)
    for layer in classifier.layers:  # moving statistics far from a batch's own: the two modes disagree
        if isinstance(layer, keras.layers.BatchNormalization):
            for weight, value in zip(layer.weights, (rng.uniform(0.5, 1.5, layer.gamma.shape),
                                                     rng.normal(0, 0.5, layer.beta.shape),
                                                     rng.normal(0, 0.5, layer.moving_mean.shape),
                                                     rng.uniform(0.2, 3.0, layer.moving_variance.shape))):
                weight.assign(value.astype("float32"))
    theirs = ref.PreActResNet(8, data.num_classes)
    copy_weights_into_reference(classifier, theirs)
    _, test_stream = pipelines.pipelines(data, config, config.batch_size)
    evaluation = ours.evaluate(test_stream, verbose=0, return_dict=True)
    images, labels = ref.load_split(folder / "test", str(tmp_path / "theirs"))
    loss, accuracy = ref.evaluate(theirs, images, labels, batch_size=8, channels_last=True)
    assert evaluation["loss"] == pytest.approx(loss, rel=1e-5)
    assert evaluation["accuracy"] == pytest.approx(accuracy, abs=1e-7)
    x = ref.normalize(images, channels_last=False)  # NCHW
    theirs.eval()
    with torch.no_grad():
        expected = torch.softmax(theirs(x), 1).numpy()  # ours ends in softmax
    x = x.permute(0, 2, 3, 1).numpy()
    np.testing.assert_allclose(keras.ops.convert_to_numpy(classifier(x, training=False)), expected, atol=1e-5)
    assert not np.allclose(keras.ops.convert_to_numpy(classifier(x, training=True)), expected, atol=1e-2)
