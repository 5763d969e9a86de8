"""What ``pip install keras-preact`` brings, what importing the library loads, and what it imports.

The model library needs Keras and numpy only; everything else is an extra (pyproject.toml), imported
lazily where it is used. The README's two environments are one ``pip install -e ".[...]"`` line each,
and ``.ci/run`` installs them exactly so (no ``--no-deps``).
"""

import ast
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

pytestmark = pytest.mark.notf

REPO = pathlib.Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
REQUIREMENT_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
# The library's modules: importing all of them must load none of the extras below.
LIBRARY_MODULES = ["keras_preact", "keras_preact.layers", "keras_preact.models", "keras_preact.applications",
                   "keras_preact.export", "keras_preact.analysis", "keras_preact.preprocessing"]
EXTRAS_MODULES = ["matplotlib", "PIL", "tensorflow_datasets", "tensorboard", "onnx", "onnxruntime", "openvino",
                  "ray", "starlette", "uvicorn", "grpc", "keras_preact_serving",
                  "keras_preact_training"]
BACKEND_MODULES = {"tensorflow": "tensorflow", "jax": "jax", "torch": "torch"}


def requirement_name(requirement):
    return REQUIREMENT_NAME.match(requirement).group(1).lower().replace("_", "-")


APP_FOLDERS = {"keras_preact_training": "training", "keras_preact_serving": "serving"}  # import name: folder


def test_every_package_is_listed_under_its_import_name():
    """The apps install from their folders under names of their own (``package-dir``), and every folder with
    an ``__init__.py`` under a listed top-level package is listed, so a non-editable install holds every
    module the checkout has (the training app's rooms included)."""
    setuptools = PYPROJECT["tool"]["setuptools"]
    assert setuptools["package-dir"] == APP_FOLDERS
    listed = set(setuptools["packages"])
    for top in {name.split(".")[0] for name in listed}:
        folder = REPO / APP_FOLDERS.get(top, top)
        found = {".".join((top, *path.parent.relative_to(folder).parts)) for path in folder.rglob("__init__.py")}
        assert found <= listed, sorted(found - listed)
    assert {name.split(".")[0] for name in listed} == {"keras_preact", *APP_FOLDERS}


def test_a_users_training_and_serving_folders_shadow_no_app(tmp_path):
    """A project of the user's with its own ``training/`` and ``serving/`` packages (most ML repositories have
    them), run from its root: the apps and their commands still load themselves, and the user's packages
    stay the user's."""
    for name in ("training", "serving"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"MINE = {name!r}\n")
    code = ("import training, serving\n"
            "import keras_preact_training.recipe.configs, keras_preact_serving.rest\n"
            "print(training.MINE, serving.MINE, keras_preact_training.recipe.configs.__name__,"
            " keras_preact_serving.rest.__name__)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["training", "serving", "keras_preact_training.recipe.configs",
                                   "keras_preact_serving.rest"]
    scripts = {script.split(":")[0].split(".")[0] for script in PYPROJECT["project"]["scripts"].values()}
    assert scripts == set(APP_FOLDERS)


def test_the_library_requires_keras_and_numpy_only():
    names = sorted(requirement_name(r) for r in PYPROJECT["project"]["dependencies"])
    assert names == ["keras", "numpy"]


def test_no_extra_pulls_an_unbounded_torch():
    """An unpinned torch resolves to a CUDA build with several GB of NVIDIA wheels, even on a CPU machine."""
    for extra, requirements in PYPROJECT["project"]["optional-dependencies"].items():
        for requirement in requirements:
            if requirement_name(requirement) == "torch":
                assert re.search(r"<\s*2\.14\b", requirement), (extra, requirement)


def requirements_of(extra, seen=None):
    """The package names an extra brings, following ``keras-preact[...]`` references."""
    seen = set() if seen is None else seen
    seen.add(extra)
    names = set()
    for requirement in PYPROJECT["project"]["optional-dependencies"][extra]:
        inner = re.match(r"keras-preact\[([^\]]+)\]", requirement)
        if inner is None:
            names.add(requirement_name(requirement))
            continue
        for name in inner.group(1).split(","):
            if name not in seen:
                names |= requirements_of(name, seen)
    return names


def test_the_tensorflow_free_environment_has_no_tensorflow_package():
    """``[dev-notf]``, and every extra it names, brings no TensorFlow package; it has both other backends."""
    names = requirements_of("dev-notf")
    assert not {n for n in names if n.startswith("tensorflow") or n in ("tensorboard", "tf2onnx")}, names
    assert {"jax", "torch"} <= names


@pytest.mark.parametrize("extra", ["dev", "dev-notf"])
def test_ci_installs_each_environment_as_the_readme_says(extra):
    line = f'pip install -e ".[{extra}]"'
    readme, ci = (REPO / "README.md").read_text(), (REPO / ".ci" / "run").read_text()
    assert line in readme
    assert f'-m {line}' in ci
    assert "--no-deps" not in ci


def loaded_after(imports, backend):
    """Which of the extras' and the other backends' modules are loaded after ``imports``, in a new process."""
    watched = EXTRAS_MODULES + [m for b, m in BACKEND_MODULES.items() if b != backend]
    code = ("import json, sys\n" + "".join(f"import {m}\n" for m in imports)
            + f"print(json.dumps(sorted(m for m in {watched!r} if m in sys.modules)))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300,
                            env={**os.environ, "KERAS_BACKEND": backend})
    assert result.returncode == 0, result.stderr[-2000:]
    return set(json.loads(result.stdout.strip().splitlines()[-1]))


def test_importing_the_library_loads_no_extra_and_no_app():
    """Beyond what ``import keras`` loads itself where installed (PIL, matplotlib, TensorFlow's tf.data)."""
    backend = os.environ.get("KERAS_BACKEND", "tensorflow")
    assert loaded_after(LIBRARY_MODULES, backend) - loaded_after(["keras"], backend) == set()


def test_a_missing_extra_is_named_in_one_line():
    """Without matplotlib, the analysis figures fail in one line naming the extra (the library imports it)."""
    code = ("import sys\nsys.modules['matplotlib'] = None\n"
            "from keras_preact.analysis import plot_gradient_norms\n"
            "try:\n    plot_gradient_norms({'a': None}, 'x.png')\n"
            "except ImportError as error:\n    print(error)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == (
        'keras_preact.analysis draws its figures with matplotlib: pip install "keras-preact[analysis]"')


APPS = ("serving", "training", "keras_preact_training", "keras_preact_serving")  # the apps, by any name


def imported_modules(path):
    """Every module name an import statement in ``path`` names (relative imports resolved; for
    ``from m import n`` both ``m`` and ``m.n``), wherever the statement is (functions included)."""
    package = list(path.relative_to(REPO).with_suffix("").parts[:-1])
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            yield module
            yield from (f"{module}.{alias.name}" for alias in node.names)


def test_the_library_imports_no_app():
    """Nothing in ``keras_preact/`` imports the serving or the training app: they import the library."""
    found = [
        (str(path.relative_to(REPO)), name)
        for path in sorted((REPO / "keras_preact").rglob("*.py"))
        for name in imported_modules(path)
        if name.split(".")[0] in APPS or name == "keras_preact.serving" or name.startswith("keras_preact.serving.")
    ]
    assert found == []
    assert not list(
        (REPO / "keras_preact").glob("serving/**/*.py")
    )  # the serving app is serving/ (a stale __pycache__ may stay)


# What of the development environment must not reach the product's code, messages, metadata or comments.
WORKSHOP_TRACES = {
    "the shared data path": re.compile(r"\.\./shared"),
    "an issue number or title": re.compile(r"\bissues? *(#?\d+|[\"\u201c'])", re.IGNORECASE),
    "a test hook": re.compile(r"[\"'][A-Z][A-Z0-9_]*_TESTS?(_[A-Z0-9]+)*[\"']|[\"']TESTS?_[A-Z0-9_]+[\"']|_FOR_TESTS?\b"
                              r"|(?i:\btest[- ]only\b|\btest hook|\bkill hook)"),
    "the repository's file-size limit": re.compile(r"2 MB limit|committed file|this project keeps", re.IGNORECASE),
    "the development GPU machine": re.compile(r"\blent (GPU )?machine|\ba lent GPU\b|\bthe device tool\b|\bcarry: \[",
                                              re.IGNORECASE),
}


# What a user reads: the library, the apps, the benchmarks, the reproductions, the docs (their code and pages).
PRODUCT_FOLDERS = ("keras_preact", *APP_FOLDERS.values(), "benchmarks", "reproduction", "docs")
PRODUCT_PAGES = ("README.md", "BENCHMARKS.md")
HISTORY = "reproduction/benchmark-history.md"  # the dated record of earlier measurements, kept as it was written


def product_files(root=REPO):
    """The product's Python files and Markdown pages, but the dated history."""
    files = [path for folder in PRODUCT_FOLDERS for suffix in ("*.py", "*.md")
             for path in (root / folder).rglob(suffix)]
    files += [root / page for page in PRODUCT_PAGES if (root / page).is_file()]
    return sorted(path for path in files if path.relative_to(root).as_posix() != HISTORY)


def workshop_traces(root=REPO):
    """(file, line number, what, line) for each line of the product's code and pages that names the development
    environment."""
    return [(str(path.relative_to(root)), number, what, line.strip())
            for path in product_files(root)
            for number, line in enumerate(path.read_text().splitlines(), 1)
            for what, pattern in WORKSHOP_TRACES.items() if pattern.search(line)]


@pytest.mark.parametrize("line, what", [
    ('    "tar xzf ../shared/data/cifar10-jpeg.tar.gz"', "the shared data path"),
    ("    # 2-core CPU machine (issue \"Trained for real\", item 3).", "an issue number or title"),
    ("# see issue 24", "an issue number or title"),
    ('TEST_KILL_ENV = "KERAS_PREACT_TEST_KILL_AT"', "a test hook"),
    ('    if os.environ.get("REFERENCE_TEST_KILL_AFTER_EPOCH") == "2":', "a test hook"),
    ('"""Test hook: SIGKILL this process."""', "a test hook"),
    ("per-file limit (this project keeps each committed file under 2 MB)", "the repository's file-size limit"),
    ("CIFAR_TEST = dict(test_input_size=(16, 16, 3))", None),
    ('UPSTREAM_ISSUE = "keras-team/keras#20585"', None),
    ("A lent GPU machine starts bare (its Python has PyTorch and JAX with CUDA)", "the development GPU machine"),
    ("# then through the device tool, carry [\".whl\", \".gpu-carry\"], from the repository root:",
     "the development GPU machine"),
    ('help="every file to keep ($OUT on a lent machine)"', "the development GPU machine"),
    ("so that a machine lent by the hour ends with its results written", None),
    ('    """Remove a registered network (for tests and interactive sessions)."""', None),
])
@pytest.mark.parametrize("where", ["keras_preact/x.py", "benchmarks/x.py", "reproduction/run/README.md",
                                   "docs/x.md", "README.md", "BENCHMARKS.md"])
def test_workshop_traces_are_recognised(line, what, where, tmp_path):
    (tmp_path / where).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / where).write_text(line + "\n")
    assert [found[2] for found in workshop_traces(tmp_path)] == ([what] if what else [])


def test_the_product_names_no_development_machine_path_or_issue():
    """No ``../shared`` data path, issue number or title, test hook or repository file-size rationale in the
    library's, the apps', the benchmarks' or the reproductions' code, messages, comments and registry metadata, nor
    in the docs: a user has none of them."""
    assert workshop_traces() == []


def test_the_serving_tests_share_one_images_helper():
    """The serving tests' random images come from ``support.images``: no test file builds its own copy (four did)."""
    copies = [path.name for path in sorted((REPO / "tests" / "serving").glob("*.py"))
              if re.search(r"^def images\(|default_rng\(\d*\)\.integers\(0, 256, \(", path.read_text(), re.M)]
    assert copies == []


def test_the_product_uses_no_asyncio_event_loop_policy():
    """asyncio's event loop policies are deprecated in Python 3.14 and removed in 3.16: no product code uses them."""
    policy = re.compile(r"event_loop_policy|EventLoopPolicy")
    assert [str(path.relative_to(REPO)) for path in product_files() if path.suffix == ".py"
            and policy.search(path.read_text())] == []


def test_no_checkpoint_file_is_committed():
    """Checkpoints are results a reproduction regenerates (its README says how), not code: none is tracked by git
    outside the tests' fixtures, and .gitignore keeps new ones out."""
    try:
        tracked = subprocess.run(["git", "ls-files", "-z", "--", "*.pt", "*.pth", "*.ckpt"], cwd=REPO,
                                 capture_output=True, text=True, timeout=60, check=True).stdout.split("\0")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    assert [path for path in tracked if path and not path.startswith("tests/data/")] == []
    ignored = subprocess.run(
        [
            "git",
            "check-ignore",
            "--no-index",
            "reproduction/x/checkpoint.pt",
            "reproduction/x/model.pth",
            "benchmarks/last.ckpt",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ignored.stdout.split() == [
        "reproduction/x/checkpoint.pt",
        "reproduction/x/model.pth",
        "benchmarks/last.ckpt",
    ]
