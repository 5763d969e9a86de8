"""The serving tests' shared fixtures: the export they serve (``export_copy``) and the plain SavedModel served
as ``cifar`` version 1 (``exported``; a module that serves something else defines its own)."""

import pytest

# Each format's top-level entries in a version directory (beside assets/, which every format shares).
EXPORT_ENTRIES = {"saved_model": ("saved_model.pb", "variables", "fingerprint.pb"), "onnx": ("model.onnx",),
                  "litert": ("model.tflite",), "openvino": ("openvino",)}


@pytest.fixture(scope="session")
def export_copy(tmp_path_factory):
    """``export_copy(base, name, formats=("saved_model",), version=1)``: ``base/name/version``, a copy of the
    serving tests' export holding ``formats`` alone (what ``export_model`` with those formats writes).

    The export is ``support.make_export_model()`` (a CIFAR ResNet-8) with ``CLASS_NAMES``, ``MEAN``, ``STD``
    and ``top_k=3``, written once per test process in every format (SavedModel, ONNX, LiteRT, OpenVINO: the
    TensorFlow pass's) on first use; each test serves or damages its own copy, never the export.
    """
    import pathlib
    import shutil

    from support import CLASS_NAMES, MEAN, STD, make_export_model

    source = []

    def copy(base, name, formats=("saved_model",), version=1):
        if not source:
            from keras_preact.export import export_model

            source.append(export_model(make_export_model(), tmp_path_factory.mktemp("shared_export"), name="cifar",
                                       formats=tuple(EXPORT_ENTRIES), class_names=CLASS_NAMES, mean=MEAN, std=STD,
                                       top_k=3))
        [export] = source
        left_out = {entry for fmt in EXPORT_ENTRIES if fmt not in formats for entry in EXPORT_ENTRIES[fmt]}
        return pathlib.Path(
            shutil.copytree(
                export,
                pathlib.Path(base) / name / str(version),
                ignore=lambda folder, names: [n for n in names if folder == str(export) and n in left_out],
            )
        )

    return copy


@pytest.fixture(scope="module")
def exported(tmp_path_factory, export_copy):
    """export_copy's SavedModel alone (top 3 of 10 classes), served as cifar version 1 (test_serving_grpc,
    test_serving_v2)."""
    pytest.importorskip("tensorflow", reason="needs TensorFlow")
    return export_copy(tmp_path_factory.mktemp("saved_models"), "cifar")
