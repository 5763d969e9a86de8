"""keras-preact-serve on every export format: ``serving_default`` on the runtime chosen (``--runtime``,
by default the fastest installed), the SavedModel's other signatures on TensorFlow, the same replies."""

import base64
import http.client
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow", reason="the SavedModel side of these tests needs TensorFlow")

from keras_preact.export import load  # noqa: E402
from keras_preact_serving import servable  # noqa: E402
from keras_preact_serving.server import main as server_main  # noqa: E402
from keras_preact_serving.server import make_server  # noqa: E402
from support import CLASS_NAMES, images, our_lines  # noqa: E402

ARTIFACTS = ("onnx", "litert", "openvino")


@pytest.fixture(scope="module")
def exported(tmp_path_factory, export_copy):
    """Version 1: every format side by side; versions 1 and 2 of another model: ONNX alone (copies of
    conftest's export, top 3 of 10 classes)."""
    base = tmp_path_factory.mktemp("saved_models")
    every = export_copy(base, "every", formats=("saved_model", *ARTIFACTS))
    export_copy(base, "onnx_only", formats=("onnx",), version=1)
    return every, export_copy(base, "onnx_only", formats=("onnx",), version=2)


def serve(model_base, **kwargs):
    server = make_server(model_base, port=0, **kwargs)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def post(port, name, body):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", f"/v1/models/{name}:predict", body=json.dumps(body).encode())
    response = conn.getresponse()
    reply = json.loads(response.read())
    conn.close()
    return response.status, reply


def test_formats_and_the_fastest_installed_runtime_are_found(exported):
    every, onnx_only = exported
    assert servable.formats_in(every) == servable.RUNTIME_SPEED_ORDER  # openvino, onnx, saved_model, litert
    assert servable.formats_in(onnx_only) == ("onnx",)
    assert servable.latest_version_dir(onnx_only.parent) == (2, onnx_only)
    fp32 = {"precision": "fp32", "saved_model": True}  # no int8 model in these versions
    assert servable.choose_runtimes(servable.formats_in(every)) == {"pixels": "openvino", **fp32}
    assert servable.choose_runtimes(("onnx", "saved_model", "litert")) == {"pixels": "onnx", **fp32}
    assert servable.choose_runtimes(("saved_model", "litert")) == {"pixels": "saved_model", **fp32}
    assert servable.choose_runtimes(("onnx",), "onnx") == {"pixels": "onnx", "precision": "fp32", "saved_model": False}
    with pytest.raises(
        ValueError, match=r"Invalid runtime='litert': the version holds no litert export \(it holds onnx\)"
    ):
        servable.choose_runtimes(("onnx",), "litert")
    with pytest.raises(ValueError, match="Invalid runtime='tensorrt': expected one of auto, openvino, onnx"):
        servable.choose_runtimes(("onnx",), "tensorrt")


@pytest.mark.parametrize("runtime", ["auto", *ARTIFACTS, "saved_model"])
def test_every_runtime_answers_as_the_saved_model_does(exported, runtime):
    """serving_default on each runtime gives the SavedModel's classes and class names and its
    probabilities within 1e-5; serving_bytes and serving_float stay on TensorFlow."""
    every, _ = exported
    server = serve(every.parent, runtime=runtime)
    try:
        model = server.model
        pixels = "openvino" if runtime == "auto" else runtime
        assert model.signatures == {"serving_default": pixels, "serving_float": "saved_model",
                                    "serving_bytes": "saved_model"}
        port = server.server_address[1]
        batch = images(4)
        code, reply = post(port, "every", {"instances": batch.tolist()})
        assert code == 200, reply
        direct = tf.saved_model.load(str(every)).signatures["serving_default"](images=tf.constant(batch))
        probabilities = np.array([row["probabilities"] for row in reply["predictions"]])
        np.testing.assert_allclose(probabilities, direct["probabilities"].numpy(), atol=1e-5)
        assert [row["classes"] for row in reply["predictions"]] == direct["classes"].numpy().tolist()
        assert [row["class_names"] for row in reply["predictions"]] == [
            [name.decode() for name in row] for row in direct["class_names"].numpy()]
        png = io.BytesIO()
        from PIL import Image

        Image.fromarray(batch[0]).save(png, format="PNG")
        code, reply = post(port, "every", {"signature_name": "serving_bytes",
                                           "instances": [{"b64": base64.b64encode(png.getvalue()).decode()}]})
        assert code == 200 and reply["predictions"][0]["classes"] == direct["classes"].numpy()[0].tolist()
        # Triton's statistics time each phase of both requests on every runtime (issue 58, case 15).
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request("GET", "/v2/models/every/stats")
        (stats,) = json.loads(conn.getresponse().read())["model_stats"]
        conn.close()
        phases = {
            name: stats["inference_stats"][name]
            for name in ("queue", "compute_input", "compute_infer", "compute_output")
        }
        assert all(phase["count"] == 2 and phase["ns"] > 0 for phase in phases.values()), phases
        assert sum(phase["ns"] for phase in phases.values()) <= stats["inference_stats"]["success"]["ns"], stats
    finally:
        server.shutdown()
        server.server_close()


def test_an_onnx_only_version_serves_serving_default_alone(exported):
    _, onnx_only = exported
    server = serve(onnx_only.parent, enable_batching=True)
    try:
        port = server.server_address[1]
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request("GET", "/v1/models/onnx_only/metadata")
        metadata = json.loads(conn.getresponse().read())
        conn.close()
        signature = metadata["metadata"]["signature_def"]["signature_def"]["serving_default"]
        assert metadata["model_spec"]["version"] == "2" and list(
            metadata["metadata"]["signature_def"]["signature_def"]
        ) == ["serving_default"]
        assert [d["size"] for d in signature["inputs"]["images"]["tensor_shape"]["dim"]] == ["-1", "32", "32", "3"]
        assert [d["size"] for d in signature["outputs"]["classes"]["tensor_shape"]["dim"]] == ["-1", "3"]
        batch = images(3, seed=1)
        code, reply = post(port, "onnx_only", {"inputs": batch.tolist()})
        want = load(onnx_only, "onnx").predict(batch)
        assert code == 200 and reply["outputs"]["classes"] == want["classes"].tolist()
        assert reply["outputs"]["class_names"] == [[CLASS_NAMES[c] for c in row] for row in want["classes"]]
        np.testing.assert_allclose(reply["outputs"]["probabilities"], want["probabilities"], atol=1e-6)
        code, reply = post(port, "onnx_only", {"signature_name": "serving_bytes", "instances": [{"b64": "AAAA"}]})
        assert code == 400 and "available: ['serving_default']" in reply["error"]
    finally:
        server.shutdown()
        server.server_close()


def test_the_console_says_which_runtime_runs_what_and_refuses_a_missing_one(exported, capsys):
    every, onnx_only = exported
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    process = subprocess.Popen([sys.executable, "-m", "keras_preact_serving.server", str(every.parent), "--port", "0"],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        line = process.stdout.readline()
        assert line.rstrip().endswith("[serving_default on openvino; serving_bytes, serving_float on saved_model]"), (
            line
        )
    finally:
        process.terminate()
        process.wait(timeout=30)
    # Refused by the console's function in this process (no interpreter start for it).
    with pytest.raises(SystemExit) as refused:
        server_main([str(onnx_only.parent), "--port", "0", "--runtime", "saved_model"])
    assert refused.value.code == 2 and capsys.readouterr().err.strip().splitlines()[-1].endswith(
        "Invalid runtime='saved_model': the version holds no saved_model export (it holds onnx).")


# keras-preact-serve's own function (pyproject.toml's script).
SERVE = [
    sys.executable,
    "-c",
    "import sys; from keras_preact_serving.console import serve; sys.exit(serve(sys.argv[1:]))",
]


def overwrite(path):
    """``path`` overwritten in place (the same inode, as a copy over it writes) with garbage of its size."""
    with open(path, "r+b") as file:
        file.write(np.random.default_rng(0).integers(0, 256, path.stat().st_size, np.uint8).tobytes())


@pytest.mark.parametrize("runtime, file", [("openvino", "openvino/model.bin"), ("litert", "model.tflite")])
def test_a_served_file_changed_on_disk_changes_no_answer(exported, tmp_path, runtime, file):
    """Issue 36, case 2: keras-preact-serve --runtime openvino / litert serving a version whose weights file
    is then overwritten in place with garbage of its size, and then truncated: after each, the answer stays
    the one given before, and the server lives (both runtimes map the file by default: a 500, or death by
    SIGBUS). One server start per runtime takes both changes in turn."""
    pytest.importorskip("ai_edge_litert" if runtime == "litert" else "openvino", reason=f"needs {runtime}")
    every, _ = exported
    version = tmp_path / "m" / "1"
    shutil.copytree(every, version, ignore=lambda folder, names: [  # the assets and this runtime's files alone
        name for name in names if folder == str(every) and name not in ("assets", file.split("/")[0])])
    process = subprocess.Popen([*SERVE, str(tmp_path / "m"), "--port", "0", "--runtime", runtime],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                               env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    try:
        line = process.stdout.readline()
        assert f"[serving_default on {runtime}]" in line, line
        port = int(line.split("http://127.0.0.1:", 1)[1].split("/")[0])
        body = {"instances": images(4, seed=2).tolist()}
        before = post(port, "m", body)
        assert before[0] == 200, before
        for damage in (overwrite, lambda path: os.truncate(path, 0)):
            size = (version / file).stat().st_size
            damage(version / file)
            assert (version / file).stat().st_size == (size if damage is overwrite else 0)
            assert post(port, "m", body) == before, damage
            assert process.poll() is None
    finally:
        process.terminate()
        process.wait(timeout=60)


# keras-preact-serve whose model loads only once the file $LOAD_GATE exists: a slow load, made to wait.
GATED_SERVE = """
import os, sys, time
from keras_preact_serving.start_up import launch
launch()  # as the console script starts
from keras_preact_serving import server

class GatedServable(server.Servable):
    def _load(self, *args):
        while not os.path.exists(os.environ["LOAD_GATE"]):
            time.sleep(0.05)
        super()._load(*args)

server.Servable = GatedServable
from keras_preact_serving.console import serve
sys.exit(serve(sys.argv[1:]))
"""


def get(port, path):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("GET", path)
    response = conn.getresponse()
    reply = response.status, json.loads(response.read())
    conn.close()
    return reply


def gated_serve(model_base, port, gate):
    return subprocess.Popen([sys.executable, "-c", GATED_SERVE, str(model_base), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "LOAD_GATE": str(gate)})


def test_the_console_binds_first_and_is_ready_only_once_the_model_is_loaded(exported, tmp_path):
    """Issue 36, case 12: keras-preact-serve listens while its model loads: live 200, ready 503, model
    routes 503; once loaded and warmed up, it prints what it serves and is ready."""
    _, onnx_only = exported
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = gated_serve(onnx_only.parent, port, tmp_path / "gate")
    try:
        live, deadline = None, time.monotonic() + 120
        while time.monotonic() < deadline and process.poll() is None:
            try:
                live = get(port, "/v2/health/live")
                break
            except ConnectionRefusedError:
                time.sleep(0.1)
        assert live == (200, {"live": True})
        assert get(port, "/v2/health/ready") == (503, {"ready": False})
        assert get(port, "/v1/models/onnx_only") == (503, {"error": "The model is loading or warming up; retry later."})
        (tmp_path / "gate").touch()
        assert "Serving model 'onnx_only' version 2" in process.stdout.readline()
        assert get(port, "/v2/health/ready") == (200, {"ready": True})
    finally:
        (tmp_path / "gate").touch()
        process.terminate()
        process.wait(timeout=60)


def test_a_port_in_use_is_refused_before_the_model_loads(exported, tmp_path):
    """The port is bound before anything loads: held by another socket, exit 1 in one line at once,
    though the model would never load (its gate stays shut). (Issue 36, case 9 for --port: the line names
    the flag and the address; test_serving_versions holds the --grpc-port case.)"""
    _, onnx_only = exported
    with socket.create_server(("127.0.0.1", 0)) as held:
        port = held.getsockname()[1]
        process = gated_serve(onnx_only.parent, port, tmp_path / "gate")
        try:
            stdout, stderr = process.communicate(timeout=120)
        finally:
            process.kill()
    assert process.returncode == 1 and stdout == "", (stdout, stderr)
    (line,) = our_lines(stderr)
    assert line.startswith(f"keras-preact-serve: error: port {port} is in use (--port, 127.0.0.1:{port}"), stderr
