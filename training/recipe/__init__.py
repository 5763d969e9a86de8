"""What is trained and how: the paper's recipe as ``Config`` presets, flags, schedules, the optimizer, the
on-device augmentation and the compiled model (layout and rules: ``training/__init__.py``)."""
