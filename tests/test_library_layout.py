"""The model library's layout: no module of ``keras_preact`` imports one that imports it back, and its rooms import
only downwards: preprocessing < layers < models < pretrained < applications < export, analysis.

Read from the source with ``ast`` (every import, top-level or in a function), as ``test_training_layout`` reads the
training app. Importing a package's module runs the package's ``__init__`` first, so ``from keras_preact.layers
import options`` depends on ``keras_preact/layers/__init__.py`` too; a module's own enclosing packages are not
counted (Python has run them before the module).

No function of the library is over ``MAX_FUNCTION_LINES`` lines of code (blank lines, comments and docstrings
aside), read with ``ast`` too."""

import ast

import pytest
from test_training_layout import REPO, find_cycle, imported_names

pytestmark = [pytest.mark.core, pytest.mark.notf, pytest.mark.any_backend]

ROOT = "keras_preact"
# Each room's rank: a module imports only from rooms of its rank or lower (``preprocessing``, ``scratch``: modules).
RANKS = {"preprocessing": 0, "scratch": 0, "layers": 1, "models": 2, "pretrained": 3, "applications": 4, "export": 5,
         "analysis": 5}
# The one lazy import upwards: create_model (``ModelSpec.build``, in models/registry.py) calls the checkpoint loader,
# which sits above the networks it builds and loads into.
LAZY_UPWARD = {("keras_preact.models.registry", "keras_preact.pretrained"),
               ("keras_preact.models.registry", "keras_preact.pretrained.loader")}


def modules():
    folder = REPO / ROOT
    found = {}
    for path in sorted(folder.rglob("*.py")):
        parts = [ROOT, *path.relative_to(folder).with_suffix("").parts]
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(name, path, known):
    """The modules of ``known`` that importing ``path`` (module ``name``) runs, its own packages aside."""
    targets = set()
    for source in imported_names(name, path):
        parts = source.split(".")
        targets.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))  # each package on the way
    own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 2)}
    return {t for t in targets if t in known and t not in own}


def graph():
    found = modules()
    return {name: sorted(imports(name, path, found)) for name, path in found.items()}


def room(name):
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else None


def upward_edges(edges):
    return {(a, b) for a, targets in edges.items() for b in targets
            if room(a) in RANKS and room(b) in RANKS and RANKS[room(b)] > RANKS[room(a)]}


def test_the_graph_sees_function_level_and_package_imports():
    edges = graph()
    assert "keras_preact.pretrained.loader" in edges["keras_preact.models.registry"]  # inside ModelSpec.build
    assert "keras_preact.layers" in edges["keras_preact.models.backbone"]  # runs layers/__init__.py first
    assert "keras_preact.models" not in edges["keras_preact.models.registry"]  # its own package: not an edge
    assert set(RANKS) | {None, "weights"} >= {room(name) for name in edges}  # every room ranked


def test_no_module_of_the_library_imports_one_that_imports_it_back():
    edges = graph()
    assert find_cycle({a: [b for b in targets if (a, b) not in LAZY_UPWARD] for a, targets in edges.items()}) is None


def test_rooms_import_only_downwards_but_for_the_one_lazy_import():
    assert upward_edges(graph()) == LAZY_UPWARD


def test_the_lazy_import_is_in_a_function_under_a_comment():
    path = REPO / "keras_preact" / "models" / "registry.py"
    lines = path.read_text().splitlines()
    found = [i for i, line in enumerate(lines) if "from keras_preact.pretrained.loader import" in line]
    assert len(found) == 1 and lines[found[0]].startswith("        ")  # indented: inside a method
    assert lines[found[0] - 1].strip().startswith("# The one lazy import of the library")


MAX_FUNCTION_LINES = 70  # lines of code: neither blank nor comment nor docstring


def code_lines(function, source_lines):
    """The lines of code of ``function`` (an ``ast`` function node): its lines, nested functions' included, less
    the blank ones, the comments and the docstrings (its own and its nested functions' and classes')."""
    docstrings = set()
    for node in ast.walk(function):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and ast.get_docstring(node):
            first = node.body[0]
            docstrings.update(range(first.lineno, first.end_lineno + 1))
    return sum(1 for number in range(function.lineno, function.end_lineno + 1)
               if number not in docstrings and source_lines[number - 1].strip()
               and not source_lines[number - 1].strip().startswith("#"))


def long_functions(limit=MAX_FUNCTION_LINES):
    found = {}
    for name, path in modules().items():
        text = path.read_text()
        lines = text.splitlines()
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and code_lines(node, lines) > limit:
                found[f"{name}:{node.lineno} {node.name}"] = code_lines(node, lines)
    return found


def test_code_lines_count_neither_blanks_nor_comments_nor_docstrings():
    source = 'def f(x):\n    """Doc\n\n    string."""\n    # a comment\n\n    def g():\n        """Doc."""\n' \
             '        return x\n    return g  # a trailing comment counts: code\n'
    (function,) = ast.parse(source).body
    assert code_lines(function, source.splitlines()) == 4  # def f, def g, return x, return g


def test_no_function_of_the_library_is_over_70_lines_of_code():
    assert long_functions() == {}
