"""Training recipes for every experiment of He et al. 2016 ("Identity Mappings in Deep Residual Networks").

Installed as ``keras_preact_training`` (this folder; ``training`` in a checkout). Python API::

    from training.configs import get_config
    from training.train import train

    result = train(get_config("t2-resnet110-full-preact", dataset="folder", data_dir="/tmp/cifar10-jpeg", epochs=2))
    result["test_accuracy"], result["run_dir"]

CLI: ``keras-preact-train --help`` (``python -m training.cli``), ``keras-preact-export RUN_DIR``,
``keras-preact-evaluate MODEL --data-dir DIR``, ``python -m training.reproduce --table 2``.

Modules, in the order data flows: ``configs`` (the ``Config`` dataclass and ``PRESETS``, one entry per
experiment of the paper); ``sources`` (synthetic / image-folder / TFDS data) -> ``pipelines`` (tf.data,
numpy and on-device input) with ``augment``; ``model`` (the network and its compilation) with
``optimizers`` and ``schedules``; ``distribute``; ``run_dir``, ``run_state`` and ``manifest`` (the run
directory, its backups and its ``config.json``); ``train`` (the ``model.fit`` loop); ``cli``,
``export``, ``evaluate``, ``reproduce``, ``plots``; ``console`` starts every console script (TensorFlow's
C++ start-up lines hidden). Nothing in ``keras_preact`` imports this package.
"""
