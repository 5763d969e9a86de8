"""Training recipes for every experiment of He et al. 2016 ("Identity Mappings in Deep Residual Networks").

Python API::

    from training.configs import get_config, PRESETS
    from training.train import train

    config = get_config("cifar10-resnet110-preact", epochs=2, steps_per_epoch=10, dataset="synthetic")
    result = train(config)        # {"run_dir": ..., "test_accuracy": ..., ...}

CLI: ``python -m training.train --help`` (console script ``keras-preact-train``).

Modules: ``configs`` (the ``Config`` dataclass and the ``PRESETS`` table, one entry per paper
experiment), ``data`` (synthetic / image-folder / TFDS data, tf.data and numpy pipelines),
``schedules`` (warm-up + step learning rates from ``keras.optimizers.schedules``), ``distribute``
(strategies and ``keras.distribution``), ``plots`` (training curves PNG), ``train`` (CLI + API).
Nothing in ``keras_preact`` imports this package.
"""
