"""The serving app on its dependencies' public APIs, and its two command lines from one set of records: nothing
private of uvicorn is imported (so uvicorn is not held to one minor version), and ``keras-preact-serve`` and
``keras-preact-serve-ray`` take the same flags with the same defaults for what they share."""

import ast
import pathlib
import re

import pytest

pytestmark = [pytest.mark.notf, pytest.mark.any_backend, pytest.mark.once]

REPO = pathlib.Path(__file__).resolve().parents[2]


def imported_modules(path):
    """Every module ``path`` imports (``import a.b`` and ``from a.b import c``: "a.b" and "a.b.c"), and every
    ``a.b`` it reads (an attribute of an imported module: ``uvicorn.config.LOGGING_CONFIG`` is "uvicorn.config")."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names += [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):  # uvicorn.config.X used
            names.append(f"{node.value.id}.{node.attr}")
    return names


def test_the_serving_app_imports_nothing_private_of_uvicorn_and_the_pin_allows_newer_releases():
    """No ``uvicorn._*`` module (``uvicorn._compat``), no ``uvicorn.protocols`` (its HTTP protocol classes) and no
    ``uvicorn.config`` (its protocol table): uvicorn's documented ``Config``/``Server`` only; so the ``serve`` extra
    does not cap uvicorn below its next minor release."""
    private = {
        f"{path.name}: {name}"
        for path in sorted((REPO / "serving").glob("*.py"))
        for name in imported_modules(path)
        if re.match(r"uvicorn\.(_|protocols|config|lifespan|loops|middleware|supervisors)", name)
    }
    assert not private, sorted(private)
    serve = re.search(r'^serve = \[(.*)\]$', (REPO / "pyproject.toml").read_text(), re.M).group(1)
    pin = re.search(r'"uvicorn([^"]*)"', serve).group(1)
    upper = re.search(r"<\s*([\d.]+)", pin)
    assert upper is None or tuple(map(int, upper.group(1).split("."))) > (0, 55), pin


def flag_defaults(parser):
    """{flag: (default, type)} of a parser's options (its positional arguments as their names)."""
    return {(action.option_strings or [action.dest])[0]: (action.default, action.type)
            for action in parser._actions if action.dest != "help"}  # noqa: SLF001 - argparse has no public list


def test_both_command_lines_take_the_shared_flags_with_the_same_defaults():
    """The request limits, the batching options, and what is served where (model, host, port, model name,
    runtime): one definition each, the same flags and defaults on ``keras-preact-serve`` and
    ``keras-preact-serve-ray``; only what one command alone has differs (gRPC, --verbose, --max-connections and
    --enable-batching: a Ray replica always batches, through Ray Serve's ``@serve.batch``; Ray's placement)."""
    import dataclasses

    from keras_preact_serving import flags

    serve, ray = flag_defaults(flags.serve_parser()), flag_defaults(flags.ray_parser())
    shared = {name: value for name, value in serve.items() if name in ray}
    assert {name: ray[name] for name in shared} == shared
    records = [f"--{field.name.replace('_', '-')}" for record in (flags.RequestLimits, flags.BatchingOptions)
               for field in dataclasses.fields(record) if not field.metadata["server_only"]]
    assert set(records) | {"model_base_path", "--port", "--host", "--model-name", "--runtime"} == set(shared)
    assert set(serve) - set(shared) == {"--max-connections", "--enable-batching", "--grpc-port", "--verbose"}
    assert set(ray) - set(shared) == {"--replicas", "--address", "--replica-cpus", "--max-replicas-per-node",
                                      "--num-cpus", "--object-store-memory"}
    assert ray["--batching-timeout-ms"] == (0.0, float) and ray["--batching-max-size"] == (32, int)


def test_each_limit_says_what_it_limits():
    """The examples one request may hold (``max_request_instances``, a 413 above) and the examples of one batched
    model call (``batching_max_size``, TF Serving's ``max_batch_size``) are two records' fields with two names."""
    import dataclasses

    from keras_preact_serving import flags

    limits = {field.name for field in dataclasses.fields(flags.RequestLimits)}
    batching = {field.name for field in dataclasses.fields(flags.BatchingOptions)}
    assert "max_request_instances" in limits and "batching_max_size" in batching
    assert not any("batch" in name for name in limits)
