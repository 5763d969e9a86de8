"""What an image folder may hold, through the commands a user runs (``keras-preact-train`` on a folder,
``keras-preact-train finetune-folder``) and ``create_model(..., class_names=...)``: class names one line each by
Unicode's definition and unique, two or more classes, a bound on each image's pixels read from its header before
anything is decoded, and entries that are no readable file (broken or looping symbolic links) left out in one
line. Each refusal is one line naming the class, the file or the argument, before any work."""

import os
import struct
import zlib

import pytest

from keras_preact_training import cli
from support import TRAIN_JIT_COMPILE, write_image_folder

pytestmark = [pytest.mark.notf]

# Every character str.splitlines() breaks a line at, besides "\n" and "\r".
LINE_BREAKS = ("\u2028", "\u2029", "\x85", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e")


def write_folder(root, classes=("cat", "dog"), per_class=4, size=16):
    return write_image_folder(root, classes, per_class, size)


def gray_png(path, width, height):
    """A valid 8-bit grayscale PNG of one colour, ``width`` x ``height``, written without holding its pixels: its
    rows compress to a few hundred KB whatever the size (a decompression bomb)."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    packer, row = zlib.compressobj(1), bytes(width + 1)  # filter byte 0 and the row's zeros
    body = b"".join(packer.compress(row) for _ in range(height)) + packer.flush()
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
                     + chunk(b"IDAT", body) + chunk(b"IEND", b""))
    return path


def train_on(data_dir, run_dir, *extra, preset=None):
    """``keras-preact-train`` on an image folder: a tiny run (ResNet-8, two steps), or ``preset``'s."""
    small = ["--batch-size", "4", "--steps", "2"]
    recipe = [preset, *small] if preset else ["--dataset", "folder", "--normalization", "centered", "--depth", "8",
                                              "--image-size", "16", "16", *small]
    return cli.main([*recipe, "--data-dir", str(data_dir), "--run-dir", str(run_dir), "--no-export", "--verbose",
                     "0", "--jit-compile", TRAIN_JIT_COMPILE, *extra])


def refusal(capsys, run):
    """The one line a refused command ends with (exit status 2), and nothing trained."""
    with pytest.raises(SystemExit) as raised:
        run()
    assert raised.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("keras-preact-train: error")]
    assert len(lines) == 1
    return lines[0]


@pytest.mark.parametrize("brk", LINE_BREAKS, ids=[f"U+{ord(c):04X}" for c in LINE_BREAKS])
def test_a_class_folder_whose_name_holds_a_line_break_is_refused_naming_it(tmp_path, capsys, brk):
    """A class folder named ``d<break>og`` would train and export a ``class_names.txt`` of more lines than classes."""
    data = write_folder(tmp_path / "data", classes=("cat", f"d{brk}og"))
    line = refusal(capsys, lambda: train_on(data, tmp_path / "run", preset="finetune-folder"))
    assert f"Invalid class folder in {data / 'train'}: {f'd{brk}og'!r} holds a line break (U+{ord(brk):04X}): " \
           "a class name is one line; rename the folder." in line
    assert not (tmp_path / "run" / "config.json").exists()  # nothing built


@pytest.mark.parametrize("brk", LINE_BREAKS, ids=[f"U+{ord(c):04X}" for c in LINE_BREAKS])
def test_create_model_refuses_class_names_with_a_line_break(brk):
    from keras_preact.models import create_model

    with pytest.raises(ValueError) as raised:
        create_model("cifar_resnet20", weights="cifar10", class_names=["cat", f"d{brk}og"])
    assert str(raised.value).startswith(f"Invalid class_names: {f'd{brk}og'!r} holds a line break "
                                        f"(U+{ord(brk):04X}): a class name is one line;")


def test_create_model_refuses_duplicate_class_names():
    from keras_preact.models import create_model

    with pytest.raises(ValueError) as raised:
        create_model("cifar_resnet20", weights="cifar10", class_names=["cat", "cat", "dog"])
    assert str(raised.value) == ("Invalid class_names: 'cat' is given twice: class names are unique; 3 unique "
                                 "one-line strings (one per class) or None are required.")


def test_one_class_is_refused_in_a_folder_and_as_num_classes(tmp_path, capsys):
    """A one-unit softmax is always 1: it trained with rc 0 to test accuracy 0."""
    from keras_preact.models import create_model

    data = write_folder(tmp_path / "data", classes=("cat",))
    for preset in ("finetune-folder", None):
        line = refusal(capsys, lambda preset=preset: train_on(data, tmp_path / "run", preset=preset))
        assert line.endswith(f"One class folder in {data / 'train'} ('cat'): a classifier needs two or more "
                             "classes, one sub-folder of images each.")
    for kwargs in ({"num_classes": 1}, {"weights": "cifar10", "class_names": ["cat"]},
                   {"weights": "cifar10", "num_classes": 1}):
        with pytest.raises(ValueError, match=r"^Invalid num_classes=1 with classifier_activation='softmax': a "
                                             r"one-unit softmax is always 1; two or more classes are required"):
            create_model("cifar_resnet20", **kwargs)


def test_an_image_over_the_pixel_bound_is_refused_from_its_header_naming_it(tmp_path, capsys):
    """A 9500x9500 PNG of one colour (90,250,000 pixels, 150 KB) among small images: refused before anything is
    decoded, by default (Pillow's 89,478,485) and by ``--max-image-pixels``; a bound it is under lets it train."""
    data = write_folder(tmp_path / "data")
    bomb = gray_png(data / "train" / "cat" / "bomb.png", 9500, 9500)
    assert bomb.stat().st_size < 2**20
    line = refusal(capsys, lambda: train_on(data, tmp_path / "run", preset="finetune-folder"))
    assert line.endswith(f"Image file {bomb} is 9500x9500 = 90,250,000 pixels, over the bound of 89,478,485 pixels "
                         "per image (--max-image-pixels; default 89,478,485, Pillow's): resize it, remove it, or "
                         "raise the bound.")
    bomb.unlink()
    larger = gray_png(data / "train" / "cat" / "larger.png", 20, 20)  # the others are 16x16
    line = refusal(capsys, lambda: train_on(data, tmp_path / "run", "--resize-images", "--max-image-pixels", "399"))
    assert f"Image file {larger} is 20x20 = 400 pixels, over the bound of 399 pixels per image" in line
    assert train_on(data, tmp_path / "run", "--resize-images", "--max-image-pixels", "400") == 0


def test_the_pixel_bound_holds_on_the_streamed_folder_path(tmp_path):
    """The folder streamed batch by batch (``FolderFiles``, no TensorFlow): refused at the start, from the header."""
    from keras_preact_training.data import sources

    data = write_folder(tmp_path / "data")
    bomb = gray_png(data / "train" / "dog" / "bomb.png", 9500, 9500)
    with pytest.raises(sources.DataError) as raised:
        sources.folder_files(data, (16, 16))
    assert str(raised.value).startswith(f"Image file {bomb} is 9500x9500 = 90,250,000 pixels, over the bound")
    files = sources.folder_files(data, (16, 16), max_image_pixels=None)  # no bound: listed, decoded when read
    assert str(bomb) in files.train_files


@pytest.mark.parametrize("link", ["looping", "broken"])
def test_a_looping_or_broken_symlink_in_a_class_folder_is_left_out_in_one_line(tmp_path, capsys, link):
    """A self-looping ``x.jpg`` ended in a 27-line ``OSError: Too many levels of symbolic links`` traceback."""
    data = write_folder(tmp_path / "data")
    entry = data / "train" / "cat" / "x.jpg"
    os.symlink(entry if link == "looping" else tmp_path / "gone.jpg", entry)
    assert train_on(data, tmp_path / "run") == 0
    out = capsys.readouterr().out
    assert (f"[data] skipped 1 entries of {data / 'train'} that are no readable file (a broken or looping symbolic "
            f"link, or a folder), e.g. {entry}") in out


def test_the_pixel_bound_holds_on_the_tf_data_streamed_folder(tmp_path, capsys):
    """``--augmentation imagenet`` streams the files through tf.data: the header is read before the file is, and
    the run stops in one line naming the file and the bound."""
    pytest.importorskip("tensorflow")
    data = write_folder(tmp_path / "data")
    bomb = gray_png(data / "train" / "dog" / "bomb.png", 9500, 9500)
    code = train_on(data, tmp_path / "run", "--augmentation", "imagenet", "--architecture", "imagenet",
                    "--depth", "18", "--eval-image-size", "16", "16", "--normalization", "imagenet")
    err = capsys.readouterr().err
    assert code == 1, err[-2000:]
    line = next(line for line in err.splitlines() if line.startswith("keras-preact-train: error"))
    assert line.startswith("keras-preact-train: error: model.fit failed: InvalidArgumentError: assertion failed: "
                           "[Image over --max-image-pixels 89,478,485 (resize or remove it, or raise the bound):] "
                           f"[{bomb}] [pixels:] [90250000]")
