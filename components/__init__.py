"""KFP components: one thin typed wrapper per voxpipe step (steps.py) and what they share (shared.py)."""
