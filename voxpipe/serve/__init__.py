"""Serving: the MLflow pyfunc model, speech generation and `voxpipe synthesize`."""
