"""The exported ``serving_bytes`` signature sees an image exactly as evaluation does.

For the same JPEG, the SavedModel's probabilities equal ``model(normalize(eval_view(jpeg)))`` computed
with ``keras_preact.preprocessing``, at 224 (shorter side 256, crop_fraction 0.875) and at 320 (the test
of a network trained at 224: shorter side 320, crop_fraction 1.0).
"""

import json

import keras
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow", reason="needs TensorFlow")

from keras_preact.applications import PreActResNet18
from keras_preact.export import export_saved_model
from keras_preact.models import PreActResNetClassifier, create_model, get_input_config, imagenet_resnet
from keras_preact.preprocessing import InputConfig, eval_view, normalize
from support import (
    encode_image,
    make_position_sensitive_classifier,
    photo_like,
    randomize_statistics,
)

# One worker (`--dist loadgroup`): the module fixture's exports (224 and 320) are made once, not on each worker.
pytestmark = pytest.mark.xdist_group("test_export_preprocessing")
IMAGENET = get_input_config("imagenet_resnet18")  # 224, crop_fraction 0.875
CONFIGS = {"224": IMAGENET, "320": IMAGENET.at_test_size(320)}
# Landscape and portrait photos, as a client would send them.
JPEGS = [encode_image(photo_like(375, 500, seed=1), quality=90), encode_image(photo_like(500, 375, seed=2), quality=90)]


def evaluated(model, encoded, config):
    """What evaluation computes for one encoded image, through the shared preprocessing module."""
    pixels = normalize(eval_view(tf.constant(encoded), config), config.mean, config.std)
    return keras.ops.convert_to_numpy(model(np.asarray(pixels)[None], training=False))[0]


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def exported(request, tmp_path_factory):
    keras.utils.clear_session(free_memory=False)
    config = CONFIGS[request.param]
    model = make_position_sensitive_classifier(config.input_size, name=f"tiny{request.param}")
    path = export_saved_model(model, tmp_path_factory.mktemp("exports"), input_config=config, top_k=2)
    return config, model, path, tf.saved_model.load(str(path)).signatures


@pytest.mark.core
def test_served_output_equals_evaluated_output(exported):
    config, model, _, signatures = exported
    served = signatures["serving_bytes"](image_bytes=tf.constant(JPEGS))["probabilities"].numpy()
    expected = np.stack([evaluated(model, jpeg, config) for jpeg in JPEGS])
    np.testing.assert_allclose(served, expected, atol=1e-5, rtol=0)
    # serving_default on the evaluation view's pixels says the same.
    views = np.stack([eval_view(tf.constant(j), config).numpy() for j in JPEGS])
    floats = signatures["serving_float"](images=tf.constant(views))["probabilities"].numpy()
    np.testing.assert_allclose(floats, expected, atol=1e-5, rtol=0)


@pytest.mark.core
def test_palette_and_1_bit_bmps_are_served_as_their_pixels(exported):
    """``serving_bytes`` gives an 8-bit palette BMP and a 1-bit BMP the output of their pixels (Pillow's, sent as a
    lossless PNG): TensorFlow's own BMP decoder served the palette's indices as gray and refused the 1-bit one."""
    import io

    from PIL import Image

    _, _, _, signatures = exported
    photo = Image.fromarray(photo_like(150, 200, seed=3))
    bmps, pngs = [], []
    for mode in ("P", "1"):
        bmp = io.BytesIO()
        photo.convert(mode).save(bmp, format="BMP")
        bmps.append(bmp.getvalue())
        pngs.append(encode_image(np.asarray(Image.open(io.BytesIO(bmp.getvalue())).convert("RGB")), "PNG"))
    served = signatures["serving_bytes"](image_bytes=tf.constant(bmps))["probabilities"].numpy()
    np.testing.assert_array_equal(
        served, signatures["serving_bytes"](image_bytes=tf.constant(pngs))["probabilities"].numpy()
    )


@pytest.mark.core
def test_the_served_view_is_not_the_shorter_side_to_crop_view(exported):
    """The export used to resize the shorter side to the crop itself whatever the model's evaluation
    crop; at crop_fraction 0.875 that view gives other outputs than the one evaluation uses."""
    config, model, _, signatures = exported
    served = signatures["serving_bytes"](image_bytes=tf.constant(JPEGS))["probabilities"].numpy()
    old = np.stack([evaluated(model, jpeg, config.replace(crop_fraction=1.0)) for jpeg in JPEGS])
    if config.crop_fraction == 1.0:  # the 320 test: the shorter side is the crop, as before
        np.testing.assert_allclose(served, old, atol=1e-5, rtol=0)
    else:
        assert np.abs(served - old).max() > 1e-3


@pytest.mark.core
def test_the_archive_records_its_input_config(exported):
    config, _, path, _ = exported
    written = json.loads((path / "assets" / "preprocessing.json").read_text(encoding="utf-8"))
    assert written == config.to_dict() and InputConfig.from_dict(written) == config
    assert sorted(p.name for p in (path / "assets").iterdir()) == ["class_names.txt", "preprocessing.json"]


def test_explicit_arguments_override_the_input_config_and_default_to_the_whole_image(tmp_path):
    model = make_position_sensitive_classifier((64, 48, 3))
    config = IMAGENET.replace(input_size=(64, 48, 3))
    path = export_saved_model(model, tmp_path, name="a", input_config=config.to_dict(), crop_fraction=0.5,
                              interpolation="bicubic", mean=[1, 2, 3])
    written = InputConfig.from_dict(json.loads((path / "assets" / "preprocessing.json").read_text()))
    assert written == config.replace(crop_fraction=0.5, interpolation="bicubic", mean=(1, 2, 3))
    # Without an input config: crop_fraction 1.0 (the shorter side resized to the crop), mean 0, std 1.
    path = export_saved_model(model, tmp_path, name="b")
    written = InputConfig.from_dict(json.loads((path / "assets" / "preprocessing.json").read_text()))
    assert written == InputConfig(input_size=(64, 48, 3), mean=(0, 0, 0), std=(1, 1, 1), crop_fraction=1.0)
    jpeg = encode_image(photo_like(90, 150), quality=95)
    served = tf.saved_model.load(str(path)).signatures["serving_bytes"](image_bytes=tf.constant([jpeg]))
    np.testing.assert_allclose(served["probabilities"].numpy()[0], evaluated(model, jpeg, written), atol=1e-5)


def test_a_registry_model_exports_with_its_own_input_config_and_class_names(tmp_path):
    """No input_config/class_names arguments: an ImageNet registry model serves ``serving_bytes``
    through its own 0.875 evaluation view and names its classes; explicit arguments still override."""
    model = randomize_statistics(create_model("imagenet_resnet18", num_classes=3, input_shape=(64, 64, 3)))
    model.class_names = ["ant", "bee", "cat"]
    config = IMAGENET.replace(input_size=(64, 64, 3))
    path = export_saved_model(model, tmp_path, name="own", top_k=2)
    written = InputConfig.from_dict(json.loads((path / "assets" / "preprocessing.json").read_text()))
    assert written == config and written.crop_fraction == 0.875
    assert (path / "assets" / "class_names.txt").read_text().split() == ["ant", "bee", "cat"]
    served = tf.saved_model.load(str(path)).signatures["serving_bytes"](image_bytes=tf.constant(JPEGS))
    expected = np.stack([evaluated(model, jpeg, config) for jpeg in JPEGS])
    np.testing.assert_allclose(served["probabilities"].numpy(), expected, atol=1e-5, rtol=0)
    path = export_saved_model(model, tmp_path, name="given", top_k=1, crop_fraction=1.0, class_names=["x", "y", "z"],
                              input_config=config.replace(interpolation="bicubic"))
    written = InputConfig.from_dict(json.loads((path / "assets" / "preprocessing.json").read_text()))
    assert written == config.replace(interpolation="bicubic", crop_fraction=1.0)
    assert (path / "assets" / "class_names.txt").read_text().split() == ["x", "y", "z"]



def test_a_fine_tuned_classifier_exports_under_its_networks_name_with_the_folders_class_names(tmp_path):
    """Fine-tuning: a new head on a trained classifier's backbone, sized by a folder's class names
    (``image_dataset_from_directory(...).class_names``): the export is served under the network's name
    (not Keras' ``pre_act_res_net_classifier``) and names the folder's classes, with no argument."""
    from keras_preact.models import cifar_resnet

    trained = cifar_resnet(8, input_shape=(16, 16, 3))
    folder = tmp_path / "folder"
    for name in ("cat", "dog"):
        (folder / name).mkdir(parents=True)
        (folder / name / "0.png").write_bytes(encode_image(photo_like(16, 16, seed=len(name)), "PNG"))
    dataset = keras.utils.image_dataset_from_directory(folder, image_size=(16, 16), batch_size=2, verbose=False)
    model = PreActResNetClassifier(trained.backbone, class_names=dataset.class_names)
    assert (model.name, model.num_classes, model.output_shape) == ("preact_resnet8_cifar", 2, (None, 2))
    path = export_saved_model(model, tmp_path / "exports")
    assert path == tmp_path / "exports" / "preact_resnet8_cifar" / "1"
    assert (path / "assets" / "class_names.txt").read_text().splitlines() == ["cat", "dog"]
    served = tf.saved_model.load(str(path)).signatures["serving_default"](images=tf.zeros((1, 16, 16, 3), tf.uint8))
    assert sorted(served["class_names"].numpy()[0].tolist()) == [b"cat", b"dog"]

# ResNet-18 with 10 classes at 224, built each way a user can: each carries ImageNet's input config.
IMAGENET18 = {
    "imagenet_resnet": lambda: imagenet_resnet(18, num_classes=10, input_shape=(224, 224, 3)),
    "create_model": lambda: create_model("imagenet_resnet18", num_classes=10),
    "PreActResNet18": lambda: PreActResNet18(classes=10),
    "classifier class": lambda: PreActResNetClassifier(
        imagenet_resnet(18, include_top=False, input_shape=(224, 224, 3)), 10),
}


@pytest.mark.parametrize("build", sorted(IMAGENET18))
def test_every_way_to_build_an_imagenet_model_carries_its_input_config_to_the_export(build):
    """Whichever way a 224 ResNet-18 was built, the input config an export takes from the model (the only thing
    of the model the export's preprocessing reads) is ImageNet's: ``imagenet_resnet`` once built none, and its
    export served another crop. The test below serves one such export end to end."""
    from keras_preact.export.version_dir import carried

    model = IMAGENET18[build]()
    assert model.input_config == IMAGENET
    assert carried(model, None, None, None)[0] is model.input_config


def test_an_imagenet_model_serves_its_evaluation_view(tmp_path):
    """Exported with ``mean``/``std`` only, a 224 ResNet-18 serves ``serving_bytes`` of a 500 x 375 photo
    through ImageNet's evaluation view (shorter side 256, centre 224), the input config its builder gave it."""
    keras.utils.set_random_seed(0)
    model = randomize_statistics(IMAGENET18["PreActResNet18"]())
    path = export_saved_model(model, tmp_path, name="resnet18", mean=IMAGENET.mean, std=IMAGENET.std, top_k=1)
    served = tf.saved_model.load(str(path)).signatures["serving_bytes"](image_bytes=tf.constant(JPEGS[:1]))
    np.testing.assert_allclose(served["probabilities"].numpy()[0], evaluated(model, JPEGS[0], IMAGENET),
                               atol=2e-3, rtol=0)


@pytest.mark.parametrize("kwargs, argument", [
    (dict(crop_fraction=0.0), "crop_fraction"),
    (dict(crop_fraction=1.5), "crop_fraction"),
    (dict(crop_fraction="0.875"), "crop_fraction"),
    (dict(interpolation="cubic"), "interpolation"),
    (dict(input_config="imagenet"), "input_config"),
    (dict(input_config=IMAGENET.at_test_size(320)), "input_config"),  # 320 for a 224 model
    (dict(input_config={"input_size": [224, 224, 3], "crop_pct": 0.9}), "input_config"),
    (dict(input_config=IMAGENET, mean=[1.0, 2.0]), "mean"),
])
def test_bad_preprocessing_arguments_raise_before_writing_anything(tmp_path, kwargs, argument):
    model = make_position_sensitive_classifier((224, 224, 3))
    with pytest.raises(ValueError, match=f"^Invalid {argument}"):
        export_saved_model(model, tmp_path / "out", **kwargs)
    assert not (tmp_path / "out").exists()


def test_the_export_uses_only_public_export_api():
    """The model is converted with ExportArchive's public add_endpoint/track/write_out; no private
    method of ExportArchive (such as _backend_add_endpoint) is called."""
    import inspect

    from keras_preact.export import saved_model

    source = inspect.getsource(saved_model)
    assert "archive._" not in source and "_backend_add_endpoint" not in source


@pytest.mark.parametrize("crop_mode", ["torchvision", "keras"])
def test_serving_bytes_views_as_the_checkpoints_library(tmp_path, crop_mode):
    """serving_bytes of a 243 x 323 PNG at crop 32 of 35 (nearest) sees the pixels of the checkpoint's library's view:
    torchvision's (the longer side 323 * 35 / 243 = 46.52 truncated to 46, the top offset round(1.5) = 2 where
    flooring says 1) or Keras' (the centred 243 x 243 square from column int(80 / 2) = 40, resized to 35, the centre
    32 from 3 // 2 = 1)."""
    from PIL import Image
    from test_view_arithmetic import coordinates, torchvision_center_crop_offsets, torchvision_resized_size

    config = InputConfig(input_size=(32, 32, 3), crop_fraction=32 / 35, interpolation="nearest",
                         mean=(100.0, 110.0, 120.0), std=(60.0, 61.0, 62.0))  # torchvision's: the default
    config = config.replace(crop_mode="keras") if crop_mode == "keras" else config
    pixels = coordinates(243, 323)
    if crop_mode == "keras":
        square, top, left = Image.fromarray(pixels[:, 40:283]).resize((35, 35), Image.Resampling.NEAREST), 1, 1
    else:
        height, width = torchvision_resized_size(243, 323, 35)
        square = Image.fromarray(pixels).resize((width, height), Image.Resampling.NEAREST)
        top, left = torchvision_center_crop_offsets(height, width, 32, 32)
    resized = np.asarray(square, np.float32)
    model = make_position_sensitive_classifier(config.input_size, name=f"tiny_{crop_mode}")

    def predicted(view):
        normalized = (view - np.float32(config.mean)) / np.float32(config.std)
        return keras.ops.convert_to_numpy(model(normalized[None], training=False))

    expected = predicted(resized[top:top + 32, left:left + 32])
    path = export_saved_model(model, tmp_path, input_config=config, top_k=2)
    served = tf.saved_model.load(str(path)).signatures["serving_bytes"](
        image_bytes=tf.constant([encode_image(pixels, "PNG")]))["probabilities"].numpy()
    np.testing.assert_allclose(served, expected, atol=1e-6, rtol=0)
    one_row_off = predicted(resized[top + 1:top + 33, left:left + 32])  # the model tells one row apart
    assert np.abs(one_row_off - expected).max() > 1e-3
