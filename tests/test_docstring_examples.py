"""The ``Examples:`` of the public API run as doctests, one case per docstring, and every public name has them.

``MODULES`` lists, explicitly, the modules whose docstrings are collected (``doctest.DocTestFinder``: a
module's own docstring and those of the functions, classes and methods defined in it). Each docstring
runs in an empty temporary working directory, which must still be empty afterwards (an example writes
only into its own ``tempfile`` directory). Outputs are what every backend prints: shapes as tuples,
counts, names, exact fractions; never unrounded floats.

``PUBLIC`` names the public modules: each name in a module's ``__all__`` (else each function and class
defined in it without a leading underscore) that is a function, a class or a module carries an
``Examples:`` section with at least one ``>>>`` line, in a docstring collected here; so a new public
function without one fails ``test_every_public_name_has_examples_that_run``.

An example that needs what not every environment has (TensorFlow, a backend that writes the SavedModel,
Pillow, matplotlib) is listed in ``NEEDS`` and skipped, with the reason, where it is missing.
"""

import doctest
import importlib
import importlib.util
import inspect
import io

import pytest

# The examples build Keras models and run them, TensorFlow-free included (CI: on TensorFlow and PyTorch, marker docs).
pytestmark = [pytest.mark.core, pytest.mark.notf, pytest.mark.docs]

MODULES = [
    "keras_preact",
    "keras_preact.layers",
    "keras_preact.layers.batch_normalization",
    "keras_preact.layers.convolution",
    "keras_preact.layers.eval_view",
    "keras_preact.layers.fused",
    "keras_preact.layers.options",
    "keras_preact.layers.padding",
    "keras_preact.layers.residual_unit",
    "keras_preact.layers.unit_config",
    "keras_preact.models",
    "keras_preact.models.backbone",
    "keras_preact.models.cifar",
    "keras_preact.models.class_names",
    "keras_preact.models.classifier",
    "keras_preact.models.finetune",
    "keras_preact.models.levers",
    "keras_preact.models.imagenet",
    "keras_preact.models.registry",
    "keras_preact.pretrained.cache",
    "keras_preact.pretrained.loader",
    "keras_preact.applications",
    "keras_preact.pretrained.convert_keras",
    "keras_preact.pretrained.convert_timm",
    "keras_preact.applications.preact_resnet",
    "keras_preact.applications.processing",
    "keras_preact.preprocessing",
    "keras_preact.export",
    "keras_preact.export.contract",
    "keras_preact.export.exporting",
    "keras_preact.export.formats",
    "keras_preact.export.quantize",
    "keras_preact.export.runtimes",
    "keras_preact.export.version_dir",
    "keras_preact.analysis",
    "keras_preact.analysis.autodiff",
    "keras_preact.analysis.health",
    "keras_preact.analysis.jacobian",
    "keras_preact.analysis.plots",
    "keras_preact.analysis.signals",
    "keras_preact_training.data.mixing",
    "keras_preact_training.data.pipelines",
    "keras_preact_training.evaluate",
    "keras_preact_training.recipe.augment",
    "keras_preact_training.run.parts",
]
# Public modules: (module, whether its own docstring must carry Examples too).
PUBLIC = [
    ("keras_preact", True),
    ("keras_preact.layers", True),
    ("keras_preact.models", True),
    ("keras_preact.applications", True),
    ("keras_preact.preprocessing", True),
    ("keras_preact.export", True),
    ("keras_preact.analysis", True),
    ("keras_preact_training.evaluate", False),  # its module docstring is the command line's; its __all__ the Python API
]
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _installed(module):
    return importlib.util.find_spec(module) is not None


def _tensorflow():
    return None if _installed("tensorflow") else "needs TensorFlow"


def _saved_model_export():
    """Why this environment cannot write a SavedModel (TensorFlow, and the tensorflow or jax backend)."""
    from keras_preact.export import check_formats

    try:
        check_formats("saved_model")
    except (ImportError, ValueError) as error:
        return str(error)
    return None


def _module(name):
    return lambda: None if _installed(name) else f"needs {name}"


# docstring (DocTest name) -> () -> why it cannot run here, or None.
NEEDS = {
    "keras_preact.preprocessing.center_crop": _tensorflow,
    "keras_preact.preprocessing.decode_image": _tensorflow,
    "keras_preact.preprocessing.eval_view": _tensorflow,
    "keras_preact.preprocessing.is_encoded_image": _tensorflow,
    "keras_preact.preprocessing.normalize": _tensorflow,
    "keras_preact.preprocessing.resize_shorter_side": _tensorflow,
    "keras_preact.preprocessing.resize_to_aspect_ratio": _tensorflow,
    "keras_preact.preprocessing.view_pixels": _tensorflow,
    "keras_preact.preprocessing.pillow_pixels": _module("PIL"),
    "keras_preact.preprocessing.decode_image_array": _module("PIL"),
    "keras_preact.export.exporting.export_model": _saved_model_export,
    "keras_preact.export.exporting.export_saved_model": _saved_model_export,
    "keras_preact.analysis.plots.plot_gradient_norms": _module("matplotlib"),
    "keras_preact.analysis.plots.plot_spectra": _module("matplotlib"),
    "keras_preact_training.evaluate.evaluate": _module("PIL"),
    "keras_preact_training.data.pipelines.FolderBatches": _module("PIL"),
}


def collect():
    """Every docstring with examples in ``MODULES``, sorted by name."""
    finder = doctest.DocTestFinder()
    tests = {}
    for name in MODULES:
        for test in finder.find(importlib.import_module(name)):
            if test.examples:
                tests[test.name] = test
    return [tests[name] for name in sorted(tests)]


DOCTESTS = collect()


@pytest.mark.parametrize("test", DOCTESTS, ids=[t.name for t in DOCTESTS])
def test_docstring_examples(test, tmp_path, monkeypatch):
    reason = NEEDS.get(test.name, lambda: None)()
    if reason:
        pytest.skip(reason)
    monkeypatch.chdir(tmp_path)
    report = io.StringIO()
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    result = runner.run(test, out=report.write, clear_globs=True)
    assert result.failed == 0, f"{test.name} ({test.filename}:{test.lineno}):\n{report.getvalue()}"
    assert result.attempted > 0, f"{test.name}: every example is skipped"
    assert sorted(p.name for p in tmp_path.iterdir()) == [], f"{test.name} left files in its working directory"


def public_names(module):
    """``module.__all__``, else the functions and classes defined in it without a leading underscore."""
    if hasattr(module, "__all__"):
        return list(module.__all__)
    return [name for name, value in vars(module).items() if not name.startswith("_")
            and (inspect.isfunction(value) or inspect.isclass(value)) and value.__module__ == module.__name__]


def missing_examples():
    """``(public name, what is wrong)`` for every public function, class or module without run examples."""
    collected = {t.name for t in DOCTESTS if any(e.options.get(doctest.SKIP) is not True for e in t.examples)}
    wrong = []
    for module_name, own_docstring in PUBLIC:
        module = importlib.import_module(module_name)
        objects = [(module_name, module)] if own_docstring else []
        for name in public_names(module):
            value = getattr(module, name)
            if inspect.ismodule(value) or inspect.isfunction(value) or inspect.isclass(value):
                objects.append((f"{module_name}.{name}", value))
        for public, value in objects:
            where = value.__name__ if inspect.ismodule(value) else f"{value.__module__}.{value.__qualname__}"
            doc = inspect.getdoc(value) or ""
            if "Examples:" not in doc:
                wrong.append((public, "no Examples: section"))
            elif where not in collected:
                wrong.append((public, f"its examples ({where}) are not run: no >>> line, or its module is not in "
                                      "MODULES"))
    return wrong


def test_every_public_name_has_examples_that_run():
    assert missing_examples() == []


def test_needs_names_collected_docstrings():
    assert sorted(set(NEEDS) - {t.name for t in DOCTESTS}) == []
