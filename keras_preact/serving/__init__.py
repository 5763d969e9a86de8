"""A TF-Serving-compatible REST server for exported SavedModels (``keras-preact-serve``)."""
