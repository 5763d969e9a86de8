"""Served accuracy: the test split through ``keras-preact-serve``, per export format and input kind,
against the in-process evaluation of ``keras-preact-evaluate``.

    KERAS_BACKEND=tensorflow PYTHONPATH=. python benchmarks/served_accuracy.py \\
        cifar_resnet20 --weights cifar10 --data-dir /tmp/cifar10-jpeg --json served_accuracy.json

MODEL is what ``keras-preact-evaluate`` takes (a registry name with ``--weights``, a run directory or a
``.keras`` file; ``keras_preact_training.evaluate.resolve_model``). Steps:

1. The reference: ``keras_preact_training.evaluate.evaluate`` on the test split of ``--data-dir`` (the same
   preprocessing, the same ``model.evaluate`` top-1), and the in-process predicted class of every image.
2. One export per format (``keras_preact.export.export_model(model, formats=(fmt,))``, nothing else
   passed: the model must carry the input config and class names its evaluation uses; one that does not
   is refused, since its export would serve other preprocessing). Default: every format the backend
   can write with its exporter and runtime installed (``keras_preact.export.check_formats``).
3. For each format, the real ``keras-preact-serve`` (the console script's ``main``) as a subprocess on a
   free loopback port (``--port 0``, the bound port read from its first line), ``--runtime`` that format.
4. Every test image sent through TF Serving's REST API (``POST /v1/models/<name>:predict``, row format
   ``{"signature_name", "instances"}``) twice: the original file bytes to ``serving_bytes``
   (``{"b64": ...}`` per image), and decoded uint8 pixels to ``serving_default``, decoded exactly as
   the evaluation decodes them (``keras_preact_training.data.sources``: ``keras_preact.preprocessing.decode_image``,
   Pillow without TensorFlow; images not at the model's input size get the client-side evaluation view
   ``keras_preact.preprocessing.eval_view``, rounded to uint8). Top-1 is each reply's ``classes[0]``.
   ``serving_bytes`` is a SavedModel signature: an ONNX, LiteRT or OpenVINO export holds
   ``serving_default`` alone, so its bytes row says it is not served.

Prints one markdown row per (format, input): served top-1, the evaluation's, the difference in points
and how many images' predicted classes differ from the in-process ones; ``--json`` writes it all with
the per-image predictions. Exits 1 when a served top-1 differs by more than ``--tolerance`` points
(default 0.1), or when nothing could be served. ``--limit N`` takes N test images evenly spaced through
the class-sorted listing (every class present), for smoke runs.

``--quantize int8 --calibration-data FOLDER`` also exports each onnx and openvino format with its int8 model
(``keras-preact-export --quantize int8``: calibrated on ``--calibration-images`` of the folder, checked on its others)
and serves it as ``<format>-int8`` (``--runtime onnx-int8``); its rows pass when the served top-1 is at most
``--max-accuracy-drop`` points (default 0.5) under the evaluation's:

    KERAS_BACKEND=torch PYTHONPATH=. python benchmarks/served_accuracy.py cifar_resnet20 --weights cifar10 \
        --data-dir /tmp/cifar10-jpeg --formats onnx openvino --quantize int8 \
        --calibration-data /tmp/cifar10-jpeg/train --json served-int8.json
"""

import argparse
import base64
import dataclasses
import http.client
import importlib.util
import json
import math
import os
import pathlib
import queue
import re
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # training/ and benchmarks/ are not installed

from keras_preact_training import evaluate as ev  # noqa: E402
from keras_preact_training.data import sources  # noqa: E402
from tests.support import decline_usage_telemetry  # noqa: E402

KINDS = {  # input kind -> (signature, input name)
    "jpeg_bytes": ("serving_bytes", "image_bytes"),
    "uint8_pixels": ("serving_default", "images"),
}
MODEL_NAME = "served"
SERVE = "import sys; from keras_preact_serving import main; sys.exit(main())"  # the keras-preact-serve script
_READY = re.compile(r"^Serving model '(?P<name>[^']+)' version (?P<version>\S+) .* at "
                    r"http://(?P<host>[^:/]+):(?P<port>\d+)/v1/models/\S+ \[(?P<runtimes>.*)\]$")


# ----------------------------------------------------------------------------------------- data
@dataclasses.dataclass
class Split:
    """The test images to send: their files, labels, and ``ev.TestData`` for the evaluation."""

    files: list
    labels: np.ndarray
    data: ev.TestData
    pixels: object  # () -> uint8 [N, H, W, 3] as the server's serving_default takes them


def test_split(data_dir, limit, cache_dir, target):
    """The folder's test split (``limit`` images evenly spaced through it), decoded once for both the
    evaluation and the uint8 requests."""
    _, test_dir = sources.folder_splits(data_dir)
    files, labels, classes = sources._list_folder(test_dir)
    if limit is not None and limit < len(files):
        keep = np.arange(limit) * len(files) // limit
        files, labels = [files[i] for i in keep], labels[keep]
    size = ev._image_size(files[0])
    decoded = {}

    def arrays():
        if "arrays" not in decoded:
            decoded["arrays"] = sources._decode_cached(files, labels, cache_dir)
        return decoded["arrays"]

    def stream():
        import tensorflow as tf

        return tf.data.Dataset.from_tensor_slices((files, labels)).map(lambda f, y: (tf.io.read_file(f), y))

    data = ev.TestData(f"{test_dir} ({len(files)} images)", classes, len(files), size, arrays, stream)

    def pixels():
        if ev.as_arrays(target, data):
            return arrays()[0]
        from keras_preact.preprocessing import eval_view

        views = stream().map(lambda e, y: eval_view(e, target.input_config)).batch(256)
        return np.concatenate([np.clip(np.round(v.numpy()), 0, 255).astype(np.uint8) for v in views])

    return Split(files, labels, data, pixels)


def decoder_name():
    if importlib.util.find_spec("tensorflow") is not None:
        return "keras_preact.preprocessing.decode_image (accurate IDCT, as keras_preact_training.data.sources decodes)"
    return "Pillow Image.open(...).convert('RGB') (keras_preact_training.data.sources without TensorFlow)"


# ---------------------------------------------------------------------------------------- model
def check_carried(model, target):
    """The export takes the model's own input config and class names: they must be the evaluation's."""
    from keras_preact.preprocessing import InputConfig

    own = getattr(model, "input_config", None)
    if not isinstance(own, InputConfig) or own.to_dict() != target.input_config.to_dict():
        raise ValueError(f"{target.label} does not carry the input config its evaluation uses (model.input_config "
                         f"is {None if own is None else own.to_dict()}, the evaluation's "
                         f"{target.input_config.to_dict()}): export_model would serve other preprocessing.")
    names = getattr(model, "class_names", None)
    if target.class_names is not None and (names is None or list(names) != list(target.class_names)):
        raise ValueError(f"{target.label} does not carry its class names (model.class_names is "
                         f"{None if names is None else list(names)[:5]}): the export would label classes 0..C-1.")


def available_formats():
    """(formats the backend can write and serve here, {format: why not} for the rest)."""
    from keras_preact.export import FORMATS, check_formats

    usable, refused = [], {}
    for name in FORMATS:
        try:
            check_formats([name])
        except (ImportError, ValueError) as error:
            refused[name] = str(error).splitlines()[0]
            continue
        usable.append(name)
    return usable, refused


# --------------------------------------------------------------------------------------- server
class Server:
    """``keras-preact-serve MODEL_BASE --port 0 --runtime FMT`` as a subprocess; a context manager that
    always stops it."""

    def __init__(self, model_base, fmt, *, max_batch, max_body, start_timeout):
        env = dict(os.environ)
        package_root = str(pathlib.Path(importlib.util.find_spec("keras_preact").origin).parents[1])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        self.command = [
            sys.executable,
            "-c",
            SERVE,
            str(model_base),
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--model-name",
            MODEL_NAME,
            "--runtime",
            fmt,
            "--max-request-instances",
            str(max_batch),
            "--max-body-bytes",
            str(max_body),
            "--max-bodies-in-flight-bytes",
            str(max(max_body, 256 * 1024 * 1024)),
        ]
        self.lines = []
        self._queue = queue.Queue()
        self.process = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        env=env)
        threading.Thread(target=self._read, daemon=True).start()
        try:
            self._wait_ready(start_timeout)
        except BaseException:
            self.stop()
            raise

    def _read(self):
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))
            self._queue.put(self.lines[-1])
        self._queue.put(None)

    def _wait_ready(self, timeout):
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"keras-preact-serve did not start within {timeout:g} s: {self.tail()}")
            try:
                line = self._queue.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                self.process.wait(10)
                raise RuntimeError(f"keras-preact-serve exited ({self.process.returncode}): {self.tail()}")
            match = _READY.match(line)
            if match:
                self.host, self.port, self.runtimes = match["host"], int(match["port"]), match["runtimes"]
                return

    def tail(self, n=5):
        return " | ".join(self.lines[-n:]) or "(no output)"

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


class Client:
    """TF Serving REST on one kept-alive connection; every call bounded by ``timeout`` seconds."""

    def __init__(self, host, port, timeout):
        self.connection = http.client.HTTPConnection(host, port, timeout=timeout)

    def request(self, method, path, body=None):
        headers = {"Content-Type": "application/json"} if body is not None else {}
        self.connection.request(method, path, body=body, headers=headers)
        reply = self.connection.getresponse()
        data = reply.read()
        if reply.status != 200:
            raise RuntimeError(f"{method} {path}: HTTP {reply.status}: {data[:300].decode('utf-8', 'replace')}")
        return json.loads(data)

    def signatures(self):
        metadata = self.request("GET", f"/v1/models/{MODEL_NAME}/metadata")
        return sorted(metadata["metadata"]["signature_def"]["signature_def"])

    def predict(self, signature, instances):
        """(top-1 classes, probabilities) of one request."""
        body = json.dumps({"signature_name": signature, "instances": instances}).encode("utf-8")
        predictions = self.request("POST", f"/v1/models/{MODEL_NAME}:predict", body)["predictions"]
        if len(predictions) != len(instances):
            raise RuntimeError(f"{len(predictions)} predictions for {len(instances)} instances.")
        return [int(p["classes"][0]) for p in predictions], [p["probabilities"] for p in predictions]

    def close(self):
        self.connection.close()


def instances(kind, split, start, stop, pixels):
    if kind == "jpeg_bytes":
        return [
            {"b64": base64.b64encode(pathlib.Path(f).read_bytes()).decode("ascii")} for f in split.files[start:stop]
        ]
    return pixels[start:stop].tolist()


def served_predictions(client, kind, split, pixels, batch):
    """(top-1 class, probabilities) of every test image, served."""
    signature = KINDS[kind][0]
    predicted, probabilities = [], []
    for start in range(0, len(split.files), batch):
        classes, probs = client.predict(signature, instances(kind, split, start, start + batch, pixels))
        predicted += classes
        probabilities += probs
    return np.asarray(predicted, np.int64), np.asarray(probabilities, np.float32)


def runtime_of(signature, description):
    """The runtime the server's start line names for ``signature`` (``"a, b on onnx; c on saved_model"``)."""
    for part in description.split("; "):
        signatures, _, runtime = part.rpartition(" on ")
        if signature in signatures.split(", "):
            return runtime
    return description


# ------------------------------------------------------------------------------------------ run
def reference(target, split, batch):
    """(``ev.evaluate``'s metrics, the in-process probabilities, the loaded model)."""
    model = target.load()
    check_carried(model, target)
    target = dataclasses.replace(target, load=lambda: model)
    metrics = ev.evaluate(target, split.data, batch, verbose=0)
    probabilities = model.predict(ev.evaluation_data(target, split.data, batch), verbose=0)
    return metrics, np.asarray(probabilities, np.float32), model


def body_limit(split, pixels, batch):
    """A ``--max-body-bytes`` that holds the largest request sent (JSON digits and base64 overhead)."""
    largest_file = max(os.path.getsize(f) for f in split.files)
    return max(64 * 1024 * 1024, batch * (4 * math.prod(pixels.shape[1:]) + 8) + 2**20,
               batch * (math.ceil(largest_file * 4 / 3) + 16) + 2**20)


def export_format(args, model, fmt, scratch, classes):
    """``fmt``'s version directory: ``fmt`` itself, or for ``<format>-int8`` the format with its int8 model
    (``--quantize int8``, calibrated on ``--calibration-data``)."""
    from keras_preact.export import export_model

    base, _, precision = fmt.partition("-")
    quantize = {} if not precision else {
        "quantize": "int8", "calibration_data": args.calibration_data, "calibration_images": args.calibration_images,
        "max_accuracy_drop": args.max_accuracy_drop}
    return export_model(model, os.path.join(scratch, fmt), formats=(base,), name=MODEL_NAME,
                        top_k=min(5, classes), **quantize)  # its default 5 needs 5 classes


def within(args, fmt, diff_points):
    """A float format answers as evaluated (``--tolerance``); an int8 one loses at most ``--max-accuracy-drop``."""
    return abs(diff_points) <= args.tolerance if "-int8" not in fmt else diff_points >= -args.max_accuracy_drop


def serve_format(args, fmt, model, split, pixels, scratch, evaluated, in_process, in_process_probabilities):
    """One format: exported, served, and both input kinds sent; its result rows."""
    labels = np.asarray(split.labels, np.int64)
    results = []
    started = time.perf_counter()
    version_dir = export_format(args, model, fmt, scratch, len(split.data.class_names))
    print(f"[served] {fmt}: exported to {version_dir} in {time.perf_counter() - started:.0f} s", flush=True)
    with Server(version_dir.parent, fmt, max_batch=args.batch, max_body=body_limit(split, pixels, args.batch),
                start_timeout=args.start_timeout) as server:
        client = Client(server.host, server.port, args.request_timeout)
        try:
            signatures = client.signatures()
            for kind, (signature, _) in KINDS.items():
                row = {"format": fmt, "input": kind, "signature": signature,
                       "runtime": runtime_of(signature, server.runtimes)}
                if signature not in signatures:
                    row.update(served=False, reason=f"{fmt} holds {', '.join(signatures)} only ("
                               f"{signature} is a SavedModel signature)")
                    results.append(row)
                    continue
                started = time.perf_counter()
                predicted, probabilities = served_predictions(client, kind, split, pixels, args.batch)
                top1 = float(np.mean(predicted == labels))
                row.update(served=True, images=len(predicted), top1_accuracy=top1,
                           diff_points=round(100 * (top1 - evaluated), 4) + 0.0,
                           differing_predictions=int(np.sum(predicted != in_process)),
                           max_probability_diff=float(np.max(np.abs(probabilities - in_process_probabilities))),
                           seconds=round(time.perf_counter() - started, 1), predictions=predicted.tolist())
                row["within_tolerance"] = within(args, fmt, row["diff_points"])
                results.append(row)
                print(f"[served] {fmt} {kind}: top-1 {top1:.2%} ({row['diff_points']:+.2f} points, "
                      f"{row['differing_predictions']} predictions differ) in {row['seconds']} s", flush=True)
        finally:
            client.close()
    return results


def measure(args, target, split):
    metrics, in_process_probabilities, model = reference(target, split, args.batch)
    in_process = np.argmax(in_process_probabilities, axis=-1).astype(np.int64)
    evaluated = metrics["top1_accuracy"]
    print(f"[served] evaluated in process: top-1 {evaluated:.2%} on {split.data.label}", flush=True)
    pixels = split.pixels()
    results = []
    with tempfile.TemporaryDirectory(prefix="served-accuracy-") as scratch:
        for fmt in args.formats:
            try:
                results += serve_format(args, fmt, model, split, pixels, scratch, evaluated, in_process,
                                        in_process_probabilities)
            except (
                RuntimeError,
                OSError,
                http.client.HTTPException,
                ValueError,
            ) as error:  # the next format still runs
                message = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
                print(f"[served] {fmt}: FAILED: {message}", flush=True)
                results.append(
                    {"format": fmt, "input": "any", "served": False, "error": message, "reason": f"FAILED: {message}"}
                )
    return metrics, in_process, results


def table(evaluated, results):
    lines = ["| format | input | served by | images | served top-1 | evaluated top-1 | diff (points) | "
             "predictions differing | max prob. diff | within tolerance |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        if r["served"]:
            lines.append(
                f"| {r['format']} | {r['input']} | {r['signature']} on {r['runtime']} | {r['images']:,} | "
                f"{r['top1_accuracy']:.2%} | {evaluated:.2%} | {r['diff_points']:+.2f} | "
                f"{r['differing_predictions']} | "
                f"{r['max_probability_diff']:.1e} | {'yes' if r['within_tolerance'] else 'NO'} |"
            )
        else:
            lines.append(f"| {r['format']} | {r['input']} | not served: {r['reason']} | | | {evaluated:.2%} | | | | |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ CLI
def _positive_float(text):
    try:
        value = float(text)
    except ValueError:
        value = -1
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: expected a positive number")
    return value


def build_parser():
    parser = argparse.ArgumentParser(prog="served_accuracy.py", description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a registry name (with --weights), a run directory or a .keras file")
    parser.add_argument("--weights", default=None, help="the registry model's trained weights, e.g. cifar10")
    parser.add_argument("--data-dir", required=True, help="image folder with train/ and test/ class folders")
    parser.add_argument("--limit", type=ev._positive_int, default=None,
                        help="N test images, evenly spaced through the class-sorted listing (default: all)")
    parser.add_argument("--formats", nargs="+", default=None,
                        help="export formats (default: every format this backend can write and serve here)")
    parser.add_argument("--batch", type=ev._positive_int, default=128, help="images per request (default 128)")
    parser.add_argument("--tolerance", type=float, default=0.1,
                        help="largest |served - evaluated| top-1 in points (default 0.1)")
    parser.add_argument("--cache-dir", default=None, help="where decoded images are cached (as keras-preact-evaluate)")
    parser.add_argument("--start-timeout", type=_positive_float, default=300.0,
                        help="seconds a server may take to start (default 300)")
    parser.add_argument("--request-timeout", type=_positive_float, default=600.0,
                        help="seconds one request may take (default 600)")
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the results to PATH (JSON)")
    parser.add_argument("--quantize", choices=("int8",), default=None,
                        help="also serve each onnx and openvino format's int8 model (keras-preact-export --quantize "
                             "int8; --runtime <format>-int8), within --max-accuracy-drop of the evaluation")
    parser.add_argument("--calibration-data", default=None, metavar="FOLDER",
                        help="the int8 models' calibration folder (class folders; e.g. DATA_DIR/train)")
    parser.add_argument("--calibration-images", type=ev._positive_int, default=300)
    parser.add_argument("--max-accuracy-drop", type=float, default=0.5)
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    decline_usage_telemetry()
    import keras

    from keras_preact.export import check_formats
    from keras_preact.export.quantize import check_quantization

    if args.json is not None and pathlib.Path(args.json).is_dir():
        parser.error(f"Invalid --json={args.json!r}: a directory; give a file path.")
    if not 0 <= args.tolerance < float("inf"):
        parser.error(f"Invalid --tolerance={args.tolerance!r}: expected a number >= 0.")
    usable, refused = available_formats()
    try:  # every argument, before anything is loaded
        if args.formats is None:
            args.formats = usable
            if not usable:
                raise ValueError(f"No format can be written and served on {keras.backend.backend()}: {refused}")
        else:
            args.formats = list(check_formats(args.formats))
            refused = {}
        int8 = check_quantization(args.quantize, args.formats, args.calibration_data, args.calibration_images,
                                  args.max_accuracy_drop, flags=True)
        args.formats += [f"{fmt}-int8" for fmt in int8]
        target = ev.resolve_model(args.model, args.weights)
        split = test_split(args.data_dir, args.limit, args.cache_dir, target)
        ev.check_match(target, split.data)
    except (ValueError, ImportError) as error:
        parser.error(str(error).splitlines()[0])
    print(f"[served] {target.label} on {split.data.label}; backend {keras.backend.backend()}; formats "
          f"{', '.join(args.formats)}" + "".join(f"; {f} not written: {why}" for f, why in refused.items()), flush=True)
    try:
        metrics, in_process, results = measure(args, target, split)
    except ValueError as error:
        parser.exit(2, f"{parser.prog}: error: {str(error).splitlines()[0]}\n")
    evaluated = metrics["top1_accuracy"]
    results += [{"format": f, "input": "any", "served": False, "reason": f"not written: {why}"}
                for f, why in refused.items()]
    print(table(evaluated, results), flush=True)
    served = [r for r in results if r["served"]]
    failed = [r for r in results if "error" in r]
    passed = bool(served) and not failed and all(r["within_tolerance"] for r in served)
    if args.json is not None:
        from keras_preact.scratch import atomic_path

        report = {"model": target.label, "data": split.data.label, "backend": keras.backend.backend(),
                  "evaluation": metrics, "tolerance_points": args.tolerance, "pixel_decoder": decoder_name(),
                  "request": "POST /v1/models/<name>:predict {signature_name, instances}; jpeg_bytes: the files' "
                             "bytes as {'b64': ...} to serving_bytes; uint8_pixels: decoded pixels to serving_default",
                  "batch": args.batch, "passed": passed, "labels": np.asarray(split.labels).tolist(),
                  "in_process_predictions": in_process.tolist(), "results": results}
        with atomic_path(args.json) as tmp:
            tmp.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    if passed:
        print(f"[served] PASS: every served top-1 within {args.tolerance} points of the evaluation's", flush=True)
    else:
        print(f"[served] FAIL: {len(failed)} format(s) failed, "
              f"{sum(not r['within_tolerance'] for r in served)} served top-1 beyond {args.tolerance} points, "
              f"{len(served)} served in all", flush=True)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
