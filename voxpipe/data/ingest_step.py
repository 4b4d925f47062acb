"""`voxpipe ingest`: every input in one pass (ingest.py), or with `ingest.shards` > 1 planned, ingested
shard by shard and merged on this machine (ingest_shards.py, which builds on ingest.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from voxpipe.data.ingest import IngestResult, decode_workers, ingest_one_pass
from voxpipe.data.ingest_shards import ingest_sharded
from voxpipe.params import Params
from voxpipe.steps.ingest import IngestParams


def ingest(p: IngestParams, asr: Mapping[str, Any] | None = None) -> IngestResult:
    """Run the ingest step; raises StepError on run-level problems (after writing the reports). `asr`: the
    asr section's values (the recognisers' model folders), which `ingest.asr` loads from."""
    decode_workers(p.workers)  # too many is refused before planning
    return ingest_sharded(p, asr) if p.shards > 1 else ingest_one_pass(p, asr)


def ingest_step(params: Params) -> IngestResult:
    """`voxpipe ingest`: the ingest section, with the asr section's model folders (read by evaluate too)."""
    return ingest(params.ingest, params.asr.model_dump())
