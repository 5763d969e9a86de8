"""Where a run runs: the Keras backend, the quiet start-up, devices and strategies, host memory, Keras
internals (layout and rules: ``training/__init__.py``)."""
