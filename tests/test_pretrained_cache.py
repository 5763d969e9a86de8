"""The cache of converted checkpoints cannot lie: keyed by every source byte, verified on every load, written
whole or not at all, one converter at a time.

The checkpoints are timm folders with random weights under timm's names (``pretrained_reference``), judged by the
numpy transcription of timm's forward, as in ``test_pretrained_convert``.
"""

import errno
import json
import os
import pathlib
import subprocess
import sys

import keras
import numpy as np
import pretrained_reference as ref
import pytest

from keras_preact.models import create_model
from keras_preact.pretrained import cache
from support import to_numpy

pytestmark = [pytest.mark.core, pytest.mark.notf]
SIZE = (64, 64, 3)
TOLERANCE = 1e-4


@pytest.fixture
def home(monkeypatch, tmp_path):
    """An empty KERAS_HOME."""
    pytest.importorskip("safetensors")
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras"))
    return tmp_path / "keras"


def timm_folder(path, seed):
    from test_pretrained_convert import write_timm_folder

    state = ref.random_state(18, num_classes=5, seed=seed)
    return write_timm_folder(path, "resnetv2_18", state), state


def images(seed=0):
    return np.random.default_rng(seed).uniform(-2, 2, (2, *SIZE)).astype("float32")


def error_against(folder, state):
    """The max abs difference of ``create_model(weights=folder)``'s logits from timm's forward of ``state``."""
    model = create_model("imagenet_resnet18", weights=str(folder), input_shape=SIZE, classifier_activation=None)
    x = images()
    return float(np.abs(to_numpy(model(x)) - ref.forward(state, x)[0]).max())


def entries(home):
    return sorted((home / "keras_preact").glob("*.weights.h5"))


def test_a_folder_whose_weights_change_loads_the_new_weights(home, tmp_path):
    """model.safetensors replaced in a timm folder, config.json kept: the next load converts the new weights."""
    folder, first = timm_folder(tmp_path / "resnetv2_18", seed=1)
    assert error_against(folder, first) <= TOLERANCE
    from safetensors.numpy import save_file

    second = ref.random_state(18, num_classes=5, seed=2)
    save_file({k: np.ascontiguousarray(v) for k, v in second.items()}, str(folder / "model.safetensors"))
    assert error_against(folder, second) <= TOLERANCE
    assert len(entries(home)) == 2  # one conversion per content


def test_an_edited_cached_conversion_is_converted_again(home, tmp_path):
    """A tensor of the cached .weights.h5 changed in place (still a valid file): one warning line, the checkpoint
    converted again, the source's predictions, never the edited ones."""
    import h5py

    folder, state = timm_folder(tmp_path / "resnetv2_18", seed=3)
    assert error_against(folder, state) <= TOLERANCE
    (entry,) = entries(home)
    with h5py.File(entry, "r+") as f:
        kernels = []
        f.visititems(lambda name, obj: kernels.append(name) if name.endswith("dense/vars/0") else None)
        f[kernels[-1]][...] = f[kernels[-1]][...] + 1.0
    with pytest.warns(RuntimeWarning, match="does not match its record") as caught:
        assert error_against(folder, state) <= TOLERANCE
    assert [str(w.message).count("\n") for w in caught if "does not match" in str(w.message)] == [0]
    assert cache.read_record(entry)["sha256"] == cache.sha256_of(entry)


def test_a_truncated_cached_conversion_is_converted_again(home, tmp_path):
    """The cached .weights.h5 cut to half its bytes: one warning line and a new conversion, not an h5py traceback."""
    folder, state = timm_folder(tmp_path / "resnetv2_18", seed=4)
    assert error_against(folder, state) <= TOLERANCE
    (entry,) = entries(home)
    size = entry.stat().st_size
    os.truncate(entry, size // 2)
    with pytest.warns(RuntimeWarning, match="edited, truncated or half-written"):
        assert error_against(folder, state) <= TOLERANCE
    assert entry.stat().st_size == size


@pytest.mark.any_backend  # the cache's files, locks and disk space: the same on every backend
def test_a_full_disk_while_caching_is_one_line_naming_keras_home(home, tmp_path, monkeypatch):
    """The write fails with ENOSPC half-way (faked: the file half-written, then the OS error): one OSError line
    naming KERAS_HOME and the space needed; no partial file is left, and nothing is served."""
    folder, _ = timm_folder(tmp_path / "resnetv2_18", seed=5)

    def half_write(model, path, *args, **kwargs):
        pathlib.Path(path).write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 1000)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(keras.Model, "save_weights", half_write)
    with pytest.raises(OSError) as error:
        create_model("imagenet_resnet18", weights=str(folder), input_shape=SIZE)
    message = str(error.value)
    assert error.value.errno == errno.ENOSPC and "\n" not in message
    assert f"KERAS_HOME={home}" in message and "it needs about" in message
    assert [p.name for p in (home / "keras_preact").iterdir() if not p.name.endswith(".lock")] == []


FULL_DISK_SCRIPT = """
import sys, types
from keras_preact.models import create_model
from keras_preact.pretrained import cache
for lie in (False, True):  # the free space checked; then misreported, and the allocation refused
    if lie:
        cache.shutil = types.SimpleNamespace(disk_usage=lambda path: types.SimpleNamespace(free=1 << 40))
    try:
        create_model("imagenet_resnet18", weights=sys.argv[1], input_shape=(64, 64, 3))
    except OSError as error:
        print("ERROR", error, flush=True)
"""


@pytest.mark.any_backend  # the cache's files, locks and disk space: the same on every backend
def test_a_full_tmpfs_as_keras_home_is_one_line_and_no_crash(tmp_path):
    """KERAS_HOME on a 2 MB tmpfs (a ResNet-18 conversion needs ~45 MB): refused by its free space, then (the
    free space misreported) by the file system itself; each is one line naming KERAS_HOME, the process ends
    normally (no SIGSEGV at exit, as h5py's left when the disk filled under it) and the tmpfs holds no file."""
    pytest.importorskip("safetensors")
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a 2 MB tmpfs needs root; test_a_full_disk_while_caching_... fakes ENOSPC instead")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        folder, _ = timm_folder(tmp_path / "resnetv2_18", seed=6)
        env = {**os.environ, "KERAS_HOME": str(mount)}
        run = subprocess.run([sys.executable, "-c", FULL_DISK_SCRIPT, str(folder)], env=env, capture_output=True,
                             text=True, timeout=300)
        errors = [line for line in run.stdout.splitlines() if line.startswith("ERROR")]
        assert run.returncode == 0, run.stderr[-3000:]
        assert len(errors) == 2, run.stdout + run.stderr[-3000:]
        assert all(f"KERAS_HOME={mount}" in line and "No space left" in line for line in errors), errors
        assert [p.name for p in (mount / "keras_preact").iterdir() if not p.name.endswith(".lock")] == []
    finally:
        subprocess.run(["umount", str(mount)], check=True)


CONCURRENT_SCRIPT = """
import sys
from keras_preact.models import create_model
from keras_preact.pretrained import sources
from keras_preact.pretrained import cache
convert = sources.convert
def counted(*args, **kwargs):
    print("CONVERTING", flush=True)
    return convert(*args, **kwargs)
sources.convert = counted
print("READY", flush=True)
sys.stdin.readline()  # both processes start converting when the test says so
model = create_model("imagenet_resnet18", weights=sys.argv[1], input_shape=(64, 64, 3))
(entry,) = (cache.keras_home() / "keras_preact").glob("*.weights.h5")
print("LOADED", cache.sha256_of(entry), flush=True)
"""


@pytest.mark.any_backend  # the cache's files, locks and disk space: the same on every backend
def test_two_processes_converting_the_same_checkpoint_end_with_one_whole_file(home, tmp_path):
    """Two processes load the same new checkpoint at once (both released by one line on their stdin after both
    imported everything): the checkpoint is converted once, both read the same whole file, its record matches."""
    folder, state = timm_folder(tmp_path / "resnetv2_18", seed=7)
    env = {**os.environ, "KERAS_HOME": str(home)}
    procs = [subprocess.Popen([sys.executable, "-c", CONCURRENT_SCRIPT, str(folder)], env=env, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for _ in range(2)]
    try:
        for proc in procs:
            assert proc.stdout.readline().strip() == "READY"
        for proc in procs:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        outputs = [proc.communicate(timeout=600) for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
    assert [proc.returncode for proc in procs] == [0, 0], [err[-3000:] for _, err in outputs]
    lines = [line for out, _ in outputs for line in out.splitlines()]
    (entry,) = entries(home)
    record = json.loads(cache.record_path(entry).read_text())
    assert lines.count("CONVERTING") == 1, lines
    assert sorted(line for line in lines if line.startswith("LOADED")) == [f"LOADED {record['sha256']}"] * 2
    assert cache.sha256_of(entry) == record["sha256"]
    assert error_against(folder, state) <= TOLERANCE


@pytest.mark.any_backend  # the cache's files, locks and disk space: the same on every backend
def test_the_key_covers_every_file_of_a_folder_by_content(tmp_path):
    """Any file of a checkpoint folder changed (its config included) changes the key; a renamed copy of the same
    bytes does not; hidden files (a download tool's .cache/) do not."""
    folder = tmp_path / "checkpoint"
    (folder / ".cache").mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"a")
    first = cache.source_digest(folder)
    (folder / ".cache" / "stamp").write_text("1")
    assert cache.source_digest(folder) == first
    (folder / "model.safetensors").write_bytes(b"b")
    assert cache.source_digest(folder) != first
    (folder / "model.safetensors").write_bytes(b"a")
    (folder / "config.json").write_text('{"num_classes": 5}')
    assert cache.source_digest(folder) != first
    copy = tmp_path / "copy.safetensors"
    copy.write_bytes(b"a")
    assert cache.source_digest(copy) == cache.source_digest(folder / "model.safetensors")


@pytest.mark.hub
def test_a_keras_hub_preset_folder_whose_weights_change_loads_the_new_weights(home, tmp_path):
    """A keras-hub preset folder saved again with other weights (its config.json unchanged): the next load
    converts the new weights."""
    keras_hub = pytest.importorskip("keras_hub")
    from test_pretrained_convert import randomize

    backbone = keras_hub.models.ResNetBackbone(
        stackwise_num_filters=[64, 128, 256, 512], stackwise_num_blocks=[2, 2, 2, 2],
        stackwise_num_strides=[1, 2, 2, 2], block_type="basic_block", use_pre_activation=True,
        input_conv_filters=[64], input_conv_kernel_sizes=[7], image_shape=(None, None, 3))
    classifier = keras_hub.models.ResNetImageClassifier(backbone=backbone, num_classes=3, activation=None)
    preset, x = tmp_path / "preset", images()
    for seed in (8, 9):
        randomize(backbone, seed)
        classifier.save_to_preset(str(preset))
        model = create_model("imagenet_resnet18", weights=str(preset), input_shape=SIZE, classifier_activation=None)
        assert np.abs(to_numpy(model(x)) - to_numpy(classifier(x))).max() <= 1e-4, f"seed {seed}"
    assert len(entries(home)) == 2
