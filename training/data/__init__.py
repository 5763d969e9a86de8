"""What a run is trained on: data sources and the input pipelines (layout and rules: ``training/__init__.py``)."""
