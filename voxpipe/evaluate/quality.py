"""Clip quality (the `QUALITY` backends of voxpipe/backends.py): DNSMOS P.835, the only one.

The scorer itself is voxpipe/data/quality.py's (ingest scores clips with it too); this names it for
eval.json's `backends.quality`.
"""

from __future__ import annotations

from voxpipe.data.quality import Dnsmos


class DnsmosScorer(Dnsmos):
    backend = "dnsmos"
    model = "DNSMOS P.835 sig_bak_ovr.onnx (speechmos 0.0.1.1), windows of dnsmos_local.py"
