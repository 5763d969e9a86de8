"""keras-preact-serve-ray: TF Serving's REST API from 2 Ray Serve replicas on loopback, requests merged.

One Ray instance for the module, started by the console script's function as a user starts it
(2 CPUs, a 200 MiB object store, no dashboard, the HTTP proxy on 127.0.0.1) and stopped by SIGTERM.
"""

import base64
import collections
import concurrent.futures
import http.client
import json
import os
import pathlib
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow", reason="needs TensorFlow")
# One pytest-xdist worker runs the whole module (`--dist loadgroup` in .ci/run): its module fixtures start
# Ray Serve once, not once per worker.
pytestmark = pytest.mark.xdist_group("ray-local-server")

from test_serving import BAD_REQUESTS, MAX_BATCH, MAX_BODY, images, request

import keras_preact
from keras_preact.export import export_saved_model
from serving import main_ray
from serving.rest import RequestError
from serving.servable import Servable
from serving.server import make_server
from support import CLASS_NAMES, MEAN, STD
from support import make_export_model as make_model

ENTRY_POINT = "import sys; from serving import main_ray; sys.exit(main_ray())"
REPO = str(pathlib.Path(keras_preact.__file__).parents[1])
REQUEST_TIMEOUT = 5  # seconds for a request's body to arrive, and for an idle kept-alive connection


def run_entry_point(*args, env=None, **kwargs):
    return [sys.executable, "-c", ENTRY_POINT, *args], {
        "env": {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": REPO, **(env or {})}, **kwargs}


def stop_entry_point(process):
    """SIGTERM to the entry point: (its exit status, or None after 120 s; what it left running in its
    session, killed). Everything Ray started runs in the command's session: nothing of it may be left."""
    process.send_signal(signal.SIGTERM)
    try:
        returncode = process.wait(timeout=120)
    except subprocess.TimeoutExpired:
        returncode = None
    leftover = subprocess.run(["ps", "-o", "pid=,args=", "--sid", str(process.pid)], capture_output=True,
                              text=True).stdout.strip()
    for pid in [int(row.split()[0]) for row in leftover.splitlines()]:
        os.kill(pid, signal.SIGKILL)
    return returncode, leftover


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def tcp_listeners(port):
    """The addresses listening on ``port`` ("127.0.0.1", "0.0.0.0", ...), from /proc/net/tcp."""
    found = []
    for line in pathlib.Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hex_port = local.split(":")
        if state == "0A" and int(hex_port, 16) == port:
            found.append(socket.inet_ntoa(bytes.fromhex(address)[::-1]))
    return found


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Versions 1 and 2 (a copy of 1) of one export; 2 is served."""
    base = tmp_path_factory.mktemp("saved_models")
    first = export_saved_model(make_model(), base, name="cifar", class_names=CLASS_NAMES, mean=MEAN, std=STD, top_k=3)
    return pathlib.Path(shutil.copytree(first, first.parent / "2"))


@pytest.fixture(scope="module")
def local(exported):
    """The single-process server on the same SavedModel, with the same limits: the reference."""
    server = make_server(exported.parent, port=0, max_batch_size=MAX_BATCH, max_body_bytes=MAX_BODY)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def served(exported, tmp_path_factory):
    """(port, signatures): keras-preact-serve-ray with 2 replicas; on teardown, SIGTERM must stop every
    process it started (Ray's included) and exit 0."""
    port = free_port()
    log = tmp_path_factory.mktemp("ray") / "serve.log"
    command, options = run_entry_point(
        str(exported.parent), "--replicas", "2", "--port", str(port), "--num-cpus", "2",
        "--object-store-memory", str(200 * 2**20), "--merge-batch-size", "8", "--merge-wait-s", "0.05",
        "--max-batch-size", str(MAX_BATCH), "--max-body-bytes", str(MAX_BODY), "--request-timeout", str(REQUEST_TIMEOUT))
    with open(log, "w") as stderr:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True, start_new_session=True,
                                   **options)
    try:
        ready, _, _ = select.select([process.stdout], [], [], 300)
        line = process.stdout.readline() if ready else ""
        assert f"Serving model 'cifar' version 2 ({exported}) on 2 Ray Serve replica(s) at http://127.0.0.1:{port}" in line, \
            log.read_text()[-4000:]
        yield port, tf.saved_model.load(str(exported)).signatures
    finally:
        returncode, leftover = stop_entry_point(process)
        assert returncode == 0 and leftover == "", (returncode, leftover, log.read_text()[-4000:])


def predict(port, body, connection):
    """(status, reply, headers) of one predict request on a kept-alive connection."""
    connection.request("POST", "/v1/models/cifar:predict", body=json.dumps(body).encode(),
                       headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    return response.status, json.loads(response.read()), dict(response.getheaders())


def test_loopback_only_and_same_status_and_metadata_as_the_local_server(served, local):
    port, _ = served
    assert tcp_listeners(port) == ["127.0.0.1"]
    assert tcp_listeners(8265) == []  # no dashboard
    for path in ("/v1/models/cifar", "/v1/models/cifar/versions/2", "/v1/models/cifar/metadata"):
        code, reply = request(port, "GET", path)
        assert (code, reply) == request(local, "GET", path) and code == 200


def test_replicas_answer_v2_health_metrics_and_tritonclient_like_the_local_server(served, local):
    """The mounted app speaks the Open Inference Protocol and serves its metrics through Ray's proxy."""
    httpclient = pytest.importorskip("tritonclient.http")
    port, _ = served
    assert request(port, "GET", "/v2/health/ready") == (200, {"ready": True})
    assert request(port, "GET", "/v2/health/live") == (200, {"live": True})
    assert request(port, "GET", "/v2/models/cifar") == request(local, "GET", "/v2/models/cifar")
    batch = images(2, seed=9)
    replies = []
    for where in (port, local):
        client = httpclient.InferenceServerClient(f"127.0.0.1:{where}")
        tensor = httpclient.InferInput("images", list(batch.shape), "UINT8").set_data_from_numpy(batch)
        replies.append(client.infer("cifar", [tensor]))
    np.testing.assert_allclose(replies[0].as_numpy("probabilities"), replies[1].as_numpy("probabilities"),
                               rtol=0, atol=1e-6)
    assert replies[0].as_numpy("classes").tolist() == replies[1].as_numpy("classes").tolist()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.request("GET", "/monitoring/prometheus/metrics")
    response = connection.getresponse()
    text = response.read().decode()
    assert response.status == 200 and 'keras_preact_serving_model_ready{model="cifar"} 1.0' in text
    connection.close()


@pytest.mark.parametrize("method, path, body, status, message", BAD_REQUESTS,
                         ids=[f"{status}-{message}" for _, _, _, status, message in BAD_REQUESTS])
def test_bad_requests_get_the_local_servers_reply(served, local, method, path, body, status, message):
    port, _ = served
    code, reply = request(port, method, path, body)
    assert (code, reply) == request(local, method, path, body)
    assert code == status and list(reply) == ["error"] and message in reply["error"], reply


def test_body_over_the_limit_is_refused_from_its_header(served):
    import http.client

    port, _ = served
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.putrequest("POST", "/v1/models/cifar:predict")
    conn.putheader("Content-Length", str(MAX_BODY + 1))
    conn.endheaders()  # no body sent: the reply must come from the header alone
    response = conn.getresponse()
    assert response.status == 413
    assert json.loads(response.read()) == {"error": f"Request body of {MAX_BODY + 1} bytes exceeds the limit of {MAX_BODY} bytes."}
    conn.close()


def test_the_proxy_bounds_connections_as_the_local_server_does(served):
    """Issue 36, case 12: within the request timeout of its opening or last reply, a connection at Ray
    Serve's proxy must have sent a whole request: one sending no byte is closed, headers sent a byte every
    0.5 s (slowloris) and a body that never arrives get the local server's 408, and a kept-alive
    connection is closed once idle (Ray's own settings time out only the last)."""
    port, _ = served
    slowloris = b"GET /v1/models/cifar HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100
    stop = threading.Event()

    def drip(sock):
        for byte in slowloris:
            if stop.wait(0.5):
                return
            try:
                sock.sendall(bytes([byte]))
            except OSError:  # closed by the proxy
                return

    def connect():
        return socket.create_connection(("127.0.0.1", port), timeout=REQUEST_TIMEOUT + 30)

    with connect() as silent, connect() as slow, connect() as no_body, connect() as kept_alive:
        dripper = threading.Thread(target=drip, args=(slow,))
        dripper.start()
        no_body.sendall(b"POST /v1/models/cifar:predict HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        kept_alive.sendall(b"GET /v1/models/cifar HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            for sock in (slow, no_body):
                head, _, body = sock.makefile("rb").read().partition(b"\r\n\r\n")  # the reply, then closed
                assert head.startswith(b"HTTP/1.1 408")
                assert json.loads(body) == {"error": f"The request did not arrive within {REQUEST_TIMEOUT:g} s."}
            head, _, body = kept_alive.makefile("rb").read().partition(b"\r\n\r\n")  # the reply, then closed
            assert head.startswith(b"HTTP/1.1 200") and b"model_version_status" in body
            assert silent.recv(1) == b""
        finally:
            stop.set()
            dripper.join(30)


def test_concurrent_single_image_requests_are_merged_on_both_replicas(served):
    """16 clients x 5 single-image requests: every reply equals the SavedModel's own output for its
    image; both replicas answer; the replies naming one (replica, SavedModel call) are exactly as many
    as the examples that call ran, and some calls ran several requests."""
    import http.client

    port, signatures = served
    pool = images(16, seed=5)
    reference = {k: v.numpy() for k, v in signatures["serving_default"](images=tf.constant(pool)).items()}
    replies, lock = [], threading.Lock()

    def client(index):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        for k in range(5):
            i = (index + k) % len(pool)
            code, reply, headers = predict(port, {"instances": pool[i:i + 1].tolist()}, conn)
            with lock:
                replies.append((i, code, reply, headers))
        conn.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert len(replies) == 80
    for i, code, reply, _ in replies:
        assert code == 200, reply
        row = reply["predictions"][0]
        np.testing.assert_allclose(row["probabilities"], reference["probabilities"][i], atol=1e-6)
        assert row["classes"] == reference["classes"][i].tolist()
        assert row["class_names"] == [CLASS_NAMES[c] for c in row["classes"]]
    calls = collections.Counter((h["x-replica-id"], h["x-batch-id"], int(h["x-batch-size"])) for *_, h in replies)
    assert len({replica for replica, _, _ in calls}) == 2
    assert all(count == size for (_, _, size), count in calls.items()), calls
    assert max(size for _, _, size in calls) > 1, calls


def test_mixed_signatures_merge_and_an_undecodable_image_fails_alone(served):
    """Requests of three signatures at once, one of them an image whose header is fine but whose data is
    cut short: that one gets a 400, every other reply is the SavedModel's own output."""
    import http.client

    port, signatures = served
    pool = images(6, seed=7)
    png = [tf.io.encode_png(image).numpy() for image in pool]
    b64 = [{"b64": base64.b64encode(data).decode()} for data in png]
    bodies = [{"instances": pool[i:i + 1].tolist()} for i in range(2)]
    bodies += [{"signature_name": "serving_float", "instances": pool[2:3].astype(float).tolist()}]
    bodies += [{"signature_name": "serving_bytes", "instances": b64[i:i + 1]} for i in range(3, 6)]
    truncated = {"signature_name": "serving_bytes", "instances": [{"b64": base64.b64encode(png[0][:80]).decode()}]}
    reference = {k: v.numpy() for k, v in signatures["serving_default"](images=tf.constant(pool)).items()}
    results = {}

    def client(index, body):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        results[index] = predict(port, body, conn)
        conn.close()

    threads = [threading.Thread(target=client, args=(i, b)) for i, b in enumerate([*bodies, truncated])]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    code, reply, _ = results[len(bodies)]
    assert code == 400 and reply["error"].startswith("Invalid input: "), reply
    for i in range(len(bodies)):
        code, reply, _ = results[i]
        assert code == 200, reply
        np.testing.assert_allclose(reply["predictions"][0]["probabilities"], reference["probabilities"][i], atol=1e-6)


def test_the_replicas_batcher_splits_one_call_and_reruns_alone_on_a_bad_input(exported):
    """What a replica's X-Batch-Id and X-Batch-Size report, without Ray: the batcher (as build_app
    configures it) runs requests of 1 and 2 examples as one SavedModel call of 3; a batch with an
    undecodable image reruns each request alone, so only that one fails."""
    import asyncio

    from serving.batching import Batcher, BatchingOptions

    model = Servable("cifar", exported.parent)
    pool = images(3, seed=11)
    direct = model.predict("serving_default", {"images": pool})
    png = [tf.io.encode_png(image).numpy() for image in pool]

    async def submit_all(batcher, signature_name, inputs_list):
        return await asyncio.gather(*(batcher.submit(signature_name, inputs) for inputs in inputs_list),
                                    return_exceptions=True)

    with Batcher(model.predict, BatchingOptions(batching_max_size=3, batching_timeout_ms=30000)) as batcher:
        results = asyncio.run(submit_all(batcher, "serving_default", [{"images": pool[:1]}, {"images": pool[1:]}]))
        assert [(r.call, r.call_size) for r in results] == [(1, 3), (1, 3)]
        for result, rows in zip(results, (slice(0, 1), slice(1, 3))):
            assert sorted(result.outputs) == sorted(direct)
            for name, value in result.outputs.items():
                np.testing.assert_array_equal(value, direct[name][rows])
        inputs = [{"image_bytes": np.array([data], dtype=object)} for data in (png[0], png[1][:80], png[2])]
        results = asyncio.run(submit_all(batcher, "serving_bytes", inputs))
    assert isinstance(results[1], RequestError) and results[1].status == 400
    assert batcher.stats().batch_sizes == {3: 2, 1: 3} and batcher.stats().reruns == 1  # call 2 failed: 3, 4, 5 alone
    assert {r.call_size for r in (results[0], results[2])} == {1} and {results[0].call, results[2].call} < {3, 4, 5}
    for k in (0, 2):
        np.testing.assert_allclose(results[k].outputs["probabilities"], direct["probabilities"][k:k + 1], atol=1e-6)


def test_entry_point_refuses_bad_input_before_starting_ray(tmp_path, capsys):
    import ray

    for args, message in (([str(tmp_path)], "no numeric version folder"),
                          ([str(tmp_path), "--replicas", "0"], "Invalid replicas=0: expected a positive integer"),
                          ([str(tmp_path), "--merge-wait-s", "-1"], "Invalid merge_wait_s=-1.0: expected a number >= 0"),
                          ([str(tmp_path), "--port", "0"], "invalid port 0: expected 1-65535"),
                          ([str(tmp_path), "--max-replicas-per-node", "0"],
                           "Invalid max_replicas_per_node=0: expected None (no limit) or an integer from 1 to 100"),
                          ([str(tmp_path), "--address", "auto", "--num-cpus", "2"], "not with --address")):
        with pytest.raises(SystemExit) as exit_info:
            main_ray(args)
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err.splitlines()[-1]
        assert not ray.is_initialized()


def test_entry_point_refuses_a_runtime_the_version_cannot_use(exported, capsys):
    import ray

    with pytest.raises(SystemExit) as exit_info:
        main_ray([str(exported.parent), "--runtime", "onnx"])
    assert exit_info.value.code == 2 and capsys.readouterr().err.splitlines()[-1].endswith(
        "Invalid runtime='onnx': the version holds no onnx export (it holds saved_model).")
    assert not ray.is_initialized()


def test_max_replicas_per_node_reaches_the_deployment_and_is_checked(exported):
    from serving.ray_serve import build_app

    assert build_app(exported.parent)._bound_deployment._replica_config.max_replicas_per_node is None
    app = build_app(exported.parent, replicas=4, max_replicas_per_node=2)
    assert app._bound_deployment._replica_config.max_replicas_per_node == 2
    for value in (0, 101, True, 1.5, "1"):
        with pytest.raises(ValueError) as error:
            build_app(exported.parent, max_replicas_per_node=value)
        assert str(error.value) == (f"Invalid max_replicas_per_node={value!r}: expected None (no limit) or an integer "
                                    "from 1 to 100.")


def test_entry_point_refuses_more_replicas_than_its_own_one_node_ray_takes(exported, capsys):
    import ray

    with pytest.raises(SystemExit) as exit_info:
        main_ray([str(exported.parent), "--replicas", "3", "--max-replicas-per-node", "2"])
    assert exit_info.value.code == 2 and capsys.readouterr().err.splitlines()[-1].endswith(
        "--replicas 3 with --max-replicas-per-node 2 needs 2 nodes: the Ray instance started here is one (deploy "
        "onto a cluster with --address)")
    assert not ray.is_initialized()


def test_entry_point_warns_when_the_cluster_has_too_few_nodes_for_max_replicas_per_node(exported, monkeypatch,
                                                                                          capsys):
    """Ray Serve would leave a replica pending, and serve.run with it, without a word from the command:
    it says so up front (Ray itself stubbed: a cluster of 2 live nodes and a dead one)."""
    from serving import ray_serve

    calls = []
    monkeypatch.setattr(ray_serve.ray, "init", lambda **kwargs: calls.append(("init", kwargs)))
    monkeypatch.setattr(ray_serve.ray, "nodes", lambda: [{"Alive": True}, {"Alive": True}, {"Alive": False}])
    monkeypatch.setattr(ray_serve.ray, "shutdown", lambda: calls.append(("shutdown",)))
    monkeypatch.setattr(ray_serve.serve, "start", lambda **kwargs: ray_serve._stop(None, None))  # as Ctrl-C
    monkeypatch.setattr(ray_serve.serve, "delete", lambda name: calls.append(("delete", name)))
    monkeypatch.setattr(signal, "signal", lambda *args: None)  # this process's handlers stay pytest's
    assert main_ray([str(exported.parent), "--address", "auto", "--replicas", "3", "--max-replicas-per-node", "1"]) == 0
    assert capsys.readouterr().err == (
        "keras-preact-serve-ray: warning: --replicas 3 with --max-replicas-per-node 1 needs 3 nodes and the cluster "
        "has 2: 1 replica(s) wait for nodes to join, and this command until they run (the others serve meanwhile)\n")
    assert calls == [("init", {"address": "auto", "runtime_env": ray_serve.PROXY_RUNTIME_ENV}), ("delete", "cifar"),
                     ("shutdown",)]
    assert main_ray([str(exported.parent), "--address", "auto", "--replicas", "4", "--max-replicas-per-node", "2"]) == 0
    assert capsys.readouterr().err == ""


def test_entry_point_without_ray_says_what_to_install_in_one_line(monkeypatch, capsys):
    import serving

    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    monkeypatch.delitem(sys.modules, "serving.ray_serve")
    monkeypatch.delattr(serving, "ray_serve")
    assert main_ray(["saved_models/x"]) == 2
    assert capsys.readouterr().err == (
        'keras-preact-serve-ray: error: serving on Ray needs Ray Serve: pip install "keras-preact[ray]"\n')


def test_a_port_in_use_exits_1_in_one_line_before_starting_ray(exported, capsys):
    """Issue 36, item 8: --port held by another socket: exit 1 in one line naming the port, before Ray starts
    (Ray's proxy failed to bind a minute later and the command exited 1 in a 69-line traceback)."""
    import ray

    with socket.create_server(("127.0.0.1", 0)) as held:
        port = held.getsockname()[1]
        with pytest.raises(SystemExit) as exit_info:
            main_ray([str(exported.parent), "--port", str(port)])
    (line,) = capsys.readouterr().err.splitlines()
    assert exit_info.value.code == 1 and line.startswith(
        f"keras-preact-serve-ray: error: port {port} is in use (--port, 127.0.0.1:{port}: "), line
    assert not ray.is_initialized()


LOAD_GATE = '''
import builtins, os, sys, time
if sys.argv and sys.argv[0].endswith("default_worker.py"):  # Ray's worker processes: each replica's load waits
    _import = builtins.__import__

    def _gate_the_load(name, *args, **kwargs):
        module = _import(name, *args, **kwargs)
        servable = sys.modules.get("serving.servable")
        if servable is not None and hasattr(servable, "Servable"):
            load = servable.Servable._load

            def gated(self, *load_args, **load_kwargs):
                while not os.path.exists(os.environ["LOAD_GATE"]):
                    time.sleep(0.05)
                return load(self, *load_args, **load_kwargs)

            servable.Servable._load = gated
            builtins.__import__ = _import
        return module

    builtins.__import__ = _gate_the_load
'''


def answer(port, method, path, body=None, timeout=2):
    """(status, decoded JSON) of one request, or None when no answer came within ``timeout`` seconds."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        return request(port, method, path, body, connection=connection)
    except (OSError, http.client.HTTPException):
        return None
    finally:
        connection.close()


def proxy_up(port):
    """Whether Ray's proxy answers its own health check (200 "success" as soon as it runs)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        connection.request("GET", "/-/healthz")
        return connection.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()


def test_ray_replicas_are_not_ready_until_loaded_and_hold_model_requests_meanwhile(exported, local, tmp_path):
    """Issue 36, items 7 and 12: the replica's model load held by a gate (a sitecustomize that Ray's workers
    inherit): Ray's proxy answers /v2/health/ready 503 {"ready": false} and /v2/health/live 200 meanwhile (it
    answered neither until the replica had loaded), a predict sent meanwhile waits for the load and succeeds, and
    the command says what it serves only once the replica is ready."""
    gate = tmp_path / "open"
    (tmp_path / "sitecustomize.py").write_text(LOAD_GATE)
    port = free_port()
    command, options = run_entry_point(
        str(exported.parent), "--replicas", "1", "--port", str(port), "--num-cpus", "1",
        "--object-store-memory", str(100 * 2**20), "--request-timeout", "120",
        env={"PYTHONPATH": f"{tmp_path}:{REPO}", "LOAD_GATE": str(gate)})
    log = tmp_path / "serve.log"
    with open(log, "w") as stderr:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True, start_new_session=True,
                                   **options)
    body = {"instances": images(1, seed=3).tolist()}
    try:
        deadline = time.monotonic() + 240
        while not proxy_up(port):
            assert time.monotonic() < deadline and process.poll() is None, log.read_text()[-4000:]
            time.sleep(0.5)
        deadline = time.monotonic() + 60  # the replica started: its constructor does not wait for the load
        while (ready := answer(port, "GET", "/v2/health/ready")) is None:
            assert time.monotonic() < deadline, "no answer to /v2/health/ready while the model loads"
        assert ready == (503, {"ready": False})
        assert answer(port, "GET", "/v2/health/live") == (200, {"live": True})
        assert select.select([process.stdout], [], [], 0)[0] == []  # nothing served yet: nothing said
        waiting = concurrent.futures.ThreadPoolExecutor(1).submit(
            answer, port, "POST", "/v1/models/cifar:predict", body, timeout=120)
        time.sleep(1)
        assert not waiting.done() and not gate.exists()  # held while the model loads, not refused
        gate.touch()
        status, reply = waiting.result(timeout=150)
        expected_status, expected_reply = request(local, "POST", "/v1/models/cifar:predict", body)
        assert status == expected_status == 200
        np.testing.assert_allclose(reply["predictions"][0]["probabilities"],
                                   expected_reply["predictions"][0]["probabilities"], rtol=0, atol=1e-6)
        assert answer(port, "GET", "/v2/health/ready") == (200, {"ready": True})
        assert select.select([process.stdout], [], [], 120)[0], log.read_text()[-4000:]
        assert f"Serving model 'cifar' version 2 ({exported}) on 1 Ray Serve replica(s)" in process.stdout.readline()
    finally:
        gate.touch()
        returncode, leftover = stop_entry_point(process)
    assert returncode == 0 and leftover == "", (returncode, leftover, log.read_text()[-4000:])
