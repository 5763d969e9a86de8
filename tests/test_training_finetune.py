"""Fine-tuning through ``keras-preact-train``'s entry point: ``--init-weights`` with the ``finetune-folder``
preset on a folder of 40 x 50 PNG and JPEG images with no test part (a validation split is held out), the new
head alone first, then every layer; the run's class names, resume, export."""

import json

import keras
import numpy as np
import pytest

from keras_preact.models import create_model
from keras_preact_training import cli
from keras_preact_training.data import sources
from support import FLOWER_CLASSES, TRAIN_JIT_COMPILE, to_numpy, write_flower_folder

CLASSES = FLOWER_CLASSES


@pytest.fixture
def flowers(tmp_path):
    """3 classes x 8 images of 40 x 50 pixels (PNG and JPEG), one folder per class and no test split."""
    return write_flower_folder(tmp_path / "flowers", (40, 50))


@pytest.fixture
def source_weights(tmp_path):
    """A trained-looking ResNet-8 (10 classes, 16 x 16) saved with ``save_weights``: the weights to start from."""
    keras.utils.set_random_seed(3)
    model = create_model("cifar_resnet20", depth=8, num_classes=10, input_shape=(16, 16, 3))
    path = tmp_path / "source.weights.h5"
    model.save_weights(path)
    return model, path


def _argv(tmp_path, flowers, weights, *extra):
    return ["finetune-folder", "--recipe", "fixed", "--init-weights", str(weights), "--depth", "8", "--image-size",
            "16", "16",
            "--data-dir", str(flowers), "--epochs", "2", "--batch-size", "8", "--run-dir", str(tmp_path / "run"),
            "--export-dir", str(tmp_path / "exported"), "--cache-dir", str(tmp_path / "cache"), "--verbose", "0",
            "--jit-compile", TRAIN_JIT_COMPILE, *extra]


@pytest.mark.core
@pytest.mark.notf
def test_finetune_folder_from_weights_through_the_command_line(tmp_path, flowers, source_weights, capsys):
    source, path = source_weights
    # --freeze-norm false: the batch-norm layers train too (auto keeps them frozen at batch 8)
    assert cli.main(_argv(tmp_path, flowers, path, "--freeze-norm", "false")) == 0
    out = capsys.readouterr().out
    assert "[data] folder decoded into memory: 24 images at 16x16: 0.0 MiB decoded" in out
    assert "[train] head phase done at step 1: every layer trains from here" in out  # 0.2 of 4 iterations
    run = tmp_path / "run"
    manifest = json.loads((run / "config.json").read_text())
    assert manifest["class_names"] == CLASSES and manifest["config"]["init_weights"] == str(path)
    # The network's own statistics: CIFAR's, those of the registered network the weights were saved from.
    np.testing.assert_allclose(manifest["input_config"]["mean"], [125.3, 123.0, 113.9], rtol=1e-6)
    model = keras.saving.load_model(run / "model.keras")
    assert model.class_names == tuple(CLASSES) and model.output_shape == (None, 3)
    # Every backbone variable moved from the source's in the second phase (BN statistics included).
    for trained, start in zip(model.backbone.weights, source.backbone.weights):
        assert not np.array_equal(to_numpy(trained), to_numpy(start)), trained.path
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["steps"] == 4 and 0 <= metrics["test_accuracy"] <= 1  # 21 train images, 3 held out
    assert (tmp_path / "exported").is_dir() == sources.has_tensorflow()  # the SavedModel export needs TensorFlow
    assert cli.main(_argv(tmp_path, flowers, path, "--freeze-norm", "false")) == 0  # finished: resumes to nothing
    assert "run already finished at step 4" in capsys.readouterr().out


@pytest.mark.core
@pytest.mark.notf
def test_a_run_of_only_the_head_phase_keeps_the_backbone(tmp_path, flowers, source_weights):
    """--head-fraction 0.9 of 4 iterations: all 4 train the head alone (BN in inference mode), with label
    smoothing; the backbone ends exactly as the weights began, the head trained."""
    source, path = source_weights
    assert cli.main(_argv(tmp_path, flowers, path, "--head-fraction", "0.9", "--label-smoothing", "0.2",
                          "--no-export")) == 0
    model = keras.saving.load_model(tmp_path / "run" / "model.keras")
    for trained, start in zip(model.backbone.weights, source.backbone.weights):
        np.testing.assert_array_equal(to_numpy(trained), to_numpy(start))
    assert model.trainable and model.backbone.trainable  # saved ready for more training
    assert model.output_shape == (None, 3)


@pytest.mark.any_backend
@pytest.mark.notf
@pytest.mark.parametrize("flag, value, message", [
    ("--init-weights", "imagenet", "Invalid --init-weights 'imagenet' for cifar_resnet20. Allowed values: None, "
                                   "'cifar10'"),
    ("--init-weights", "/nowhere/x.keras", "Invalid --init-weights '/nowhere/x.keras' of cifar_resnet20: no such "
                                           "file"),
    ("--label-smoothing", "1.5", "Invalid label_smoothing=1.5: a fraction in \\[0, 1\\)"),
    ("--validation-split", "1", "Invalid validation_split=1.0"),
    ("--decoded-budget-mib", "-1", "Invalid decoded_budget_mib=-1.0: a finite number of MiB >= 0 is required"),
    ("--architecture", "imagenet_edge_pool", "argument --architecture: invalid choice: 'imagenet_edge_pool'"),
])
def test_bad_finetune_flags_exit_2_naming_them(tmp_path, flowers, flag, value, message, capsys):
    argv = ["finetune-folder", "--data-dir", str(flowers), "--run-dir", str(tmp_path / "run"), flag, value]
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2
    assert message.replace("\\", "") in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.core
@pytest.mark.notf
@pytest.mark.skipif(keras.backend.backend() != "torch", reason="three runs, six compiles: 108 s on TensorFlow, 170 s "
                    "on JAX on the 2-core CI machine (both pass); the PyTorch pass (16 s) checks this resume")
def test_a_run_stopped_after_its_head_phase_resumes_to_the_same_weights(tmp_path, flowers, source_weights, monkeypatch):
    """Stopped right after the backup of step 2 (the head phase is step 1), the same command resumes from it
    (every layer trainable, the optimizer restored) and ends with the weights of a run never stopped."""
    from keras_preact_training.run import run_dir as run_files

    _, path = source_weights
    whole = _argv(tmp_path / "whole", flowers, path, "--no-export", "--checkpoint-every", "1")
    assert cli.main(whole) == 0
    save = run_files.AtomicBackup._save_model

    def stop_after_step_2(self):
        save(self)
        if self.step == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(run_files.AtomicBackup, "_save_model", stop_after_step_2)
    argv = _argv(tmp_path, flowers, path, "--no-export", "--checkpoint-every", "1")
    with pytest.raises(KeyboardInterrupt):
        cli.main(argv)
    assert json.loads((tmp_path / "run" / "checkpoints" / "backup" / "latest.json").read_text())["step"] == 2
    monkeypatch.setattr(run_files.AtomicBackup, "_save_model", save)
    assert cli.main(argv) == 0
    resumed = keras.saving.load_model(tmp_path / "run" / "model.keras")
    expected = keras.saving.load_model(tmp_path / "whole" / "run" / "model.keras")
    for a, b in zip(resumed.weights, expected.weights):
        np.testing.assert_allclose(to_numpy(a), to_numpy(b), rtol=0, atol=1e-6, err_msg=a.path)


@pytest.mark.any_backend
@pytest.mark.notf
def test_dry_run_counts_the_folder_without_its_held_out_part_and_names_the_phases(flowers, capsys):
    assert cli.main(["finetune-folder", "--recipe", "fixed", "--data-dir", str(flowers), "--dry-run", "--batch-size",
                     "7"]) == 0
    out = capsys.readouterr().out
    assert "data: folder, 21 training images, batch 7" in out  # 24 less one per class held out (0.1 of 8)
    assert "iterations: 30 = 10 epochs x 3" in out
    assert ("fine-tuning: from init_weights cifar10; the new head alone for the first 6 iterations, then every "
            "layer; label smoothing 0.1") in out


@pytest.mark.notf
def test_init_weights_of_a_timm_folder_take_its_preprocessing(tmp_path, monkeypatch):
    """--init-weights a timm folder (config.json + model.safetensors): not taken for an unfinished run (a run's
    folder holds a config.json too); --normalization model uses the checkpoint's pretrained_cfg. The checkpoint
    is read (converted) when the config is validated, before any data."""
    pytest.importorskip("safetensors")
    import pretrained_reference as ref
    from test_pretrained_convert import write_timm_folder

    from keras_preact_training.recipe import configs
    from keras_preact_training.recipe.model import init_input_config

    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras"))
    folder = write_timm_folder(tmp_path / "resnetv2_18", "resnetv2_18", ref.random_state(18, num_classes=3),
                               mean=[0.5] * 3, std=[0.25] * 3)
    config = configs.get_config("finetune-folder", architecture="imagenet", depth=18, image_size=(224, 224),
                                init_weights=str(folder), data_dir=str(tmp_path))
    input_config = init_input_config(config)
    assert (input_config.mean, input_config.std) == ((127.5,) * 3, (63.75,) * 3)
    assert (input_config.interpolation, tuple(input_config.input_size)) == ("bicubic", (224, 224, 3))


def test_init_weights_of_a_registered_keras_hub_preset_take_its_image_converter(tmp_path, monkeypatch):
    """--init-weights keras_hub_imagenet (ResNet-50's registered keras-hub preset, found in kagglehub's cache): the
    preset's image converter (64 x 48, statistics 127.5/63.75, bicubic) is the run's input config under
    --normalization model, not the ImageNet family's; keras-hub keeps it in the preset, not our registry. A
    randomly initialised keras-hub ResNet-50 (pre-activation, the preset's architecture: --init-weights is converted
    when the config is checked) saved under the preset's handle stands in for it."""
    keras_hub = pytest.importorskip("keras_hub")
    from keras_preact.models import model_spec
    from keras_preact.pretrained import sources as weight_sources
    from keras_preact_training.recipe import configs
    from keras_preact_training.recipe.model import init_input_config

    monkeypatch.setenv("KAGGLEHUB_CACHE", str(tmp_path / "kaggle"))
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras"))  # the conversion's cache
    monkeypatch.setattr(weight_sources, "KAGGLE_ENDPOINT", "https://kaggle.invalid")  # a cache miss fails fast
    mean, std = (127.5,) * 3, (63.75,) * 3
    converter = keras_hub.layers.ResNetImageConverter(
        image_size=(64, 48), scale=[1 / s for s in std], offset=[-m / s for m, s in zip(mean, std)],
        interpolation="bicubic")
    backbone = keras_hub.models.ResNetBackbone(
        stackwise_num_filters=[64, 128, 256, 512], stackwise_num_blocks=[3, 4, 6, 3],
        stackwise_num_strides=[1, 2, 2, 2], block_type="bottleneck_block", use_pre_activation=True,
        input_conv_filters=[64], input_conv_kernel_sizes=[7], image_shape=(None, None, 3))
    classifier = keras_hub.models.ResNetImageClassifier(
        backbone=backbone, num_classes=3, preprocessor=keras_hub.models.ResNetImageClassifierPreprocessor(converter))
    handle = model_spec("imagenet_resnet50").weights["keras_hub_imagenet"].checkpoint
    classifier.save_to_preset(str(weight_sources.kaggle_cache(handle)))

    config = configs.get_config("finetune-folder", architecture="imagenet", depth=50, image_size=(224, 224),
                                init_weights="keras_hub_imagenet", data_dir=str(tmp_path))
    assert config.normalization == configs.MODEL_NORMALIZATION
    input_config = init_input_config(config)
    assert (input_config.interpolation, tuple(input_config.input_size)) == ("bicubic", (64, 48, 3))
    np.testing.assert_allclose(input_config.mean, mean, rtol=1e-6)
    np.testing.assert_allclose(input_config.std, std, rtol=1e-6)


@pytest.mark.core
@pytest.mark.notf
def test_a_run_from_a_timm_checkpoint_is_evaluated_and_exported_with_its_crop_and_interpolation(tmp_path, flowers):
    """--init-weights a timm folder (random resnetv2_18 under timm's names; pretrained_cfg crop_pct 0.9, bicubic,
    mean/std 0.5/0.25): the run's input config (config.json, model.keras, keras-preact-evaluate's view of the run,
    the export's preprocessing.json) has the checkpoint's statistics, crop and interpolation, not the ImageNet
    family's (the centre 224 of 256, bilinear)."""
    pytest.importorskip("safetensors")
    import pretrained_reference as ref
    from test_pretrained_convert import write_timm_folder

    from keras_preact.preprocessing import timm_crop_fraction
    from keras_preact_training import evaluate

    folder = write_timm_folder(tmp_path / "resnetv2_18", "resnetv2_18", ref.random_state(18, num_classes=10, seed=2),
                               crop_pct=0.9, std=[0.25] * 3)
    argv = ["finetune-folder", "--architecture", "imagenet", "--depth", "18", "--image-size", "32", "32",
            "--init-weights", str(folder), "--data-dir", str(flowers), "--epochs", "1", "--batch-size", "8",
            "--run-dir", str(tmp_path / "run"), "--export-dir", str(tmp_path / "exported"),
            "--cache-dir", str(tmp_path / "cache"), "--verbose", "0", "--jit-compile", TRAIN_JIT_COMPILE]
    assert cli.main(argv) == 0
    expected = {"input_size": [32, 32, 3], "mean": [127.5] * 3, "std": [63.75] * 3,
                "crop_fraction": timm_crop_fraction(224, 0.9), "interpolation": "bicubic"}
    run = tmp_path / "run"
    assert json.loads((run / "config.json").read_text())["input_config"] == expected
    assert keras.saving.load_model(run / "model.keras").input_config.to_dict() == expected
    assert evaluate.resolve_model(str(run), None).input_config.to_dict() == expected
    if sources.has_tensorflow():  # the SavedModel export: what serving reads
        (version,) = (tmp_path / "exported" / "run").iterdir()  # named after its run directory
        assert json.loads((version / "assets" / "preprocessing.json").read_text()) == expected


@pytest.mark.notf
def test_offline_init_weights_fail_in_one_line_naming_the_flag_before_any_data(tmp_path, flowers, monkeypatch, capsys):
    """--init-weights timm_a1h_in1k offline (an unreachable Hub, empty caches): exit 2 with one line that names
    --init-weights (not weights=) and says what to download, before a single image is decoded."""
    pytest.importorskip("huggingface_hub")
    import huggingface_hub.constants

    from keras_preact.pretrained import sources
    from keras_preact_training.data import sources as data_sources

    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras"))
    monkeypatch.setenv("HF_ENDPOINT", "https://huggingface.invalid")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setattr(sources, "KERAS_WEIGHTS_URL", "https://keras-weights.invalid/resnet/")

    def no_decoding(*args, **kwargs):
        raise AssertionError("images decoded before the weights were checked")

    monkeypatch.setattr(data_sources, "_decode_files", no_decoding)
    monkeypatch.setattr(data_sources, "folder_stream", no_decoding)
    argv = ["finetune-folder", "--architecture", "imagenet", "--depth", "50", "--init-weights", "timm_a1h_in1k",
            "--data-dir", str(flowers), "--run-dir", str(tmp_path / "run"), "--cache-dir", str(tmp_path / "cache")]
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--init-weights" in error and "unreachable" in error and "weights=" not in error, error
    assert not (tmp_path / "run").exists()
