"""Model FLOPs utilisation: analytic step FLOPs, device peaks, and the `voxpipe mfu` report."""
