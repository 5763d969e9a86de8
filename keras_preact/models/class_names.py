"""Class names shipped as package data, read on first use: the 1,000 ImageNet-1k classes of the published
checkpoints (``imagenet1k_classes.txt``, next to this module: source and licence in its header).

``IMAGENET1K_CLASSES`` is what the registry's ImageNet-1k weights entries carry as ``class_names``; the file
is read when the names are first used (a model built with those weights, ``decode_predictions``), not when
``keras_preact`` is imported.
"""

import collections.abc
import pathlib

IMAGENET1K_FILE = pathlib.Path(__file__).resolve().with_name("imagenet1k_classes.txt")


class ClassNames(collections.abc.Sequence):
    """``count`` class names from a text file (one per line, index = label; ``#`` lines are its header),
    read and checked on first use; equal to the tuple of its names."""

    def __init__(self, file, count, what):
        self.file, self.count, self.what = pathlib.Path(file), count, what
        self._names = None

    def names(self):
        """The names, a tuple; ValueError when the file is missing or does not hold ``count`` unique names."""
        if self._names is None:
            try:
                lines = self.file.read_text(encoding="utf-8").splitlines()
            except OSError as error:
                raise ValueError(f"Invalid {self.what} class names: {self.file} is unreadable ({error}); reinstall "
                                 "keras-preact (the class names are package data).") from None
            names = tuple(line for line in lines if line and not line.startswith("#"))
            if len(names) != self.count or len(set(names)) != self.count:
                raise ValueError(f"Invalid {self.what} class names: {self.file} holds {len(names)} names "
                                 f"({len(set(names))} unique), {self.count} unique names are expected.")
            self._names = names
        return self._names

    def __len__(self):
        return self.count

    def __getitem__(self, index):
        return self.names()[index]

    def __iter__(self):
        return iter(self.names())

    def __eq__(self, other):
        if isinstance(other, ClassNames):
            return self.names() == other.names()
        return isinstance(other, (list, tuple)) and self.names() == tuple(other)

    def __hash__(self):
        return hash(self.names())

    def __repr__(self):
        return f"<{self.count} {self.what} class names, {self.file.name}>"


IMAGENET1K_CLASSES = ClassNames(IMAGENET1K_FILE, 1000, "ImageNet-1k")


def imagenet_class_names():
    """The 1,000 ImageNet-1k class names, a tuple in the standard class order (index = label: the classes
    sorted by WordNet ID), each its synset's WordNet lemmas; what ``decode_predictions`` names the classes of
    an ImageNet-1k checkpoint with.

    Examples:
        >>> from keras_preact.models import imagenet_class_names
        >>> names = imagenet_class_names()
        >>> len(names), names[0], names[999]
        (1000, 'tench, Tinca tinca', 'toilet tissue, toilet paper, bathroom tissue')
    """
    return IMAGENET1K_CLASSES.names()
