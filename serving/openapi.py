"""The serving application's HTTP API as an OpenAPI 3.0 document, served at ``/openapi.json`` and committed
as ``docs/openapi.json`` (``python -m serving.openapi`` writes it).

``document()`` is the committed, model-independent document: the model's name and version are path
parameters. ``document(model)``, what a running server serves, names the served model's name and version
as each parameter's only value (``enum``) and adds an example predict and infer body of its
``serving_default`` shape, so a fuzzer (schemathesis, in ``tests/test_serving_openapi.py``) reaches the
model instead of 404s; without those, the two are equal.
"""

import copy
import json
import pathlib
import sys

import keras_preact

PATH = "/openapi.json"
COMMITTED = pathlib.Path(__file__).resolve().parents[1] / "docs" / "openapi.json"
JSON = "application/json"


def _ref(name):
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema, description):
    return {"description": description, "content": {JSON: {"schema": schema}}}


_ERRORS = {
    "4XX": _json(_ref("Error"), "A bad request: 400 invalid, 404 unknown path, model or version, 405 method, "
                                "408 body too slow, 411 no length, 413 over a limit, 415 compressed body"),
    "503": _json(_ref("Error"), "The model is loading or failed to load, the batching queue is full, or the "
                                "server is shutting down"),
}
_MODEL = {"name": "model_name", "in": "path", "required": True, "schema": {"type": "string", "pattern": r"^[^/:\s]+$"},
          "description": "the served model's name"}
_VERSION = {"name": "version", "in": "path", "required": True, "schema": {"type": "string", "pattern": r"^[^/:\s]+$"},
            "description": "the served version"}

_SCHEMAS = {
    "Error": {"type": "object", "required": ["error"], "additionalProperties": False,
              "properties": {"error": {"type": "string"}}},
    "ModelStatus": {
        "type": "object", "required": ["model_version_status"],
        "properties": {"model_version_status": {"type": "array", "items": {
            "type": "object", "required": ["version", "state"],
            "properties": {"version": {"type": "string"}, "state": {"type": "string"},
                           "status": {"type": "object", "properties": {
                               "error_code": {"type": "string"}, "error_message": {"type": "string"}}}}}}}},
    "ModelMetadata": {
        "type": "object", "required": ["model_spec", "metadata"],
        "properties": {"model_spec": {"type": "object", "required": ["name", "version"], "properties": {
            "name": {"type": "string"}, "signature_name": {"type": "string"}, "version": {"type": "string"}}},
            "metadata": {"type": "object", "properties": {"signature_def": {"type": "object"}}}}},
    "PredictRequest": {
        "type": "object", "description": "TF Serving's predict request: 'instances' (row format) or 'inputs' "
                                         "(columnar), binary strings as {\"b64\": ...}",
        "properties": {"signature_name": {"type": "string"}, "instances": {"type": "array"}, "inputs": {}}},
    "PredictResponse": {
        "type": "object", "additionalProperties": False,
        "properties": {"predictions": {"type": "array"}, "outputs": {}},
        "anyOf": [{"required": ["predictions"]}, {"required": ["outputs"]}]},
    "Live": {"type": "object", "required": ["live"], "additionalProperties": False,
             "properties": {"live": {"type": "boolean"}}},
    "Ready": {"type": "object", "required": ["ready"], "additionalProperties": False,
              "properties": {"ready": {"type": "boolean"}}},
    "ServerMetadata": {"type": "object", "required": ["name", "version", "extensions"], "properties": {
        "name": {"type": "string"}, "version": {"type": "string"},
        "extensions": {"type": "array", "items": {"type": "string"}}}},
    "TensorMetadata": {"type": "object", "required": ["name", "datatype", "shape"], "properties": {
        "name": {"type": "string"}, "datatype": {"type": "string"},
        "shape": {"type": "array", "items": {"type": "integer"}}}},
    "V2ModelMetadata": {"type": "object", "required": ["name", "platform", "inputs", "outputs"], "properties": {
        "name": {"type": "string"}, "versions": {"type": "array", "items": {"type": "string"}},
        "platform": {"type": "string"}, "inputs": {"type": "array", "items": _ref("TensorMetadata")},
        "outputs": {"type": "array", "items": _ref("TensorMetadata")}}},
    "V2ModelReady": {"type": "object", "required": ["name", "ready"], "properties": {
        "name": {"type": "string"}, "ready": {"type": "boolean"}}},
    "InferInput": {"type": "object", "required": ["name", "shape", "datatype"], "properties": {
        "name": {"type": "string"}, "datatype": {"type": "string"},
        "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
        "parameters": {"type": "object"}, "data": {"type": "array"}}},
    "InferRequest": {
        "type": "object", "required": ["inputs"], "description": "The Open Inference Protocol's infer request "
        "(JSON tensors; with the Inference-Header-Content-Length header, Triton's binary tensor data follows)",
        "properties": {"id": {"type": "string"}, "parameters": {"type": "object"},
                       "inputs": {"type": "array", "items": _ref("InferInput")},
                       "outputs": {"type": "array", "items": {"type": "object", "required": ["name"], "properties": {
                           "name": {"type": "string"}, "parameters": {"type": "object"}}}}}},
    "InferOutput": {"type": "object", "required": ["name", "shape", "datatype"], "properties": {
        "name": {"type": "string"}, "datatype": {"type": "string"},
        "shape": {"type": "array", "items": {"type": "integer"}},
        "parameters": {"type": "object"}, "data": {"type": "array"}}},
    "InferResponse": {"type": "object", "required": ["model_name", "outputs"], "properties": {
        "model_name": {"type": "string"}, "model_version": {"type": "string"}, "id": {"type": "string"},
        "outputs": {"type": "array", "items": _ref("InferOutput")}}},
}


def _get(summary, schema, parameters=(), ok="OK", content_type=JSON, errors=True):
    responses = {"200": {"description": ok, "content": {content_type: {"schema": schema}}}}
    if errors:
        responses.update(_ERRORS)
    return {"get": {"summary": summary, "parameters": list(parameters), "responses": responses}}


def _post(summary, request, response, parameters=(), binary=False):
    content = {JSON: {"schema": response}}
    if binary:  # outputs asked for as binary data: the JSON header, then the data
        content["application/octet-stream"] = {"schema": {"type": "string", "format": "binary"}}
    return {"post": {"summary": summary, "parameters": list(parameters),
                     "requestBody": {"required": True, "content": {JSON: {"schema": request}}},
                     "responses": {"200": {"description": "OK", "content": content}, **_ERRORS}}}


def _health(schema, what):
    response = _json(schema, f"{what}: 200 when true")
    return {"get": {"summary": f"Server {what.lower()}", "parameters": [],
                    "responses": {"200": response, "503": _json(schema, f"not {what.lower()}")}}}


def _model_paths(prefix, ops):
    """The same operations under ``prefix`` and ``prefix/versions/{version}``."""
    return {**{f"{prefix}{suffix}": make([_MODEL]) for suffix, make in ops.items()},
            **{f"{prefix}/versions/{{version}}{suffix}": make([_MODEL, _VERSION]) for suffix, make in ops.items()}}


def document(model=None):
    """The OpenAPI document (module docstring); ``model``: the served ``servable.Servable`` or None."""
    from serving import metrics

    paths = {
        **_model_paths("/v1/models/{model_name}", {
            "": lambda p: _get("TF Serving model status", _ref("ModelStatus"), p),
            "/metadata": lambda p: _get("TF Serving model metadata (signature definitions)", _ref("ModelMetadata"), p),
            ":predict": lambda p: _post("TF Serving predict", _ref("PredictRequest"), _ref("PredictResponse"), p),
        }),
        "/v2": _get("Open Inference Protocol server metadata", _ref("ServerMetadata")),
        "/v2/health/live": _health(_ref("Live"), "Live"),
        "/v2/health/ready": _health(_ref("Ready"), "Ready"),
        **_model_paths("/v2/models/{model_name}", {
            "": lambda p: _get("Open Inference Protocol model metadata", _ref("V2ModelMetadata"), p),
            "/ready": lambda p: _get("Open Inference Protocol model readiness", _ref("V2ModelReady"), p),
            "/infer": lambda p: _post("Open Inference Protocol infer", _ref("InferRequest"), _ref("InferResponse"), p,
                                      binary=True),
        }),
        metrics.PATH: _get("Prometheus metrics (text format)", {"type": "string"}, ok="Prometheus' text format",
                           content_type="text/plain", errors=False),
        PATH: _get("This OpenAPI document", {"type": "object"}, errors=False),
    }
    doc = {
        "openapi": "3.0.3",
        "info": {"title": "keras-preact-serve", "version": keras_preact.__version__,
                 "description": "TF Serving's REST API and KServe's Open Inference Protocol (v2) for an exported "
                                "keras-preact model, with Prometheus metrics and health."},
        "paths": paths,
        "components": {"schemas": copy.deepcopy(_SCHEMAS)},
    }
    if model is not None:
        _name_the_model(doc, model)
    return doc


def _name_the_model(doc, model):
    """The served model's name and version as the path parameters' only values, and example bodies."""
    import numpy as np

    values = {"model_name": model.name, "version": str(model.version)}
    for item in doc["paths"].values():
        for operation in item.values():
            operation["parameters"] = [dict(p, schema=dict(p["schema"], enum=[values[p["name"]]]))
                                       for p in operation["parameters"]]
    specs = model.input_specs.get("serving_default", {})
    if len(specs) != 1 or next(iter(specs.values())).dtype == "string":
        return
    (name, spec), = specs.items()
    shape = [1 if d is None else d for d in spec.shape]
    zeros = np.zeros(shape, spec.dtype)
    predict = {"instances": zeros.tolist()}
    infer = {"inputs": [{"name": name, "shape": shape, "datatype": _v2_datatype(spec),
                         "data": zeros.reshape(-1).tolist()}]}
    for path, item in doc["paths"].items():
        if path.endswith(":predict"):
            item["post"]["requestBody"]["content"][JSON]["example"] = predict
        elif path.endswith("/infer"):
            item["post"]["requestBody"]["content"][JSON]["example"] = infer


def _v2_datatype(spec):
    from serving import v2

    return v2.datatype_of_spec(spec)


def main(argv=None):
    """Write the committed document (``COMMITTED``, or the path given)."""
    argv = sys.argv[1:] if argv is None else argv
    target = pathlib.Path(argv[0]) if argv else COMMITTED
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(document(), indent=2, sort_keys=True) + "\n")
    print(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
