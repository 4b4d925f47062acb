"""A few rows per speaker of the shipped sample, for tests that run the whole pipeline (encode time
grows with the rows)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample"


def write_small_sample(dest: Path, per_speaker: int = 6) -> Path:
    """dest/train.parquet: the first `per_speaker` rows of each speaker, in the sample's schema."""
    table = pq.read_table(sorted(SAMPLE.glob("*.parquet"))[0])
    parts = [table.filter(pc.equal(table["speaker"], s)).slice(0, per_speaker)
             for s in sorted(set(table["speaker"].to_pylist()))]
    dest.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.concat_tables(parts), dest / "train.parquet")
    return dest
