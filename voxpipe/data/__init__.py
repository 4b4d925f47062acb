"""Data steps: ingest, manifest, validate, encode, batching."""
