"""``keras-preact-train``: the command line of ``train`` (``python -m keras_preact_training.cli``).

Flags are the ``Config`` fields (``--batch-size``, ``--lr`` for ``base_lr``, ...) over a preset;
``--dry-run`` prints the recipe; ``--config RUN_DIR/config.json`` re-runs a run. The Keras backend is Keras'
own choice (``KERAS_BACKEND``, ``keras.json``) unless ``--backend`` names one (``training/machine/backends.py``),
so this module imports Keras only once that is set: the modules that load Keras are imported inside the
functions. ``--measure-backends`` times the installed backends on the run's model (``backend_probe``);
``--backend fastest`` times them too (each in a child process), then trains on the fastest.
"""

import argparse
import os
import sys

from .machine import backends, start_up

FASTEST = "fastest"  # --backend fastest: measured on the run's model, then chosen


def describe_recipe(config):
    """What ``--dry-run`` prints: the run's iterations, its lr at every change, the optimizer."""
    from .data import sources
    from .recipe import configs, schedules

    assumed = ""
    if config.dataset == "synthetic":
        train_size = config.synthetic_train_size
    elif config.dataset == "folder" and config.data_dir:
        train_size = len(sources.folder_lists(config.data_dir, config.validation_split, config.seed)[0][0])
    elif config.dataset == "folder" and config.normalization in configs.TRAIN_SIZES:
        # No folder given: the statistics it is normalized with name the dataset it holds.
        train_size = configs.TRAIN_SIZES[config.normalization]
        assumed = f" (assumed: the size of {config.normalization}; --data-dir counts the folder)"
    elif config.dataset in configs.TRAIN_SIZES:
        train_size = configs.TRAIN_SIZES[config.dataset]
    elif config.steps_per_epoch:
        train_size = config.steps_per_epoch * config.batch_size
        assumed = " (not counted: --steps-per-epoch sets the epoch)"
    else:
        raise ValueError(f"--dry-run does not know the size of dataset={config.dataset!r}; pass --data-dir "
                         "(a folder is counted) or --steps-per-epoch.")
    train_size = min(train_size, config.subset or train_size)
    resolved = schedules.resolve(config, train_size)
    lines = [
        f"preset {config.name} ({config.paper})",
        f"model: {config.architecture} ResNet-{config.depth} {config.unit_options or ''}".rstrip()
        + (f", remat {config.remat}" if config.remat else ""),
        f"data: {config.dataset}, {train_size} training images{assumed}, batch {config.batch_size}, augmentation "
        f"{config.augmentation}, normalization {config.normalization}",
        f"iterations: {resolved.total_steps} = {resolved.epochs} epochs x {resolved.steps_per_epoch}",
        *([f"fine-tuning: from init_weights {config.init_weights}; " + (
            f"the new head alone for the first {round(config.head_fraction * resolved.total_steps)} iterations, "
            "then every layer" if config.head_fraction else "every layer from the first iteration")
           + (", a new head from a linear probe" if config.head_init == "probe" else "")
           + f"; label smoothing {config.label_smoothing}"] if config.init_weights else []),
        f"optimizer: TorchSGD momentum {config.momentum}, nesterov {config.nesterov}, dampening 0, weight "
        f"decay {config.weight_decay} (coupled, scope {config.weight_decay_scope})",
        f"learning rate ({config.schedule}), from iteration:",
    ]
    lines += [f"  {step:>9}  {lr:.6g}" for step, lr in schedules.lr_table(config, resolved)]
    lines.append(f"  {resolved.total_steps:>9}  (stop)")
    return "\n".join(lines)


def _preset_table():
    from .recipe import configs

    width = max(map(len, configs.PRESETS))
    return "\n".join(f"  {name:<{width}}  {preset.paper}" for name, preset in configs.PRESETS.items())


def build_parser():
    from .recipe import configs, flags

    p = argparse.ArgumentParser(
        prog="keras-preact-train",
        description="Train a pre-activation ResNet (He et al. 2016) with model.fit. With no arguments: "
        "ResNet-8 on built-in synthetic data for a few CPU minutes, then export to saved_models/.",
        epilog="presets (one per experiment of the paper):\n" + _preset_table(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,  # --epoch is an error, not --epochs
    )
    p.add_argument("preset_name", nargs="?", metavar="PRESET", help="same as --preset")
    p.add_argument("--preset", choices=sorted(configs.PRESETS), metavar="NAME",
                   help=f"preset (default {configs.DEFAULT_PRESET}; list below)")
    p.add_argument("--config", metavar="CONFIG_JSON", help="re-run a run's config.json (flags override it)")
    p.add_argument("--ordering", help="unit ordering (paper Table 2), e.g. full_preact, original "
                   "(sets unit_options['ordering'])")
    p.add_argument("--dry-run", action="store_true",
                   help="print the resolved recipe (schedule as iteration/lr, optimizer) and exit; no training")
    p.add_argument("--backend", choices=(*backends.BACKENDS, FASTEST), default=None,
                   help="Keras backend for this run (default: Keras' own choice, KERAS_BACKEND, else \"backend\" in "
                   "~/.keras/keras.json, else tensorflow; printed at start); fastest: time a few training steps "
                   "of this run's model on every installed backend (a child process each, as --measure-backends) "
                   "and train on the fastest")
    p.add_argument("--measure-backends", action="store_true",
                   help="time a few training steps of this run's model on every installed backend (one child "
                   "process per backend other than this one's), print the figures and how to choose the fastest, "
                   "and exit; no training")
    p.add_argument("--measure-steps", type=int, default=5, metavar="N",
                   help="--measure-backends: timed training steps per backend (default 5, after 2 untimed)")
    flags.add_config_flags(p)
    return p


def config_from_args(args, parser, check=True):
    """The run's ``Config`` from the flags over a preset (or ``--config``), checked (``configs.validate``, which
    loads Keras); ``check=False``: the preset and flags only, unchecked (standard library only)."""
    from .recipe import configs, flags

    if args.preset and args.preset_name and args.preset != args.preset_name:
        parser.error(f"two presets given: {args.preset_name!r} and --preset {args.preset!r}")
    preset = args.preset or args.preset_name
    overrides = flags.overrides_from_args(args)
    needs_data = not args.dry_run  # --dry-run reads no data
    try:
        if args.config:
            from .run.manifest import config_from_run  # loads Keras

            base = config_from_run(args.config)
            if preset:
                parser.error("give either a preset or --config, not both")
            config = configs.validate(base.replace(**overrides), needs_data=needs_data)
        else:
            if preset and preset not in configs.PRESETS:
                parser.error(f"argument --preset: invalid choice: {preset!r} (choose from "
                             f"{', '.join(sorted(configs.PRESETS))})")
            if not check:
                config = configs.PRESETS[preset or configs.DEFAULT_PRESET].replace(**overrides)
                ordering = {"ordering": args.ordering} if args.ordering else {}
                return config.replace(unit_options={**config.unit_options, **ordering})
            config = configs.get_config(preset or configs.DEFAULT_PRESET, needs_data=needs_data, **overrides)
        if args.ordering:
            config = configs.validate(config.replace(unit_options={**config.unit_options, "ordering": args.ordering}),
                                      needs_data=needs_data)
        if config.recipe == "auto" and config.dataset == "folder" and config.data_dir and not args.config:
            config = auto_recipe(config, overrides, needs_data)
    except (ValueError, OSError) as e:
        parser.error(str(e))
    return config


def check_paths(args, parser):
    """The run's paths and the values that need no Keras, said in one line (exit 2) before Keras loads: a missing
    ``--config`` file, a folder dataset without ``--data-dir`` (``--dry-run`` reads no data) or with one that is
    not a directory, ``--measure-steps`` below 1."""

    def fail(message):
        parser.exit(2, f"{parser.prog}: error: {message}\n")

    if args.measure_steps < 1:
        fail(f"argument --measure-steps: {args.measure_steps} given, at least 1 is required")
    if args.config:
        if args.backend != FASTEST and not os.path.exists(args.config):  # choose_fastest refuses --config
            fail(f"Invalid --config={args.config!r}: no such file or directory (a run's config.json, or its run "
                 "directory)")
        return
    config = config_from_args(args, parser, check=False)
    if config.dataset != "folder" or args.dry_run:
        return
    if not config.data_dir:
        fail(f"Invalid --data-dir: dataset 'folder' (preset {config.name}) needs --data-dir DIR, a folder with "
             "train/ and test/ (or val/) sub-folders holding one folder of images per class")
    if not os.path.isdir(config.data_dir):
        fail(f"Invalid --data-dir={config.data_dir!r}: {config.data_dir} is not a directory")


def auto_recipe(config, overrides, needs_data):
    """``--recipe auto``: the folder's plan (``recipe.hyperrule``) over the config, flags given winning; its line
    printed before any work."""
    from .data import sources
    from .recipe import configs, hyperrule

    num_images, image_size = sources.folder_images(config)
    config, line = hyperrule.apply(config, num_images, image_size, given=set(overrides))
    print(line, flush=True)
    return configs.validate(config, needs_data=needs_data)


def choose_fastest(args, parser):
    """``--backend fastest``: the installed backend whose training step of this run's model is the fastest,
    each timed in a child process before Keras loads here (``backend_probe.measure_in_children``); the figures
    are printed. None (said in one line) when no backend gave a figure."""
    from . import backend_probe

    if args.config:
        parser.error("--backend fastest measures a preset's model before Keras loads; with --config name the "
                     "backend (the run's config.json records keras_backend)")
    if args.measure_backends or args.dry_run:
        parser.error("--backend fastest trains; --measure-backends and --dry-run take a backend by name or none")
    steps, warmup = args.measure_steps, backend_probe.MEASURE_WARMUP_STEPS
    if steps < 1:
        parser.error(f"argument --measure-steps: {steps} given, at least 1 is required")
    present = [b for b in backends.BACKENDS if backends.installed(b)]
    if not present:
        parser.exit(2, "keras-preact-train: error: --backend fastest: no Keras backend is installed: install one "
                       "of tensorflow, jax, torch\n")
    if len(present) == 1:
        print(f"[measure] {present[0]} is the one Keras backend installed: nothing to time", flush=True)
        return present[0]
    if "keras" in sys.modules:
        parser.error("--backend fastest: Keras is already imported in this process, so its backend is fixed; run "
                     "keras-preact-train in a new process")
    # Checking a config loads Keras (its options are the library's), which would fix the backend here: the
    # children check it, and the first to find it invalid stops the measurement with its message.
    config = config_from_args(args, parser, check=False)
    try:
        figures, failed = backend_probe.measure_in_children(config, steps, warmup)
    except ValueError as e:
        parser.exit(2, f"keras-preact-train: error: {e}\n")
    lines = backend_probe.report(config, figures, failed, steps, warmup)
    print("\n".join(line for line in lines if not line.startswith("[measure] fastest")), flush=True)
    if not figures:
        print("keras-preact-train: error: --backend fastest: no installed backend finished its timed steps "
              "(see the lines above)", file=sys.stderr)
        return None
    return min(figures, key=figures.get)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    # The parser is standard library only (recipe.configs, recipe.flags): --help and a bad flag are answered
    # before Keras loads.
    parser = build_parser()
    args = parser.parse_args(argv)
    check_paths(args, parser)
    # TensorFlow's start-up settings and PyTorch's threads, before Keras loads here or in a child that times it
    start_up.launch()
    reason = "--backend"
    if args.backend == FASTEST:
        timed = sum(map(backends.installed, backends.BACKENDS)) > 1
        args.backend = choose_fastest(args, parser)
        reason = "--backend fastest: " + ("the fastest measured" if timed else "the one installed")
        if args.backend is None:
            return 1
    try:
        # Keras' own choice unless --backend: said in one line and set before Keras is imported.
        backends.select(args.backend, reason=reason)
    except ValueError as e:
        print(f"keras-preact-train: error: {e}", file=sys.stderr)
        return 2
    from .run import run_state
    from .train import TrainingDiverged, TrainingFailed, train

    config = config_from_args(args, parser)
    if args.measure_backends:
        if args.measure_steps < 1:
            parser.error(f"argument --measure-steps: {args.measure_steps} given, at least 1 is required")
        from . import backend_probe

        figures, failed = backend_probe.measure(config, args.measure_steps)
        print("\n".join(backend_probe.report(config, figures, failed, args.measure_steps,
                                             backend_probe.MEASURE_WARMUP_STEPS)), flush=True)
        return 0 if figures else 1
    if args.dry_run:
        try:
            print(describe_recipe(config))
        except ValueError as e:
            parser.exit(2, f"keras-preact-train: error: {e}\n")
        return 0
    note = backends.xla_flags_for_remat(os.environ["KERAS_BACKEND"], config.remat)
    if note:
        print(note, flush=True)
    try:
        train(config)
    except (TrainingDiverged, OSError) as e:
        if isinstance(e, OSError) and not run_state.is_disk_full(e):
            raise
        print(f"keras-preact-train: error: {e}", file=sys.stderr)
        return 1
    except TrainingFailed as e:
        if os.environ.get("KERAS_PREACT_TRACEBACK"):
            raise
        print(f"keras-preact-train: error: {e} (set KERAS_PREACT_TRACEBACK=1 for the traceback)",
              file=sys.stderr)
        return 1
    except ValueError as e:
        parser.exit(2, f"keras-preact-train: error: {e}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
