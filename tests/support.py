"""The test suite's shared checks and fixtures (not part of the library).

Reusable checks for layers and models, in the manner of keras-hub's ``TestCase.run_*_test`` and timm's
``tests/test_models.py``: each ``run_*_test`` function is one check on one layer or network (config echo,
saving, forward/backward, pyramid outputs, mixed precision, channels-first), plus the helpers they share;
the export and serving tests' models and images; and ``decline_usage_telemetry`` for test and benchmark
processes. Tests import it as ``support`` (pytest puts tests/ on the path), benchmarks as ``tests.support``."""

import inspect
import os
import re
import sys
import tempfile

import keras
import numpy as np

# ``--jit-compile`` of the training runs tests start: one XLA program per step on JAX (eagerly every op is a
# program of its own: a ResNet-8 step took 32 s on a loaded CI core, against 7 s jitted), none on TensorFlow
# (XLA's compile of a step costs more than the few steps a test runs) and PyTorch.
TRAIN_JIT_COMPILE = "true" if keras.backend.backend() == "jax" else "false"

# The environment of the training and benchmark processes tests start: one OpenMP (PyTorch intra-op) thread.
# CI runs two test workers on two cores; a PyTorch process's default of one thread per core oversubscribes them,
# and its threads then wait on each other: the reference's ResNet-8 steps (batch 4) on the loaded 2-core machine
# ran at 1.4 images/s with PyTorch's 2 threads, 33 with one. The numbers tests check do not depend on it.
ONE_THREAD = {"OMP_NUM_THREADS": "1"}



def tiny_training_command(run_dir, *options, epochs, steps_per_epoch):
    """``python -m keras_preact_training.cli`` training the tests' tiny network (ResNet-8 on 16x16 images, batch
    16) for ``epochs`` x ``steps_per_epoch`` steps into ``run_dir``, then ``options``."""
    return [sys.executable, "-m", "keras_preact_training.cli", "--depth", "8", "--image-size", "16", "16",
            "--batch-size", "16", "--epochs", str(epochs), "--steps-per-epoch", str(steps_per_epoch),
            "--run-dir", str(run_dir), *options]

def trainable_params(model):
    return sum(int(np.prod(w.shape)) for w in model.trainable_weights)


def to_numpy(x):
    return keras.ops.convert_to_numpy(x)


def zero_branch(unit):
    """Set every convolution kernel of a unit's residual branch to zero."""
    for conv in unit.convs():
        conv.kernel.assign(np.zeros(conv.kernel.shape, "float32"))


def vector_jacobian_product(fn, x, upstream):
    """``upstream^T d fn / d x`` with the current backend's autodiff (the library's one autodiff table,
    ``keras_preact.analysis.autodiff``): the gradient of ``sum(fn(x) * upstream)``."""
    from keras_preact.analysis.autodiff import get_autodiff

    upstream = keras.ops.convert_to_tensor(np.asarray(upstream, "float32"))

    def objective(x):
        return keras.ops.sum(fn(x) * upstream), None

    _, _, grads = get_autodiff().value_and_grad(objective, [keras.ops.convert_to_tensor(x)])
    return to_numpy(grads[0])


def run_config_echo_test(cls, instance):
    """Every constructor argument is echoed by ``get_config`` and ``from_config`` rebuilds it."""
    config = instance.get_config()
    arguments = [p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "kwargs")]
    missing = [a for a in arguments if a not in config]
    assert not missing, f"get_config misses {missing}"
    clone = cls.from_config(config)
    assert clone.get_config() == config


def run_saving_test(model, inputs, atol=0.0):
    """A ``.keras`` round trip with ``safe_mode=True`` gives the same outputs."""
    expected = to_numpy(model(inputs, training=False))
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "model.keras")
        model.save(path)
        restored = keras.saving.load_model(path, safe_mode=True)
    actual = to_numpy(restored(inputs, training=False))
    np.testing.assert_allclose(actual, expected, rtol=0, atol=atol)
    return restored


def _value_and_grads(model, images, labels):
    """Cross-entropy of ``model`` on a batch and its gradient for every trainable variable."""
    from keras_preact.analysis.autodiff import get_autodiff

    variables = model.trainable_variables
    non_trainable = [v.value for v in model.non_trainable_variables]
    loss_fn = keras.losses.SparseCategoricalCrossentropy()

    def objective(values):
        outputs, _ = model.stateless_call(values, non_trainable, images, training=True)
        return keras.ops.cast(loss_fn(labels, outputs), "float32"), None

    value, _, grads = get_autodiff().value_and_grad(objective, [[v.value for v in variables]])
    return to_numpy(value), [to_numpy(g) for g in grads[0]]


def run_forward_backward_test(model, images, labels, inference=True):
    """Finite outputs (in training mode, and in inference mode where ``inference``); a finite,
    non-zero gradient on every trainable variable.

    With fresh BN statistics (mean 0, variance 1) every unit of an untrained pre-activation network
    roughly doubles the signal's variance in inference mode (x + F(x), F variance-preserving), so
    networks of a few hundred units overflow float32 there until trained: pass ``inference=False``.
    """
    for training in (True, False) if inference else (True,):
        assert np.isfinite(to_numpy(model(images, training=training))).all(), f"non-finite output ({training=})"
    loss, grads = _value_and_grads(model, images, labels)
    assert np.isfinite(loss)
    dead = [v.path for v, g in zip(model.trainable_variables, grads) if not np.isfinite(g).all() or not np.any(g)]
    assert not dead, f"zero or non-finite gradient for {dead}"


def run_pyramid_outputs_test(backbone, images):
    """``pyramid_outputs["P{n}"]`` is at stride 2^n with the channels ``feature_info`` names."""
    extractor = keras.Model(backbone.input, backbone.pyramid_outputs)
    outputs = extractor(images, training=False)
    assert set(outputs) == set(backbone.pyramid_outputs) and outputs
    channels_last = backbone.data_format == "channels_last"
    height, width = images.shape[1:3] if channels_last else images.shape[2:4]
    for info in backbone.feature_info:
        level = info["level"]
        if level is None or backbone.get_layer(info["layer"]).output is not backbone.pyramid_outputs[level]:
            continue
        shape = tuple(outputs[info["level"]].shape)
        expected = (-(-height // info["stride"]), -(-width // info["stride"]))
        spatial, channels = (shape[1:3], shape[3]) if channels_last else (shape[2:4], shape[1])
        assert spatial == expected and channels == info["channels"], (info, shape)
        assert 2 ** int(info["level"][1:]) == info["stride"]


def run_mixed_precision_test(build, images, policy="mixed_bfloat16"):
    """Under ``policy`` every layer computes in the low precision with float32 variables, except
    the float32 output."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        model = build()
        output = model(images, training=True)  # batch statistics: finite at any depth, untrained
    finally:
        keras.config.set_dtype_policy(previous)
    compute = policy.split("_")[1]
    assert keras.backend.standardize_dtype(output.dtype) == "float32"
    assert np.isfinite(to_numpy(output)).all()

    assert all(variable.dtype == "float32" for variable in model.weights)

    def layers(model):
        for layer in model.layers:
            yield from layers(layer) if isinstance(layer, keras.Model) else [layer]

    for layer in layers(model):
        if isinstance(layer, (keras.layers.Conv2D, keras.layers.Dense)) and layer.name != "logits":
            assert layer.compute_dtype == compute, (layer.name, layer.compute_dtype)
        if hasattr(layer, "convs"):  # a ResidualUnit passes its policy to its convolutions
            assert layer.convs()[0].compute_dtype == compute, layer.name


def compiled_call(model, inputs, training=False):
    """``model(inputs)`` in a compiled function: TensorFlow's CPU kernels are NHWC-only, so a
    ``channels_first`` network runs on a TensorFlow CPU only through XLA (as ``fit``/``predict``
    compile it by default)."""
    if keras.backend.backend() != "tensorflow":
        return model(inputs, training=training)
    import tensorflow as tf

    return tf.function(lambda x: model(x, training=training), jit_compile=True, autograph=False)(inputs)


def run_channels_first_test(build, images, atol=1e-5):
    """``data_format="channels_first"`` gives the channels-last network's outputs on transposed
    images, with the same weights (in training mode: batch statistics keep any depth finite)."""
    last = build(data_format="channels_last")
    first = build(data_format="channels_first", input_shape=(images.shape[3], *images.shape[1:3]))
    first.set_weights(last.get_weights())
    expected = to_numpy(last(images, training=True))
    actual = to_numpy(compiled_call(first, np.transpose(images, (0, 3, 1, 2)), training=True))
    assert np.isfinite(expected).all()
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=atol)


# ---------------------------------------------------------------------- export and serving fixtures
def crop_draws(outputs, image, padding):
    """The (row offset, column offset, mirrored) that made each of ``outputs`` (N, H, W, C) from ``image`` (H, W, C)
    by zero-padding ``padding`` pixels, cropping back to H x W and mirroring left-right: looked up among every
    possible view, so each draw is identified exactly (``image`` needs distinct non-zero pixels and H, W >
    2 * padding, so that no two views are equal). An output that is no such view fails."""
    height, width = image.shape[:2]
    padded = np.pad(image, [(padding, padding), (padding, padding), (0, 0)])
    views = {}
    for oy in range(2 * padding + 1):
        for ox in range(2 * padding + 1):
            for mirrored in (False, True):
                view = padded[oy:oy + height, ox:ox + width]
                views[np.ascontiguousarray(view[:, ::-1] if mirrored else view).tobytes()] = (oy, ox, mirrored)
    assert len(views) == 2 * (2 * padding + 1) ** 2, "the image must make every view distinct"
    draws = [views.get(np.ascontiguousarray(out, image.dtype).tobytes()) for out in outputs]
    assert None not in draws, f"output {draws.index(None)} is no padded crop (nor its mirror) of the image"
    return np.array(draws, dtype=np.int64)


def assert_uniform_crop_draws(draws, padding):
    """Every offset -padding..padding each way and both mirrorings drawn, uniformly and independently per image:
    each axis's counts pass Pearson's chi-square test at p = 1e-6 (8 degrees of freedom for padding 4: 42.7), the
    mirror count lies within 5.5 standard deviations of n / 2 (p = 4e-8), and every (row, column, mirror) cell
    occurs (n = 4000: a cell of 1/162 is missed with probability 3e-9). A never-reached extreme offset, an
    offset range shifted by one, a flip never or always taken fail by far."""
    n, sides = len(draws), 2 * padding + 1
    bound = {4: 42.70}[padding]  # chi2.isf(1e-6, 8)
    for axis, name in ((0, "row"), (1, "column")):
        counts = np.bincount(draws[:, axis], minlength=sides)
        assert len(counts) == sides and counts.min() > 0, f"{name} offsets drawn: {counts.tolist()} of 0..{sides - 1}"
        chi2 = ((counts - n / sides) ** 2 / (n / sides)).sum()
        assert chi2 < bound, f"{name} offsets {counts.tolist()}: chi-square {chi2:.1f} >= {bound}"
    mirrored = int(draws[:, 2].sum())
    assert abs(mirrored - n / 2) < 5.5 * np.sqrt(n) / 2, f"{mirrored} of {n} mirrored"
    cells = len({tuple(d) for d in draws.tolist()})
    assert cells == 2 * sides * sides, f"{cells} of {2 * sides * sides} (row, column, mirror) draws occur"


CLASS_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
MEAN = [124.14, 122.96, 112.57]  # CIFAR-10 statistics in 0-255 pixel units
STD = [62.50, 61.85, 66.42]


def images(n, seed=0):
    """``n`` random uint8 CIFAR-size images ``[n, 32, 32, 3]``, the same for the same ``seed``: what the serving
    tests send."""
    return np.random.default_rng(seed).integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)


def randomize_statistics(model, seed=0):
    """Random BN moving statistics, gammas, betas and biases, so that every weight matters."""
    rng = np.random.default_rng(seed)
    for v in model.non_trainable_variables:
        shape = tuple(v.shape)
        v.assign(rng.uniform(0.5, 2.0, shape) if "variance" in v.path else rng.normal(0.0, 0.2, shape))
    for v in model.trainable_variables:
        if "gamma" in v.path or "beta" in v.path or "bias" in v.path:
            v.assign(rng.normal(1.0 if "gamma" in v.path else 0.0, 0.2, tuple(v.shape)))
    return model


def make_export_model(seed=0, name="resnet8"):
    """A CIFAR ResNet-8 (10 classes, 32 x 32) with random statistics: the export and serving tests' model.
    It carries no input config (``input_config=None``): those tests give export its preprocessing."""
    from keras_preact.models import cifar_resnet

    keras.utils.set_random_seed(seed)
    return randomize_statistics(cifar_resnet(8, 10, name=name, input_config=None), seed)


def make_position_sensitive_classifier(input_size, num_classes=5, seed=0, name="tiny"):
    """A small classifier at ``input_size`` (h, w, 3) whose output depends on where each pixel is
    (strided conv, local pooling, flatten, dense, softmax): it tells apart two crops of one image."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input(input_size)
    x = keras.layers.Conv2D(4, 8, strides=8)(inputs)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.Activation("relu")(x)
    x = keras.layers.AveragePooling2D(4)(x)
    x = keras.layers.Flatten()(x)
    outputs = keras.layers.Dense(num_classes, activation="softmax", name="predictions")(x)
    return randomize_statistics(keras.Model(inputs, outputs, name=name), seed)


def encode_image(pixels, fmt="JPEG", **options):
    """uint8 ``[H, W, 3]`` pixels encoded with Pillow (``fmt``: JPEG, PNG, GIF, BMP), as bytes."""
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.asarray(pixels, np.uint8)).save(buffer, fmt, **options)
    return buffer.getvalue()


def write_image_folder(root, classes=("cat", "dog"), per_class=8, size=32):
    """``root`` with ``train/`` and ``test/``, each holding ``per_class`` random PNGs of ``size`` x ``size`` pixels in
    one folder per class (the image-folder layout ``keras-preact-train --dataset folder`` reads); the same pixels
    for the same arguments."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for name in classes:
            (root / split / name).mkdir(parents=True)
            for i in range(per_class):
                Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(
                    root / split / name / f"{i:04d}.png")
    return root


FLOWER_CLASSES = ["daisy", "rose", "tulip"]


def write_flower_folder(root, size, per_class=8):
    """``root`` holding 3 classes (``FLOWER_CLASSES``) x ``per_class`` images of ``size`` (height, width), PNG and
    JPEG alternately, one folder per class and no test split; each class brightest in its own channel."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for label, name in enumerate(FLOWER_CLASSES):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.uniform(0, 80, (*size, 3))
            pixels[..., label] += 160
            Image.fromarray(pixels.astype("uint8")).save(root / name / f"{i}.{'png' if i % 2 else 'jpg'}")
    return root


def photo_like(height, width, seed=0):
    """A smooth uint8 RGB test image (gradients and blobs, no noise), as a JPEG would hold a photo."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    channels = []
    for _ in range(3):
        cy, cx, r = rng.uniform(0, height), rng.uniform(0, width), rng.uniform(0.1, 0.4) * min(height, width)
        blob = np.exp(-((y - cy) ** 2 + (x - cx) ** 2) / (2 * r * r))
        ramp = rng.uniform(-1, 1) * x / width + rng.uniform(-1, 1) * y / height
        channels.append(128 + 90 * blob + 60 * ramp + 20 * np.sin(x / rng.uniform(3, 12)))
    return np.clip(np.stack(channels, -1), 0, 255).astype(np.uint8)


# ------------------------------------------------------------------------------- units of metrics
# The convention every command line and JSON file follows: an accuracy or an error is a fraction in [0, 1],
# under a key that says which (``*_accuracy``, ``*_error``; the registry's ``top1``/``top5``).
METRIC_KEY = re.compile(r"^(?:\w*_)?(?:accuracy|error)$|^top[15]$")
PRINTED_METRIC = re.compile(r"(?<![\w-])(\w*(?:accuracy|error)|top-?[15])(?::)?\s+(-?\d+(?:\.\d+)?)(\s*%)?")


def misnamed_metrics(value, where="$"):
    """``[(path, value)]`` of every accuracy or error in ``value`` (nested dicts and lists, as read from
    JSON) that is not a fraction in [0, 1], and of every key naming a percentage (``*_percent``)."""
    wrong = []
    if isinstance(value, dict):
        for key, item in value.items():
            path = f"{where}.{key}"
            if str(key).endswith("_percent") or (METRIC_KEY.match(str(key)) and isinstance(item, (int, float))
                                                 and not 0 <= item <= 1):
                wrong.append((path, item))
            wrong += misnamed_metrics(item, path)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            wrong += misnamed_metrics(item, f"{where}[{i}]")
    return wrong


def printed_metrics(text):
    """``[(name, value, percent sign)]`` of every accuracy or error printed in ``text``: ``name value``
    (keras-preact's summaries) or ``top-1 87.15%`` (a percentage)."""
    return [(name, float(value), bool(percent)) for name, value, percent in PRINTED_METRIC.findall(text)]


def assert_printed_fractions(text, expected_names):
    """Every accuracy and error printed in ``text`` is a fraction in [0, 1], with no % sign, under one of
    its keys; ``expected_names`` are all printed."""
    printed = printed_metrics(text)
    wrong = [(name, value) for name, value, percent in printed
             if percent or not METRIC_KEY.match(name) or not 0 <= value <= 1]
    assert wrong == [], f"not a fraction under its key: {wrong} in {text!r}"
    assert set(expected_names) <= {name for name, _, _ in printed}, text


# ---------------------------------------------------------------------- test and benchmark processes
def decline_usage_telemetry():
    """Keep tests and benchmarks from reporting usage to third parties: Ray's usage statistics off in this
    process and its children (``RAY_USAGE_STATS_ENABLED=0`` unless set), and OpenVINO's telemetry
    declined through its own consent file (``~/intel/openvino_telemetry``, what its ``opt_in_out --opt_out``
    writes) where no choice is recorded yet: ``import openvino`` sends an event unless declined or CI=true."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        from openvino_telemetry.utils.opt_in_checker import ConsentCheckResult, OptInChecker
    except ImportError:
        return
    checker = OptInChecker()
    if checker.consent_file_base_dir() is not None and not os.path.exists(checker.consent_file()):
        checker.update_result(ConsentCheckResult.DECLINED)


# ---------------------------------------------------------------------- a numpy model's server in its own process
# A Server on a numpy model: y = sum(x) per example, after sleeping x[0][1] seconds (0: no sleep). With a file
# descriptor as argv[5], the model writes one line there for each example as it enters the model (before its
# sleep): a test waits on those lines, the event, not on a guess of how long the requests take to arrive.
NUMPY_SERVER = """
import sys, time
import numpy as np
from keras_preact_serving import app, rest, server
from keras_preact_serving.batching import BatchingOptions

class Model:
    name, version, path = "m", 1, "numpy"
    signatures = {"serving_default": "numpy"}
    input_specs = {"serving_default": {"x": rest.TensorSpec("x", "float32", (None, 2))}}
    metadata = {"model_spec": {"name": "m", "signature_name": "", "version": "1"}}

    def status(self):
        return {"model_version_status": [{"version": "1", "state": "AVAILABLE"}]}

    def predict(self, signature_name, inputs):
        if entered is not None:
            entered.write("".join(f"{row[0]:g}\\n" for row in inputs["x"]))
            entered.flush()
        time.sleep(float(inputs["x"][0][1]))
        return {"y": inputs["x"].sum(axis=1)}

entered = open(int(sys.argv[5]), "w") if len(sys.argv) > 5 else None

batching = None if sys.argv[1] == "off" else BatchingOptions(batching_max_size=8, batching_timeout_ms=50)
in_flight = {} if sys.argv[4] == "default" else {"max_bodies_in_flight_bytes": int(sys.argv[4])}
limits = app.RequestLimits(request_timeout=float(sys.argv[2]), max_body_bytes=int(sys.argv[3]), **in_flight)
served = server.Server(app.ServingState(Model, limits, batching), "127.0.0.1", 0)
served.state.start()
print(served.server_address[1], flush=True)
served.serve_forever()
served.server_close()
print("exited", flush=True)
"""


def start_numpy_server(batching, timeout, max_body, max_bodies_in_flight=None, report_entries=False):
    """(process, port) of ``NUMPY_SERVER`` in its own process: ``batching`` "off" or "on", the request limits given
    (``max_bodies_in_flight`` None: the server's default). With ``report_entries``, ``process.entered`` is a text
    pipe's read end (a file descriptor) the model writes a line to for each example entering it
    (``wait_for_entries`` reads them)."""
    import pathlib
    import select
    import subprocess
    import sys

    import keras_preact

    repo = str(pathlib.Path(keras_preact.__file__).parents[1])  # where keras_preact_serving is found too
    in_flight = "default" if max_bodies_in_flight is None else str(max_bodies_in_flight)
    arguments = [sys.executable, "-c", NUMPY_SERVER, batching, str(timeout), str(max_body), in_flight]
    read_end = write_end = None
    if report_entries:
        read_end, write_end = os.pipe()
        arguments.append(str(write_end))
    try:
        process = subprocess.Popen(
            arguments, stdout=subprocess.PIPE, text=True, pass_fds=() if write_end is None else (write_end,),
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3",
                 "PYTHONPATH": os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), repo]))})
    finally:
        if write_end is not None:
            os.close(write_end)  # the server holds the only write end: its exit ends the file
    process.entered = read_end
    ready, _, _ = select.select([process.stdout], [], [], 120)
    assert ready, "the server did not start"
    return process, int(process.stdout.readline())


def wait_for_entries(process, values, timeout=120):
    """Returns once the examples whose first values are ``values`` (floats other than 0: the server's warm-up sends
    zeros) have all entered the model of a server started with ``report_entries``, which reports each as it enters
    (a line on the pipe ``process.entered``, read unbuffered so that ``select`` sees every line); fails after
    ``timeout`` s. An example in a batch call in progress has entered."""
    import select
    import time

    wanted, seen, data, deadline = {float(v) for v in values}, set(), b"", time.monotonic() + timeout
    while not wanted <= seen:
        ready, _, _ = select.select([process.entered], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"of {sorted(wanted)}, only {sorted(wanted & seen)} reached the model in {timeout} s"
        chunk = os.read(process.entered, 4096)
        assert chunk, f"the server closed its report with only {sorted(wanted & seen)} of {sorted(wanted)} in the model"
        data += chunk
        seen = {float(line) for line in data.decode().split()}


def stop_numpy_server(process):
    """SIGTERM: the server drains and exits 0."""
    import signal

    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0


# TensorFlow's C++ lines that no documented setting hides (logged while its libraries load, before
# absl::InitializeLog()): a command's "one line" is its own, these aside.
TF_START_UP_LINE = re.compile(
    r"^(?:WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|[IWE]\d{4} [\d:.]+\s+\d+ (?:cudart_stub|port|cuda_platform|cuda_executor|cuda_diagnostics)\.cc:\d+\] .*)$"
)


def our_lines(text):
    """The non-empty lines of a command's stderr, TensorFlow's own start-up lines (``TF_START_UP_LINE``) left out."""
    return [line for line in text.splitlines() if line.strip() and not TF_START_UP_LINE.match(line)]


def require_data(path, what):
    """Skip the test when the data set at ``path`` is not there, or, under CI (``CI=true``, as GitHub Actions and
    most CI services set it), fail it: a CI run without the data would pass while testing less."""
    if path.exists():
        return
    import pytest

    if os.environ.get("CI") == "true":
        pytest.fail(f"{path} is not here ({what}): with CI=true a missing data set fails the tests that read it; "
                    "put it there, or unset CI to skip them", pytrace=False)
    pytest.skip(f"{path} is not here ({what})")


def never_sent_call(channel, method, request_type, response_type):
    """(open, release) for a unary gRPC ``method`` whose client sends its headers and never its message: each
    ``open()`` starts such a call (its request iterator blocks until ``release.set()``) and returns its future."""
    import threading

    release = threading.Event()

    def nothing():  # the request message never comes (until release)
        release.wait(60)
        yield from ()

    call = channel.stream_unary(method, request_serializer=request_type.SerializeToString,
                                response_deserializer=response_type.FromString).future
    return (lambda: call(nothing())), release
