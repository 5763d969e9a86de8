"""keras-preact-serve-ray on a Ray cluster of two nodes on this machine (issue 25, item 7).

One ``ray.cluster_utils.Cluster`` for the module, built as Ray's own multi-node tests build one: a head
node and a second node, both on 127.0.0.1 (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` makes Ray resolve this
machine to loopback rather than its network address), each with 2 logical CPUs, Ray's minimum object store
(75 MiB) and no dashboard. ``keras-preact-serve-ray --address <the head> --replicas 2
--max-replicas-per-node 1`` deploys onto it, the console script's function in a process of its own as a
user runs it against ``ray start``. Each node has the CPUs for both replicas, so only
``--max-replicas-per-node`` spreads them. Ray Serve runs an HTTP proxy on each node, both bound to
127.0.0.1:<port> (SO_REUSEPORT: the kernel hands each new connection to one of them), and each proxy
routes to the replica on its own node while that one is alive.

A node that loses its last replica has its proxy drained: ``/-/healthz`` answers 503, and once
``RAY_SERVE_PROXY_MIN_DRAINING_PERIOD_S`` (30 s) has passed with no request in it, the controller stops
it; a new proxy starts when a replica is placed there again. A load balancer that health-checks each node
stops sending to a draining proxy; the kernel's SO_REUSEPORT does not, so a proxy stopped while the
replacement replica is still starting resets the connections queued to it (seen in CI, where the
replacement took 48 s). The nodes here keep a draining proxy for longer than the recovery can take.

Where a replica runs is Ray's word: the GCS actor table (``ray._private.state.actors``: name, state, node
id, PID; Ray's state API needs the dashboard), matched to the replies' ``X-Replica-Id`` and checked
against the process tree (a replica's process is a child of its node's raylet).
"""

import dataclasses
import http.client
import json
import os
import pathlib
import select
import signal
import subprocess
import threading
import time

import numpy as np
import pytest

pytest.importorskip("tensorflow", reason="needs TensorFlow")
ray = pytest.importorskip("ray", reason="needs Ray Serve: pip install keras-preact[ray]")
pytestmark = pytest.mark.xdist_group("ray-cluster")  # the cluster starts once (`--dist loadgroup`)

from ray import serve  # noqa: E402
from ray._private import ray_constants  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402
from test_serving import images  # noqa: E402
from test_serving_ray import REPO, free_port, run_entry_point, stop_entry_point  # noqa: E402

from keras_preact.export import export_saved_model  # noqa: E402
from serving.servable import Servable  # noqa: E402
from support import CLASS_NAMES, MEAN, STD  # noqa: E402
from support import make_export_model as make_model  # noqa: E402

NODE = {"num_cpus": 2, "object_store_memory": ray_constants.OBJECT_STORE_MINIMUM_MEMORY_BYTES,
        "node_ip_address": "127.0.0.1"}
CLIENTS = 4  # concurrent clients during the kill: the most requests that can be in flight at once
RECOVERY_TIMEOUT_S = 120
POOL = images(8, seed=21)


@dataclasses.dataclass
class Actor:
    node_id: str
    pid: int


def replica_actors():
    """{replica id: Actor} of the live Ray Serve replicas, from the GCS actor table."""
    found = {}
    for actor in ray._private.state.actors().values():
        if actor["State"] == "ALIVE" and actor["Name"].startswith("SERVE_REPLICA::"):
            found[actor["Name"].rsplit("#", 1)[1]] = Actor(actor["Address"]["NodeID"], actor["Pid"])
    return found


def parent_pid(pid):
    return int(pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def replica_states():
    return serve.status().applications["cifar"].deployments["cifar"].replica_states


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    base = tmp_path_factory.mktemp("saved_models")
    return export_saved_model(make_model(), base, name="cifar", class_names=CLASS_NAMES, mean=MEAN, std=STD, top_k=3)


@pytest.fixture(scope="module")
def reference(exported):
    """The in-process Servable's outputs for ``POOL``."""
    return Servable("cifar", exported.parent).predict("serving_default", {"images": POOL})


@pytest.fixture(scope="module")
def cluster():
    """(cluster, [head node, second node]), this process connected to it as a driver; on teardown Serve,
    this driver and every node are shut down whatever happened."""
    with pytest.MonkeyPatch.context() as patch:
        # Loopback for Ray's addresses in this process (already imported: the constant) and in everything
        # it starts; the nodes' worker processes (the replicas) import keras_preact from this checkout.
        patch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        patch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)
        patch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
        patch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")
        # No health-checking load balancer in front of the proxies here (module docstring).
        patch.setenv("RAY_SERVE_PROXY_MIN_DRAINING_PERIOD_S", str(3 * RECOVERY_TIMEOUT_S))
        cluster = Cluster(initialize_head=True, head_node_args={**NODE, "include_dashboard": False})
        try:
            nodes = [cluster.head_node, cluster.add_node(**NODE)]
            cluster.wait_for_nodes(timeout=60)
            ray.init(address=cluster.address, log_to_driver=False)
            yield cluster, nodes
        finally:
            try:
                if ray.is_initialized():
                    serve.shutdown()
            finally:
                ray.shutdown()
                cluster.shutdown()


@pytest.fixture(scope="module")
def served(cluster, exported, tmp_path_factory):
    """The port of keras-preact-serve-ray deployed onto ``cluster`` with 2 replicas, at most 1 per node; on
    teardown SIGTERM must delete the application and end the command (exit 0), leaving nothing it started."""
    cluster, _ = cluster
    port = free_port()
    log = tmp_path_factory.mktemp("ray_cluster") / "serve.log"
    command, options = run_entry_point(
        str(exported.parent), "--address", cluster.address, "--replicas", "2", "--max-replicas-per-node", "1",
        "--port", str(port), "--merge-batch-size", "8", "--merge-wait-s", "0.005")
    with open(log, "w") as stderr:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True, start_new_session=True,
                                   **options)
    try:
        ready, _, _ = select.select([process.stdout], [], [], 300)
        line = process.stdout.readline() if ready else ""
        assert f"Serving model 'cifar' version 1 ({exported}) on 2 Ray Serve replica(s) at http://127.0.0.1:{port}" \
            in line, log.read_text()[-4000:]
        yield port
    finally:
        returncode, leftover = stop_entry_point(process)
        deleted = "cifar" not in serve.status().applications
        assert returncode == 0 and leftover == "" and deleted, (returncode, leftover, log.read_text()[-4000:])


@dataclasses.dataclass
class Reply:
    client: int
    start: float
    end: float
    status: int  # 0: no HTTP reply (the connection failed)
    replica: str
    image: int
    body: object


def send(port, image, client=0):
    """One single-image predict on a new connection (the kernel picks the node's proxy), as a ``Reply``."""
    start = time.monotonic()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request("POST", "/v1/models/cifar:predict", body=json.dumps({"instances": POOL[image:image + 1].tolist()}),
                           headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        data = response.read()
        try:
            body = json.loads(data)
        except ValueError:
            body = data[:200]
        return Reply(client, start, time.monotonic(), response.status, response.getheader("X-Replica-Id") or "",
                     image, body)
    except (OSError, http.client.HTTPException) as error:
        return Reply(client, start, time.monotonic(), 0, "", image, repr(error))
    finally:
        connection.close()


def assert_correct(reply, reference):
    assert reply.status == 200, reply
    row = reply.body["predictions"][0]
    np.testing.assert_allclose(row["probabilities"], reference["probabilities"][reply.image], rtol=0, atol=1e-6)
    assert row["classes"] == reference["classes"][reply.image].tolist()


def replies_from_every_replica(port, replicas, reference, attempts=60):
    """Requests on new connections until every replica in ``replicas`` has answered (each reply checked
    against the Servable's); {replica id: replies}."""
    seen = {}
    for k in range(attempts):
        reply = send(port, k % len(POOL))
        assert_correct(reply, reference)
        assert reply.replica in replicas, (reply.replica, replicas)
        seen.setdefault(reply.replica, []).append(reply)
        if set(seen) == set(replicas):
            return seen
    raise AssertionError(f"only {sorted(seen)} of {sorted(replicas)} answered {attempts} requests")


def wait_for(condition, timeout, interval=0.5, message="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"{message}: not within {timeout} s")


def test_replicas_are_placed_one_per_node_and_each_answers_like_the_servable(cluster, served, reference):
    _, nodes = cluster
    port = served
    assert dict(replica_states()) == {"RUNNING": 2}
    replicas = replica_actors()
    assert len(replicas) == 2
    assert sorted(actor.node_id for actor in replicas.values()) == sorted(node.node_id for node in nodes)
    for actor in replicas.values():  # the actor table agrees with the processes: each replica a child of its raylet
        node = next(node for node in nodes if node.node_id == actor.node_id)
        assert parent_pid(actor.pid) == node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid
    replies_from_every_replica(port, replicas, reference)


def test_a_killed_replica_fails_at_most_the_requests_in_flight_and_ray_places_a_new_one_on_its_node(
        cluster, served, reference):
    """CLIENTS clients send single-image requests back to back while one replica's process is SIGKILLed:
    only requests in flight at the kill fail (at most one per client), every request sent after it
    succeeds (the other node's replica serves meanwhile), and Ray Serve starts a replacement on the node
    that lost its replica (max 1 per node) within RECOVERY_TIMEOUT_S, which then answers correctly."""
    _, nodes = cluster
    port = served
    before = replica_actors()
    victim_id = next(replica for replica, actor in before.items() if actor.node_id == nodes[1].node_id)
    victim = before[victim_id]
    replies, lock, stop = [], threading.Lock(), threading.Event()

    def client(index):
        k = index
        while not stop.is_set():
            reply = send(port, k % len(POOL), client=index)
            with lock:
                replies.append(reply)
            k += 1

    def answered_by(replica):
        with lock:
            return any(r.replica == replica and r.status == 200 for r in replies)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: answered_by(victim_id), 60, 0.05, "the victim answered under load")
        killed_at = time.monotonic()
        os.kill(victim.pid, signal.SIGKILL)
        kill_returned = time.monotonic()
        noticed = []  # when Serve's status first showed fewer than 2 replicas running

        def replaced():
            states, now = dict(replica_states()), replica_actors()
            if states != {"RUNNING": 2} and not noticed:
                noticed.append(time.monotonic() - killed_at)
            return states == {"RUNNING": 2} and len(now) == 2 and victim_id not in now and now

        replacement = wait_for(replaced, RECOVERY_TIMEOUT_S, message="a replacement replica RUNNING")
        running_s = time.monotonic() - killed_at
        new_id = next(replica for replica in replacement if replica not in before)
        wait_for(lambda: answered_by(new_id), 60, 0.05, "the replacement answered under load")
        answering_s = min(r.end for r in replies if r.replica == new_id) - killed_at
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads)
    failures = [r for r in replies if r.status != 200]
    in_flight = [r for r in replies if r.start < kill_returned and r.end > killed_at]
    after = [r for r in replies if r.start >= kill_returned]
    print(f"\nreplica killed under {CLIENTS} clients: {len(failures)} failed of {len(in_flight)} in flight at the kill "
          f"({sorted({(r.status, str(r.body)[:80]) for r in failures})}); "
          f"{sum(r.status == 200 for r in after)} of {len(after)} requests sent after it answered; Serve noticed after "
          f"{noticed[0] if noticed else float('nan'):.1f} s, replacement RUNNING after {running_s:.1f} s, first reply "
          f"from it after {answering_s:.1f} s")
    assert len(in_flight) <= CLIENTS
    assert all(any(r is f for f in in_flight) for r in failures), (failures, killed_at, kill_returned)
    assert len(failures) <= len(in_flight) and len({r.client for r in failures}) == len(failures)
    assert all(r.status >= 500 for r in failures), failures  # the proxy's error reply, not a dropped connection
    for r in replies:
        if r.status == 200:
            assert_correct(r, reference)
    assert len(after) > CLIENTS and all(r.status == 200 for r in after)
    assert {r.replica for r in after} >= {new_id} and victim_id not in {r.replica for r in after}
    # Ray Serve keeps max_replicas_per_node: the replacement runs on the node that lost its replica.
    assert replacement[new_id].node_id == victim.node_id
    assert sorted(actor.node_id for actor in replacement.values()) == sorted(node.node_id for node in nodes)
    assert parent_pid(replacement[new_id].pid) == nodes[1].all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid
    replies_from_every_replica(port, replacement, reference)


def test_without_address_it_starts_a_ray_of_its_own_beside_a_running_cluster(cluster, exported, reference, tmp_path):
    """Without ``--address``, keras-preact-serve-ray starts its own Ray instance even while a cluster runs on
    this machine: Ray's default joins the latest cluster started here and then refuses ``--num-cpus`` (seen in
    CI, where this module's cluster was up beside tests/test_serving_ray.py's local server)."""
    port = free_port()
    log = tmp_path / "serve.log"
    command, options = run_entry_point(str(exported.parent), "--replicas", "1", "--num-cpus", "1",
                                       "--object-store-memory", str(100 * 2**20), "--port", str(port))
    with open(log, "w") as stderr:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True, start_new_session=True,
                                   **options)
    try:
        ready, _, _ = select.select([process.stdout], [], [], 300)
        line = process.stdout.readline() if ready else ""
        assert f"on 1 Ray Serve replica(s) at http://127.0.0.1:{port}" in line, log.read_text()[-4000:]
        assert_correct(send(port, 0), reference)
    finally:
        returncode, leftover = stop_entry_point(process)
        assert returncode == 0 and leftover == "", (returncode, leftover, log.read_text()[-4000:])
