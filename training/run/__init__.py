"""A run directory's life: created, locked, backed up, resumed, recorded in ``config.json``, plotted (layout
and rules: ``training/__init__.py``)."""
