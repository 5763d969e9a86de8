"""Training recipes for every experiment of He et al. 2016 ("Identity Mappings in Deep Residual Networks").

The training app, beside the model library ``keras_preact``. Its import name is ``keras_preact_training``
(from the folder ``training/``), the same in a checkout and installed (``pip install keras-preact[train]``),
so that no ``training`` package of a user's own shadows it. Python API::

    from keras_preact_training.recipe.configs import get_config
    from keras_preact_training.train import train

    result = train(get_config("t2-resnet110-full-preact", dataset="folder", data_dir="/tmp/cifar10-jpeg", epochs=2))
    result["test_accuracy"], result["run_dir"]

CLI: ``keras-preact-train --help`` (``python -m keras_preact_training.cli``), ``keras-preact-export RUN_DIR``,
``keras-preact-evaluate MODEL --data-dir DIR``, ``python -m keras_preact_training.reproduce --table 2``.

Layout. The top level holds what a user runs, each module a job with its Python API and its command line;
the four rooms hold what the jobs are made of::

    training/
      train.py          train(config): the model.fit loop; a run directory in, metrics out
      cli.py            keras-preact-train: train's command line (the backend set before Keras loads)
      export.py         export_run(run_dir) / keras-preact-export: SavedModel, ONNX, LiteRT, OpenVINO
      evaluate.py       keras-preact-evaluate: top-1/top-5 of a registry name, a run or a .keras file
      publish.py        python -m keras_preact_training.publish: a run's weights as a registry network's
      reproduce.py      python -m keras_preact_training.reproduce: a table of the paper, ours beside theirs
      carry.py          python -m keras_preact_training.carry: a run's resumable files, to resume it on another machine
      backend_probe.py  keras-preact-train --measure-backends: a few timed training steps of a run's model per backend
      console.py        the console scripts' entry points (pyproject.toml [project.scripts])
      machine/          where a run runs (it imports no other room)
        start_up.py     the launcher: TensorFlow's start-up settings, before Keras loads (standard library only)
        backends.py     which Keras backend: Keras' own choice or --backend (standard library only)
        compat.py       every use of a Keras internal, with the version it was checked against
        distribute.py   --distribute: one device, MirroredStrategy, MultiWorkerMirroredStrategy
        memory_guard.py host memory watched: one line before the kernel's OOM killer (standard library only)
      recipe/           what is trained and how: the paper's recipe
        configs.py      Config and PRESETS (one per experiment), validated
        flags.py        Config's fields as command-line flags
        schedules.py    learning-rate schedules
        optimizers.py   TorchSGD (optim.sgd step for step)
        augment.py      CIFAR augmentation and normalization inside the compiled step
        model.py        the network, wrapped for model.fit and compiled
      data/             what it is trained on
        sources.py      synthetic / image-folder / TFDS data
        pipelines.py    tf.data, numpy and on-device input streams
      run/              a run directory's life: created, locked, backed up, resumed, recorded
        run_state.py    what a killed run left, disk-full checks
        run_dir.py      the directory and its atomic writes; backups
        run_lock.py     one owner per run directory
        manifest.py     config.json (RunManifest): the one description of a run
        resume.py       a resume checked against the manifest
        timing.py       each epoch's training and evaluation seconds
        plots.py        training curves (history.csv -> PNG)

Rules (tests/test_training_layout.py checks them from the source):

- No module imports one that imports it back, directly or through others, counting imports inside
  functions and ``__main__`` blocks.
- Rooms import downwards only, in the order ``machine`` < ``recipe`` < ``data``, ``run``: a room module
  imports its own room and the rooms before it (``data`` and ``run`` do not import each other), never the
  top level. The top-level jobs import any room and each other (``train`` calls ``export``).
- ``__init__`` files import nothing, so ``import keras_preact_training.console`` (the console scripts, the serving
  app's too) loads no Keras: ``machine/start_up.py`` is standard library only; each console script calls
  its ``launch`` before Keras loads.
- Nothing in ``keras_preact`` imports this package.
"""
