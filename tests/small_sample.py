"""A few rows per speaker of the shipped sample, for tests that run the whole pipeline (encode time
grows with the rows)."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample"
# ingest settings for test data that is nobody's voice (tones, noise, made-up rows): no consent record
TEST_CONSENT = {"consent": "not_required", "consent_reason": "test signals: nobody's voice"}
TEST_CONSENT_FLAGS = ["--consent", "not_required", "--consent-reason", "test signals: nobody's voice"]


def speech_16k(first: int, last: int = 0) -> list[np.ndarray]:
    """The first `first` and the last `last` clips of the sample's first shard (the two voices sit at its
    two ends), decoded and resampled to 16 kHz mono float32, as the scorers take them."""
    import soundfile as sf
    import soxr

    table = pq.read_table(sorted(SAMPLE.glob("*.parquet"))[0])
    rows = table.slice(0, first).to_pylist() + table.slice(len(table) - last, last).to_pylist()
    out = []
    for row in rows:
        wav, sr = sf.read(io.BytesIO(row["audio"]["bytes"]), dtype="float32")
        out.append(soxr.resample(wav, sr, 16_000).astype(np.float32))
    return out


def write_small_sample(dest: Path, per_speaker: int = 6) -> Path:
    """dest/train.parquet: the first `per_speaker` rows of each speaker, in the sample's schema, with the
    sample's consent records (dest/voices.yaml)."""
    table = pq.read_table(sorted(SAMPLE.glob("*.parquet"))[0])
    parts = [table.filter(pc.equal(table["speaker"], s)).slice(0, per_speaker)
             for s in sorted(set(table["speaker"].to_pylist()))]
    dest.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.concat_tables(parts), dest / "train.parquet")
    shutil.copy(SAMPLE / "voices.yaml", dest)
    return dest
