"""`voxpipe ingest`: every input in one pass (ingest.py), or with `ingest.shards` > 1 planned, ingested
shard by shard and merged on this machine (ingest_shards.py, which builds on ingest.py)."""

from __future__ import annotations

from voxpipe.data.ingest import IngestResult, decode_workers, ingest_one_pass
from voxpipe.data.ingest_shards import ingest_sharded
from voxpipe.steps.ingest import IngestParams


def ingest(p: IngestParams) -> IngestResult:
    """Run the ingest step; raises StepError on run-level problems (after writing the reports)."""
    decode_workers(p.workers)  # too many is refused before planning
    return ingest_sharded(p) if p.shards > 1 else ingest_one_pass(p)
