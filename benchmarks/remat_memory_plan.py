"""XLA's compiled memory plan of a training step, per ``--remat`` policy and batch size, without running it (issue 26).

JAX only. Each row builds the network and its compiled training model as ``keras-preact-train`` does
(``keras_preact_training.recipe.model.build_model``: the preset's optimizer, loss and metrics), lowers the Keras JAX trainer's
own step (``model.train_step``, jitted with the trainer's ``donate_argnums=0``) at the batch size, compiles it
and reads ``compiled.memory_analysis()``: the step's arguments (weights, optimizer state, the batch), its
outputs, what the donated arguments alias, and XLA's temporary buffers (the activations kept for the
backward pass and the workspace). ``peak`` = arguments + outputs - aliased + temporaries: the device memory
the step needs. Nothing runs, so sizes that no machine here could hold are planned too.

``--target`` says whose compiler plans:
- ``h100``: XLA's *GPU* compiler, for an H100 80GB that is not here (deviceless ahead-of-time compilation:
  ``jax.experimental.topologies`` with the GpuTargetConfig in ``benchmarks/gpu_targets/``). Needs JAX's CUDA
  plugin (``pip install "jax[cuda12]"``), not a GPU or a driver. With no GPU to time convolution
  algorithms on, autotuning is off (``--xla_gpu_autotune_level=0``): cuDNN's first choice is planned, whose
  workspace may differ from the one autotuning picks. Nothing here ran on a GPU, so it stays a projection.
- ``cpu``: XLA's CPU compiler (JAX ``cpu``), with the flags ``keras-preact-train --remat`` sets on a CPU
  (``keras_preact_training.machine.backends.XLA_CPU_REMAT_FLAGS``: without them XLA's CPU compile merges the recomputation back
  into the forward pass, and keeps the activations whatever the policy): the plan to check against the RSS
  measured here (``benchmarks/remat_memory.py``).

The "fits" columns hold each plan against an 80 GB H100 (79.6 GiB seen by CUDA; JAX preallocates 75% of it
unless ``XLA_PYTHON_CLIENT_MEM_FRACTION`` says otherwise).

    PYTHONPATH=. KERAS_BACKEND=jax python benchmarks/remat_memory_plan.py --target h100 \\
        --preset t3-cifar10-resnet164-preact --batch-sizes 64 128 256 512 \\
        --policies none units segments:4 segments:7 stages --out reproduction/remat-memory/plan-resnet164-h100
"""

import argparse
import importlib.util
import json
import os
import pathlib
import platform
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from keras_preact_training.machine import backends  # noqa: E402  (standard library only: before JAX starts)

GIB = 2**30
H100_GIB = 79.6  # an 80 GB H100's memory as CUDA reports it (81,559 MiB)
JAX_PREALLOCATED = 0.75  # XLA_PYTHON_CLIENT_MEM_FRACTION's default
SIZES = ("argument", "output", "alias", "temp")
TARGETS = {"cpu": None, "h100": REPO / "benchmarks" / "gpu_targets" / "h100-sxm-80gb.txtpb"}
GPU_PLUGIN = "jax_plugins.xla_cuda12"  # jax[cuda12]'s PJRT plugin: XLA's GPU compiler


def has_gpu_plugin():
    return importlib.util.find_spec("jax_plugins") is not None and importlib.util.find_spec(GPU_PLUGIN) is not None


def target_sharding(target):
    """Where the step is compiled for: None (JAX's default device) or a sharding on ``target``'s GPU, which
    need not be present (``jax.experimental.topologies``, deviceless compilation)."""
    if TARGETS[target] is None:
        return None
    import jax
    from jax.experimental import topologies

    topology = topologies.get_topology_desc(platform="cuda", target_config=TARGETS[target].read_text(),
                                            topology="1x1x1")
    mesh = topologies.make_mesh(topology, (1,), ("device",))
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())


def plan(preset, batch_size, policy, depth=None, num_classes=10, target="cpu", sharding=None):
    """One row: XLA's compiled sizes (bytes) of ``preset``'s training step (at ``depth`` if given) at
    ``batch_size`` under ``policy``, compiled for ``sharding``'s device (JAX's default where None)."""
    import jax
    import numpy as np

    from keras_preact_training.recipe import configs, schedules
    from keras_preact_training.recipe.model import build_model

    config = configs.get_config(preset, needs_data=False, batch_size=batch_size,
                                remat=None if policy == "none" else policy, **({"depth": depth} if depth else {}))
    resolved = schedules.resolve(config, batch_size)
    started = time.perf_counter()
    _, model = build_model(config, num_classes, resolved)
    images = np.zeros((batch_size, *model.input_shape[1:]), "float32")
    labels = np.zeros((batch_size,), "int32")
    model.optimizer.build(model.trainable_variables)
    model._symbolic_build(data_batch=(images, labels))  # the metrics' variables, as fit builds them
    state = model._get_jax_state(trainable_variables=True, non_trainable_variables=True,
                                 optimizer_variables=True, metrics_variables=True)
    specs = jax.tree.map(lambda array: jax.ShapeDtypeStruct(np.shape(array), array.dtype, sharding=sharding),
                         (state, (images, labels)))
    compiled = jax.jit(model.train_step, donate_argnums=0).lower(*specs).compile()
    analysis = compiled.memory_analysis()
    row = {"preset": preset, "depth": config.depth, "batch_size": batch_size, "policy": policy, "target": target,
           "backend": jax.default_backend() if sharding is None else "cuda",
           **{f"{name}_bytes": int(getattr(analysis, f"{name}_size_in_bytes")) for name in SIZES},
           "compile_seconds": round(time.perf_counter() - started, 1)}
    row["peak_bytes"] = row["argument_bytes"] + row["output_bytes"] - row["alias_bytes"] + row["temp_bytes"]
    jax.clear_caches()
    return row


def table(rows):
    """Markdown: per preset and batch, each policy's compiled peak and temporaries, over none's, and the fits."""
    lines = ["| network | depth | batch | --remat | peak (GiB) | x none | temporaries (GiB) | fits 80 GB H100 "
             f"(all / JAX's default {JAX_PREALLOCATED:.0%}) |", "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        none = next((r for r in rows if r["policy"] == "none" and r["preset"] == row["preset"]
                     and r["batch_size"] == row["batch_size"]), None)
        peak = row["peak_bytes"] / GIB
        fits = ["yes" if peak <= limit else "no" for limit in (H100_GIB, H100_GIB * JAX_PREALLOCATED)]
        lines.append(f"| {row['preset']} | {row['depth']} | {row['batch_size']} | {row['policy']} | {peak:.2f} | "
                     f"{row['peak_bytes'] / none['peak_bytes']:.2f}x | {row['temp_bytes'] / GIB:.2f} | "
                     f"{' / '.join(fits)} |" if none else
                     f"| {row['preset']} | {row['depth']} | {row['batch_size']} | {row['policy']} | {peak:.2f} | - | "
                     f"{row['temp_bytes'] / GIB:.2f} | {' / '.join(fits)} |")
    return "\n".join(lines)


def write_atomic(path, text):
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    temporary.replace(path)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", nargs="+", required=True, help="training presets (training/recipe/configs.py)")
    parser.add_argument("--depth", type=int, help="the network's depth instead of the preset's")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[64, 128, 256, 512])
    parser.add_argument("--policies", nargs="+", default=["none", "units", "segments:4", "stages"],
                        help="'none' or a --remat value")
    parser.add_argument("--target", choices=sorted(TARGETS), default="cpu",
                        help="compile for this machine's CPU (default), or for an H100 that need not be here")
    parser.add_argument("--out", type=pathlib.Path, help="write OUT.json and OUT.md (each row as it comes)")
    args = parser.parse_args(argv)
    if os.environ.get("KERAS_BACKEND", "jax") != "jax":
        parser.error(f"KERAS_BACKEND={os.environ['KERAS_BACKEND']}: the plan is XLA's, so it needs KERAS_BACKEND=jax")
    if any(size < 1 for size in args.batch_sizes):
        parser.error(f"--batch-sizes must be positive integers, got {args.batch_sizes}")
    gpu = TARGETS[args.target] is not None
    if gpu:
        if not has_gpu_plugin():
            parser.error(f"--target {args.target} compiles for a GPU that need not be here, with JAX's CUDA plugin, "
                         f"which is not installed: pip install \"jax[cuda12]\" (no GPU or driver needed)")
        if "jax" in sys.modules:
            parser.error(f"--target {args.target}: JAX is imported already; run this as its own process")
        # JAX itself runs on the CPU (no GPU client, no driver check); XLA's GPU compiler plans for the target.
        os.environ.update(JAX_PLATFORMS="cpu", JAX_SKIP_CUDA_CONSTRAINTS_CHECK="1",
                          XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} --xla_gpu_autotune_level=0".strip())
    os.environ["KERAS_BACKEND"] = "jax"
    from keras_preact.models.remat import parse_remat
    from keras_preact_training.recipe import configs

    for preset in args.preset:
        if preset not in configs.PRESETS:
            parser.error(f"--preset {preset!r} is not a preset; choose from {', '.join(sorted(configs.PRESETS))}")
    for policy in args.policies:
        try:
            parse_remat(None if policy == "none" else policy)
        except ValueError as error:
            parser.error(f"--policies: {error}")
    if not gpu:
        # The schedule keras-preact-train --remat compiles with, for every row (none too: one schedule, one table).
        backends.xla_flags_for_remat("jax", "units", accelerator=False)
    sharding = target_sharding(args.target)
    rows = []
    for preset in args.preset:
        for batch_size in args.batch_sizes:
            for policy in args.policies:
                try:
                    rows.append(plan(preset, batch_size, policy, args.depth, target=args.target, sharding=sharding))
                except ValueError as error:  # a depth the preset's family does not build
                    parser.error(f"--depth {args.depth}: {error}")
                print(json.dumps(rows[-1]), flush=True)
                if args.out:
                    args.out.parent.mkdir(parents=True, exist_ok=True)
                    write_atomic(args.out.with_name(args.out.name + ".json"), json.dumps(rows, indent=1))
    compiler = ("XLA's GPU compiler for an H100 80GB, deviceless (no GPU here: a projection)" if gpu
                else f"XLA's CPU compiler (JAX {rows[0]['backend']} backend)")
    text = (f"XLA memory plans of the training step, {compiler}, XLA_FLAGS="
            f"{os.environ.get('XLA_FLAGS', '')!r}; {platform.machine()}, {os.cpu_count()} cores\n\n{table(rows)}\n")
    print(text)
    if args.out:
        write_atomic(args.out.with_name(args.out.name + ".md"), text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
