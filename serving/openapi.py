"""The OpenAPI 3.0 document, generated from the routes (Starlette's ``SchemaGenerator``; each endpoint's docstring)."""

import copy
import re

import numpy as np
import yaml
from starlette.schemas import SchemaGenerator

import keras_preact
from keras_preact_serving import v2

PATH = "/openapi.json"
_BASE = yaml.safe_load("""
openapi: 3.0.3
info: {title: keras-preact-serve, description: "TF Serving's REST API and KServe's Open Inference Protocol (v2) for an
  exported keras-preact model, with Triton's model configuration and statistics, Prometheus metrics and health."}
components:
  responses:
    Error: {description: "A bad request: 400 invalid, 404 unknown path, model or version, 405 method, 408 body too slow,
      411 no length, 413 over a limit, 415 compressed body", content: {application/json: {schema: {$ref: '#/components/schemas/Error'}}}}
    Unavailable: {description: "The model is loading or failed to load, the batching queue is full, or the server is
      shutting down", content: {application/json: {schema: {$ref: '#/components/schemas/Error'}}}}
  schemas:
    Error: {type: object, required: [error], additionalProperties: false, properties: {error: {type: string}}}
    ModelStatus: {type: object, required: [model_version_status], properties: {model_version_status: {type: array, items: {type: object,
      required: [version, state], properties: {version: {type: string}, state: {type: string}, status: {type: object, properties: {
        error_code: {type: string}, error_message: {type: string}}}}}}}}
    ModelMetadata: {type: object, required: [model_spec, metadata], properties: {model_spec: {type: object, required: [name, version],
      properties: {name: {type: string}, signature_name: {type: string}, version: {type: string}}},
      metadata: {type: object, properties: {signature_def: {type: object}}}}}
    PredictRequest: {type: object, description: "TF Serving's predict request: 'instances' (row format) or 'inputs'
      (columnar), binary strings as {\\"b64\\": ...}", properties: {signature_name: {type: string}, instances: {type: array}, inputs: {}}}
    PredictResponse: {type: object, additionalProperties: false, properties: {predictions: {type: array}, outputs: {}},
                      anyOf: [{required: [predictions]}, {required: [outputs]}]}
    Live: {type: object, required: [live], additionalProperties: false, properties: {live: {type: boolean}}}
    Ready: {type: object, required: [ready], additionalProperties: false, properties: {ready: {type: boolean}}}
    ServerMetadata: {type: object, required: [name, version, extensions], properties: {name: {type: string}, version: {type: string},
      extensions: {type: array, items: {type: string}}}}
    Tensor: {type: object, required: [name, datatype, shape], properties: {name: {type: string}, datatype: {type: string},
      shape: {type: array, items: {type: integer}}, parameters: {type: object}, data: {type: array}}}
    V2ModelMetadata: {type: object, required: [name, platform, inputs, outputs], properties: {name: {type: string},
      versions: {type: array, items: {type: string}}, platform: {type: string},
      inputs: {type: array, items: {$ref: '#/components/schemas/Tensor'}},
      outputs: {type: array, items: {$ref: '#/components/schemas/Tensor'}}}}
    V2ModelReady: {type: object, required: [name, ready], properties: {name: {type: string}, ready: {type: boolean}}}
    InferRequest: {type: object, required: [inputs], description: "The Open Inference Protocol's infer request (JSON tensors;
      with the Inference-Header-Content-Length header, Triton's binary tensor data follows)", properties: {
      id: {type: string}, parameters: {type: object}, inputs: {type: array, items: {$ref: '#/components/schemas/Tensor'}},
      outputs: {type: array, items: {type: object, required: [name], properties: {name: {type: string}, parameters: {type: object}}}}}}
    InferResponse: {type: object, required: [model_name, outputs], properties: {model_name: {type: string},
      model_version: {type: string}, id: {type: string}, outputs: {type: array, items: {$ref: '#/components/schemas/Tensor'}}}}
    ModelConfig: {type: object, required: [name, platform, max_batch_size, input, output], properties: {name: {type: string},
      platform: {type: string}, max_batch_size: {type: integer}, input: {type: array, items: {$ref: '#/components/schemas/TensorConfig'}},
      output: {type: array, items: {$ref: '#/components/schemas/TensorConfig'}}}}
    TensorConfig: {type: object, required: [name, data_type, dims], properties: {name: {type: string}, data_type: {type: string},
      dims: {type: array, items: {type: integer}}}}
    ModelStatistics: {type: object, required: [model_stats], properties: {model_stats: {type: array, items: {type: object,
      required: [name, version, inference_count, execution_count, inference_stats]}}}}
    RepositoryIndex: {type: array, items: {type: object, required: [name, version, state], properties: {name: {type: string},
      version: {type: string}, state: {type: string}, reason: {type: string}}}}
""")
_PARAMETERS = {"model_name": "the served model's name", "version": "the served version"}
_ERRORS = {"4XX": {"$ref": "#/components/responses/Error"}, "503": {"$ref": "#/components/responses/Unavailable"}}


def document(routes, model=None):
    """The OpenAPI document of ``routes``; given the served ``model``, its name, version and example bodies (for
    fuzzers)."""
    generator = SchemaGenerator(copy.deepcopy(_BASE))
    doc = generator.get_schema(routes)
    for endpoint in generator.get_endpoints(routes):  # the summary: the docstring before "---"
        doc["paths"][endpoint.path][endpoint.http_method]["summary"] = endpoint.func.__doc__.split("---")[0].strip()
    doc["info"]["version"] = keras_preact.__version__
    values = {"model_name": model and model.name, "version": model and str(model.version)}
    for path, item in doc["paths"].items():
        for operation in item.values():
            operation["parameters"] = [
                {"name": name, "in": "path", "required": True, "description": _PARAMETERS[name],
                 "schema": {"type": "string", "pattern": r"^[^/:\s]+$", **({"enum": [values[name]]} if model else {})}}
                for name in re.findall(r"{(\w+)}", path)]
            if operation["parameters"]:
                operation["responses"].update(_ERRORS)
    if model is not None:
        _add_examples(doc, model)
    return doc


def _add_examples(doc, model):
    """An example predict and infer body: one example of zeros, unless ``serving_default`` takes no one array."""
    specs = model.input_specs.get("serving_default", {})
    if len(specs) != 1 or next(iter(specs.values())).dtype == "string":
        return
    (name, spec), = specs.items()
    shape = [1 if d is None else d for d in spec.shape]
    zeros = np.zeros(shape, spec.dtype)
    examples = {":predict": {"instances": zeros.tolist()},
                "/infer": {"inputs": [{"name": name, "shape": shape, "datatype": v2.datatype_of(spec.dtype),
                                       "data": zeros.reshape(-1).tolist()}]}}
    for path, item in doc["paths"].items():
        for suffix, example in examples.items():
            if path.endswith(suffix):
                item["post"]["requestBody"]["content"]["application/json"]["example"] = example
