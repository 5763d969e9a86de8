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


def class_name_problem(names):
    """Why ``names`` are not class names, in words (None when they are): each a non-empty string that is one
    line by Unicode's definition (``str.splitlines()`` finds no break in it: not only ``\\n`` but U+2028,
    U+2029, U+0085, ``\\x0b``, ``\\x0c``, ``\\x1c``-``\\x1e``), and no name twice: a ``class_names.txt``
    reads back one name a line, as many names as classes.

    Examples:
        >>> from keras_preact.models.class_names import class_name_problem
        >>> class_name_problem(["cat", "dog"]) is None
        True
        >>> print(class_name_problem(["cat", "cat", "dog"]))
        'cat' is given twice: class names are unique
        >>> print(class_name_problem(["cat", "d\\u2028og"]))
        'd\\u2028og' holds a line break (U+2028): a class name is one line
    """
    seen = set()
    for name in names:
        if not isinstance(name, str) or not name:
            return f"{name!r} is not a non-empty string"
        if name.splitlines() != [name]:
            breaks = sorted({f"U+{ord(c):04X}" for c in name if (c + "x").splitlines() != [c + "x"]})
            return f"{name!r} holds a line break ({', '.join(breaks)}): a class name is one line"
        if name in seen:
            return f"{name!r} is given twice: class names are unique"
        seen.add(name)
    return None


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
