"""Which Keras backend ``keras-preact-train`` runs on (``--backend``), decided before Keras is imported.

``--backend auto`` (the default) keeps the user's choice where there is one (``KERAS_BACKEND``, or a
backend other than Keras' default written in ``keras.json``). Otherwise it measures: each installed
backend trains ``PROBE_STEPS`` steps of the run's own model and batch on synthetic images, in its own
process (``training/backend_probe.py``; warm-up steps not timed, median ms/step), and the fastest
wins. The figures are cached per machine and model (``backend_probe.json`` in ``$KERAS_PREACT_CACHE`` or
``~/.cache/keras_preact``), keyed by the CPU, core count, accelerator, the versions of Keras and the
backends and the model-defining config fields, so a second run only reads them. A probe that fails
is named and skipped; if all fail, or with no run to measure (``--dry-run``, in-process use), the fixed
order is used: ``CPU_FASTEST_FIRST`` (measured on one Intel Xeon, BENCHMARKS.md "Training speed"), or
with an accelerator ``BACKENDS`` (Keras' default first). One backend installed: nothing to measure.
The library never changes the backend: only the command line does, and it prints its choice.
This module imports nothing but the standard library, so it runs before Keras loads.

Examples::

    keras-preact-train --depth 56        # [backend] torch (measured on this machine: torch 412 ms/step, ...)
    backends.choose("auto", argv=["--depth", "56"])   # ("torch", "measured on this machine: ...")
"""

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import pathlib
import platform
import subprocess
import sys
import tempfile

BACKENDS = ("tensorflow", "jax", "torch")
CPU_FASTEST_FIRST = ("tensorflow", "torch", "jax")
QUICKEST_IMPORT_FIRST = ("torch", "jax", "tensorflow")  # the backend that reads the run's model fields: Keras starts fastest on it
PROBE_STEPS = 5  # timed training steps per backend (--backend-probe-steps)
PROBE_WARMUP_STEPS = 2  # untimed first steps: compilation, allocator warm-up
PROBE_TIMEOUT_S = 300
PROBE_CACHE_FILE = "backend_probe.json"
# Distributions whose versions key the cache, per backend (the first one installed counts).
VERSIONED = {"keras": ("keras",), "tensorflow": ("tensorflow", "tensorflow-cpu", "tf-nightly"),
             "jax": ("jax",), "jaxlib": ("jaxlib",), "torch": ("torch",)}
PACKAGE_ROOT = pathlib.Path(__file__).resolve().parents[2]  # holds training/: the probe imports it
ACCELERATOR_DEVICES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd", "/dev/accel0")
# XLA's CPU compiler undoes rematerialisation: it drops jax.checkpoint's optimization barriers, so its
# common-subexpression elimination merges the recomputation back into the forward pass, and its default
# (concurrency-optimized) schedule keeps the activations alive anyway. With CSE off and the memory-minimizing
# schedule, the compiled step keeps the recomputation and about half the memory (docs/training.md, "Training the
# deepest networks on one device"; BENCHMARKS.md, "Rematerialisation"). Both are flags of XLA's CPU compile only: not set where an
# accelerator is present, where remat works as compiled (CSE off would slow its step).
XLA_CPU_REMAT_FLAGS = {"--xla_cpu_enable_concurrency_optimized_scheduler": "false", "--xla_disable_hlo_passes": "cse"}
INSTALL_HINT = {"tensorflow": "pip install tensorflow", "jax": 'pip install "jax[cpu]"  (or jax[cuda12])',
                "torch": "pip install torch  (CPU build: pip install torch --index-url "
                         "https://download.pytorch.org/whl/cpu)"}


def installed(backend):
    return importlib.util.find_spec(backend) is not None


def has_accelerator():
    return any(pathlib.Path(p).exists() for p in ACCELERATOR_DEVICES)


def configured(environ=None):
    """(backend, where) the user chose: ``KERAS_BACKEND``, or ``keras.json`` naming a backend other than
    Keras' default ``tensorflow`` (Keras writes that file itself on first import); else (None, None)."""
    environ = os.environ if environ is None else environ
    if environ.get("KERAS_BACKEND"):
        return environ["KERAS_BACKEND"], "KERAS_BACKEND"
    path = pathlib.Path(environ.get("KERAS_HOME") or pathlib.Path.home() / ".keras") / "keras.json"
    try:
        backend = json.loads(path.read_text()).get("backend")
    except (OSError, ValueError, AttributeError):
        return None, None
    return (backend, str(path)) if backend and backend != "tensorflow" else (None, None)


class ProbeFailed(Exception):
    """A backend's probe did not give a figure (import error, crash, timeout); the message says why."""


def default_cache_dir(environ=None):
    """``$KERAS_PREACT_CACHE`` or ``~/.cache/keras_preact``, as ``keras_preact_training.data.sources.default_cache_dir``."""
    environ = os.environ if environ is None else environ
    return pathlib.Path(environ.get("KERAS_PREACT_CACHE") or pathlib.Path.home() / ".cache" / "keras_preact")


def machine():
    """What makes this machine's timings its own: CPU model name, cores, accelerator present."""
    cpu = platform.processor() or platform.machine()
    try:
        names = [line.split(":", 1)[1].strip() for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": cpu, "cores": cores, "accelerator": has_accelerator()}


def installed_versions():
    """{package: version} of Keras and every backend installed (read from metadata, nothing imported)."""
    versions = {}
    for package, distributions in VERSIONED.items():
        for distribution in distributions:
            try:
                versions[package] = importlib.metadata.version(distribution)
                break
            except importlib.metadata.PackageNotFoundError:
                continue
    return versions


def cache_key(model, versions=None, this_machine=None):
    """The probe cache's key: a hash of the machine, the installed versions and the model's fields."""
    keyed = {"machine": machine() if this_machine is None else this_machine,
             "versions": installed_versions() if versions is None else versions, "model": model}
    return hashlib.sha256(json.dumps(keyed, sort_keys=True).encode()).hexdigest()[:16], keyed


def read_cache(path):
    try:
        entries = json.loads(pathlib.Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return entries if isinstance(entries, dict) else {}


def write_cache(path, key, entry):
    """Add ``entry`` under ``key`` to the cache file: written to a temporary name, then renamed."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    entries = {**read_cache(path), key: entry}
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(entries, f, indent=1, sort_keys=True)
        os.replace(temporary, path)
    except BaseException:
        pathlib.Path(temporary).unlink(missing_ok=True)
        raise


def run_probe(backend, argv, steps=PROBE_STEPS, warmup=PROBE_WARMUP_STEPS, timeout=PROBE_TIMEOUT_S):
    """Run ``keras_preact_training.backend_probe`` on ``backend`` with the run's flags ``argv`` in a subprocess;
    its JSON result (``ms_per_step``, ``model``). Raises ProbeFailed saying why it gave none.

    Example: ``run_probe("jax", ["--depth", "8", "--image-size", "16", "16"], steps=2)["ms_per_step"]``"""
    path = os.pathsep.join(p for p in (str(PACKAGE_ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "KERAS_BACKEND": backend, "PYTHONPATH": path}
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    command = [sys.executable, "-m", "keras_preact_training.backend_probe", "--steps", str(steps),
               "--warmup", str(warmup), "--", *argv]
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ProbeFailed(f"timed out after {timeout} s") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise ProbeFailed(f"exit {done.returncode}: {last[:200]}")
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise ProbeFailed(f"no result line in its output: {done.stdout[-200:]!r}") from None


def measure_step_ms(backend, argv, steps=PROBE_STEPS):
    """The median ms/step of ``backend`` on the run of ``argv`` (a probe subprocess)."""
    return run_probe(backend, argv, steps=steps)["ms_per_step"]


def describe_model(backend, argv):
    """The model-defining config fields of the run of ``argv`` (a probe subprocess on ``backend``, no steps)."""
    return run_probe(backend, argv, steps=0)["model"]


def _figures(milliseconds):
    ranked = sorted(milliseconds.items(), key=lambda item: item[1])
    return ", ".join(f"{name} {ms:.0f}" + (" ms/step" if i == 0 else "") for i, (name, ms) in enumerate(ranked))


def measured(present, argv, fallback, *, measure=None, describe=None, cache_dir=None, steps=PROBE_STEPS):
    """(backend, reason): the fastest of ``present`` measured on the run of ``argv``, from the cache when
    this machine and model were measured before; ``fallback`` (backend, reason) when nothing could be."""
    measure = measure or (lambda backend, argv: measure_step_ms(backend, argv, steps))
    describe = describe or describe_model
    try:
        model = describe(min(present, key=QUICKEST_IMPORT_FIRST.index), argv)
    except ProbeFailed as e:
        return fallback[0], f"{fallback[1]}; not measured: the run's model could not be built ({e})"
    key, keyed = cache_key(model)
    path = pathlib.Path(cache_dir or default_cache_dir()) / PROBE_CACHE_FILE
    entry = read_cache(path).get(key)
    cached = isinstance(entry, dict) and bool(entry.get("ms_per_step"))
    if not cached:
        entry = {**keyed, "ms_per_step": {}, "failed": {}, "steps": steps}
        for backend in present:
            try:
                entry["ms_per_step"][backend] = float(measure(backend, argv))
            except ProbeFailed as e:
                entry["failed"][backend] = str(e)
    failed = "".join(f"; {name} failed: {why}" for name, why in entry.get("failed", {}).items())
    if not entry["ms_per_step"]:
        return fallback[0], f"{fallback[1]}; every probe failed{failed}"
    if not cached:
        write_cache(path, key, entry)
    fastest = min(entry["ms_per_step"], key=entry["ms_per_step"].get)
    where = f"cached in {path}" if not cached else f"from {path}"
    return fastest, (f"{'cached: ' if cached else ''}measured on this machine: {_figures(entry['ms_per_step'])}"
                     f"{failed}; {where}")


def choose(requested="auto", environ=None, *, argv=None, dry_run=False, **probe):
    """(backend, reason). ``argv``: the run's ``keras-preact-train`` flags, for ``auto`` to measure the
    backends on its model (None: the fixed order); ``probe``: ``measure``, ``describe``, ``cache_dir``,
    ``steps`` of ``measured``. Raises ValueError naming ``--backend`` for a backend that cannot run here."""
    if requested != "auto" and requested not in BACKENDS:
        raise ValueError(f"Invalid --backend {requested!r}: allowed auto, {', '.join(BACKENDS)}.")
    if "keras" in sys.modules:  # in-process use (tests, notebooks): Keras' backend is fixed already
        import keras

        current = keras.backend.backend()
        if requested not in ("auto", current):
            raise ValueError(f"--backend {requested}: Keras is already imported with backend {current} in this "
                             f"process; set KERAS_BACKEND={requested} before Python starts.")
        return current, "Keras already imported"
    if requested != "auto":
        if not installed(requested):
            raise ValueError(f"--backend {requested}: {requested} is not installed ({INSTALL_HINT[requested]}).")
        return requested, "--backend"
    backend, where = configured(environ)
    if backend:
        return backend, f"set by {where}"
    accelerator = has_accelerator()
    present = [backend for backend in (BACKENDS if accelerator else CPU_FASTEST_FIRST) if installed(backend)]
    if not present:
        raise ValueError("No Keras backend is installed: install one of tensorflow, jax, torch.")
    fallback = (present[0], "accelerator found: Keras' default order" if accelerator
                else "fixed order measured on one CPU (BENCHMARKS.md, Training speed)")
    if len(present) == 1:
        return present[0], "the only backend installed: nothing to measure"
    if dry_run:
        return present[0], f"--dry-run: a run would measure {', '.join(present)} on this model; {fallback[1]}"
    if argv is None:
        return fallback
    return measured(present, list(argv), fallback, **probe)


def select(requested="auto", environ=None, **choice):
    """Choose (``choose``'s arguments), set ``KERAS_BACKEND`` for Keras to read when it loads, print the
    choice in one line; the backend. Example: ``select("auto", argv=sys.argv[1:])``."""
    backend, reason = choose(requested, environ, **choice)
    (os.environ if environ is None else environ)["KERAS_BACKEND"] = backend
    print(f"[backend] {backend} ({reason}; --backend or KERAS_BACKEND to choose)", flush=True)
    return backend


def recorded_backend(argv):
    """(backend, config.json path) a run records (``keras_backend``), for the first argument of ``argv`` that
    is a run directory or a ``.keras`` file in one; (None, None) when none is."""
    for word in argv:
        if word.startswith("-"):
            continue
        path = pathlib.Path(word)
        config = path / "config.json" if path.is_dir() else path.parent / "config.json"
        if path.suffix != ".keras" and not path.is_dir():
            continue
        try:
            backend = json.loads(config.read_text()).get("keras_backend")
        except (OSError, ValueError, AttributeError):
            continue
        if backend in BACKENDS:
            return backend, config
    return None, None


def for_command(prog, argv, environ=None):
    """The backend of a command that loads a model (export, evaluate, serve), set in ``KERAS_BACKEND``
    before Keras loads; returns the line saying so, or None when the user's choice (``KERAS_BACKEND``,
    ``keras.json``) or Keras' default (TensorFlow, installed) stands. Without TensorFlow, the run's own
    backend (``config.json``'s ``keras_backend``, when installed), else the first installed of
    ``QUICKEST_IMPORT_FIRST``. ValueError (one line: what to install) when no backend is installed."""
    environ = os.environ if environ is None else environ
    if configured(environ)[0] is not None or installed("tensorflow"):
        return None
    recorded, config = recorded_backend(argv)
    if recorded is not None and installed(recorded):
        backend, reason = recorded, f"the run's, recorded in {config}"
    else:
        backend = next((b for b in QUICKEST_IMPORT_FIRST if installed(b)), None)
        reason = "installed" + (f"; the run's {recorded} is not" if recorded else "")
    if backend is None:
        raise ValueError(f"{prog} needs a Keras backend and none is installed: pip install torch, "
                         'pip install "jax[cpu]" or pip install tensorflow')
    environ["KERAS_BACKEND"] = backend
    return (f"[backend] {backend} ({reason}; TensorFlow, Keras' default, is not installed; set KERAS_BACKEND to "
            "choose)")


def xla_flags_for_remat(backend, remat, environ=None, *, accelerator=None):
    """On JAX with ``remat`` and no accelerator: add ``XLA_CPU_REMAT_FLAGS`` to ``XLA_FLAGS``, each unless the
    user set that flag (theirs wins), so that remat saves memory on the CPU. The line to print, or None. XLA
    reads them when JAX starts its CPU client: where that happened already, the line says how to set them."""
    environ = os.environ if environ is None else environ
    accelerator = has_accelerator() if accelerator is None else accelerator
    flags = environ.get("XLA_FLAGS", "")
    added = [f"{name}={value}" for name, value in XLA_CPU_REMAT_FLAGS.items() if name not in flags]
    if backend != "jax" or not remat or accelerator or not added:
        return None
    bridge = sys.modules.get("jax._src.xla_bridge")
    if bridge is not None and getattr(bridge, "_backends", None):
        return (f"[remat] warning: JAX has started already, so XLA's CPU compile undoes remat (no memory saved); set "
                f"XLA_FLAGS=\"{' '.join(added)}\" before Python starts")
    environ["XLA_FLAGS"] = " ".join([flags, *added]).strip()
    return (f"[remat] XLA_FLAGS += {' '.join(added)} (XLA's CPU compile would merge the recomputation back into the "
            f"forward pass and keep the activations; set these flags yourself to choose)")
