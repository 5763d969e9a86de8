"""``keras-preact-serve-ray``: ``keras-preact-serve``'s application in Ray Serve replicas, each merging the predict
requests it gets with Ray Serve's ``@serve.batch`` (docs/export-and-serving.md, "Scale-out on Ray Serve")."""

import asyncio
import dataclasses
import errno
import functools
import math
import os
import pathlib
import signal
import socket
import sys
import threading
import time

import ray
from ray import serve

from keras_preact_serving import batching, connections, flags
from keras_preact_serving.app import RequestLimits, ServingState, create_app, model_name_or_default
from keras_preact_serving.batching import BatchingOptions, check_number
from keras_preact_serving.flags import DEFAULT_REPLICAS, MAX_REPLICAS_PER_NODE
from keras_preact_serving.servable import Servable, check_runtime
from keras_preact_serving.server import PortInUse, load_error_line, port_in_use


def replica_headers():
    """The reply header naming the Ray Serve replica (called in the replica, by the app's lifespan)."""
    return {"X-Replica-Id": serve.get_replica_context().replica_id.unique_id}


class ServeBatcher(batching.MergedCalls):
    """A replica's batcher: Ray Serve's ``@serve.batch`` gathers the concurrent predict requests of the replica (at most
    ``batching_max_size`` examples, counted by its ``batch_size_fn``; the first waits at most ``batching_timeout_ms``
    for more; ``batching_threads`` gathered lists run at once), and each list runs as ``Batcher`` runs a batch: one
    model call per signature and per-example shapes, rerun request by request if it fails. A request of more than
    ``batching_max_size`` examples runs alone, as ``Batcher``'s does."""

    def __init__(self, predict, options=None):
        super().__init__(predict, options)
        self.options = options = self.options
        self._waiting = 0
        self._gathered = serve.batch(
            max_batch_size=options.batching_max_size, batch_wait_timeout_s=options.batching_timeout_ms / 1000,
            max_concurrent_batches=options.batching_threads, batch_size_fn=lambda batch: sum(p.size for p in batch),
        )(self._run_gathered)

    async def submit(self, signature_name, inputs):
        """``keras_preact_serving.batching.Batcher.submit``: a ``BatchResult`` (raises the request's own error)."""
        pending = self.pending(signature_name, inputs)
        self._waiting += 1
        try:
            if pending.size > self.options.batching_max_size:
                await asyncio.to_thread(self.run, [pending])
            else:
                await self._gathered(pending)
        finally:
            self._waiting -= 1
        return pending.future.result()

    async def _run_gathered(self, batch):
        """What ``@serve.batch`` calls with the requests it gathered: each merge key's requests in one model call."""
        keys = {}
        for pending in batch:
            keys.setdefault(batching.merge_key(pending.signature_name, pending.inputs), []).append(pending)
        await asyncio.to_thread(lambda: [self.run(same) for same in keys.values()])
        return [None] * len(batch)  # each request's result is its future's

    def queued(self):
        """Requests this replica holds that have not been answered yet."""
        return self._waiting

    def close(self):
        """Nothing to stop: Ray Serve's batch queue belongs to the replica."""


class TFServingReplica:
    """One Ray Serve replica: the ingress app's (``build_app``), its model loaded in the background; while it loads,
    model routes wait for it, at most ``--request-timeout`` (why: docs/export-and-serving.md, "Metrics and health").
    The command prints what it serves once every replica's model is ready (``loaded``); a failed load: one line, exit 1.
    """

    def __init__(self):
        self.health_checked = False  # Ray Serve's first health check, right after the constructor, is done

    async def loaded(self):
        """(this replica's id, the version and path it serves, None) once its model is ready (the newest version that
        loads), or (its id, None, the load error in one line)."""
        state = self.app.state.serving
        replica = serve.get_replica_context().replica_id.unique_id
        if await state.loaded():
            return replica, (state.model.version, state.model.path), None
        return replica, None, load_error_line(state.load_error)

    def check_health(self):
        """Ray Serve's health check: fails once loading failed, so Ray reports the deployment unhealthy with the error
        and replaces the replica. The first check (right after the constructor) passes: else a load that fails at once
        fails the deployment, and the command in Ray's traceback instead of one line (``wait_until_loaded``)."""
        first, self.health_checked = not self.health_checked, True
        error = self.app.state.serving.load_error
        if error is not None and not first:
            raise RuntimeError(load_error_line(error))


HTTP_PROXY_WAIT_S = 60  # how long serve.start waits for the HTTP proxies before it raises (Ray's own, fixed)
PROXY_POLL_S = 0.5


def start_serve(http_options):
    """Ray Serve started (or joined) with ``http_options``; False where ``serve.start`` gave up waiting for the HTTP
    proxies. It waits for them at most ``HTTP_PROXY_WAIT_S``, then raises ``TimeoutError`` while the controller it
    started goes on starting them: on a busy machine a proxy's cold Ray worker takes longer. A second
    ``serve.start`` then joins that controller, which keeps these options; ``wait_for_proxies`` waits for them.

    Example: ``start_serve({"host": "127.0.0.1", "port": 8000})`` before ``serve.run``."""
    try:
        serve.start(http_options=http_options)
        return True
    except TimeoutError:
        serve.start(http_options=http_options)
        return False


def wait_for_proxies():
    """Until Ray Serve's HTTP proxies are up (``serve.status().proxies``): at least one, and none starting or
    unhealthy (Ray restarts an unhealthy one; a draining one is on a node without replicas)."""
    while True:
        states = {getattr(state, "value", state) for state in serve.status().proxies.values()}
        if states and not states & {"STARTING", "UNHEALTHY"}:
            return
        time.sleep(PROXY_POLL_S)


def wait_until_loaded(handle, replicas):
    """((version, path) served, None) once each of the deployment's ``replicas`` has its model ready, else (None, the
    first load error in one line)."""
    ready = {}
    while len(ready) < replicas:
        for replica, served, error in [
            response.result() for response in [handle.loaded.remote() for _ in range(replicas)]
        ]:
            if error is not None:
                return None, error
            ready[replica] = served
    return min(ready.values()), None  # the same on every replica unless a version was copied in meanwhile


def build_app(
    model_base,
    *,
    model_name=None,
    replicas=DEFAULT_REPLICAS,
    replica_cpus=1.0,
    max_replicas_per_node=None,
    limits=None,
    batching=None,
    runtime="auto",
    **values,
):
    """The Ray Serve application (for ``serve.run``), every argument checked first; ``model_base`` read by every
    node. Fields of ``RequestLimits`` and ``BatchingOptions`` may be given by name, as to ``server.make_server``.

    Examples:
        >>> serve.run(build_app("saved_models/cifar", replicas=2, batching_max_size=8))  # doctest: +SKIP
    """
    limit_names = {field.name for field in dataclasses.fields(RequestLimits)}
    batching_names = {field.name for field in dataclasses.fields(BatchingOptions)}
    unknown = sorted(set(values) - limit_names - batching_names)
    if unknown:
        raise TypeError(f"build_app() got unexpected keyword arguments {unknown}")
    limits = dataclasses.replace(limits or RequestLimits(), **{k: v for k, v in values.items() if k in limit_names})
    options = dataclasses.replace(batching or BatchingOptions(),
                                  **{k: v for k, v in values.items() if k in batching_names})
    check_number("replicas", replicas)
    check_number("replica_cpus", replica_cpus, real=True, at_least=0)
    if max_replicas_per_node is not None and (
            isinstance(max_replicas_per_node, bool) or not isinstance(max_replicas_per_node, int)
            or not 1 <= max_replicas_per_node <= MAX_REPLICAS_PER_NODE):
        raise ValueError(f"Invalid max_replicas_per_node={max_replicas_per_node!r}: expected None (no limit) or an "
                         f"integer from 1 to {MAX_REPLICAS_PER_NODE}.")
    model_base = pathlib.Path(model_base).resolve()
    check_runtime(model_base, runtime)  # valid and installed here for some version (else Value/ImportError)
    model_name = model_name_or_default(model_base, model_name)
    state = ServingState(functools.partial(Servable, model_name, str(model_base), runtime=runtime), limits, options,
                         identify=replica_headers, load_in_background=True, wait_for_load=True,
                         batcher=ServeBatcher)  # ``TFServingReplica``
    deployment = serve.deployment(
        serve.ingress(create_app(state))(TFServingReplica), name=model_name, num_replicas=replicas,
        ray_actor_options={"num_cpus": replica_cpus}, max_ongoing_requests=options.batching_max_queue,
        max_replicas_per_node=max_replicas_per_node)
    return deployment.bind()


build_parser = flags.ray_parser  # the parser, standard library only (keras_preact_serving.flags)

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
            args.model_base_path,
            model_name=args.model_name,
            replicas=args.replicas,
            batching=BatchingOptions.from_args(args),
            replica_cpus=args.replica_cpus,
            max_replicas_per_node=args.max_replicas_per_node,
            limits=RequestLimits.from_args(args),
            runtime=args.runtime,
        )
    except ValueError as error:
        parser.error(str(error))
    except ImportError as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    model_name = model_name_or_default(args.model_base_path, args.model_name)
    local = args.address is None
    needed = 1 if args.max_replicas_per_node is None else math.ceil(args.replicas / args.max_replicas_per_node)
    if local and needed > 1:
        parser.error(f"--replicas {args.replicas} with --max-replicas-per-node {args.max_replicas_per_node} needs "
                     f"{needed} nodes: the Ray instance started here is one (deploy onto a cluster with --address)")
    if local and port_in_use(args.host, args.port, socket.AF_INET6 if ":" in args.host else socket.AF_INET):
        # else Ray's proxy fails to bind a minute later, in a 70-line traceback (a running Serve on a cluster keeps its
        # own)
        parser.exit(
            1, f"{parser.prog}: error: {PortInUse(args.host, args.port, '--port', os.strerror(errno.EADDRINUSE))}\n"
        )
    if local:
        os.environ.setdefault(
            "RAY_USAGE_STATS_ENABLED", "0"
        )  # no usage statistics unless asked (a cluster keeps its own)
        # "local": an instance of its own (else Ray joins the latest cluster started here, and refuses --num-cpus)
        ray.init(address="local", num_cpus=args.num_cpus, object_store_memory=args.object_store_memory,
                 include_dashboard=False, runtime_env=connections.ray_runtime_env(args.request_timeout))
    else:
        ray.init(address=args.address, runtime_env=connections.ray_runtime_env(args.request_timeout))
        nodes = sum(node["Alive"] for node in ray.nodes())
        if needed > nodes:
            waiting = args.replicas - nodes * args.max_replicas_per_node
            print(f"{parser.prog}: warning: --replicas {args.replicas} with --max-replicas-per-node "
                  f"{args.max_replicas_per_node} needs {needed} nodes and the cluster has {nodes}: {waiting} "
                  "replica(s) wait for nodes to join, and this command until they run (the others serve meanwhile)",
                  file=sys.stderr, flush=True)
    for signum in (signal.SIGINT, signal.SIGTERM):  # either stops serving and the Ray instance started here
        signal.signal(signum, _stop)
    try:
        if not start_serve({"host": args.host, "port": args.port,
                            "keep_alive_timeout_s": math.ceil(args.request_timeout)}):
            print(f"{parser.prog}: Ray Serve's HTTP proxies are not up after Ray's {HTTP_PROXY_WAIT_S} s wait (a busy "
                  "machine starts their workers slowly): deploying meanwhile; serving once they are up",
                  file=sys.stderr, flush=True)
        served, error = wait_until_loaded(serve.run(app, name=model_name, route_prefix="/"), args.replicas)
        if error is not None:
            print(f"{parser.prog}: error: {error}", file=sys.stderr, flush=True)
            return 1
        wait_for_proxies()
        version, path = served
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
