"""TF Serving's gRPC API for ``keras-preact-serve --grpc-port``, on REST's event loop, ``ServingState`` and limits,
with TF Serving's status codes (docs/export-and-serving.md, "TF Serving's gRPC API"); needs TensorFlow. Served by
``keras_preact_serving.grpc_server`` beside Triton's gRPC API."""

import grpc
import tensorflow as tf
from google.protobuf import json_format
from starlette.concurrency import run_in_threadpool
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from keras_preact_serving import rest
from keras_preact_serving.app import run_predict, timed
from keras_preact_serving.grpc_server import Abort as _Abort
from keras_preact_serving.grpc_server import answer, create_server  # noqa: F401 - create_server: where it was
from keras_preact_serving.grpc_server import short as _short
from keras_preact_serving.rest import RequestError

DEFAULT_SIGNATURE = "serving_default"
# TF's AsProtoField: each dtype's typed repeated field (strings: string_val, as make_tensor_proto writes them)
PROTO_FIELDS = {
    "float32": "float_val",
    "float64": "double_val",
    "int64": "int64_val",
    "uint32": "uint32_val",
    "uint64": "uint64_val",
    "bool": "bool_val",
    **dict.fromkeys(("int32", "int16", "int8", "uint16", "uint8"), "int_val"),
}


def check_model_spec(model, model_spec, call):
    """As TF Serving's ``ServerCore``: INVALID_ARGUMENT for a ``model_spec`` without a name or with a version
    label (this server defines none), NOT_FOUND unless it names the served model and, if any, its version;
    ``call`` learns the model."""
    if not model_spec.name:
        raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, "ModelSpec has no name specified.")
    if model_spec.version_label:
        raise _Abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"Unrecognized servable version label: {_short(model_spec.version_label)} (this server defines no labels).",
        )
    if model_spec.name != model.name:
        raise _Abort(grpc.StatusCode.NOT_FOUND, f"Servable not found for request: Latest({_short(model_spec.name)}); "
                                                f"serving model '{model.name}'.")
    call.model = model.name
    if model_spec.HasField("version") and model_spec.version.value != model.version:
        raise _Abort(grpc.StatusCode.NOT_FOUND, f"Servable not found for request: Specific({model_spec.name}, "
                                                f"{model_spec.version.value}); loaded version is {model.version}.")


def _tensor(spec, proto, max_request_instances):
    """An input's array; dtype, shape, batch and integer range checked from the ``TensorProto`` before reading
    values."""
    expected = tf.dtypes.as_dtype(spec.dtype)
    if proto.dtype != expected.as_datatype_enum:
        try:
            got = tf.dtypes.as_dtype(proto.dtype).name
        except TypeError:
            got = f"dtype enum {proto.dtype}"
        raise RequestError(f"Input '{spec.name}' must be a {expected.name} tensor; got {got}.")
    if proto.tensor_shape.unknown_rank:
        raise RequestError(f"Input '{spec.name}' has an unknown rank; send its shape.")
    shape = tuple(dim.size for dim in proto.tensor_shape.dim)
    rest.check_shape(shape, spec)
    if shape[0] > max_request_instances:
        raise RequestError(f"Batch size {shape[0]} exceeds the limit of {max_request_instances}.", 413)
    if expected.is_integer:
        rest.check_range({tf.int64: proto.int64_val, tf.uint32: proto.uint32_val, tf.uint64: proto.uint64_val}.get(
            expected, proto.int_val), spec)
    try:
        array = tf.make_ndarray(proto)
    except (ValueError, TypeError) as error:
        raise RequestError(f"Input '{spec.name}': its values do not fill its shape {list(shape)}: {error}") from None
    return rest.to_array(array, spec)


def decode_predict_request(model, request, call, **limits):
    """(signature name, ``{input: array}``) of a ``PredictRequest``, within the limits (``app.decode_predict``)."""
    check_model_spec(model, request.model_spec, call)
    signature_name = request.model_spec.signature_name or DEFAULT_SIGNATURE
    if signature_name not in model.signatures:
        raise _Abort(
            grpc.StatusCode.FAILED_PRECONDITION,
            f'Serving signature key "{_short(signature_name)}" not found; available: {sorted(model.signatures)}.',
        )
    call.signature = signature_name
    specs = model.input_specs[signature_name]
    if set(request.inputs) != set(specs):
        raise RequestError(f"The request must have exactly the inputs {sorted(specs)} of signature "
                           f"'{signature_name}'; got {[_short(name) for name in sorted(request.inputs)[:5]]}.")
    most = limits["max_request_instances"]
    inputs = {name: _tensor(spec, request.inputs[name], most) for name, spec in specs.items()}
    rest.check_inputs(specs, inputs, **limits)
    return signature_name, inputs


def encode_predict_response(model, signature_name, outputs, output_filter):
    """The ``PredictResponse`` of ``outputs`` (``{name: array}``), only ``output_filter``'s if given."""
    unknown = [_short(name) for name in sorted(set(output_filter) - set(outputs))[:5]]
    duplicates = sorted({_short(name) for name in output_filter if output_filter.count(name) > 1})
    if duplicates:
        raise RequestError(f"duplicate output tensor alias in output_filter: {duplicates}.")
    if unknown:
        raise RequestError(f"output_filter names {unknown}, not outputs of signature '{signature_name}' "
                           f"(its outputs: {sorted(outputs)}).")
    response = predict_pb2.PredictResponse(
        model_spec={"name": model.name, "version": {"value": model.version}, "signature_name": signature_name})
    for name in output_filter or sorted(outputs):
        as_proto_field(outputs[name], response.outputs[name])
    return response


def as_proto_field(array, proto):
    """Write ``array`` into the ``TensorProto`` ``proto`` as ``Tensor::AsProtoField``: in its typed field."""
    field = PROTO_FIELDS.get(array.dtype.name)
    if field is None:  # strings: make_tensor_proto already fills string_val
        proto.CopyFrom(tf.make_tensor_proto(array))
        return
    proto.dtype = tf.as_dtype(array.dtype).as_datatype_enum
    proto.tensor_shape.CopyFrom(tf.TensorShape(array.shape).as_proto())
    getattr(proto, field).extend(array.ravel().tolist())


class _Service(prediction_service_pb2_grpc.PredictionServiceServicer, model_service_pb2_grpc.ModelServiceServicer):
    """Both services on one ``app.ServingState``: every RPC ends in a reply or a status, never a crash."""

    def __init__(self, state):
        self.state = state

    async def _answer(self, context, api, work):
        """``work(model, call)``'s reply, or its error as TF Serving's status (``grpc_server.answer``)."""
        return await answer(self.state, context, api, work)

    async def Predict(self, request, context):  # noqa: N802 - the service's method names
        async def predict(model, call):
            limits = self.state.limits.model_limits()
            signature_name, inputs = await run_in_threadpool(
                timed, call, "compute_input", decode_predict_request, model, request, call, **limits
            )
            outputs, headers = await run_predict(self.state, signature_name, inputs, call)
            if headers:  # the model call that ran a batched request
                context.set_trailing_metadata(tuple((name.lower(), value) for name, value in headers.items()))
            return await run_in_threadpool(
                timed,
                call,
                "compute_output",
                encode_predict_response,
                model,
                signature_name,
                outputs,
                list(request.output_filter),
            )

        return await self._answer(context, "grpc:predict", predict)

    async def GetModelMetadata(self, request, context):  # noqa: N802
        async def metadata(model, call):
            check_model_spec(model, request.model_spec, call)
            fields = list(request.metadata_field)
            if fields != ["signature_def"]:
                sent = [_short(field) for field in fields[:3]] + ["..."] * (len(fields) > 3)
                raise RequestError(f"Invalid metadata_field ({len(fields)} values: {', '.join(sent)}): the one "
                                   "metadata field served is 'signature_def'.")
            response = get_model_metadata_pb2.GetModelMetadataResponse(
                model_spec={"name": model.name, "version": {"value": model.version}}
            )
            response.metadata["signature_def"].Pack(json_format.ParseDict(  # the servable's signature defs
                model.metadata["metadata"]["signature_def"], get_model_metadata_pb2.SignatureDefMap()))
            return response

        return await self._answer(context, "grpc:metadata", metadata)

    async def GetModelStatus(self, request, context):  # noqa: N802
        async def status(model, call):
            check_model_spec(model, request.model_spec, call)
            return json_format.ParseDict(model.status(), get_model_status_pb2.GetModelStatusResponse())

        return await self._answer(context, "grpc:status", status)

    async def _unimplemented(self, request, context):
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Not supported: the signatures are predict signatures "
                                                           "(use Predict), and the served model is fixed at start.")

    Classify = Regress = MultiInference = HandleReloadConfigRequest = _unimplemented


def add_to_server(state, server):
    """Register TF Serving's ``PredictionService`` and ``ModelService`` of ``state`` on the grpc.aio ``server``."""
    service = _Service(state)
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(service, server)
    model_service_pb2_grpc.add_ModelServiceServicer_to_server(service, server)
