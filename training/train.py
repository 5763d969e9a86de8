"""Train a pre-activation ResNet with ``model.fit``: ``train(config)``.

Python API::

    from keras_preact_training.recipe.configs import get_config
    from keras_preact_training.train import train

    result = train(get_config("t3-cifar10-resnet164-preact", dataset="folder", data_dir="/tmp/cifar10-jpeg"))
    result["test_accuracy"], result["run_dir"]

CLI: ``keras-preact-train`` (``training/cli.py``).

Run directory (``--run-dir``, default ``runs/<name>-<timestamp>``): ``config.json`` (resolved config,
enough to re-run: ``keras-preact-train --config RUN_DIR/config.json``), ``history.csv``
(CSVLogger), ``tensorboard/``, ``checkpoints/`` (BackupAndRestore state), ``model.keras``,
``metrics.json``, ``curves.png``. Every file is written to a temporary name and renamed.

Fault tolerance: run the same command with the same ``--run-dir`` after a kill (SIGKILL at any
moment) and the run resumes from the last backup (every ``checkpoint_every`` steps and every epoch
end) at the exact global step, with the exact data stream, and ends with the same epochs and steps.
The backup is restored before anything else, so a run killed after training (evaluation, ``model.keras``,
export) finishes those phases from the trained weights, and a finished run re-run does nothing
(``training/run/run_state.py``).
A NaN/inf loss stops the run (at the next backup or epoch end: ``AtomicBackup``, which reads no device value on
other steps), raises ``TrainingDiverged`` naming the last good checkpoint, which is kept.
While ``model.fit`` and ``model.evaluate`` run,
``keras_preact_training.machine.memory_guard`` ends the process with one line (exit 1) when host memory in use reaches
``config.memory_limit`` of the limit.
"""

import contextlib
import dataclasses
import functools
import json
import pathlib
import sys
import time

import keras

from keras_preact import scratch
from keras_preact.models import finetune

from . import export as export_lib
from .data import mixing, pipelines, sources
from .machine import distribute, execution, memory_guard
from .machine.memory_guard import OUT_OF_MEMORY_HINT
from .recipe import configs, ema, optimizers, schedules
from .recipe.model import build_model, compile_model, head_steps, new_head, set_phase
from .run import plots, resume, run_lock, run_state, timing
from .run.manifest import RunManifest, input_config_for, model_fingerprint
from .run.plots import read_history
from .run.run_dir import AtomicBackup, prepare_run_dir, read_backup, save_model, write_json


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite; the last good checkpoint is kept."""


# ------------------------------------------------------------------------------------- training
def set_determinism(config):
    keras.utils.set_random_seed(config.seed)
    if config.deterministic and keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        tf.config.experimental.enable_op_determinism()


def has_tensorboard():
    """The TensorBoard callback needs the ``tensorboard`` package (and TensorFlow) for its writer."""
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        return False
    return sources.has_tensorflow()


def _fit_phases(start_step, steps_per_epoch, total_steps):
    """[(initial_epoch, epochs, steps_per_epoch)] from ``start_step`` to ``total_steps``: the rest of
    a cut epoch, whole epochs, then a last partial epoch (the paper stops at an iteration count)."""
    phases, step = [], start_step
    while step < total_steps:
        epoch, done = divmod(step, steps_per_epoch)
        whole = (total_steps - step) // steps_per_epoch if not done else 0
        if whole:
            phases.append((epoch, epoch + whole, steps_per_epoch))
            step += whole * steps_per_epoch
        else:
            steps = min(steps_per_epoch - done, total_steps - step)
            phases.append((epoch, epoch + 1, steps))
            step += steps
    return phases


def _verbose(config):
    if str(config.verbose) == "auto":
        return 1 if sys.stdout.isatty() else 2
    return int(config.verbose)


def train(config, data=None):
    """Train ``config`` (a ``keras_preact_training.recipe.configs.Config``); returns the final metrics and ``run_dir``.

    ``data``: optional ``keras_preact_training.data.sources.ArrayData`` to train on instead of ``config.dataset``.
    Raises ValueError (naming the bad argument) before any training for bad input, and
    ``TrainingDiverged`` when the loss becomes non-finite.

    The run goes through four phases, each a function of one ``Run`` record: ``prepare`` (data, schedule,
    backup), ``build`` (model, restored weights, manifest), ``fit`` (input streams, callbacks,
    ``model.fit``) and ``finalise`` (evaluation, metrics, ``model.keras``, export).
    """
    configs.validate(config)
    run_dir = prepare_run_dir(config)
    keras.config.set_dtype_policy(config.precision)
    dist = distribute.make(config)
    run = Run(config, dist, run_dir)
    run.files_dir.mkdir(exist_ok=True)
    # One owner per worker file set, before anything is written; the kernel frees it when we die.
    with run_lock.owned(run.files_dir / run_lock.RUN_LOCK, f"run_dir={str(run_dir)!r}"):
        resume.check(run_dir, config)
        done = prepare(run, data)
        if done is not None:
            return done
        build(run)
        if config.linear_probe:  # the head in closed form, no model.fit
            probe(run)
        else:
            if config.head_init == "probe" and run.start_step == 0 and new_head(config, run.data.class_names):
                if run.dist.process_count > 1:  # model.predict's features are sharded across the processes
                    print(f"[train] head: --head-init probe fits in one process; across {run.dist.process_count} "
                          "processes the new head starts from its initialiser", flush=True)
                else:
                    accuracy = probe_head(run, "[train] head: fitted in closed form on the features of {n} training "
                                               "images before the first step (--head-init probe)")
                    if config.probe_rate_rule:
                        rate_after_probe(run, accuracy)
            fit(run)
        return finalise(run)


@dataclasses.dataclass
class Run:
    """What the phases of one run share: given, then filled by ``prepare``, ``build`` and ``fit``.

    Every chief/worker decision is a property here, and the phases only read them: the chief writes the
    run's shared files (``config.json``, ``metrics.json``, curves, TensorBoard, the export); every process
    writes its own history, backups and ``model.keras`` in ``files_dir`` (the chief's is ``run_dir``)."""

    config: configs.Config
    dist: object  # keras_preact_training.machine.distribute's distribution
    run_dir: pathlib.Path
    data: object = None
    resolved: schedules.ResolvedSchedule = None
    backup: dict = None  # the chief's backup this run resumes from (None: from the start)
    mean: object = None  # pixel statistics, 0-255 units (pipelines.pixel_stats), computed once
    std: object = None
    pipeline: str = None
    classifier: keras.Model = None  # what is saved and exported
    model: keras.Model = None  # what is compiled and fitted (the classifier behind its input)
    test_stream: object = None  # the evaluation input, every epoch and at the end
    backup_callback: AtomicBackup = None
    wall_s: float = 0.0
    steps_per_execution: int = 1  # training steps per compiled call: the config's, else the app's choice
    steps_per_execution_why: str = ""
    last_validation: dict = None  # the test figures fit measured at the last step, when this session ran it

    @property
    def start_step(self):
        return self.backup["step"] if self.backup else 0

    # ---- every chief/worker decision
    @property
    def is_chief(self):
        """This process writes the run's shared files: ``config.json``, ``metrics.json``, curves, export."""
        return self.dist.is_chief

    @property
    def files_dir(self):
        """This process's own files: history, backups, ``model.keras``."""
        return self.run_dir if self.is_chief else self.run_dir / f"worker-{self.dist.process_index}"

    @property
    def may_stop_finished(self):
        """A finished run returns its metrics at once: one process only (processes must fit together)."""
        return self.dist.process_count == 1

    @functools.cached_property
    def tensorboard_dir(self):
        """The chief's TensorBoard event files; None for a worker, or without TensorFlow and tensorboard."""
        return self.run_dir / "tensorboard" if self.is_chief and has_tensorboard() else None

    @property
    def sharded(self):
        """Each process feeds its own shard of every batch (multi-process data parallelism)."""
        return self.dist.process_count > 1 and self.config.distribute == "data-parallel"


# ---------------------------------------------------------------------------------------- phases
def prepare(run, data):
    """Data, schedule and the backup to resume from; the finished run's metrics when nothing is left."""
    config = run.config
    run.data = data.validate() if data is not None else sources.load(config)
    pipelines.check_image_size(run.data, config)
    pipelines.check_batch_size(run.data, config)
    if run.sharded:
        pipelines.check_sharded_eval(run.data, config)
    run.resolved = schedules.resolve(config, run.data.train_size)
    for directory in (run.files_dir, run.files_dir / "checkpoints" / "backup"):  # this process's own
        scratch.remove_stale(directory)
    run.backup = read_backup(run.run_dir / "checkpoints" / "backup")  # the chief's: every worker resumes from it
    if run.backup and config.probe_rate_rule:  # the rate the run started at, from its probe's record
        run.resolved = resolved_after_probe(run.resolved, read_probe_record(run.run_dir))
    resume.check_classes(run.run_dir, run.data.class_names, run.backup)
    if run.may_stop_finished:
        done = run_state.finished(run.run_dir, config, run.resolved.total_steps, run.backup)
        if done is not None:
            print(f"[train] run already finished at step {run.start_step}; nothing to do (metrics in "
                  f"{run.run_dir / 'metrics.json'})", flush=True)
            return done
    if config.export and run.is_chief:
        run_state.check_export_target(config.export_dir, export_lib.export_name(config.name, run.run_dir))
    run.mean, run.std = pipelines.pixel_stats(config, run.data)
    return None


def build(run):
    """The network (weights restored from the backup), carrying its input config and class names; the
    chief writes the run manifest."""
    config = run.config
    set_determinism(config)
    run.pipeline = pipelines.resolve_pipeline(config)
    distribute.check_pipeline(run.pipeline, run.dist)
    backend = keras.backend.backend()
    run.steps_per_execution, run.steps_per_execution_why = execution.choose_steps_per_execution(
        config.steps_per_execution, backend, execution.device_kind(backend), run.resolved.steps_per_epoch,
        checkpoint_every=config.checkpoint_every, health_every=config.health_every)
    with run.dist.scope():
        on_device = run.pipeline == "device"
        run.classifier, run.model = build_model(config, run.data.num_classes, run.resolved, pipeline=run.pipeline,
                                                mean=run.mean if on_device else None,
                                                std=run.std if on_device else None,
                                                class_names=tuple(run.data.class_names), start_step=run.start_step,
                                                steps_per_execution=run.steps_per_execution)
        if run.backup:  # before anything is decided: with nothing left to fit, fit never restores
            restore_backup(run)
    # The model carries what it was trained for, through model.keras: export and evaluation need no argument.
    run.classifier.input_config = input_config_for(config, run.mean.tolist(), run.std.tolist())
    run.classifier.class_names = tuple(run.data.class_names)
    if run.is_chief:
        write_manifest(run)


def write_manifest(run):
    """The run manifest, ``config.json``: the config, the schedule resolved from it, what the model is."""
    config = run.config
    manifest = RunManifest(
        name=config.name, class_names=run.classifier.class_names, input_config=run.classifier.input_config,
        config=dataclasses.asdict(config), resolved_schedule=dataclasses.asdict(run.resolved),
        keras_backend=keras.backend.backend(), keras_version=keras.__version__,
        model=final_fingerprint(run),
    )
    write_json(run.run_dir / "config.json", manifest.to_dict())


def restore_backup(run):
    """The backup's model and optimizer state into the compiled model. A backup at the last step of the head phase
    holds the head phase's optimizer (its few variables): restored into the head phase's model, then the phase ends
    as in a run never stopped (``unfreeze``: every layer, a fresh optimizer at the schedule's step)."""
    config, resolved = run.config, run.resolved
    head_end = head_steps(config, resolved)
    at_boundary = 0 < head_end == run.start_step < resolved.total_steps
    if at_boundary:
        set_phase(run.classifier, config, resolved, head_end - 1)
        compile_model(run.model, config, resolved, run.data.num_classes, steps_per_execution=run.steps_per_execution)
    run_state.restore(run.model, run.backup)
    if at_boundary:
        unfreeze(run)


def final_fingerprint(run):
    """The fingerprint of the model the run ends with (``model.keras``): in a head phase, with every layer
    trainable as after it (a frozen backbone's ``trainable`` is in its config); the phase is then restored."""
    if run.start_step >= head_steps(run.config, run.resolved):
        return model_fingerprint(run.classifier)
    set_phase(run.classifier, run.config, run.resolved, run.resolved.total_steps)
    fingerprint = model_fingerprint(run.classifier)
    set_phase(run.classifier, run.config, run.resolved, run.start_step)
    return fingerprint


def input_streams(run):
    """(train_stream(step): the training batches from global ``step``, the test stream)."""
    config, data = run.config, run.data
    eval_data = data
    shard = (run.dist.process_index, run.dist.process_count) if run.sharded else None
    if shard and isinstance(data, sources.ArrayData):
        test_images, test_labels = distribute.shard_eval(data.test_images, data.test_labels, config.batch_size, *shard)
        eval_data = dataclasses.replace(data, test_images=test_images, test_labels=test_labels)
    elif shard and isinstance(data, sources.FolderFiles):  # the same positions, decoded from their files
        pick = distribute.shard_eval_index(len(data.test_labels), config.batch_size, *shard)
        eval_data = dataclasses.replace(data, test_files=[data.test_files[i] for i in pick],
                                        test_labels=data.test_labels[pick])

    def train_stream(step):
        if shard and isinstance(data, sources.FolderFiles):  # each process decodes its own slice
            return pipelines.pipelines(data, config, config.batch_size, start_step=step, shard=shard)[0]
        stream, _ = pipelines.pipelines(data, config, config.batch_size, start_step=step)
        if shard:
            sharded = distribute.ShardedTrain(*shard)
            stream = sharded.tf_data(stream, config.batch_size) if run.pipeline == "tf_data" else sharded.numpy(stream)
        return stream

    per_process_batch = config.batch_size // shard[1] if shard else config.batch_size
    _, test_stream = pipelines.pipelines(eval_data, config, per_process_batch, start_step=0)
    if config.mixup or config.cutmix:  # one-hot labels, mixed in training (keras_preact_training.data.mixing)
        return mixing.mixed_stream(train_stream, data.num_classes, config), mixing.OneHotBatches(
            test_stream, data.num_classes)
    return train_stream, test_stream


def make_callbacks(run):
    """Epoch timer, CSV history, backups and the NaN stop, health signals; TensorBoard on the chief.

    None of them reads a device value on every step (no ``on_train_batch_end`` but the health signals' every
    ``health_every`` steps), so Keras on JAX and PyTorch runs the batch-end callbacks off the training loop; not
    with TensorBoard, whose batch end reads the model (on JAX only the loop's thread may sync its state)."""
    config, data = run.config, run.data
    # Multi-worker: every worker restored the chief's backup (the weights are in sync), so all resume at
    # one step; each still writes its own (saving may run collectives).
    run.backup_callback = AtomicBackup(run.files_dir / "checkpoints" / "backup", config.checkpoint_every,
                                       run.start_step, run.backup)
    callbacks = [
        timing.EpochTimer(),  # before CSVLogger: train_seconds / eval_seconds land in history.csv
        keras.callbacks.CSVLogger(str(run.files_dir / "history.csv"), append=True),
        run.backup_callback,
    ]
    if config.ema_momentum:  # validation on the averaged weights; every fit trains on from the raw ones
        callbacks[:0] = [ema.EvaluateAverages(), ema.KeepTrainingWeights()]
    if config.health_every and isinstance(data, sources.ArrayData):
        # Before CSVLogger, so the health signals land in history.csv (keras_preact.analysis).
        from keras_preact.analysis import TrainingHealthCallback

        probe = ((data.train_images[:64].astype("float32") - run.mean) / run.std, data.train_labels[:64])
        health_dir = str(run.tensorboard_dir / "health") if run.tensorboard_dir else None
        callbacks.insert(1, TrainingHealthCallback(probe, config.health_every, log_dir=health_dir,
                                                   model=run.classifier))
    (run.run_dir / "tensorboard").mkdir(exist_ok=True)
    if run.tensorboard_dir:
        # Not async_safe: its first batch end reads ``self.model`` (for the train graph), and on JAX that property
        # syncs the trainer's state into the variables (``jax_state_sync``). From the thread Keras' CallbackList
        # dispatches async-safe batch ends to, the sync raced the loop's next step, which donates that state: the
        # variables were left holding deleted buffers, marked in sync, and the run's validation or next run
        # failed in model.fit ("Array has been deleted"). With TensorBoard the batch ends stay on the loop.
        callbacks.append(keras.callbacks.TensorBoard(str(run.tensorboard_dir), update_freq="epoch"))
    elif run.is_chief:
        print("[train] TensorBoard event files skipped: they need TensorFlow and tensorboard "
              "(pip install tensorflow tensorboard); history.csv and curves.png hold the curves.")
    return callbacks


def describe(run):
    """The one line a run starts with."""
    config, data, resolved = run.config, run.data, run.resolved
    return (
        f"[train] {config.name}: {config.architecture} ResNet-{config.depth}, {run.classifier.count_params():,} "
        f"params; data {config.dataset} ({data.train_size} train images, {data.num_classes} classes); "
        f"batch {config.batch_size} on {run.dist.num_replicas} replica(s) ({run.dist.name}), input {run.pipeline}; "
        f"{resolved.epochs} epochs x {resolved.steps_per_epoch} steps = {resolved.total_steps} "
        f"iterations, {run.steps_per_execution} per compiled call ({run.steps_per_execution_why}); "
        f"lr {config.schedule} {resolved.warmup_lr}->{resolved.base_lr}, "
        f"warm-up {resolved.warmup_steps}, boundaries {list(resolved.boundaries)}; run dir {run.run_dir}"
        + (f"; resuming at step {run.start_step}" if run.start_step else "")
    )


def fit(run):
    """``model.fit`` from the resumed step to the recipe's last iteration, in whole and partial epochs;
    ``TrainingDiverged`` when the loss became non-finite."""
    config, resolved = run.config, run.resolved
    train_stream, run.test_stream = input_streams(run)
    callbacks = make_callbacks(run)
    backup = run.backup_callback
    print(describe(run), flush=True)
    started = time.time()
    history = None
    head_end = head_steps(config, resolved)
    phases = _fit_phases(run.start_step, resolved.steps_per_epoch, min(head_end, resolved.total_steps))
    phases.append(None)  # the head phase over: every layer trains from here
    phases += _fit_phases(max(run.start_step, head_end), resolved.steps_per_epoch, resolved.total_steps)
    for phase in phases:
        if phase is None:
            if run.start_step < head_end < resolved.total_steps:
                unfreeze(run)
            continue
        initial_epoch, epochs, steps = phase
        with _reported("model.fit"), memory_guard.watch("model.fit", config.memory_limit):
            history = run.model.fit(
                train_stream(backup.step), epochs=epochs, initial_epoch=initial_epoch, steps_per_epoch=steps,
                validation_data=run.test_stream, callbacks=callbacks, verbose=_verbose(config), shuffle=False,
            )
        if not backup.finite or run.model.stop_training:
            break
    run.wall_s = time.time() - started
    if not backup.finite:
        last = backup.last_good
        raise TrainingDiverged(
            f"The training diverged (a NaN/inf loss or weight) near step {backup.step} of {config.name}; "
            f"stopped. Last good checkpoint: "
            + (f"{last['weights']} (step {last['step']})" if last else "none (diverged before the first backup)")
            + ". Lower the learning rate (--lr) or use float32 (--precision float32)."
        )
    if backup.step != resolved.total_steps:
        raise RuntimeError(f"Trained to step {backup.step}, expected {resolved.total_steps}.")
    if history is not None:  # the last epoch's validation ran on the final weights: the test evaluation
        run.last_validation = {key[len("val_"):]: values[-1] for key, values in history.history.items()
                               if key.startswith("val_") and values}


def probe(run):
    """``linear_probe``: the head fitted in closed form on the frozen backbone's features of the training images
    (``keras_preact.models.levers.linear_probe``), one forward pass in the order of the files; no ``model.fit``."""
    config = run.config
    _, run.test_stream = input_streams(run)
    run.backup_callback = AtomicBackup(run.files_dir / "checkpoints" / "backup", config.checkpoint_every,
                                       run.start_step, run.backup)
    started = time.time()
    probe_head(run, "[train] linear probe: the head in closed form on the features of {n} training images (one "
                    "forward pass, no training)")
    run.wall_s = time.time() - started


def probe_head(run, message):
    """The classifier's head fitted in closed form on the frozen backbone's features of the training images
    (``keras_preact.models.levers.linear_probe``), one forward pass in the order of the files: ``linear_probe``'s
    whole run, and ``head_init="probe"``'s start (LP-FT: Kumar et al. 2022)."""
    from keras_preact.models import levers

    config, data = run.config, run.data
    if isinstance(data, sources.ArrayData):
        batches = pipelines.ArrayBatches(data.train_images, data.train_labels, config.batch_size, mean=run.mean,
                                         std=run.std)
    else:
        batches = pipelines.FolderBatches(data, "train", config.batch_size, mean=run.mean, std=run.std, raw=False)
    print(message.format(n=len(batches.labels)), flush=True)
    return levers.fit_head(run.classifier, levers.features(run.classifier, batches), batches.labels)


PROBE_RECORD = "probe.json"  # a probed run's probe: its accuracy on the training images (--probe-rate-rule)


def rate_after_probe(run, accuracy):
    """``--probe-rate-rule``: the schedule's rates after the probe (``keras_preact.models.finetune.rate_after_probe``:
    halved when the probe is right on 99% or more of the training images), said in one line. The probe's accuracy
    is kept in the run directory, so a resumed run trains at the rate the run started at."""
    write_json(run.run_dir / PROBE_RECORD, {"train_accuracy": accuracy, "train_images": run.data.train_size})
    peak = run.resolved.base_lr
    run.resolved = resolved_after_probe(run.resolved, accuracy)
    share = f"the probe is right on {accuracy:.1%} of the {run.data.train_size:,} training images"
    if run.resolved.base_lr == peak:
        print(f"[recipe] {share} (under {finetune.SEPARABLE:.0%}): every layer trains at the peak rate {peak:g}",
              flush=True)
        return
    print(f"[recipe] {share} ({finetune.SEPARABLE:.0%} or more): the features already separate them, so every "
          f"layer trains at half the rate, peak {run.resolved.base_lr:g} (keras_preact.models.finetune."
          "rate_after_probe; --lr sets the rate)", flush=True)
    with run.dist.scope():
        compile_model(run.model, run.config, run.resolved, run.data.num_classes,
                      steps_per_execution=run.steps_per_execution)
    write_manifest(run)


def read_probe_record(run_dir):
    """The training accuracy a probed run's probe recorded, or None (no record: the run starts at its rate)."""
    path = pathlib.Path(run_dir) / PROBE_RECORD
    if not path.is_file():
        return None
    return float(json.loads(path.read_text())["train_accuracy"])


def resolved_after_probe(resolved, accuracy):
    """``resolved`` with its rates scaled as ``keras_preact.models.finetune.rate_after_probe`` says for a probe right
    on ``accuracy`` of the training images (None: unchanged)."""
    if accuracy is None:
        return resolved
    factor = finetune.rate_after_probe(resolved.base_lr, accuracy) / resolved.base_lr
    return dataclasses.replace(resolved, base_lr=resolved.base_lr * factor, warmup_lr=resolved.warmup_lr * factor)


def unfreeze(run):
    """The end of the head phase: every layer trains; compiled again (Keras fixes what trains at compile) with
    a fresh optimizer that goes on at the schedule's step (its iteration count set to the head phase's)."""
    config, resolved = run.config, run.resolved
    set_phase(run.classifier, config, resolved, head_steps(config, resolved))
    with run.dist.scope():
        compile_model(run.model, config, resolved, run.data.num_classes, steps_per_execution=run.steps_per_execution)
    optimizers.set_iterations(run.model.optimizer, head_steps(config, resolved))
    ema.start_averages(run.model)
    frozen = (" (the batch-norm statistics kept frozen: --freeze-norm "
              f"{config.freeze_norm}{', batch < 64 or < 20,000 images' if config.freeze_norm == 'auto' else ''})"
              if resolved.freeze_norm else "")
    print(f"[train] head phase done at step {head_steps(config, resolved)}: every layer trains from here{frozen}",
          flush=True)


def run_metrics(run, evaluation):
    """``metrics.json``: the test evaluation, the run's length and speed, the last training epoch.

    Accuracies and errors are fractions in [0, 1], as Keras reports them (``accuracy``, ``val_accuracy``):
    ``test_accuracy``, ``test_error`` (= 1 - ``test_accuracy``), ``test_top5_accuracy``, ``train_accuracy``.
    A ``metrics.json`` written before ``test_error`` was a fraction held it in percent;
    ``run_state.read_metrics`` reads either."""
    config, steps = run.config, run.backup_callback.step
    metrics = {
        "name": config.name,
        "test_loss": float(evaluation["loss"]),
        "test_accuracy": float(evaluation["accuracy"]),
        "test_error": run_state.error_of(evaluation["accuracy"]),
        **({"test_top5_accuracy": float(evaluation["top5_accuracy"])} if "top5_accuracy" in evaluation else {}),
        "epochs": run.resolved.epochs,
        "steps": steps,
        "steps_this_session": steps - run.start_step,
        "wall_time_s": round(run.wall_s, 1),
        "train_images_per_s": round((steps - run.start_step) * config.batch_size / max(run.wall_s, 1e-9), 1),
        "params": int(run.classifier.count_params()),
        "run_dir": str(run.run_dir),
    }
    history = read_history(run.files_dir / "history.csv")
    if history:
        metrics["train_loss"] = float(history[-1]["loss"])
        metrics["train_accuracy"] = float(history[-1]["accuracy"])
        metrics["history_epochs"] = len(history)
    return metrics


def finalise(run):
    """Evaluate, save ``model.keras``; the chief writes metrics and curves, then exports."""
    config = run.config
    ema.use_averages(run.model)  # evaluated, saved and exported from the averaged weights
    evaluation = run.last_validation
    if not evaluation or "loss" not in evaluation or "accuracy" not in evaluation:  # trained before this session
        if run.is_chief:
            print(f"[train] evaluating the trained weights on the test set ({_test_size(run.data)} images)", flush=True)
        with _reported("model.evaluate"), memory_guard.watch("model.evaluate", config.memory_limit):
            evaluation = run.model.evaluate(run.test_stream, verbose=_verbose(config) if run.is_chief else 0,
                                            return_dict=True)
    metrics = run_metrics(run, evaluation)
    set_phase(run.classifier, config, run.resolved, run.resolved.total_steps)  # saved with every layer trainable
    # Under a multi-process JAX distribution, saving runs collectives (Keras creates variables while
    # it walks the model), so every process saves; the chief's copy is the run's model.
    if run.is_chief:
        print(f"[train] saving {run.files_dir / 'model.keras'}", flush=True)
    save_model(run.classifier, run.files_dir / "model.keras")
    if not run.is_chief:
        return metrics
    write_json(run.run_dir / "metrics.json", metrics)
    plots.plot_curves(run.run_dir / "history.csv", run.run_dir / "curves.png", run.resolved.steps_per_epoch,
                      title=f"{config.name} ({config.paper})")
    print_summary(metrics)
    if config.export:
        if run.dist.process_count > 1:  # the export reloads the model: keep it out of the collectives
            keras.distribution.set_distribution(None)
        metrics["export_dir"] = export(run.run_dir, config.export_dir)
        write_json(run.run_dir / "metrics.json", metrics)  # marks the export done
    return metrics


def _test_size(data):
    return data.test_size if hasattr(data, "test_size") else len(data.test_labels)


def print_summary(metrics):
    print("\n[train] summary")
    for key in ("name", "test_accuracy", "test_error", "test_top5_accuracy", "train_loss", "epochs",
                "steps", "wall_time_s", "train_images_per_s", "params", "run_dir"):
        if key in metrics:
            value = metrics[key]
            print(f"  {key:<20} {value:.4f}" if isinstance(value, float) else f"  {key:<20} {value}")
    sys.stdout.flush()


class TrainingFailed(RuntimeError):
    """Keras raised inside ``fit``/``evaluate``; the message is its first line (no array dumps)."""


@contextlib.contextmanager
def _reported(what):
    """Re-raise an error from inside Keras as ``TrainingFailed`` with its type and first line."""
    try:
        yield
    except (KeyboardInterrupt, TrainingDiverged, run_state.DiskFullError):  # ours: already one line
        raise
    except Exception as e:  # noqa: BLE001 - any backend error, summarised; the cause stays chained
        lines = str(e).strip().splitlines() or [""]
        out_of_memory = is_out_of_memory(e)
        first = next((line.strip() for line in lines if out_of_memory and any(
            text in line for text in OUT_OF_MEMORY_MESSAGES)), lines[0])  # TF's OOM line is not its first
        checks = [line[line.index("assertion failed:"):].strip() for line in lines if "assertion failed:" in line]
        first = checks[0] if checks else first  # a data check's words, not tf.data's preamble
        if len(first) > 300:
            first = first[:300] + " ..."
        hint = OUT_OF_MEMORY_HINT if out_of_memory else ""
        raise TrainingFailed(f"{what} failed: {type(e).__name__}: {first}{hint}") from e


# How each backend says it ran out of memory: TensorFlow's ResourceExhaustedError ("OOM when allocating"),
# XLA's RESOURCE_EXHAUSTED status (JAX), torch.OutOfMemoryError, Python's MemoryError (numpy, PyTorch on CPU).
OUT_OF_MEMORY_TYPES = ("ResourceExhaustedError", "OutOfMemoryError", "MemoryError")
OUT_OF_MEMORY_MESSAGES = ("RESOURCE_EXHAUSTED", "OOM when allocating", "Out of memory", "out of memory",
                          "DefaultCPUAllocator: not enough memory")
# OUT_OF_MEMORY_HINT, the remedies this error ends with, is memory_guard's: its line names the same.


def is_out_of_memory(error):
    """Whether ``error`` is a backend's out-of-memory error (``OUT_OF_MEMORY_TYPES``/``_MESSAGES``)."""
    names = {cls.__name__ for cls in type(error).__mro__}
    return bool(names & set(OUT_OF_MEMORY_TYPES)) or any(text in str(error) for text in OUT_OF_MEMORY_MESSAGES)


def export_here_line(run_dir):
    """The command that exports ``run_dir`` without TensorFlow in this environment (ONNX and OpenVINO, those this
    backend writes), with the install line of those not installed; None where this backend writes neither."""
    from keras_preact.export import check_formats

    formats, installs = [], []
    for name in ("onnx", "openvino"):
        try:
            check_formats([name])
        except ValueError:  # not written from this backend
            continue
        except ImportError as error:
            installs.append(str(error).rsplit(": ", 1)[-1])
        formats.append(name)
    if not formats:
        return None
    command = f"keras-preact-export {run_dir} --format {','.join(formats)}"
    return " && ".join([*dict.fromkeys(installs), command])


def export(run_dir, export_dir):
    if not export_lib.has_tensorflow():
        here = export_here_line(run_dir)
        print("[train] export skipped: SavedModel export needs TensorFlow (pip install tensorflow); "
              f"model.keras is saved. Export later with: keras-preact-export {run_dir} (where TensorFlow is "
              f"installed)" + (f", or here: {here}" if here else ""))
        return None
    from keras_preact.export import FORMATS

    backend = keras.backend.backend()
    if backend not in FORMATS["saved_model"].exporters:  # PyTorch: TensorFlow writes it, from the saved model.keras
        print(f"[train] exporting to {export_dir} on TensorFlow, in a child process (Keras writes no SavedModel "
              f"from the {backend} backend)", flush=True)
        try:
            path = export_lib.export_in_tensorflow(run_dir, export_dir)
        except RuntimeError as error:
            raise TrainingFailed(f"{error}; model.keras is saved: export it with keras-preact-export "
                                 f"{run_dir}") from None
    else:
        print(f"[train] exporting to {export_dir}", flush=True)
        path = export_lib.export_run(run_dir, export_dir)
    print(f"[train] exported SavedModel to {path}")
    return str(path)


if __name__ == "__main__":
    sys.exit(
        "keras_preact_training.train is the training library (train(config)); the command line is keras-preact-train "
        "(python -m keras_preact_training.cli), e.g.: keras-preact-train --preset synthetic-resnet8"
    )
