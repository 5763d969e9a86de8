"""Prometheus metrics of one serving application (docs/export-and-serving.md, "Metrics and health"); labels never come
from a request."""

import time

import prometheus_client

CONTENT_TYPE = prometheus_client.CONTENT_TYPE_LATEST
PATH = "/monitoring/prometheus/metrics"  # TF Serving's (--monitoring_config_file's default path)
# The routes counted: TF Serving REST ("v1:..."), the Open Inference Protocol over HTTP ("v2:...") and over gRPC
# (Triton's, "grpc:v2:..."), and TF Serving's gRPC API ("grpc:..."); a gRPC request's ``code`` is its status name
# (e.g. "OK"); "" otherwise.
V2_APIS = ("v2:server_metadata", "v2:model_metadata", "v2:model_ready", "v2:infer", "v2:model_config", "v2:model_stats",
           "v2:repository_index")
API_NAMES = ("v1:status", "v1:metadata", "v1:predict", *V2_APIS, "grpc:status", "grpc:metadata", "grpc:predict",
             *(f"grpc:{name}" for name in V2_APIS), "")
INFERENCE_APIS = ("v1:predict", "v2:infer", "grpc:predict", "grpc:v2:infer")
# The phases of an inference request Triton's statistics extension times (``app.Call.phases``): each successful
# request's count and seconds, beside its "success" (the whole request) and "fail".
PHASES = ("queue", "compute_input", "compute_infer", "compute_output")
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
BATCH_SIZE_BUCKETS = tuple(2.0**i for i in range(13))  # 1, 2, 4, ..., 4096 examples


class ServingMetrics:
    """The metrics of one application, in their own ``registry``; ``inferences`` tallies them for Triton's
    statistics."""

    def __init__(self):
        self.registry = prometheus_client.CollectorRegistry(auto_describe=True)
        prefix = "keras_preact_serving_"
        self.requests = prometheus_client.Counter(
            prefix + "requests",
            "Requests answered, by model, API route, signature and HTTP status code (gRPC: status name).",
            ["model", "api", "signature", "code"],
            registry=self.registry,
        )
        self.latency = prometheus_client.Histogram(
            prefix + "request_latency_seconds", "Seconds from a request's arrival to its reply.",
            ["model", "api", "signature"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.batch_size = prometheus_client.Histogram(
            prefix + "batch_size", "Examples per model call (merged calls with batching).",
            ["model", "signature"], buckets=BATCH_SIZE_BUCKETS, registry=self.registry)
        self.queue_depth = prometheus_client.Gauge(prefix + "queue_depth", "Requests waiting for a batch.", ["model"],
                                                   registry=self.registry)
        self.model_ready = prometheus_client.Gauge(
            prefix + "model_ready", "1 once the model is loaded and warmed up.", ["model"], registry=self.registry)
        self.inferences = {}  # model -> {"success"|"fail"|PHASES: [requests, seconds], "last": time.time() of the last}

    def model_started(self, model_name, queued):
        """Call once the model ``model_name`` is ready; ``queued()`` says how many requests wait for a batch."""
        self.queue_depth.labels(model_name).set_function(queued)
        self.model_ready.labels(model_name).set(1)

    def observe_request(self, model, api, signature, code, seconds, phases=None):
        """One request answered with ``code`` after ``seconds``; an inference request's ``phases`` ({PHASES name:
        seconds}) are tallied when it succeeded."""
        if api not in API_NAMES:
            raise ValueError(f"Invalid api={api!r}: expected one of {API_NAMES}.")
        self.requests.labels(model, api, signature, str(code)).inc()
        self.latency.labels(model, api, signature).observe(seconds)
        if api in INFERENCE_APIS:
            tally = self.inferences.setdefault(model, {name: [0, 0.0] for name in ("success", "fail", *PHASES)})
            success = str(code) in ("200", "OK")
            timed = [("success" if success else "fail", seconds)]
            if success:
                timed += [(phase, phases[phase]) for phase in PHASES if phase in (phases or {})]
            for name, value in timed:
                tally[name][0] += 1
                tally[name][1] += value
            tally["last"] = time.time()

    def observe_batch(self, model, signature, size):
        self.batch_size.labels(model, signature).observe(size)

    def model_calls(self, model):
        """(model calls, examples they ran) of ``model``, from the batch-size histogram."""
        samples = [s for family in self.batch_size.collect() for s in family.samples if s.labels["model"] == model]
        return tuple(round(sum(s.value for s in samples if s.name.endswith(end))) for end in ("_count", "_sum"))

    def exposition(self):
        """The registry in Prometheus' text format (bytes)."""
        return prometheus_client.generate_latest(self.registry)
