"""The training app's layout (``training/__init__.py``): no module imports one that imports it back, rooms
import only downwards, the package's ``__init__`` files import nothing, ``keras_preact_training.machine.start_up`` (the
console scripts' quiet start) is standard library only, and the model library imports no app.

Read from the source with ``ast`` (every import: top-level, in functions, in ``if __name__ == "__main__"``
blocks, relative or absolute), so nothing is loaded."""

import ast
import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.core, pytest.mark.notf, pytest.mark.any_backend]

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = REPO / "training"
# The rooms each room may import besides itself (training/__init__.py): machine < recipe < data, run. The top
# level (training.<job>) may import every room; no room imports the top level.
ROOMS_BELOW = {"machine": set(), "recipe": {"machine"}, "data": {"recipe", "machine"}, "run": {"recipe", "machine"}}


FOLDERS = {"keras_preact_training": "training"}  # import name: folder (pyproject.toml's package-dir)


def module_name(path, root_package):
    parts = [root_package, *path.relative_to(REPO / FOLDERS.get(root_package, root_package)).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root_package):
    folder = REPO / FOLDERS.get(root_package, root_package)
    return {module_name(path, root_package): path for path in sorted(folder.rglob("*.py"))}


def imported_names(name, path):
    """Every module name ``path`` imports (``from a import b`` gives ``a`` and ``a.b``)."""
    is_package = path.name == "__init__.py"
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module
            names.add(source)
            names.update(f"{source}.{alias.name}" for alias in node.names)
    return names


def graph(root_package):
    """The import graph among ``root_package``'s modules (a package's ``__init__`` named as the package)."""
    found = modules(root_package)
    return {name: sorted(n for n in imported_names(name, path) if n in found and n != name)
            for name, path in found.items()}


def find_cycle(edges):
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in edges[node]:
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        state[node] = "done"
        stack.pop()
        return None

    for node in edges:
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_the_finder_sees_a_cycle():
    assert find_cycle({"a": ["b"], "b": ["c"], "c": ["a"], "d": []}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": ["b"], "b": [], "c": ["a", "b"]}) is None


def test_every_import_of_a_relative_or_function_level_kind_is_seen():
    edges = graph("keras_preact_training")
    assert (
        "keras_preact_training.machine.start_up" in edges["keras_preact_training.cli"]
    )  # from .machine import ..., start_up
    assert "keras_preact_training.machine.start_up" in edges["keras_preact_training.export"]  # in the __main__ block
    assert "keras_preact_training.export" in edges["keras_preact_training.console"]  # inside a function
    assert (
        "keras_preact_training.recipe.configs" in edges["keras_preact_training.data.pipelines"]
    )  # from ..recipe.configs import ...


def test_no_module_of_training_imports_one_that_imports_it_back():
    assert find_cycle(graph("keras_preact_training")) is None


def room(name):
    """``training.<room>[.<module>]``'s room; None for the top level (``training``, ``training.<command>``)."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and (PACKAGE / parts[1]).is_dir() else None


def test_rooms_import_only_their_own_room_and_the_rooms_below():
    edges = graph("keras_preact_training")
    assert {room(name) for name in edges} - {None} == set(ROOMS_BELOW)
    for name, targets in edges.items():
        for target in targets:
            if room(name) is None:
                continue
            assert room(target) is not None, f"{name} (room {room(name)}) imports the top level: {target}"
            assert room(target) in {room(name)} | ROOMS_BELOW[room(name)], (name, target)


def test_package_inits_import_nothing():
    for path in PACKAGE.rglob("__init__.py"):
        tree = ast.parse(path.read_text())
        assert not [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))], path


def test_the_quiet_start_up_is_standard_library_only():
    """The console scripts import the launcher before anything loads Keras: importing it, the consoles and the
    CLI loads none of Keras, TensorFlow, JAX, PyTorch or numpy."""
    tree = ast.parse((PACKAGE / "machine" / "start_up.py").read_text())
    imported = {alias.name.split(".")[0] for node in tree.body if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in tree.body if isinstance(node, ast.ImportFrom)}
    assert imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)
    code = ("import sys; import keras_preact_training.console, keras_preact_training.machine.start_up, "
            "keras_preact_training.cli, keras_preact_serving.console; "
            "print(sorted({'keras', 'tensorflow', 'jax', 'torch', 'numpy'} & set(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(
                              p for p in (os.environ.get("PYTHONPATH"), str(REPO)) if p)})
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr[-2000:] or done.stdout

