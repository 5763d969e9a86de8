"""keras-preact-serve as TF Serving treats versions, and its start-up failures in one line (issue 36,
cases 1, 8 and 9): a half-copied newest version is skipped (one log line naming the file and the error,
reported in the model status) and the newest whole one served; a corrupt only version, or a port in use,
exits 1 with one line, never a traceback. Each test runs the real entry point in a subprocess."""

import http.client
import json
import os
import shutil
import socket
import subprocess
import sys

import pytest

from support import our_lines

pytest.importorskip("tensorflow", reason="the SavedModel side of these tests needs TensorFlow")
pytest.importorskip("onnxruntime", reason="needs ONNX Runtime")
pytest.importorskip("openvino", reason="needs OpenVINO")
httpclient = pytest.importorskip("tritonclient.http")


ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
# keras-preact-serve's own function (pyproject.toml's script; its quiet start keeps TensorFlow's C++ lines out).
SERVE = [
    sys.executable,
    "-c",
    "import sys; from keras_preact_serving.console import serve; sys.exit(serve(sys.argv[1:]))",
]


@pytest.fixture(scope="module")
def whole(tmp_path_factory, export_copy):
    """A whole version: SavedModel, ONNX and OpenVINO side by side (auto: serving_default on OpenVINO), a
    copy of conftest's export."""
    return export_copy(tmp_path_factory.mktemp("exports"), "m", formats=("saved_model", "onnx", "openvino"))


def truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])


def remove(path):
    shutil.rmtree(path) if path.is_dir() else path.unlink()


def overwrite_with_random_bytes(path):
    """The file's size kept, its bytes replaced (seeded): a copy whole in length but not in content."""
    import numpy as np

    path.write_bytes(np.random.default_rng(0).bytes(path.stat().st_size))


# Damage done to a copy cut short (case 1), and the file the one line must name.
DAMAGES = {
    "variables_removed": (lambda v: remove(v / "variables"), "variables/variables.index"),
    "saved_model_pb_truncated": (lambda v: truncate(v / "saved_model.pb"), "saved_model.pb"),
    "variables_data_truncated": (lambda v: truncate(next((v / "variables").glob("variables.data-*"))),
                                 "variables/variables.data-"),
    "openvino_xml_truncated": (lambda v: truncate(v / "openvino" / "model.xml"), "openvino/model.xml"),
    "openvino_bin_truncated": (lambda v: truncate(v / "openvino" / "model.bin"), "openvino/model.bin"),
    # The weights of the right length, but not the IR's: OpenVINO fails validating a node, the .bin to blame.
    "openvino_bin_random": (lambda v: overwrite_with_random_bytes(v / "openvino" / "model.bin"),
                            "): openvino/model.bin: "),
    # No input size: the default 224x224 is fed to a 32x32 model, the preprocessing file to blame.
    "preprocessing_empty": (lambda v: (v / "assets" / "preprocessing.json").write_text("{}"),
                            "assets/preprocessing.json: input size 224x224 but the model takes 32x32"),
    "assets_removed": (lambda v: remove(v / "assets"), "assets/class_names.txt"),
    "class_names_empty": (lambda v: (v / "assets" / "class_names.txt").write_text(""), "assets/class_names.txt"),
    "preprocessing_broken": (lambda v: (v / "assets" / "preprocessing.json").write_text('{"input_size": [32, 32'),
                             "assets/preprocessing.json"),
}


def serve(*args):
    return subprocess.Popen([*SERVE, *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV)


def get(port, path):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("GET", path)
    response = conn.getresponse()
    reply = json.loads(response.read())
    conn.close()
    return response.status, reply


def lines_of(text):
    return our_lines(text)  # TensorFlow's own start-up lines aside


def test_half_copied_newer_versions_are_skipped_each_in_one_line_and_the_whole_one_served(whole, tmp_path):
    """Version 1 whole; versions 2-11 each a copy cut short or overwritten another way (``DAMAGES``): one start of
    the server tries them newest first, skips each with one line naming its file, reports each in the model status
    (END, its error) and serves version 1."""
    base = tmp_path / "m"
    shutil.copytree(whole, base / "1")
    damaged = {}
    for version, damage in enumerate(sorted(DAMAGES), start=2):
        damage_fn, file = DAMAGES[damage]
        shutil.copytree(whole, base / str(version))
        damage_fn(base / str(version))
        damaged[str(version)] = (damage, file)
    process = serve(base, "--port", "0")
    try:
        line = process.stdout.readline()
        assert "Serving model 'm' version 1" in line, (line, process.communicate(timeout=60)[1][-3000:])
        port = int(line.split("http://127.0.0.1:", 1)[1].split("/")[0])
        code, status = get(port, "/v1/models/m")
        assert code == 200, status
        by_version = {entry["version"]: entry for entry in status["model_version_status"]}
        assert sorted(by_version, key=int) == ["1", *damaged]
        served = by_version["1"]
        assert served == {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}
        for version, (damage, file) in damaged.items():
            failed = by_version[version]
            assert failed["state"] == "END" and failed["status"]["error_code"] != "OK", (damage, failed)
            assert file in failed["status"]["error_message"], (damage, failed)
            assert get(port, f"/v1/models/m/versions/{version}") == (200, {"model_version_status": [failed]})
        code, reply = get(port, "/v1/models/m/versions/1")
        assert code == 200 and reply == {"model_version_status": [served]}
        # Triton's repository index says the same (issue 36, case 14).
        index = httpclient.InferenceServerClient(f"127.0.0.1:{port}").get_model_repository_index()
        assert index[0] == {"name": "m", "version": "1", "state": "READY"}
        assert {entry["version"]: entry["state"] for entry in index[1:]} == dict.fromkeys(damaged, "UNAVAILABLE")
        assert all(damaged[entry["version"]][1] in entry["reason"] for entry in index[1:]), index
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=60)
    for version, (damage, file) in damaged.items():
        skipped = [line for line in lines_of(stderr) if f"version {version} " in line or f"version {version}:" in line]
        assert len(skipped) == 1 and file in skipped[0] and str(base / version) in skipped[0], (damage, stderr[-3000:])
    assert "Traceback" not in stderr, stderr[-3000:]


def test_a_corrupt_onnx_only_version_exits_1_in_one_line(whole, tmp_path):
    """Case 8: a truncated model.onnx served with --runtime onnx, and no other version: exit 1, one line."""
    base = tmp_path / "m"
    (base / "1").mkdir(parents=True)
    shutil.copytree(whole / "assets", base / "1" / "assets")
    shutil.copy(whole / "model.onnx", base / "1" / "model.onnx")
    truncate(base / "1" / "model.onnx")
    result = subprocess.run([*SERVE, str(base), "--port", "0", "--runtime", "onnx"],
                            capture_output=True, text=True, timeout=300, env=ENV)
    assert result.returncode == 1 and result.stdout == "", result
    (line,) = lines_of(result.stderr)
    assert line.startswith("keras-preact-serve: error: no version of model 'm' loads: version 1 (")
    assert "model.onnx" in line and "Protobuf parsing failed" in line, line


# --port: test_serving_runtimes' port-in-use test (the same one line, exit 1, before the model loads).
@pytest.mark.parametrize("flag", ["--grpc-port"])
def test_a_port_in_use_exits_1_in_one_line(whole, tmp_path, flag):
    """Case 9: the gRPC port held by another socket: exit 1, one line naming the port."""
    pytest.importorskip("tensorflow_serving", reason="--grpc-port needs tensorflow-serving-api")
    shutil.copytree(whole, tmp_path / "m" / "1", ignore=shutil.ignore_patterns("openvino", "model.onnx"))
    with socket.create_server(("127.0.0.1", 0)) as held:
        port = held.getsockname()[1]
        ports = ["--port", port] if flag == "--port" else ["--port", "0", "--grpc-port", port]
        result = subprocess.run([*SERVE, str(tmp_path / "m"), *map(str, ports)],
                                capture_output=True, text=True, timeout=300, env=ENV)
    assert result.returncode == 1 and result.stdout == "", result
    (line,) = lines_of(result.stderr)
    assert line.startswith(f"keras-preact-serve: error: port {port} is in use ({flag}, 127.0.0.1:{port}"), line


def test_damaged_names_index_or_formats_and_folders_not_versions_are_skipped_each_in_one_line(whole, tmp_path, caplog):
    """Issue 56 cases 3-6, on the Servable keras-preact-serve loads: class names cut short or missing their first line
    (fewer names than the model's classes), a truncated variables.index (named, not the data shard), a SavedModel
    begun but not whole (auto would serve fewer signatures), and export folders whose names are not ASCII digits
    within int64 ('²', '٣', 2**63) are each skipped with one line; version 1 serves with all three signatures."""
    import logging

    from keras_preact_serving.servable import Servable

    base = tmp_path / "m"
    shutil.copytree(whole, base / "1")
    names = whole / "assets" / "class_names.txt"
    damages = {
        "2": (
            lambda v: (v / "assets" / "class_names.txt").write_text(
                "\n".join(names.read_text().splitlines()[:5]) + "\n"
            ),
            "assets/class_names.txt",
        ),
        "3": (
            lambda v: (v / "assets" / "class_names.txt").write_text(
                "\n".join(names.read_text().splitlines()[1:]) + "\n"
            ),
            "assets/class_names.txt",
        ),
        "4": (lambda v: truncate(v / "variables" / "variables.index"), "variables/variables.index"),
        "5": (lambda v: (v / "saved_model.pb").unlink(), "saved_model.pb"),
    }
    for version, (damage, _) in damages.items():
        shutil.copytree(whole, base / version)
        damage(base / version)
    for folder in ("²", "٣", str(2**63)):
        shutil.copytree(whole, base / folder)
    with caplog.at_level(logging.WARNING, logger="keras_preact_serving.servable"):
        model = Servable("m", base)
    assert model.version == 1 and sorted(model.signatures) == ["serving_bytes", "serving_default", "serving_float"]
    assert {f.version: f.file for f in model.failed} == {int(v): file for v, (_, file) in damages.items()}
    assert all(f.code == "DATA_LOSS" for f in model.failed if f.version in (2, 3, 4)), model.failed
    lines = [record.getMessage() for record in caplog.records]
    for folder in ("²", "٣", str(2**63)):
        assert len([line for line in lines if str(base / folder) + ":" in line]) == 1, lines
    assert len(lines) == 3 + len(damages), lines


def test_an_explicit_runtime_missing_from_the_newest_version_serves_the_older_one(whole, tmp_path, caplog):
    """Issue 56 case 4: --runtime onnx, version 2 part-copied (its model.onnx not written yet): version 1 serves on
    ONNX, version 2 skipped in one line naming model.onnx; a runtime no version holds is refused in one line."""
    import logging

    from keras_preact_serving.servable import Servable, check_runtime

    base = tmp_path / "m"
    shutil.copytree(whole, base / "1")
    shutil.copytree(whole, base / "2", ignore=shutil.ignore_patterns("model.onnx"))
    with caplog.at_level(logging.WARNING, logger="keras_preact_serving.servable"):
        model = Servable("m", base, runtime="onnx")
    assert model.version == 1 and model.signatures["serving_default"] == "onnx"
    assert [(f.version, f.file) for f in model.failed] == [(2, "model.onnx")]
    assert len(caplog.records) == 1 and "model.onnx" in caplog.records[0].getMessage()
    with pytest.raises(ValueError, match=r"Invalid runtime='litert': the version holds no litert export"):
        check_runtime(base, "litert")
