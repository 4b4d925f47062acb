"""evaluate's scorers on two threads beside generation, so that the machine's cores all work.

Scoring a clip costs more than making it on the CPU (run.json's `costs`: DNSMOS alone about as much as
generation, then pitch, ASR and the speaker encoder). One thread runs DNSMOS, the other the voice's
scorers (the real voices first, then each clip's speaker embedding, pitch and ASR, then the real
recordings' ASR and the benchmark set's scores), while the main thread loads the next checkpoint and
generates. Each scorer only ever runs on one thread (pocketsphinx's decoder is not thread-safe), and
every clip is scored by the same code on the same samples as when one step follows the other, so the
figures are the same; torch runs on one intra-op thread (step.py's CPU_THREADS), onnxruntime on its own
fixed one. Waiting on a result raises the scorer's error there.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import Any, TypeVar

from voxpipe.evaluate.costs import Costs
from voxpipe.evaluate.generation import Generated
from voxpipe.evaluate.metrics import ClipMeasures, Scorers, Voice, clip_16k, clip_quality, measure

T = TypeVar("T")


class ScoringThreads:
    """A DNSMOS thread and a voice thread; `with` it: leaving waits for what was queued (or cancels it,
    on an error)."""

    def __init__(self, scorers: Scorers, costs: Costs) -> None:
        self.scorers, self.costs = scorers, costs
        self._quality = ThreadPoolExecutor(1, thread_name_prefix="voxpipe-dnsmos")
        self._voice = ThreadPoolExecutor(1, thread_name_prefix="voxpipe-voice")

    def __enter__(self) -> ScoringThreads:
        return self

    def __exit__(self, kind: Any, *_: Any) -> None:
        for pool in (self._quality, self._voice):
            pool.shutdown(wait=True, cancel_futures=kind is not None)

    def voice(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """`fn(*args)` on the voice thread, after what was queued there before it."""
        return self._voice.submit(fn, *args)

    def clip(self, clip: Generated, voices: dict[str, Future[Voice]]) -> Callable[[], ClipMeasures]:
        """Queue one clip's scoring; the returned call waits for it and gives its measures."""
        wav = clip_16k(clip)
        mos = self._quality.submit(clip_quality, wav, self.scorers, self.costs)
        rest = self._voice.submit(
            lambda: measure(clip, wav, {name: v.result() for name, v in voices.items()}, self.scorers,
                            self.costs))

        def result() -> ClipMeasures:
            measures = rest.result()
            return replace(measures, record={**measures.record, "mos": mos.result()})

        return result
