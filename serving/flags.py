"""The serving commands' flags (``keras-preact-serve``, ``keras-preact-serve-ray``) and the records they fill
(``RequestLimits``, ``BatchingOptions``). Standard library only: the console scripts answer ``--help`` and a bad flag
from these parsers before Starlette, Ray or Keras load."""

import argparse
import dataclasses
import math

# Fastest first on CPU, as measured in BENCHMARKS.md, "Export runtimes".
RUNTIME_SPEED_ORDER = ("openvino", "onnx", "saved_model", "litert")
# A format's float or int8 model (keras-preact-export --quantize int8); a bare onnx/openvino (and auto) takes the int8
# model where the version holds one.
PRECISION_RUNTIMES = ("openvino-int8", "openvino-fp32", "onnx-int8", "onnx-fp32")
RUNTIMES = ("auto", *RUNTIME_SPEED_ORDER, *PRECISION_RUNTIMES)
DEFAULT_ENABLE_BATCHING = False  # decided from BENCHMARKS.md, "Dynamic batching"
DEFAULT_PORT = 8501  # TF Serving's REST port, for both commands (so a TF Serving client needs no change)
DEFAULT_REPLICAS = 1  # keras-preact-serve-ray
MAX_REPLICAS_PER_NODE = 100  # Ray Serve's limit on max_replicas_per_node


def check_number(argument, value, *, real=False, at_least=None):
    """ValueError naming ``argument`` unless ``value`` is a positive integer (``real``: finite number, >=
    ``at_least``)."""
    is_number = not isinstance(value, bool) and isinstance(value, (int, float) if real else int)
    if not real:
        valid, expected = is_number and value >= 1, "a positive integer"
    else:
        valid = is_number and (0 < value if at_least is None else at_least <= value) and value < math.inf
        expected = "a positive number" if at_least is None else f"a number >= {at_least:g}"
    if not valid:
        raise ValueError(f"Invalid {argument}={value!r}: expected {expected}.")


def flag(default, help, *, at_least=None, server_only=False):  # noqa: A002 - argparse's word
    """A ``FlagRecord`` field: default, help, a float's lower bound, whether only ``keras-preact-serve`` has it."""
    return dataclasses.field(default=default, metadata={"help": help, "at_least": at_least, "server_only": server_only})


class FlagRecord:
    """A frozen dataclass whose fields are flags (``--batching-max-size``) and ``make_server`` arguments, checked."""

    def __post_init__(self):
        for field in dataclasses.fields(self):
            check_number(
                field.name, getattr(self, field.name), real=field.type is float, at_least=field.metadata["at_least"]
            )

    @classmethod
    def add_arguments(cls, parser, *, server_only=True):
        """One flag per field (without the ``server_only`` ones unless asked), defaults as the record's."""
        for field in dataclasses.fields(cls):
            if server_only or not field.metadata["server_only"]:
                parser.add_argument("--" + field.name.replace("_", "-"), type=field.type, default=field.default,
                                    help=f"{field.metadata['help']} (default %(default)s)")

    @classmethod
    def from_args(cls, args):
        """The record of parsed flags (``add_arguments``); a field without its flag keeps its default."""
        return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)})



@dataclasses.dataclass(frozen=True)
class BatchingOptions(FlagRecord):
    """How requests are merged into model calls (each field's help says how): by
    ``keras_preact_serving.batching.Batcher`` in ``keras-preact-serve``, by Ray Serve's ``@serve.batch`` in each
    ``keras-preact-serve-ray`` replica; both commands take the same flags with the same defaults."""

    batching_max_size: int = flag(
        32, "examples in one model call; a larger request runs alone (TF Serving's max_batch_size)"
    )
    batching_timeout_ms: float = flag(0.0, "the longest the oldest request of a batch waits for more (0: batch "
                                           "what is queued when the model is free)", at_least=0)
    batching_max_queue: int = flag(64, "requests waiting for a batch (503 beyond; in a Ray replica: requests it "
                                       "holds, Ray Serve's max_ongoing_requests)")
    batching_threads: int = flag(1, "batches run at once (Ray Serve's max_concurrent_batches)")



@dataclasses.dataclass(frozen=True)
class RequestLimits(FlagRecord):
    """What one request (and, in the local server, one connection: ``server_only``) may use."""

    max_body_bytes: int = flag(64 * 1024 * 1024, "request body, Content-Length or chunked (413 above)")
    max_bodies_in_flight_bytes: int = flag(
        256 * 1024 * 1024,
        "bytes of request bodies held at once by all requests in "
        "flight, REST and gRPC (503 beyond); at least --max-body-bytes",
    )
    max_request_instances: int = flag(256, "examples (instances) in one request (413 above)")
    max_image_pixels: int = flag(4096 * 4096, "pixels an encoded image may decode to, read from its header (413 above)")
    max_aspect_ratio: float = flag(8.0, "longer/shorter side of an encoded image (413 above)", at_least=1)
    max_request_pixels: int = flag(64 * 1024 * 1024, "pixels of all encoded images of one request (413 above)")
    request_timeout: float = flag(
        30.0, "seconds a client may take to send a whole request (headers and body; 408 after), or stay idle"
    )
    max_connections: int = flag(4096, "open connections at once (503 beyond)", server_only=True)

    def __post_init__(self):
        super().__post_init__()
        if self.max_bodies_in_flight_bytes < self.max_body_bytes:
            raise ValueError(
                f"Invalid max_bodies_in_flight_bytes={self.max_bodies_in_flight_bytes!r}: expected at least "
                f"max_body_bytes={self.max_body_bytes!r} (one whole body)."
            )

    def model_limits(self):
        """The limits ``rest.check_inputs`` applies (keyword arguments)."""
        return {
            name: getattr(self, name)
            for name in ("max_request_instances", "max_image_pixels", "max_aspect_ratio", "max_request_pixels")
        }



def _common_arguments(parser, prog, port, port_help):
    """The flags both commands share: what is served, where, and on which runtime (one definition for both)."""
    parser.add_argument("model_base_path", help="model directory holding numeric version folders (saved_models/<name>)")
    parser.add_argument("--port", type=int, default=port, help=f"{port_help} (default %(default)s)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1, loopback only)")
    parser.add_argument("--model-name", default=None, help="name in the URL (default: the directory name)")
    parser.add_argument("--runtime", choices=RUNTIMES, default="auto",
                        help="what runs serving_default (uint8 pixels): an export format's runtime, or auto (default): "
                             "the fastest installed for a format the version holds; the SavedModel's other "
                             "signatures run on TensorFlow. auto, onnx and openvino serve the version's int8 model "
                             "where it has one; onnx-fp32, openvino-fp32 the float model; onnx-int8, openvino-int8 "
                             "the int8 model")
    RequestLimits.add_arguments(parser.add_argument_group("request limits"), server_only=prog == SERVE)
    return parser.add_argument_group(
        "dynamic batching", "merge concurrent predict requests of one signature into batched model calls")


SERVE, SERVE_RAY = "keras-preact-serve", "keras-preact-serve-ray"
DESCRIPTION = ("Serve the latest version of an exported model with TF Serving's REST API and KServe's Open Inference "
               "Protocol (v2), with Prometheus metrics")


def serve_parser():
    parser = argparse.ArgumentParser(prog=SERVE, description=DESCRIPTION + ".", allow_abbrev=False)
    batching_flags = _common_arguments(parser, SERVE, DEFAULT_PORT, "port (TF Serving's REST port; 0: any free port)")
    batching_flags.add_argument(
        "--enable-batching",
        action=argparse.BooleanOptionalAction,
        default=DEFAULT_ENABLE_BATCHING,
        help=f"batch concurrent requests (default {'on' if DEFAULT_ENABLE_BATCHING else 'off'})",
    )
    BatchingOptions.add_arguments(batching_flags)
    parser.add_argument("--grpc-port", type=int, default=None,
                        help="also serve gRPC on this port: Triton's GRPCInferenceService (KServe v2, "
                             "tritonclient.grpc) and, with TensorFlow, TF Serving's PredictionService and "
                             "ModelService (TF Serving's port is 8500; 0: any free port; default: no gRPC). Needs "
                             "pip install 'keras-preact[grpc]' ('keras-preact[triton-grpc]' without TensorFlow)")
    parser.add_argument("--verbose", action="store_true", help="log every request")
    return parser


def ray_parser():
    parser = argparse.ArgumentParser(
        allow_abbrev=False,  # --replica is an error, not --replicas
        prog=SERVE_RAY, description=DESCRIPTION + " from Ray Serve replicas, each batching its requests (@serve.batch)."
    )
    BatchingOptions.add_arguments(_common_arguments(
        parser, SERVE_RAY, DEFAULT_PORT, "HTTP port of Ray Serve's proxy on every node (1-65535)"))
    parser.add_argument(
        "--replicas", type=int, default=DEFAULT_REPLICAS, help="Ray Serve replicas, each a process with the model"
    )
    parser.add_argument(
        "--address",
        default=None,
        help="Ray cluster to deploy onto ('auto': the one `ray start` runs here; default: start one here)",
    )
    parser.add_argument("--replica-cpus", type=float, default=1.0, help="CPUs Ray reserves for each replica")
    parser.add_argument("--max-replicas-per-node", type=int, default=None,
                        help=f"most replicas Ray places on one node, 1-{MAX_REPLICAS_PER_NODE} (default: no limit; 1 "
                             "spreads the replicas one per node)")
    parser.add_argument(
        "--num-cpus", type=int, default=None, help="CPUs of the Ray instance started here (default: all)"
    )
    parser.add_argument("--object-store-memory", type=int, default=None,
                        help="bytes of the object store of the Ray instance started here (default: Ray's)")
    return parser
