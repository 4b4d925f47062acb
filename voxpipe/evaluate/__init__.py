"""`voxpipe evaluate`: evidence that a fine-tune learned and kept the voice (see step.py)."""
