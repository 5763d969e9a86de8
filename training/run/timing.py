"""``EpochTimer``: each epoch's training and evaluation seconds, logged beside the metrics.

Keras times neither phase separately (``fit``'s progress bar mixes both), so speed figures from a run
directory (``benchmarks/train_speed_vs_pytorch.py``) read these two columns of ``history.csv``.
"""

import time

import keras


class EpochTimer(keras.callbacks.Callback):
    """Adds ``train_seconds`` (first batch to last, compilation included in a run's first epoch) and
    ``eval_seconds`` (the validation pass) to each epoch's logs; put it before ``CSVLogger``."""

    def __init__(self):
        super().__init__()
        self._train_start = self._eval_start = None
        self.train_seconds = self.eval_seconds = 0.0

    def on_epoch_begin(self, epoch, logs=None):
        self._train_start, self.eval_seconds = time.perf_counter(), 0.0

    def on_test_begin(self, logs=None):
        self._eval_start = time.perf_counter()
        if self._train_start is not None:  # validation inside fit: training ends here
            self.train_seconds = self._eval_start - self._train_start
            self._train_start = None

    def on_test_end(self, logs=None):
        self.eval_seconds = time.perf_counter() - self._eval_start

    def on_epoch_end(self, epoch, logs=None):
        if self._train_start is not None:  # no validation this epoch
            self.train_seconds = time.perf_counter() - self._train_start
            self._train_start = None
        if logs is not None:
            logs["train_seconds"] = round(self.train_seconds, 3)
            logs["eval_seconds"] = round(self.eval_seconds, 3)
