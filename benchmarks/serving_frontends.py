"""keras-preact-serve's front ends against each other, in one run: the ``http.server`` one (thread per
connection, last in commit c09ad94) and today's Starlette app on uvicorn, REST and gRPC, batching off and on,
1 and 16 concurrent clients, each over the same runtime called in-process (issue 25, item 8).

    KERAS_BACKEND=tensorflow PYTHONPATH=. python benchmarks/serving_frontends.py \\
        --rounds 2 --duration 5 --warmup 2 --out /tmp/serving-frontends

- Each model is exported once by today's code (``serving_batching.export``: CIFAR pre-act ResNet-20 at 32x32,
  ImageNet pre-act ResNet-50 at 224x224, random weights).
- The old front end is ``git archive <--old-ref> keras_preact`` extracted into a temporary directory and run
  from there (``PYTHONPATH`` and the working directory are that tree: nothing of today's package is imported);
  the new one is this working tree's. Both run ``python -m <SERVER_MODULES[frontend]> BASE --runtime
  saved_model`` (the old tree's ``keras_preact.serving.server``, today's ``keras_preact_serving.server``: the SavedModel
  on TensorFlow in every row), batching off, and on with the same flags (``batching_flags``). A model's
  servers are started once, side by side, and stay up, idle (~0.3% of a core each), while the others are
  measured. Before any timing each server must answer as the runtime does in-process (probabilities within
  1e-5, every input and protocol) and show which front end it is (today's answers
  ``/monitoring/prometheus/metrics``; the old one 404s).
- Clients: ``max(--clients)`` client processes, started once (spawn; no TensorFlow in them). In a cell each
  holds one connection (HTTP/1.1 keep-alive, or its own gRPC channel) with one request in flight, and sends
  prepared single-image requests back to back, reading each reply whole. REST: TF Serving's predict body, the
  same bytes for both front ends. gRPC (the new front end only): TF Serving's ``PredictionService/Predict``
  with the same images, a ``PredictRequest`` built by the official ``tensorflow-serving-api`` protos
  (``tf.make_tensor_proto``) and serialized once; a client sends those bytes on the official service's
  method path and reads the reply's bytes, as a REST client sends a prepared body (the stub itself needs
  TensorFlow imported: ~6 s of CPU per client process). The check above sends each payload once through the
  official ``PredictionServiceStub``.
- Inputs: ``pixels``, uint8 pixels (REST: JSON ``instances``; gRPC: a uint8 tensor; ``serving_default``), and
  ``jpeg``, the same image as a quality-90 JPEG (REST: base64 in JSON; gRPC: a string tensor;
  ``serving_bytes``, decoded in the graph). ResNet-50 at 224 gets ``jpeg`` alone by default: a JSON body of
  150,528 pixel values costs more to parse than the model. The images are ``serving_batching.images``
  (uniform noise, 4 per client).
- A cell: ``--warmup`` s of load untimed, then ``--duration`` s timed (the clients keep sending until it ends,
  so the load is steady across it). images/s: each successful request counts for the fraction of its time
  (sent to replied) inside the window, over the window's length; unlike a count of replies in the window,
  this neither loses nor gains a whole burst of batched replies at an edge (ResNet-50 with batching replies
  to 16 clients at once, about once a second on this CPU). p50/p99 and errors: the replies completed in the
  window. "batch/call": examples per model call over the cell, from the new server's metrics (its gRPC
  requests without batching call the model outside them: "-").
- In-process reference, every round: ``Servable.predict`` (the call both servers make: ``tf.constant``, the
  signature, ``.numpy()``) in this process with the same input form, back to back for ``--duration`` s (and
  3 calls at least), at batch 1 and at each client count (the most one batched call can hold at one image
  per client). Efficiency = served images/s over in-process images/s at batch 1 (batching off, or one
  client) or at the client count (batching on: the strict reference; "batch/call" says what the batcher
  formed). The goal row: batching on at the largest client count, efficiency >= 0.9. Without batching,
  many clients can exceed 1: the server runs several single-image calls at once, the reference one at a time.
- Rounds: each round measures the in-process reference, then, per batching setting, the old front end's cells
  then the new one's (old, new, old, new over the run: drift hits both). Reported: images/s, p50 and p99 of
  the median round by images/s (the lower middle one for an even count); efficiency and new/old, the median
  over rounds of the ratio within each round. ``--out OUT`` writes OUT.md (the table) and OUT.json (every
  round's figures), each through a temporary file renamed into place.
"""

import argparse
import ctypes
import dataclasses
import http.client
import importlib.util
import io
import json
import math
import multiprocessing
import os
import pathlib
import platform
import queue
import re
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # benchmarks/ is not installed

from benchmarks import serving_batching as shared  # noqa: E402

OLD_REF = "c09ad94"  # the last commit with the http.server front end
FRONTENDS = ("old", "new")
# Each front end's server module: serving lived in the library (keras_preact/serving/) until issue 34.
SERVER_MODULES = {"old": "keras_preact.serving.server", "new": "keras_preact_serving.server"}
PROTOCOLS = ("rest", "grpc")
INPUTS = ("pixels", "jpeg")
DEFAULT_INPUTS = {"cifar_resnet20": ("pixels", "jpeg"), "imagenet_resnet50": ("jpeg",)}
SIGNATURES = {"pixels": "serving_default", "jpeg": "serving_bytes"}
REST_SIGNATURES = {"pixels": "default", "jpeg": "bytes"}  # serving_batching.rest_body's names
IMAGES_PER_CLIENT = 4
METRICS_PATH = "/monitoring/prometheus/metrics"  # today's front end only
OK = ("200", "OK")  # a REST reply's status, a gRPC call's code
GOAL = 0.9


START = time.monotonic()


def log(message):
    print(f"[{time.monotonic() - START:6.1f} s] {message}", flush=True)


class SetupError(Exception):
    """What keeps the run from starting, in one line naming the argument concerned."""


# ---------------------------------------------------------------------------------------------- clients


def connect(protocol, port, path):
    """(send(body) -> status, close) over one connection: HTTP/1.1 keep-alive, or one gRPC channel on which
    ``path`` is called with prepared request bytes (no serializer: they go as they are)."""
    if protocol == "rest":
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)

        def send(body):
            conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            response.read()
            return str(response.status)

        return send, conn.close
    import grpc

    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    predict = channel.unary_unary(path)

    def send(body):
        try:
            predict(body, timeout=600)
        except grpc.RpcError as error:
            return error.code().name
        return "OK"

    return send, channel.close


def client(index, inbox, outbox):
    """A client process: per job from ``inbox`` ((protocol, port, path, payloads)), connect and send one
    warm-up request, put "ready", wait for (start_at, stop_at), send ``payloads`` in turn until stop_at
    (time.time()), put [(start, end, status)]. None ends it; an exception is put as "error" and ends it."""
    parent = os.getppid()

    def get():  # the next message; None once the benchmark process is gone, however it ended
        while True:
            try:
                return inbox.get(timeout=5)
            except queue.Empty:
                if os.getppid() != parent:
                    return None

    while (job := get()) is not None:
        try:
            protocol, port, path, payloads = job
            send, close = connect(protocol, port, path)
            status = send(payloads[0])
            if status not in OK:
                raise RuntimeError(f"the warm-up {protocol} request got {status}")
            outbox.put(("ready", index, None))
            if (go := get()) is None:
                return
            _, stop_at = go
            records = []
            i = 0
            while time.time() < stop_at:
                start = time.time()
                status = send(payloads[i % len(payloads)])
                records.append((start, time.time(), status))
                i += 1
            close()
        except Exception as error:  # noqa: BLE001 - reported to the parent, which stops the run
            outbox.put(("error", index, f"{type(error).__name__}: {error}"))
            return
        outbox.put(("records", index, records))


class ClientPool:
    """``size`` client processes, started once and reused by every cell."""

    def __init__(self, size):
        context = multiprocessing.get_context("spawn")
        self.outbox = context.Queue()
        self.inboxes = [context.Queue() for _ in range(size)]
        self.processes = [context.Process(target=client, args=(i, inbox, self.outbox), daemon=True)
                          for i, inbox in enumerate(self.inboxes)]
        for process in self.processes:
            process.start()

    def _collect(self, count, kind, timeout):
        out = {}
        while len(out) < count:
            got, index, value = self.outbox.get(timeout=timeout)
            if got == "error":
                raise RuntimeError(f"client {index}: {value}")
            if got != kind:
                raise RuntimeError(f"client {index} answered {got!r}, expected {kind!r}")
            out[index] = value
        return out

    def run(self, jobs, warmup, duration):
        """Every job (one per client) at once; (all records, start_at, stop_at)."""
        for inbox, job in zip(self.inboxes, jobs):
            inbox.put(job)
        self._collect(len(jobs), "ready", timeout=600)
        start_at = time.time() + warmup  # every client loads the server from now; timed from start_at
        stop_at = start_at + duration
        for inbox in self.inboxes[:len(jobs)]:
            inbox.put((start_at, stop_at))
        records = self._collect(len(jobs), "records", timeout=warmup + duration + 600)
        return [r for i in sorted(records) for r in records[i]], start_at, stop_at

    def close(self):
        for inbox in self.inboxes:
            inbox.put(None)
        for process in self.processes:
            process.join(10)
            if process.is_alive():
                process.terminate()
                process.join(10)


def summarize(records, start_at, stop_at):
    """images/s in [start_at, stop_at]: each successful request counts for the fraction of its own time
    (start to reply) that falls in the window, so a request in flight at either edge counts in part and a
    burst of batched replies just outside the window is not lost or gained whole; p50 and p99 (ms) and the
    errors of the replies completed in the window."""
    done = [(s, e, status) for s, e, status in records if start_at <= e <= stop_at]
    ok = np.array([e - s for s, e, status in done if status in OK]) * 1e3
    p50, p99 = np.percentile(ok, [50, 99]) if len(ok) else (math.nan, math.nan)
    served = sum(max(0.0, min(e, stop_at) - max(s, start_at)) / (e - s)
                 for s, e, status in records if status in OK and e > s)
    return {"images_per_s": served / (stop_at - start_at), "p50_ms": float(p50), "p99_ms": float(p99),
            "replies": len(done), "errors": len(done) - len(ok)}


# ---------------------------------------------------------------------------------------------- servers


@dataclasses.dataclass
class Server:
    frontend: str
    batching: str
    process: subprocess.Popen
    log: pathlib.Path
    port: int = 0
    grpc_port: int = 0


def old_tree(ref, directory):
    """Extract ``keras_preact`` at ``ref`` (git archive) into ``directory``; its commit, in one line."""
    try:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", ref, "keras_preact"],
                                 capture_output=True, check=False)
    except FileNotFoundError:
        raise SetupError(f"--old-ref {ref}: the old front end is taken from git (git archive), and git is not "
                         "installed") from None
    if archive.returncode:
        message = archive.stderr.decode(errors="replace").strip().splitlines()
        raise SetupError(f"--old-ref {ref}: git archive failed in {REPO}: {message[-1] if message else archive.returncode}")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(directory, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    server = pathlib.Path(directory) / "keras_preact" / "serving" / "server.py"
    if not server.is_file() or "http.server" not in server.read_text():
        raise SetupError(f"--old-ref {ref}: its keras_preact/serving/server.py is not the http.server front end")
    return subprocess.run(["git", "-C", str(REPO), "log", "-1", "--format=%h %s", ref], capture_output=True,
                          text=True, check=False).stdout.strip()


def die_with_parent():
    """Run in a server process before exec (Linux): SIGTERM once the benchmark process dies, however it dies
    (its own cleanup stops the servers; this is for a SIGKILL)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def batching_flags(args):
    """The batching flags given to both front ends (each spelled out, so neither's defaults decide)."""
    return ["--enable-batching", "--batching-max-size", "32", "--batching-timeout-ms", f"{args.batching_timeout_ms:g}",
            "--batching-max-queue", "64", "--batching-threads", "1"]


def start_servers(base, args, trees, logs):
    """One server per front end and batching setting, started side by side; each with its port(s)."""
    servers = []
    for frontend in args.frontends:
        for batching in args.batching:
            flags = ["--runtime", "saved_model", *(batching_flags(args) if batching == "on" else [])]
            if frontend == "new" and "grpc" in args.protocols:
                flags += ["--grpc-port", "0"]
            env = {**os.environ, "PYTHONPATH": str(trees[frontend]), "TF_CPP_MIN_LOG_LEVEL": "3",
                   "KERAS_BACKEND": "tensorflow"}
            log = pathlib.Path(logs) / f"{base.name}-{frontend}-{batching}.log"
            with open(log, "w") as stderr:
                process = shared.launch_server(base, flags, SERVER_MODULES[frontend], env=env, cwd=trees[frontend],
                                               stderr=stderr, preexec_fn=die_with_parent if sys.platform == "linux" else None)
            servers.append(Server(frontend, batching, process, log))
    try:
        for server in servers:
            try:
                server.port = shared.server_port(server.process)
                if server.frontend == "new" and "grpc" in args.protocols:
                    line = server.process.stdout.readline()
                    match = re.search(r" at \S+:(\d+)$", line.strip())
                    if not match:
                        raise RuntimeError(f"no gRPC port in {line!r}")
                    server.grpc_port = int(match[1])
            except RuntimeError as error:
                tail = "\n".join(server.log.read_text(errors="replace").strip().splitlines()[-5:])
                raise RuntimeError(f"the {server.frontend} front end (batching {server.batching}) did not start: "
                                   f"{error}\n{tail}") from None
    except BaseException:
        stop_servers(servers)
        raise
    return servers


def stop_servers(servers):
    for server in servers:
        if server.process.poll() is None:
            server.process.terminate()
    for server in servers:
        try:
            server.process.wait(60)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait(60)
        server.process.stdout.close()


def http_get(port, path):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def batch_counters(server):
    """(examples, model calls) so far, from the new server's batch-size histogram; None for the old one."""
    if server.frontend != "new":
        return None
    _, text = http_get(server.port, METRICS_PATH)
    totals = {"sum": 0.0, "count": 0.0}
    for line in text.decode().splitlines():
        match = re.match(r"keras_preact_serving_batch_size_(sum|count)\{.*\} (\S+)$", line)
        if match:
            totals[match[1]] += float(match[2])
    return totals["sum"], totals["count"]


# ---------------------------------------------------------------------------------------------- payloads


@dataclasses.dataclass
class ModelUnderTest:
    name: str
    inputs: tuple
    base: pathlib.Path = None
    servable: object = None
    pixels: list = None  # per client: IMAGES_PER_CLIENT uint8 images
    jpegs: list = None  # the same, JPEG-encoded
    expected: dict = None  # input -> in-process probabilities of client 0's first image

    def input_name(self, kind):
        (name,) = self.servable.input_specs[SIGNATURES[kind]]
        return name

    def value(self, kind, client_index, image_index):
        """The input array of one image (batch of 1)."""
        if kind == "pixels":
            return self.pixels[client_index][image_index][None]
        return np.array([self.jpegs[client_index][image_index]], dtype=object)

    def batch(self, kind, size):
        """``size`` images, one per client (their first), as one input array."""
        if kind == "pixels":
            return np.stack([self.pixels[c][0] for c in range(size)])
        return np.array([self.jpegs[c][0] for c in range(size)], dtype=object)

    def rest_payloads(self, kind, client_index):
        return [shared.rest_body(REST_SIGNATURES[kind], p) for p in self.pixels[client_index]]

    def grpc_payloads(self, kind, client_index):
        return [grpc_request(self.name, SIGNATURES[kind], self.input_name(kind), self.value(kind, client_index, i))
                for i in range(IMAGES_PER_CLIENT)]


def grpc_predict_path():
    """The method path of TF Serving's Predict, from the official service descriptor (what its stub calls)."""
    from tensorflow_serving.apis import prediction_service_pb2

    service = prediction_service_pb2.DESCRIPTOR.services_by_name["PredictionService"]
    return f"/{service.full_name}/{service.methods_by_name['Predict'].name}"


def grpc_request(model_name, signature_name, input_name, value):
    """A serialized ``PredictRequest`` (the official protos, ``tf.make_tensor_proto``)."""
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    request = predict_pb2.PredictRequest()
    request.model_spec.name = model_name
    request.model_spec.signature_name = signature_name
    request.inputs[input_name].CopyFrom(tf.make_tensor_proto(value))
    return request.SerializeToString()


def check_server(server, model, args):
    """RuntimeError unless ``server`` is the front end asked for and answers each input and protocol as the
    runtime does in-process."""
    status, _ = http_get(server.port, METRICS_PATH)
    if (status == 200) != (server.frontend == "new"):
        raise RuntimeError(f"the server started as the {server.frontend} front end answered GET {METRICS_PATH} "
                           f"with {status}: it is not that front end")
    for kind in model.inputs:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=600)
        conn.request("POST", f"/v1/models/{model.name}:predict", body=model.rest_payloads(kind, 0)[0],
                     headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        reply = json.loads(response.read())
        conn.close()
        if response.status != 200:
            raise RuntimeError(f"{server.frontend} front end, {kind} over REST: {response.status} {reply}")
        served = {"rest": np.array(reply["predictions"][0]["probabilities"])}
        if server.frontend == "new" and "grpc" in args.protocols:
            import grpc
            import tensorflow as tf
            from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

            request = predict_pb2.PredictRequest.FromString(model.grpc_payloads(kind, 0)[0])
            with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
                response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, 600)
            served["grpc"] = tf.make_ndarray(response.outputs["probabilities"])[0]
        for protocol, probabilities in served.items():
            difference = np.abs(probabilities - model.expected[kind]).max()
            if not difference <= 1e-5:
                raise RuntimeError(f"the {server.frontend} front end (batching {server.batching}) answered {kind} over "
                                   f"{protocol} {difference:.2e} away from the in-process call")


# ---------------------------------------------------------------------------------------------- measuring


def in_process(model, kind, size, duration, min_calls=3):
    """(images/s, ms per call) of ``Servable.predict`` on ``size`` images, back to back for ``duration`` s and
    at least ``min_calls`` calls."""
    inputs = {model.input_name(kind): model.batch(kind, size)}
    model.servable.predict(SIGNATURES[kind], inputs)  # warm-up
    calls = 0
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < duration or calls < min_calls:
        model.servable.predict(SIGNATURES[kind], inputs)
        calls += 1
    return calls * size / elapsed, elapsed / calls * 1e3


def cells(args, frontend, model):
    """(clients, input, protocol) of one server, in the order measured."""
    protocols = [p for p in args.protocols if frontend == "new" or p == "rest"]
    return [(c, kind, protocol) for c in args.clients for kind in model.inputs for protocol in protocols]


def measure_model(model, args, trees, pool, logs, served_rows, reference_rows):
    servers = start_servers(model.base, args, trees, logs)
    try:
        for server in servers:
            check_server(server, model, args)
        log(f"{len(servers)} servers of {model.name} up, each answering as the runtime in-process")
        path = {"rest": f"/v1/models/{model.name}:predict", "grpc": grpc_predict_path()}
        payloads = {(kind, protocol): [getattr(model, f"{protocol}_payloads")(kind, c) for c in range(max(args.clients))]
                    for kind in model.inputs for protocol in args.protocols}
        for round_index in range(1, args.rounds + 1):
            reference = {}
            for kind in model.inputs:
                for size in sorted({1, *args.clients}):
                    ips, ms = in_process(model, kind, size, args.duration)
                    reference[kind, size] = ips
                    reference_rows.append({"model": model.name, "input": kind, "batch": size, "round": round_index,
                                           "images_per_s": ips, "ms_per_call": ms})
                    log(f"in-process {model.name} {kind} batch {size} round {round_index}: {ips:.1f} images/s")
            for batching in args.batching:
                for frontend in args.frontends:
                    (server,) = [s for s in servers if (s.frontend, s.batching) == (frontend, batching)]
                    for clients, kind, protocol in cells(args, frontend, model):
                        port = server.grpc_port if protocol == "grpc" else server.port
                        jobs = [(protocol, port, path[protocol], payloads[kind, protocol][c]) for c in range(clients)]
                        before = batch_counters(server)
                        records, start_at, stop_at = pool.run(jobs, args.warmup, args.duration)
                        after = batch_counters(server)
                        row = {"model": model.name, "input": kind, "protocol": protocol, "frontend": frontend,
                               "batching": batching, "clients": clients, "round": round_index,
                               **summarize(records, start_at, stop_at)}
                        calls = after[1] - before[1] if after else 0
                        row["batch_per_call"] = (after[0] - before[0]) / calls if calls else None
                        row["reference_batch"] = clients if batching == "on" else 1
                        row["reference_images_per_s"] = reference[kind, row["reference_batch"]]
                        row["efficiency"] = row["images_per_s"] / row["reference_images_per_s"]
                        served_rows.append(row)
                        log(f"{model.name} {kind} {protocol} {frontend} batching {batching} {clients} clients "
                            f"round {round_index}: {row['images_per_s']:.1f} images/s, p50 {row['p50_ms']:.1f} ms, "
                            f"p99 {row['p99_ms']:.1f} ms, {row['errors']} errors, efficiency {row['efficiency']:.2f}")
    finally:
        stop_servers(servers)


# ---------------------------------------------------------------------------------------------- report

KEY = ("model", "input", "protocol", "frontend", "batching", "clients")


def summary(served_rows, reference_rows, max_clients):
    """One row per cell: the median round's figures, the median efficiency and new/old."""
    by_key = {}
    for row in served_rows:
        by_key.setdefault(tuple(row[k] for k in KEY), []).append(row)
    out = []
    for key, rows in by_key.items():
        median_row = sorted(rows, key=lambda r: r["images_per_s"])[(len(rows) - 1) // 2]
        entry = {k: median_row[k] for k in (*KEY, "images_per_s", "p50_ms", "p99_ms", "batch_per_call",
                                              "reference_batch")}
        entry["rounds"] = len(rows)
        entry["errors"] = sum(r["errors"] for r in rows)
        entry["images_per_s_range"] = [min(r["images_per_s"] for r in rows), max(r["images_per_s"] for r in rows)]
        entry["reference_images_per_s"] = statistics.median(
            r["images_per_s"] for r in reference_rows
            if (r["model"], r["input"], r["batch"]) == (key[0], key[1], entry["reference_batch"]))
        entry["efficiency"] = statistics.median(r["efficiency"] for r in rows)
        old = by_key.get((*key[:3], "old", *key[4:]))
        if key[3] == "new" and old:
            old_by_round = {r["round"]: r["images_per_s"] for r in old}
            ratios = [r["images_per_s"] / old_by_round[r["round"]] for r in rows if old_by_round.get(r["round"])]
            entry["new_over_old"] = statistics.median(ratios) if ratios else None
        else:
            entry["new_over_old"] = None
        entry["goal_row"] = entry["batching"] == "on" and entry["clients"] == max_clients
        out.append(entry)
    return out


def fmt(value, digits=1):
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:,.{digits}f}"


def spread(row):
    """The images/s range over rounds, " (min-max)", when a cell ran in several."""
    low, high = row["images_per_s_range"]
    return f" ({low:,.0f}-{high:,.0f})" if row["rounds"] > 1 else ""


def markdown(meta, rows, reference_rows):
    lines = [
        f"{meta['machine']}; load average {meta['load_average_start']} at the start, {meta['load_average_end']} at "
        f"the end; TensorFlow {meta['tensorflow']}, Python {meta['python']}.",
        f"Old front end: {meta['old']} (http.server); new: {meta['new']} (Starlette on uvicorn; gRPC on grpc.aio). "
        f"Both `--runtime saved_model`; batching on = `{' '.join(meta['batching_flags'])}`.",
        f"{meta['rounds']} round(s); per cell {meta['warmup']:g} s warm-up, {meta['duration']:g} s timed; each client "
        "process one single-image request in flight. images/s, p50, p99: the median round (images/s min-max over "
        "rounds in brackets); efficiency (served over "
        "in-process images/s, at batch 1 without batching, at the client count with it) and new/old: medians of "
        f"per-round ratios. Goal row: batching on at {meta['max_clients']} clients, efficiency >= {GOAL}.",
        "",
        "| model | input | protocol | front end | batching | clients | images/s | p50 ms | p99 ms | errors "
        "| batch/call | in-process images/s (batch) | efficiency | new/old | goal |",
        "|---|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        goal = ("met" if r["efficiency"] >= GOAL else "missed") + f" (>= {GOAL})" if r["goal_row"] else ""
        lines.append(
            f"| {r['model']} | {r['input']} | {r['protocol']} | {r['frontend']} | {r['batching']} | {r['clients']} "
            f"| {fmt(r['images_per_s'])}{spread(r)} | {fmt(r['p50_ms'])} | {fmt(r['p99_ms'])} | {r['errors']} "
            f"| {fmt(r['batch_per_call'])} | {fmt(r['reference_images_per_s'])} ({r['reference_batch']}) "
            f"| {fmt(r['efficiency'], 2)} | {fmt(r['new_over_old'], 2)} | {goal} |")
    lines += ["", "In-process reference (`Servable.predict`, the SavedModel on TensorFlow), median over rounds:", "",
              "| model | input | batch | images/s | ms per call |", "|---|---|---:|---:|---:|"]
    seen = {}
    for r in reference_rows:
        seen.setdefault((r["model"], r["input"], r["batch"]), []).append(r)
    for (name, kind, size), rs in seen.items():
        lines.append(f"| {name} | {kind} | {size} | {fmt(statistics.median(r['images_per_s'] for r in rs))} "
                     f"| {fmt(statistics.median(r['ms_per_call'] for r in rs))} |")
    return "\n".join(lines) + "\n"


def write_atomically(path, text):
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    temporary.replace(path)


# ---------------------------------------------------------------------------------------------- arguments


def non_negative(text):
    value = float(text)
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is not a number >= 0")
    return value


def model_spec(text):
    """NAME[:INPUT,...] -> (name, inputs)."""
    name, _, inputs = text.partition(":")
    if name not in shared.MODELS:
        raise argparse.ArgumentTypeError(f"invalid model {name!r} (choose from {', '.join(sorted(shared.MODELS))})")
    chosen = tuple(dict.fromkeys(inputs.split(","))) if inputs else DEFAULT_INPUTS[name]
    for kind in chosen:
        if kind not in INPUTS:
            raise argparse.ArgumentTypeError(f"invalid input {kind!r} for {name} (choose from {', '.join(INPUTS)})")
    return name, chosen


def unique(values):
    return list(dict.fromkeys(values))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", type=model_spec, metavar="NAME[:INPUT,...]",
                        default=[model_spec(f"{n}:{','.join(i)}") for n, i in DEFAULT_INPUTS.items()],
                        help=f"models ({', '.join(sorted(shared.MODELS))}) and their inputs ({', '.join(INPUTS)}); "
                             "default: cifar_resnet20:pixels,jpeg imagenet_resnet50:jpeg")
    parser.add_argument("--frontends", nargs="+", choices=FRONTENDS, default=list(FRONTENDS))
    parser.add_argument("--protocols", nargs="+", choices=PROTOCOLS, default=list(PROTOCOLS),
                        help="grpc: the new front end only")
    parser.add_argument("--batching", nargs="+", choices=("off", "on"), default=["off", "on"])
    parser.add_argument("--clients", nargs="+", type=shared.positive(int), default=[1, 16],
                        help="concurrent client processes per cell, one request in flight each")
    parser.add_argument("--duration", type=shared.positive(float), default=5.0, help="seconds timed per cell and per "
                                                                               "in-process figure")
    parser.add_argument("--warmup", type=shared.positive(float), default=2.0, help="seconds of load before each timed window")
    parser.add_argument("--rounds", type=shared.positive(int), default=2, help="the whole comparison this many times")
    parser.add_argument("--batching-timeout-ms", type=non_negative, default=0.0,
                        help="both front ends' --batching-timeout-ms when batching is on (default 0)")
    parser.add_argument("--old-ref", default=OLD_REF, help=f"git commit of the old front end (default {OLD_REF})")
    parser.add_argument("--out", type=pathlib.Path, help="write OUT.md and OUT.json")
    args = parser.parse_args(argv)
    names = [name for name, _ in args.models]
    if len(set(names)) != len(names):
        parser.error(f"argument --models: a model named twice: {' '.join(names)}")
    args.frontends = [f for f in FRONTENDS if f in args.frontends]  # old before new
    args.protocols, args.batching = unique(args.protocols), unique(args.batching)
    args.clients = unique(args.clients)
    if args.frontends == ["old"] and args.protocols == ["grpc"]:
        parser.error("argument --protocols: grpc is served by the new front end only; with --frontends old, ask "
                     "for rest")
    if "new" not in args.frontends:
        args.protocols = ["rest"]
    missing = [m for m in ("grpc", "tensorflow_serving") if importlib.util.find_spec(m) is None]
    if "grpc" in args.protocols and missing:
        parser.error(f"argument --protocols: grpc needs grpcio and tensorflow-serving-api (pip install "
                     f"'keras-preact[grpc]'); not installed: {', '.join(missing)}")
    if args.out is not None and args.out.is_dir():
        parser.error(f"argument --out: {args.out} is a directory; give a path prefix (OUT.md and OUT.json are "
                     "written)")
    return parser, args


def main(argv=None):
    global START
    parser, args = parse_args(argv)
    START = time.monotonic()
    started = time.time()
    load_start = os.getloadavg()
    served_rows, reference_rows = [], []
    with tempfile.TemporaryDirectory(prefix="serving-frontends-") as tmp:
        tmp = pathlib.Path(tmp)
        trees = {"new": REPO}
        old_commit = None
        if "old" in args.frontends:
            (tmp / "old").mkdir()
            try:
                old_commit = old_tree(args.old_ref, tmp / "old")
            except SetupError as error:
                parser.error(str(error))
            trees["old"] = tmp / "old"
        if args.out is not None:
            args.out.parent.mkdir(parents=True, exist_ok=True)
        pool = ClientPool(max(args.clients))  # before TensorFlow is imported here
        log(f"{max(args.clients)} client processes started")
        try:
            import tensorflow as tf

            from keras_preact_serving.servable import Servable

            models = []
            for name, inputs in args.models:
                model = ModelUnderTest(name, inputs, base=shared.export(name, tmp / "export"))
                log(f"exported {name}")
                size = shared.MODELS[name][1]
                model.pixels = [shared.images(size, IMAGES_PER_CLIENT, seed=c) for c in range(max(args.clients))]
                model.jpegs = [[shared.jpeg(p) for p in images] for images in model.pixels]
                models.append(model)
            for model in models:
                model.servable = Servable(model.name, model.base, runtime="saved_model")
                model.expected = {kind: model.servable.predict(SIGNATURES[kind], {model.input_name(kind):
                                                                                  model.value(kind, 0, 0)})
                                  ["probabilities"][0] for kind in model.inputs}
                measure_model(model, args, trees, pool, tmp, served_rows, reference_rows)
                model.servable = None
        finally:
            pool.close()
    head = subprocess.run(["git", "-C", str(REPO), "log", "-1", "--format=%h"], capture_output=True, text=True,
                          check=False).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, check=False).stdout.strip()
    meta = {
        "command": "python benchmarks/serving_frontends.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
        "python": platform.python_version(), "tensorflow": tf.__version__,
        "old": old_commit,
        "new": f"{head} (working tree" + (", with uncommitted changes)" if dirty else ")"),
        "batching_flags": batching_flags(args), "rounds": args.rounds, "warmup": args.warmup,
        "duration": args.duration, "max_clients": max(args.clients),
        "load_average_start": " ".join(f"{x:.2f}" for x in load_start),
        "load_average_end": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "wall_seconds": round(time.time() - started, 1),
    }
    rows = summary(served_rows, reference_rows, max(args.clients))
    text = markdown(meta, rows, reference_rows)
    print("\n" + text + f"\n(whole run: {meta['wall_seconds']:.0f} s)")
    if args.out is not None:
        write_atomically(args.out.with_name(args.out.name + ".md"), text)
        write_atomically(args.out.with_name(args.out.name + ".json"), json.dumps(
            {"meta": meta, "summary": rows, "served": served_rows, "in_process": reference_rows}, indent=1))
    return 0


def terminated(signum, frame):
    raise SystemExit(128 + signum)  # SIGTERM (e.g. from timeout): stop the servers and clients on the way out


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, terminated)
    sys.exit(main())
