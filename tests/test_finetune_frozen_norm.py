"""The fine-tuning recipe's batch-norm rule: at a batch under 64 or on under 20,000 images the all-layers phase
keeps the statistics of the trained weights (``freeze_norm_rule``; ``keras-preact-train finetune-folder``'s
``--freeze-norm auto``). Unfrozen at batch 32 on 900 images they moved the features under the new head and the
all-layers phase ended below the head phase (docs/fine-tuning.md)."""

import numpy as np
import pytest

from keras_preact_training import cli
from support import TRAIN_JIT_COMPILE, write_image_folder

pytestmark = [pytest.mark.notf]


def write_folder(root, classes=("cat", "dog"), per_class=8):
    return write_image_folder(root, classes, per_class)


def moving_statistics(model):
    import keras

    return [np.asarray(v) for layer in model.backbone._flatten_layers(include_self=False)
            if isinstance(layer, keras.layers.BatchNormalization) for v in (layer.moving_mean, layer.moving_variance)]


def test_the_rule_freezes_under_batch_64_or_20000_images_and_checks_its_arguments():
    from keras_preact.models.finetune import freeze_norm_rule

    assert [freeze_norm_rule(batch_size=b, num_images=n) for b, n in
            ((63, 10**6), (64, 19_999), (64, 20_000), (32, 900), (256, 50_000))] == [True, True, False, True, False]
    with pytest.raises(ValueError, match=r"^Invalid num_images=0: a positive integer is required\.$"):
        freeze_norm_rule(batch_size=32, num_images=0)


def test_finetune_folder_keeps_the_statistics_of_the_weights_at_a_small_batch_unless_asked(tmp_path, capsys):
    import keras

    import keras_preact.layers  # noqa: F401  (registers the layers for loading)
    from keras_preact.models import create_model

    data = write_folder(tmp_path / "data")
    trained = moving_statistics(create_model("cifar_resnet20", weights="cifar10"))
    after = {}
    for choice in ("auto", "false"):
        run = tmp_path / choice
        assert cli.main(["finetune-folder", "--data-dir", str(data), "--run-dir", str(run), "--epochs", "2",
                         "--steps-per-epoch", "1", "--head-fraction", "0.5", "--batch-size", "8", "--freeze-norm",
                         choice, "--no-export", "--verbose", "0", "--jit-compile", TRAIN_JIT_COMPILE]) == 0
        out = capsys.readouterr().out
        frozen = "(the batch-norm statistics kept frozen: --freeze-norm auto, batch < 64 or < 20,000 images)"
        assert (frozen in out) == (choice == "auto")
        model = keras.saving.load_model(run / "model.keras")
        assert all(layer.trainable for layer in model._flatten_layers())  # saved with every layer trainable
        after[choice] = moving_statistics(model)
    for got, want in zip(after["auto"], trained):
        np.testing.assert_array_equal(got, want)
    assert any(not np.array_equal(got, want) for got, want in zip(after["false"], trained))
