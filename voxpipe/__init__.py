"""voxpipe: fine-tune VoxCPM2 on your own voice data and ship the result."""

__version__ = "0.1.0"
