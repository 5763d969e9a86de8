"""A fine-tuning run exports as a model of its own, named after its run directory (``--name`` for another), not
as ``finetune-folder`` whatever the folder; the guide's next line, ``keras-preact-export RUN_DIR``, finds the
SavedModel the run exported and writes no duplicate version."""

import pytest

from keras_preact_training import cli
from keras_preact_training import export as export_cli
from support import TRAIN_JIT_COMPILE, write_image_folder

pytestmark = []


def write_folder(root, classes=("cat", "dog"), per_class=8):
    return write_image_folder(root, classes, per_class)


def test_a_finetuning_run_exports_under_its_run_directory_name_once(tmp_path, capsys):
    pytest.importorskip("tensorflow")  # the run's own export is a SavedModel
    data, saved = write_folder(tmp_path / "data"), tmp_path / "saved_models"
    run = tmp_path / "runs" / "my-photos"
    assert cli.main(["finetune-folder", "--data-dir", str(data), "--run-dir", str(run), "--epochs", "1",
                     "--steps-per-epoch", "2", "--batch-size", "8", "--export-dir", str(saved), "--verbose", "0",
                     "--jit-compile", TRAIN_JIT_COMPILE]) == 0
    assert sorted(p.name for p in saved.iterdir()) == ["my-photos"]
    assert sorted(p.name for p in (saved / "my-photos").iterdir()) == ["1"]
    capsys.readouterr()

    assert export_cli.main([str(run), "--export-dir", str(saved)]) == 0  # the guide's next line
    out, err = capsys.readouterr()
    assert out.strip() == str(saved / "my-photos" / "1")
    assert f"[export] {run} was exported by its run to {saved / 'my-photos' / '1'}: nothing written" in err
    assert sorted(p.name for p in (saved / "my-photos").iterdir()) == ["1"]

    assert export_cli.main([str(run), "--export-dir", str(saved), "--version", "2"]) == 0  # asked: another version
    assert export_cli.main([str(run), "--export-dir", str(saved), "--name", "holiday"]) == 0
    assert sorted(p.name for p in (saved / "my-photos").iterdir()) == ["1", "2"]
    assert sorted(p.name for p in saved.iterdir()) == ["holiday", "my-photos"]
