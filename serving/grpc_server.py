"""The gRPC server of ``keras-preact-serve --grpc-port``: one grpc.aio server on REST's event loop, ``ServingState``
and limits, holding Triton's ``GRPCInferenceService`` (``keras_preact_serving.triton_grpc``) and, where TensorFlow
and tensorflow-serving-api are installed, TF Serving's ``PredictionService`` and ``ModelService``
(``keras_preact_serving.grpc_service``); docs/export-and-serving.md. Imports no TensorFlow itself."""

import asyncio
import importlib.util
import time

import grpc

from keras_preact_serving import rest
from keras_preact_serving.app import Call
from keras_preact_serving.rest import RequestError

TF_SERVING_MODULES = ("tensorflow", "tensorflow_serving")  # what TF Serving's gRPC API needs besides grpcio
MAX_DETAILS = 2000  # characters of an error's details at most: gRPC clients refuse metadata over 8 kB by default
TF_SERVING = "TF Serving's PredictionService and ModelService"
TRITON = "Triton's GRPCInferenceService"
STATUS_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    404: grpc.StatusCode.NOT_FOUND,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    503: grpc.StatusCode.UNAVAILABLE,
}  # REST's HTTP status -> gRPC's (TF Serving's service)


def short(value, limit=40):
    """A client's string in an error message, cut (a long one would overflow gRPC's metadata limit)."""
    return value if len(value) <= limit else f"{value[:limit]!r}... ({len(value)} characters)"


class Abort(Exception):
    """An RPC's end with the gRPC status ``code`` and ``message``."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


def has_tf_serving():
    """Whether TF Serving's gRPC API can be served here (TensorFlow and tensorflow-serving-api installed)."""
    return all(importlib.util.find_spec(name) is not None for name in TF_SERVING_MODULES)



def services():
    """The services ``create_server`` registers here, in words."""
    return [TF_SERVING, TRITON] if has_tf_serving() else [TRITON]


async def answer(state, context, api, work, status_codes=None, needs_model=True):
    """``work(model, call)``'s reply, or its error as a status (``status_codes``: REST's HTTP status -> gRPC's; else
    INTERNAL); counted and timed in the metrics under ``api``. UNAVAILABLE until the model is loaded, unless
    ``needs_model`` is False (then ``model`` may be None)."""
    call, started, code = Call(api), time.perf_counter(), grpc.StatusCode.OK
    try:
        if state.model is None and needs_model:
            raise Abort(grpc.StatusCode.UNAVAILABLE, "The model is not loaded yet; retry later.")
        reply = await work(state.model, call)
    except Abort as error:
        code, details = error.code, str(error)
    except Exception as error:  # noqa: BLE001 - the server answers and stays up
        status, details = rest.error_status(error)
        code = (status_codes or STATUS_CODES).get(status, grpc.StatusCode.INTERNAL)
    state.metrics.observe_request(
        call.model, call.api, call.signature, code.name, time.perf_counter() - started, call.phases
    )
    if code != grpc.StatusCode.OK:
        if len(details) > MAX_DETAILS:  # a client's long string quoted in it
            details = f"{details[:MAX_DETAILS]}... ({len(details)} characters)"
        await context.abort(code, details)
    return reply


class RequestDeadline(grpc.aio.ServerInterceptor):
    """A unary RPC's message must arrive within ``request_timeout`` (else DEADLINE_EXCEEDED): gRPC bounds neither that
    wait nor a call without a deadline. Each unary-unary handler is served as stream-unary, reading the message itself;
    its bytes count in ``state.bodies`` until answered (RESOURCE_EXHAUSTED past the bound)."""

    def __init__(self, state):
        self.state, self.timeout = state, state.limits.request_timeout

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_streaming or handler.response_streaming:
            return handler

        async def behavior(requests, context):
            try:
                request = await asyncio.wait_for(anext(requests), self.timeout)
            except asyncio.TimeoutError:
                self.state.metrics.observe_request("", "", "", grpc.StatusCode.DEADLINE_EXCEEDED.name, self.timeout)
                await context.abort(
                    grpc.StatusCode.DEADLINE_EXCEEDED, f"The request did not arrive within {self.timeout:g} s."
                )
            except StopAsyncIteration:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "The call ended without a request message.")
            with self.state.bodies.share() as share:  # the message's bytes held until the reply (REST's bound too)
                try:
                    share.take(request.ByteSize(), close=False)
                except RequestError as error:
                    self.state.metrics.observe_request("", "", "", grpc.StatusCode.RESOURCE_EXHAUSTED.name, 0.0)
                    await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(error))
                return await handler.unary_unary(request, context)

        return grpc.stream_unary_rpc_method_handler(behavior, handler.request_deserializer, handler.response_serializer)


def create_server(state, host, port):
    """(grpc.aio server of ``state``, port bound) on ``host:port``, not started; OSError if it cannot bind. It holds
    Triton's service, and TF Serving's where ``has_tf_serving()``."""
    from keras_preact_serving import triton_grpc

    limits = state.limits
    server = grpc.aio.server(interceptors=[RequestDeadline(state)],
                             maximum_concurrent_rpcs=limits.max_connections, options=[
        ("grpc.max_receive_message_length", limits.max_body_bytes),
        ("grpc.max_connection_idle_ms", int(limits.request_timeout * 1000)),
        ("grpc.so_reuseport", 0),  # a port in use is an error, not shared
    ])
    if has_tf_serving():
        from keras_preact_serving import grpc_service

        grpc_service.add_to_server(state, server)
    triton_grpc.add_to_server(state, server)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as error:
        raise OSError(f"Cannot bind the gRPC port {address}: {error}") from None
    if not bound:
        raise OSError(f"Cannot bind the gRPC port {address}.")
    return server, bound
