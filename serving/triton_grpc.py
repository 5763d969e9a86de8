"""Triton's gRPC API for ``keras-preact-serve --grpc-port``: KServe's Open Inference Protocol over gRPC
(``inference.GRPCInferenceService``, the service ``tritonclient.grpc`` speaks), with the v2 REST semantics
(``keras_preact_serving.v2``: metadata, config, statistics, repository index, the signature chosen by the inputs'
names and datatypes) and Triton's status codes; served by ``keras_preact_serving.grpc_server`` beside TF Serving's.
Its messages and service stubs are the ones generated in tritonclient; it needs no TensorFlow."""

import math

import grpc
import numpy as np
from google.protobuf import json_format
from starlette.concurrency import run_in_threadpool
from tritonclient.grpc import service_pb2, service_pb2_grpc

import keras_preact
from keras_preact_serving import rest, v2
from keras_preact_serving.app import run_predict, timed
from keras_preact_serving.grpc_server import Abort, answer, short
from keras_preact_serving.rest import RequestError

# Each datatype's field of InferTensorContents (the "JSON-equivalent" typed values); FP16 and BF16 have none: they
# travel in raw_input_contents only.
CONTENTS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
            "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
            "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents"}
# REST's HTTP status -> Triton's gRPC status: Triton answers a request it refuses INVALID_ARGUMENT, a batch over
# max_batch_size (REST's 413) included.
STATUS_CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 404: grpc.StatusCode.NOT_FOUND,
                408: grpc.StatusCode.DEADLINE_EXCEEDED, 413: grpc.StatusCode.INVALID_ARGUMENT,
                503: grpc.StatusCode.UNAVAILABLE}
FIXED_MODEL = "the served model is fixed at start (no model control)"


def check_model(model, name, version, call=None):
    """NOT_FOUND, with REST v2's message, unless ``name`` is the served model's and ``version`` ("" for the
    newest) its version; ``call`` learns the model."""
    if name != model.name:
        raise Abort(grpc.StatusCode.NOT_FOUND,
                    f"Request for unknown model: '{short(name)}' is not found; serving model '{model.name}'.")
    if call is not None:
        call.model = name
    if version not in ("", str(model.version)):
        raise Abort(grpc.StatusCode.NOT_FOUND, f"Request for unknown model: '{name}' version {short(version)} is not "
                                               f"found; loaded version is {model.version}.")


def parameters_of(parameters):
    """A map of ``InferParameter`` as ``{name: value}`` (the v2 JSON request's "parameters").

    Examples:
        >>> request = service_pb2.ModelInferRequest()
        >>> request.parameters["signature_name"].string_param = "serving_float"
        >>> parameters_of(request.parameters)
        {'signature_name': 'serving_float'}
    """
    return {name: getattr(value, value.WhichOneof("parameter_choice")) for name, value in parameters.items()
            if value.WhichOneof("parameter_choice")}


def _check_header(tensor, max_values):
    """A 400 unless an input's datatype and shape are the protocol's; a 413 past ``max_values`` elements."""
    name, datatype, shape = short(tensor.name), tensor.datatype, list(tensor.shape)
    if datatype not in v2.DATATYPES:
        raise RequestError(f"Input '{name}' has datatype {short(datatype)!r}: expected one of "
                           f"{', '.join(v2.DATATYPES)}.")
    if len(shape) > v2.MAX_DIMS or any(d < 0 for d in shape):
        raise RequestError(f"Input '{name}' has shape {shape[:v2.MAX_DIMS + 1]}: expected at most {v2.MAX_DIMS} "
                           "non-negative dimensions.")
    if max_values is not None and math.prod(shape) > max_values:
        raise RequestError(f"Input '{name}' of shape {shape}: {math.prod(shape)} elements exceeds the limit of "
                           f"{max_values} values (--max-request-instances examples of this model's inputs).", 413)


def contents_array(tensor):
    """An input's flat array from its typed ``contents`` (the field of its datatype alone, one value per element).

    Examples:
        >>> tensor = service_pb2.ModelInferRequest.InferInputTensor(
        ...     name="images", datatype="UINT8", shape=[1, 2], contents={"uint_contents": [7, 255]})
        >>> contents_array(tensor)
        array([  7, 255], dtype=uint8)
    """
    name, datatype, count = tensor.name, tensor.datatype, math.prod(tensor.shape)
    field = CONTENTS.get(datatype)
    if field is None:
        raise RequestError(f"Input '{name}' of {datatype} has no typed contents field: send it in raw_input_contents.")
    sent = [descriptor.name for descriptor, _ in tensor.contents.ListFields()]
    if sent not in ([], [field]):
        raise RequestError(f"Input '{name}' of {datatype} takes its values in contents.{field}; got "
                           f"{', '.join(sent)}.")
    values = getattr(tensor.contents, field)
    if len(values) != count:
        raise RequestError(f"Input '{name}': shape {list(tensor.shape)} holds {count} elements; contents.{field} "
                           f"has {len(values)}.")
    if datatype == "BYTES":
        return np.fromiter(values, object, count)
    dtype = np.dtype(v2.DATATYPES[datatype])
    array = np.asarray(values) if count else np.zeros(0, dtype)
    if dtype.kind in "iu":  # int_contents carries int8 and int16 as int32, uint_contents uint8 and uint16 as uint32
        rest.check_range(array, rest.TensorSpec(name, dtype.name, ()))
    return array.astype(dtype)


def decode_infer(model, request, call, limits):
    """(outputs asked for, signature name, ``{input: array}``) of a ``ModelInferRequest``, every input checked
    (``v2.decode_inputs``'s checks) before the model runs."""
    check_model(model, request.model_name, request.model_version, call)
    inputs, raw = request.inputs, request.raw_input_contents
    if not inputs:
        raise RequestError("The inference request must have 'inputs': a non-empty list of tensors.")
    max_values = rest.max_values(model.input_specs, limits["max_request_instances"])
    for tensor in inputs:
        _check_header(tensor, max_values)
    names = [tensor.name for tensor in inputs]
    if len(set(names)) != len(names):
        raise RequestError(f"Input names must be distinct; got {[short(n) for n in names[:8]]}.")
    if raw and len(raw) != len(inputs):
        raise RequestError(f"raw_input_contents holds {len(raw)} tensors for {len(inputs)} inputs: send every "
                           "input's values there, in the inputs' order, or none.")
    header = {"inputs": [{"name": t.name, "datatype": t.datatype} for t in inputs],
              "parameters": parameters_of(request.parameters)}
    signature_name = v2.choose_signature(model, header)
    call.signature = signature_name
    specs, arrays = model.input_specs[signature_name], {}
    for index, tensor in enumerate(inputs):
        if raw:
            if tensor.contents.ListFields():
                raise RequestError(f"Input '{tensor.name}' has both contents and raw_input_contents: send its values "
                                   "one way.")
            data = raw[index]
            flat = v2.binary_array(tensor.name, tensor.datatype, list(tensor.shape), data,
                                   f"raw_input_contents[{index}] holds {len(data)}")
        else:
            flat = contents_array(tensor)
        arrays[tensor.name] = v2.checked_input(flat, list(tensor.shape), specs[tensor.name])
    rest.check_inputs(specs, arrays, **limits)
    asked = [{"name": output.name, "parameters": parameters_of(output.parameters)} for output in request.outputs]
    return asked, signature_name, arrays


def encode_infer(model, request_id, asked, outputs):
    """The ``ModelInferResponse``: the outputs asked for (all by default) in ``raw_output_contents``, as Triton
    answers."""
    response = service_pb2.ModelInferResponse(model_name=model.name, model_version=str(model.version), id=request_id)
    for output, array in v2.reply_tensors(model, asked, outputs):
        response.outputs.add(name=output["name"], datatype=v2.datatype_of(array.dtype), shape=list(array.shape))
        response.raw_output_contents.append(v2.raw_bytes(array))
    return response


class _Service(service_pb2_grpc.GRPCInferenceServiceServicer):
    """Triton's ``GRPCInferenceService`` on one ``app.ServingState``: every RPC ends in a reply or a status."""

    def __init__(self, state):
        self.state = state

    async def _answer(self, context, api, work, needs_model=True):
        return await answer(self.state, context, api, work, STATUS_CODES, needs_model)

    async def ServerLive(self, request, context):  # noqa: N802 - the service's method names
        return service_pb2.ServerLiveResponse(live=self.state.load_error is None)

    async def ServerReady(self, request, context):  # noqa: N802
        return service_pb2.ServerReadyResponse(ready=self.state.ready.is_set())

    async def ModelReady(self, request, context):  # noqa: N802
        async def ready(model, call):  # an unknown model or version is not ready (no error), as in Triton
            try:
                check_model(model, request.name, request.version, call)
            except Abort:
                return service_pb2.ModelReadyResponse(ready=False)
            return service_pb2.ModelReadyResponse(ready=self.state.ready.is_set())

        if self.state.model is None:
            return service_pb2.ModelReadyResponse(ready=False)
        return await self._answer(context, "grpc:v2:model_ready", ready)

    async def ServerMetadata(self, request, context):  # noqa: N802
        async def metadata(model, call):
            return json_format.ParseDict(v2.server_metadata(keras_preact.__version__),
                                         service_pb2.ServerMetadataResponse())

        return await self._answer(context, "grpc:v2:server_metadata", metadata, needs_model=False)

    async def ModelMetadata(self, request, context):  # noqa: N802
        async def metadata(model, call):
            check_model(model, request.name, request.version, call)
            return json_format.ParseDict(v2.model_metadata(model), service_pb2.ModelMetadataResponse())

        return await self._answer(context, "grpc:v2:model_metadata", metadata)

    async def ModelConfig(self, request, context):  # noqa: N802
        async def config(model, call):
            check_model(model, request.name, request.version, call)
            config = v2.model_config(model, self.state.limits.max_request_instances, self.state.batching)
            return json_format.ParseDict({"config": config}, service_pb2.ModelConfigResponse())

        return await self._answer(context, "grpc:v2:model_config", config)

    async def ModelStatistics(self, request, context):  # noqa: N802
        async def statistics(model, call):
            if request.name or request.version:  # no name: every model's (the one served)
                check_model(model, request.name, request.version, call)
            return json_format.ParseDict(v2.model_statistics(model, self.state.metrics),
                                         service_pb2.ModelStatisticsResponse())

        return await self._answer(context, "grpc:v2:model_stats", statistics)

    async def RepositoryIndex(self, request, context):  # noqa: N802
        async def index(model, call):
            if request.repository_name:
                raise Abort(grpc.StatusCode.NOT_FOUND, f"Unknown model repository '{short(request.repository_name)}': "
                                                       "this server has one, unnamed (send no repository_name).")
            models = [entry for entry in v2.repository_index(model) if not request.ready or entry["state"] == "READY"]
            return json_format.ParseDict({"models": models}, service_pb2.RepositoryIndexResponse())

        return await self._answer(context, "grpc:v2:repository_index", index)

    async def ModelInfer(self, request, context):  # noqa: N802
        async def infer(model, call):
            limits = self.state.limits.model_limits()
            asked, signature_name, inputs = await run_in_threadpool(
                timed, call, "compute_input", decode_infer, model, request, call, limits)
            outputs, headers = await run_predict(self.state, signature_name, inputs, call)
            if headers:  # the model call that ran a batched request
                context.set_trailing_metadata(tuple((name.lower(), value) for name, value in headers.items()))
            return await run_in_threadpool(
                timed, call, "compute_output", encode_infer, model, request.id, asked, outputs)

        return await self._answer(context, "grpc:v2:infer", infer)

    async def ModelStreamInfer(self, request_iterator, context):  # noqa: N802
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "ModelStreamInfer is not supported: send each request "
                                                           "with ModelInfer (async_infer for many at once).")

    async def _model_control(self, request, context):
        await context.abort(grpc.StatusCode.UNAVAILABLE, f"Model load and unload are not supported: {FIXED_MODEL}.")

    async def _unimplemented(self, request, context):
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Not supported by this server: shared memory, trace and "
                                                           "log settings (send tensors in the request).")

    RepositoryModelLoad = RepositoryModelUnload = _model_control
    SystemSharedMemoryStatus = SystemSharedMemoryRegister = SystemSharedMemoryUnregister = _unimplemented
    CudaSharedMemoryStatus = CudaSharedMemoryRegister = CudaSharedMemoryUnregister = _unimplemented
    TraceSetting = LogSettings = _unimplemented


def add_to_server(state, server):
    """Register Triton's ``GRPCInferenceService`` of ``state`` on the grpc.aio ``server``."""
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(_Service(state), server)
