"""Scale-out serving on Ray Serve: TF Serving's REST API from several replicas of a SavedModel.

    keras-preact-serve-ray saved_models/<name> [--replicas 2] [--port 8000] [--host 127.0.0.1] [--address auto]

Every replica loads the latest version under the base directory (``servable.Servable``) and answers the
paths, formats, errors and request limits of ``keras-preact-serve`` (``server.route``,
``server.decode_predict``): ``GET /v1/models/<name>[/metadata]``, ``POST /v1/models/<name>:predict``.
Predict requests a replica receives within ``merge_wait_s`` of each other are merged by ``@serve.batch``
into one SavedModel call of at most ``merge_batch_size`` examples (per signature); a request larger than
that runs alone. Replies carry ``X-Replica-Id`` (the Ray Serve replica), ``X-Batch-Id`` (that replica's
SavedModel call) and ``X-Batch-Size`` (the examples that call ran). Without ``--address`` the command
starts a one-machine Ray instance (no dashboard) and stops it on exit; with ``--address auto`` it
deploys onto a running Ray cluster and deletes its application on exit.
"""

import argparse
import asyncio
import itertools
import os
import pathlib
import signal
import sys
import threading

import numpy as np
import ray
from ray import serve
from starlette.responses import Response

from keras_preact.serving import rest, server
from keras_preact.serving.rest import RequestError
from keras_preact.serving.servable import RUNTIMES, Servable, choose_runtimes, formats_in, latest_version_dir

DEFAULT_PORT = 8000  # Ray Serve's HTTP port
DEFAULT_REPLICAS = 1
DEFAULT_MERGE_BATCH_SIZE = 32
DEFAULT_MERGE_WAIT_S = 0.005


def _examples(items):
    """The examples in a list of (signature name, inputs) predict items: @serve.batch's batch size."""
    return sum(len(next(iter(inputs.values()))) for _, inputs in items)


def predict_merged(model, signature_name, inputs_list, call_ids):
    """``model``'s outputs for each of ``inputs_list`` (one signature) from one SavedModel call on their
    concatenation, as ``[(outputs or RequestError, call id, examples in the call)]``. When that call fails
    on an input (e.g. an image that does not decode), each runs alone, so only the bad ones fail."""
    merged = {name: np.concatenate([inputs[name] for inputs in inputs_list]) for name in inputs_list[0]}
    total = len(next(iter(merged.values())))
    call = next(call_ids)
    try:
        outputs = model.predict(signature_name, merged)
    except RequestError as error:  # e.g. an image that does not decode
        if len(inputs_list) > 1:
            return [predict_merged(model, signature_name, [inputs], call_ids)[0] for inputs in inputs_list]
        return [(error, call, total)]
    offsets = np.cumsum([len(next(iter(inputs.values()))) for inputs in inputs_list])[:-1]
    parts = {name: np.split(value, offsets) for name, value in outputs.items()}
    return [({name: part[i] for name, part in parts.items()}, call, total) for i in range(len(inputs_list))]


class TFServingReplica:
    """One Ray Serve replica: the exported model (``servable.Servable``), TF Serving's REST routes,
    predict requests merged."""

    def __init__(self, model_name, model_base, limits, merge_batch_size, merge_wait_s, runtime="auto"):
        self.model = Servable(model_name, model_base, runtime=runtime)
        self.max_body_bytes = limits["max_body_bytes"]
        self.limits = {k: v for k, v in limits.items() if k != "max_body_bytes"}
        self.merge_batch_size = merge_batch_size
        self._predict_batch.set_max_batch_size(merge_batch_size)
        self._predict_batch.set_batch_wait_timeout_s(merge_wait_s)
        self.replica_id = serve.get_replica_context().replica_id.unique_id
        self._call_ids = itertools.count(1)  # next() is atomic: ids stay unique across threads

    async def __call__(self, request):
        try:
            body = await self._read_body(request)
            reply = server.route(self.model, request.method, request.url.path)
            if reply is not None:
                return self._reply(200, reply)
            signature_name, inputs, mode = await asyncio.to_thread(server.decode_predict, self.model, body, **self.limits)
            if _examples([(signature_name, inputs)]) > self.merge_batch_size:
                result = (await asyncio.to_thread(self._predict, signature_name, [inputs]))[0]
            else:
                result = await self._predict_batch((signature_name, inputs))
            outputs, call, examples = result
            if isinstance(outputs, RequestError):
                raise outputs
            headers = {"X-Batch-Id": str(call), "X-Batch-Size": str(examples)}
            return self._reply(200, await asyncio.to_thread(rest.encode_outputs, outputs, mode), headers)
        except RequestError as error:
            return self._reply(error.status, rest.error_body(str(error)))
        except RecursionError:
            return self._reply(400, rest.error_body("Invalid request: values nested too deeply."))
        except Exception as error:  # noqa: BLE001 - the replica answers and stays up
            return self._reply(500, rest.error_body(f"Internal error: {type(error).__name__}: {error}"))

    async def _read_body(self, request):
        """The body (b"" for a GET without one); refused from the headers when over ``max_body_bytes``."""
        length = request.headers.get("content-length")
        if length is None and request.method != "POST":
            return b""
        if length is None or not length.isdigit():
            raise RequestError("A Content-Length header is required (chunked bodies are not accepted).",
                               411 if length is None else 400)
        if int(length) > self.max_body_bytes:
            raise RequestError(f"Request body of {length} bytes exceeds the limit of {self.max_body_bytes} bytes.", 413)
        return await request.body()

    def _reply(self, status, body, headers=None):
        return Response(body, status_code=status, media_type="application/json",
                        headers={"X-Replica-Id": self.replica_id, **(headers or {})})

    def _predict(self, signature_name, inputs_list):
        return predict_merged(self.model, signature_name, inputs_list, self._call_ids)

    @serve.batch(max_batch_size=DEFAULT_MERGE_BATCH_SIZE, batch_wait_timeout_s=DEFAULT_MERGE_WAIT_S,
                 batch_size_fn=_examples)
    async def _predict_batch(self, items):
        """[(signature name, inputs)] -> [(outputs or RequestError, call id, examples)], one SavedModel
        call per signature, run in a thread so the replica keeps reading requests meanwhile."""
        results = [None] * len(items)
        by_signature = {}
        for index, (signature_name, _) in enumerate(items):
            by_signature.setdefault(signature_name, []).append(index)
        for signature_name, indices in by_signature.items():
            group = await asyncio.to_thread(self._predict, signature_name, [items[i][1] for i in indices])
            for index, result in zip(indices, group):
                results[index] = result
        return results


def build_app(model_base, *, model_name=None, replicas=DEFAULT_REPLICAS, merge_batch_size=DEFAULT_MERGE_BATCH_SIZE,
              merge_wait_s=DEFAULT_MERGE_WAIT_S, replica_cpus=1.0, max_body_bytes=server.DEFAULT_MAX_BODY_BYTES,
              max_batch_size=server.DEFAULT_MAX_BATCH_SIZE, max_image_pixels=server.DEFAULT_MAX_IMAGE_PIXELS,
              max_aspect_ratio=server.DEFAULT_MAX_ASPECT_RATIO, max_request_pixels=server.DEFAULT_MAX_REQUEST_PIXELS,
              runtime="auto"):
    """The Ray Serve application for the latest version under ``model_base`` (for ``serve.run``); every
    argument is checked, and the version folder found, before anything starts. Each replica reads
    ``model_base`` by its absolute path: on a cluster, a file system every node sees."""
    limits = {"max_body_bytes": max_body_bytes, "max_batch_size": max_batch_size, "max_image_pixels": max_image_pixels,
              "max_aspect_ratio": max_aspect_ratio, "max_request_pixels": max_request_pixels}
    server.check_limits(replicas=replicas, merge_batch_size=merge_batch_size, **limits)
    for argument, value in (("merge_wait_s", merge_wait_s), ("replica_cpus", replica_cpus)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
            raise ValueError(f"Invalid {argument}={value!r}: expected a number >= 0.")
    model_base = pathlib.Path(model_base).resolve()
    _, path = latest_version_dir(model_base)
    choose_runtimes(formats_in(path), runtime)  # the runtime is valid and installed here (else Value/ImportError)
    model_name = server.model_name_or_default(model_base, model_name)
    deployment = serve.deployment(
        TFServingReplica, name=model_name, num_replicas=replicas, ray_actor_options={"num_cpus": replica_cpus},
        # One merged call running and the next one filling, per replica.
        max_ongoing_requests=2 * merge_batch_size,
    )
    return deployment.bind(model_name, str(model_base), limits, merge_batch_size, merge_wait_s, runtime)


def build_parser():
    parser = argparse.ArgumentParser(
        prog="keras-preact-serve-ray",
        description="Serve the latest version of an exported model with TF Serving's REST API from Ray Serve replicas.",
    )
    parser.add_argument("model_base_path", help="model directory holding numeric version folders (saved_models/<name>)")
    parser.add_argument("--replicas", type=int, default=DEFAULT_REPLICAS, help="Ray Serve replicas, each a process with the model")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"HTTP port of Ray Serve's proxy (default {DEFAULT_PORT})")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address Ray Serve's proxy binds on every node (default 127.0.0.1, loopback only)")
    parser.add_argument("--address", default=None,
                        help="Ray cluster to deploy onto ('auto': the one `ray start` runs here; default: start one here)")
    parser.add_argument("--model-name", default=None, help="name in the URL (default: the directory name)")
    parser.add_argument("--merge-batch-size", type=int, default=DEFAULT_MERGE_BATCH_SIZE,
                        help="examples one merged SavedModel call may hold (@serve.batch max_batch_size)")
    parser.add_argument("--merge-wait-s", type=float, default=DEFAULT_MERGE_WAIT_S,
                        help="seconds a replica waits for more requests to merge (@serve.batch batch_wait_timeout_s)")
    parser.add_argument("--replica-cpus", type=float, default=1.0, help="CPUs Ray reserves for each replica")
    parser.add_argument("--num-cpus", type=int, default=None, help="CPUs of the Ray instance started here (default: all)")
    parser.add_argument("--object-store-memory", type=int, default=None,
                        help="bytes of the object store of the Ray instance started here (default: Ray's)")
    parser.add_argument("--runtime", choices=RUNTIMES, default="auto",
                        help="what runs serving_default, as keras-preact-serve's --runtime (default auto: the fastest "
                             "installed for a format the version holds)")
    server.add_request_limit_arguments(parser)
    return parser


def _stop(signum, frame):
    raise KeyboardInterrupt


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if not 1 <= args.port <= 65535:
        parser.error(f"argument --port: invalid port {args.port}: expected 1-65535")
    if args.address is not None and (args.num_cpus is not None or args.object_store_memory is not None):
        parser.error("--num-cpus and --object-store-memory size the Ray instance started here: not with --address")
    try:
        app = build_app(
            args.model_base_path, model_name=args.model_name, replicas=args.replicas,
            merge_batch_size=args.merge_batch_size, merge_wait_s=args.merge_wait_s, replica_cpus=args.replica_cpus,
            max_body_bytes=args.max_body_bytes, max_batch_size=args.max_batch_size,
            max_image_pixels=args.max_image_pixels, max_aspect_ratio=args.max_aspect_ratio,
            max_request_pixels=args.max_request_pixels, runtime=args.runtime,
        )
    except ValueError as error:
        parser.error(str(error))
    except ImportError as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    model_base = pathlib.Path(args.model_base_path).resolve()
    model_name = server.model_name_or_default(model_base, args.model_name)
    version, path = latest_version_dir(model_base)
    local = args.address is None
    if local:
        # A Ray instance started here reports no usage statistics to Ray's servers unless asked to
        # (RAY_USAGE_STATS_ENABLED=1); a cluster joined with --address keeps its own setting.
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        ray.init(num_cpus=args.num_cpus, object_store_memory=args.object_store_memory, include_dashboard=False)
    else:
        ray.init(address=args.address)
    for signum in (signal.SIGINT, signal.SIGTERM):  # either stops serving and the Ray instance started here
        signal.signal(signum, _stop)
    try:
        serve.start(http_options={"host": args.host, "port": args.port})
        serve.run(app, name=model_name, route_prefix="/")
        print(f"Serving model '{model_name}' version {version} ({path}) on {args.replicas} Ray Serve replica(s) "
              f"at http://{args.host}:{args.port}/v1/models/{model_name}", flush=True)
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        if local:
            serve.shutdown()
        else:
            serve.delete(model_name)
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
