"""SavedModel export: TF Serving layout, signatures, preprocessing in the graph, verified without keras."""

import os
import pathlib
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow", reason="needs TensorFlow")

from keras_preact.export import export_saved_model
from support import CLASS_NAMES, MEAN, STD
from support import make_export_model as make_model

# One worker (`--dist loadgroup`): the module fixture's export is made once, not on each worker.
pytestmark = pytest.mark.xdist_group("test_export")
TOP_K = 3


def keras_reference(model, images):
    normalized = (images.astype(np.float32) - np.float32(MEAN)) / np.float32(STD)
    return np.asarray(model.predict(normalized, verbose=0))


def top_k(probabilities, k=TOP_K):
    return np.argsort(-probabilities, axis=1, kind="stable")[:, :k]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    keras.utils.clear_session(free_memory=False)
    model = make_model()
    export_dir = tmp_path_factory.mktemp("saved_models")
    path = export_saved_model(
        model, export_dir, name="cifar_r8", class_names=CLASS_NAMES, mean=MEAN, std=STD, top_k=TOP_K
    )
    images = np.random.default_rng(1).integers(0, 256, (6, 32, 32, 3), dtype=np.uint8)
    return model, path, images, keras_reference(model, images)


@pytest.mark.core
def test_layout_version_folder_assets_and_no_leftovers(exported):
    model, path, _, _ = exported
    assert path == path.parent.parent / "cifar_r8" / "1"
    assert sorted(p.name for p in path.parent.iterdir()) == ["1"]  # no temporary directory left
    assert (path / "saved_model.pb").is_file() and (path / "variables").is_dir()
    assert (path / "assets" / "class_names.txt").read_text(encoding="utf-8").splitlines() == CLASS_NAMES


@pytest.mark.core
def test_next_version_is_one_more_and_default_name_is_model_name(tmp_path):
    model = make_model(name="tiny")
    (tmp_path / "tiny" / "7").mkdir(parents=True)
    (tmp_path / "tiny" / "not_a_version").mkdir()
    assert export_saved_model(model, tmp_path) == tmp_path / "tiny" / "8"
    # Default class names are the label numbers.
    loaded = tf.saved_model.load(str(tmp_path / "tiny" / "8"))
    out = loaded.signatures["serving_default"](images=tf.zeros((1, 32, 32, 3), tf.uint8))
    np.testing.assert_array_equal(out["class_names"].numpy(), out["classes"].numpy().astype(str).astype(bytes))


FRESH_PROCESS = textwrap.dedent(
    """
    import sys

    # TensorFlow imports keras when it is installed (for tf.keras); make keras, keras_preact and
    # tf_keras unimportable, as if not installed, so nothing below can use them.
    for blocked in ("keras", "keras_preact", "tf_keras"):
        sys.modules[blocked] = None
    import numpy as np
    import tensorflow as tf

    path, images_file, png_file, out_file = sys.argv[1:5]
    loaded = tf.saved_model.load(path)
    images = np.load(images_file)
    default = loaded.signatures["serving_default"](images=tf.constant(images))
    floats = loaded.signatures["serving_float"](images=tf.constant(images.astype(np.float32)))
    encoded = loaded.signatures["serving_bytes"](image_bytes=tf.constant(list(np.load(png_file))))
    leaked = sorted(m for m, module in sys.modules.items()
                    if module is not None and m.split(".")[0] in ("keras", "keras_preact", "tf_keras"))
    np.savez(
        out_file,
        leaked=np.array(leaked, dtype=str),
        **{f"{sig}_{k}": v.numpy().astype(str) if v.dtype == tf.string else v.numpy() for sig, out in
           (("default", default), ("float", floats), ("bytes", encoded)) for k, v in out.items()},
    )
    """
)


@pytest.mark.core
def test_fresh_tensorflow_only_process_matches_keras(exported, tmp_path):
    """A process importing only TensorFlow reproduces the Keras predictions."""
    model, path, images, reference = exported
    np.save(tmp_path / "images.npy", images)
    np.save(tmp_path / "png.npy", np.array([tf.io.encode_png(i).numpy() for i in images], dtype=object),
            allow_pickle=True)
    script = FRESH_PROCESS.replace("np.load(png_file)", "np.load(png_file, allow_pickle=True)")
    subprocess.run(
        [sys.executable, "-c", script, str(path), str(tmp_path / "images.npy"), str(tmp_path / "png.npy"),
         str(tmp_path / "out.npz")],
        check=True, capture_output=True, timeout=300, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    out = np.load(tmp_path / "out.npz")
    assert out["leaked"].tolist() == []
    for signature in ("default", "float", "bytes"):
        np.testing.assert_allclose(out[f"{signature}_probabilities"], reference, atol=1e-5, rtol=0)
        np.testing.assert_array_equal(out[f"{signature}_classes"], top_k(out[f"{signature}_probabilities"]))
        np.testing.assert_allclose(
            out[f"{signature}_scores"], np.take_along_axis(reference, out[f"{signature}_classes"], 1), atol=1e-5
        )
        names = np.array(CLASS_NAMES)[out[f"{signature}_classes"]]
        np.testing.assert_array_equal(out[f"{signature}_class_names"].astype(str), names)
    np.testing.assert_array_equal(out["default_classes"], top_k(reference))


def test_encoded_images_are_resized_on_the_shorter_side_and_centre_cropped(exported):
    _, path, images, _ = exported
    serve = tf.saved_model.load(str(path)).signatures
    # 32 x 96 image: the shorter side is already 32, so the crop must return the middle 32 columns exactly.
    wide = np.concatenate([np.zeros_like(images[:1]), images[:1], np.full_like(images[:1], 255)], axis=2)
    # A solid 90 x 60 image resizes to a solid 32 x 32 one.
    solid = np.full((90, 60, 3), (200, 30, 90), np.uint8)
    png = [tf.io.encode_png(wide[0]), tf.io.encode_png(solid), tf.io.encode_jpeg(images[1], quality=100)]
    out = serve["serving_bytes"](image_bytes=tf.stack(png))
    expected = serve["serving_default"](images=tf.constant(np.stack([images[0], solid[:32, :32]])))
    np.testing.assert_allclose(out["probabilities"].numpy()[:2], expected["probabilities"].numpy(), atol=1e-5)
    with pytest.raises(tf.errors.InvalidArgumentError, match="image"):
        serve["serving_bytes"](image_bytes=tf.constant([b"not an image"]))


def test_saved_model_cli_show_and_run(exported, tmp_path):
    _, path, images, reference = exported
    show = subprocess.run(
        ["saved_model_cli", "show", "--all", "--dir", str(path)],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    for text in ("signature_def['serving_default']", "signature_def['serving_float']",
                 "signature_def['serving_bytes']", "inputs['images']", "dtype: DT_UINT8", "shape: (-1, 32, 32, 3)",
                 "inputs['image_bytes']", "dtype: DT_STRING", "outputs['probabilities']", "shape: (-1, 10)",
                 "outputs['classes']", "dtype: DT_INT32", "shape: (-1, 3)", "outputs['class_names']",
                 "Method name is: tensorflow/serving/predict"):
        assert text in show, text
    np.save(tmp_path / "images.npy", images)
    subprocess.run(
        ["saved_model_cli", "run", "--dir", str(path), "--tag_set", "serve", "--signature_def", "serving_default",
         "--inputs", f"images={tmp_path / 'images.npy'}", "--outdir", str(tmp_path / "out")],
        check=True, capture_output=True, timeout=120,
    )
    np.testing.assert_allclose(np.load(tmp_path / "out" / "probabilities.npy"), reference, atol=1e-5)
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "classes.npy"), top_k(reference))


def test_tfsm_layer_reloads_the_export(exported):
    _, path, images, reference = exported
    layer = keras.layers.TFSMLayer(str(path), call_endpoint="serving_default")
    out = layer(images)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(out["probabilities"]), reference, atol=1e-5)
    floats = keras.layers.TFSMLayer(str(path), call_endpoint="serving_float")(images.astype("float32"))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(floats["probabilities"]), reference, atol=1e-5)


@pytest.mark.parametrize(
    "kwargs, argument",
    [
        (dict(name="a/b"), "name"),
        (dict(version=0), "version"),
        (dict(version="2"), "version"),
        (dict(top_k=11), "top_k"),
        (dict(class_names=["a"] * 9), "class_names"),
        (dict(class_names=["a\nb"] + ["c"] * 9), "class_names"),
        (dict(std=[1.0, 0.0, 1.0]), "std"),
        (dict(mean=[1.0, 2.0]), "mean"),
        (dict(image_size=(16, 16)), "image_size"),
    ],
)
def test_bad_arguments_raise_before_writing_anything(tmp_path, kwargs, argument):
    model = make_model()
    with pytest.raises(ValueError, match=f"Invalid {argument}"):
        export_saved_model(model, tmp_path / "out", **kwargs)
    assert not (tmp_path / "out").exists()


def test_existing_version_is_never_overwritten_and_a_failed_export_leaves_nothing(tmp_path, monkeypatch):
    model = make_model()
    first = export_saved_model(model, tmp_path, name="m", version=3)
    before = (first / "saved_model.pb").read_bytes()
    with pytest.raises(ValueError, match="Invalid version=3"):
        export_saved_model(model, tmp_path, name="m", version=3)
    assert (first / "saved_model.pb").read_bytes() == before

    from keras_preact.export import saved_model

    def fail_halfway(path, *args):
        os.makedirs(path)
        pathlib.Path(path, "saved_model.pb").write_bytes(b"partial")
        raise RuntimeError("disk full")

    monkeypatch.setattr(saved_model, "_write_archive", fail_halfway)
    with pytest.raises(RuntimeError, match="disk full"):
        export_saved_model(model, tmp_path, name="m")
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["3"]
