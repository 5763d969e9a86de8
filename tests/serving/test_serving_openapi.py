"""The serving API's OpenAPI document (``keras_preact_serving.openapi``), generated from the app's declared routes:
every route is in it, and what a server serves is that document with its model's name, version and
example bodies; and schemathesis, fuzzing a real export's server from the served document on loopback
(positive and negative cases, bounded in examples and time), finds no 5xx and no reply the document does
not describe."""

import copy
import json
import threading
import time
import urllib.request

import pytest
from test_serving_metrics import Model, started

from keras_preact_serving import app, openapi

EXAMPLES_PER_OPERATION = 10  # at most, per operation and generation mode (23 operations x 2 modes, each fuzzed)
TIME_BUDGET_S = 120  # the whole fuzzing run; CI's bound, should the machine be slow


def generic(doc):
    """The served document without the served model's name, version and example bodies."""
    doc = copy.deepcopy(doc)
    for item in doc["paths"].values():
        for operation in item.values():
            for parameter in operation["parameters"]:
                parameter["schema"].pop("enum", None)
            for content in operation.get("requestBody", {}).get("content", {}).values():
                content.pop("example", None)
    return doc


def served_document(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/openapi.json", timeout=30) as reply:
        assert reply.status == 200 and reply.headers["Content-Type"] == "application/json"
        return json.loads(reply.read())


@pytest.mark.notf
def test_the_document_is_generated_from_the_routes_and_served():
    generated = json.loads(json.dumps(openapi.document(app.ROUTES)))
    declared = {(route.path.replace(":name}", "}"), method.lower()) for route in app.ROUTES
                for method in route.methods - {"HEAD"} if route.include_in_schema}
    assert {(path, method) for path, item in generated["paths"].items() for method in item} == declared
    assert len(declared) == 23
    running = started(Model())
    try:
        doc = served_document(running.port)
        assert generic(doc) == generated
        parameters = doc["paths"]["/v2/models/{model_name}/versions/{version}/infer"]["post"]["parameters"]
        assert [(p["name"], p["schema"]["enum"]) for p in parameters] == [("model_name", ["m"]), ("version", ["1"])]
        example = doc["paths"]["/v1/models/{model_name}:predict"]["post"]["requestBody"]["content"][
            "application/json"]["example"]
        assert example == {"instances": [[0.0, 0.0]]}
        assert running.request("POST", "/v1/models/m:predict", example)[:2] == (200, b'{"predictions": [0.0]}')
    finally:
        running.close()


@pytest.fixture(scope="module")
def export_served(tmp_path_factory, export_copy):
    """conftest's SavedModel, served as cifar version 1 with batching on."""
    pytest.importorskip("tensorflow", reason="needs TensorFlow")
    from keras_preact_serving.server import make_server

    path = export_copy(tmp_path_factory.mktemp("saved_models"), "cifar")
    server = make_server(path.parent, port=0, max_request_instances=16, max_body_bytes=1_000_000, enable_batching=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_schemathesis_finds_no_server_error_and_no_reply_off_the_schema(export_served):
    schemathesis = pytest.importorskip("schemathesis")
    from hypothesis import HealthCheck, given, settings
    from hypothesis.errors import Unsatisfiable
    from schemathesis.checks import not_a_server_error
    from schemathesis.generation import GenerationMode
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

    port = export_served
    base_url = f"http://127.0.0.1:{port}"
    schema = schemathesis.openapi.from_dict(served_document(port))
    checks = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
    deadline = time.monotonic() + TIME_BUDGET_S
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == 23
    calls = []
    for operation in operations:
        body = operation.definition.raw.get("requestBody", {}).get("content", {}).get("application/json", {})
        if "example" in body:  # the served example: a real prediction, its reply checked against the schema
            named = {p["name"]: p["schema"]["enum"][0] for p in operation.definition.raw["parameters"]}
            case = operation.Case(path_parameters=named, body=body["example"])
            response = case.call_and_validate(base_url=base_url, checks=checks)
            assert response.status_code == 200, response.text
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            if time.monotonic() > deadline:
                break

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, derandomize=True, database=None,
                      suppress_health_check=list(HealthCheck))
            def fuzz(case):
                response = case.call_and_validate(base_url=base_url, checks=checks, timeout=30)
                calls.append(response.status_code)

            try:
                fuzz()
            except Unsatisfiable:  # nothing to get wrong: no parameter and no body
                assert mode == GenerationMode.NEGATIVE and not operation.definition.raw["parameters"]
    assert time.monotonic() < deadline + 60, "the fuzzing run went past its time budget"
    assert len(calls) > 10 * EXAMPLES_PER_OPERATION and all(code < 500 for code in calls)  # it fuzzed; no 5xx
