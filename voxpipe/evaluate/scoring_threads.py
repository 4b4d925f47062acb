"""evaluate's scorers on threads beside generation, so that the machine's cores all work.

Scoring a clip costs more than making it on the CPU (run.json's `costs`: DNSMOS alone more than
generation, then ASR, pitch and the speaker encoder). While the main thread loads the next checkpoint
and generates:
- DNSMOS runs on a pool of one thread per core this process may use (its affinity and cgroup quota,
  voxpipe/cores.py). It is the longest chain, so a core the others leave idle takes its next
  clip. Its one onnxruntime session runs each window on the calling thread alone (intra-op threads: 1),
  so a clip's score does not depend on which thread or how many score beside it.
- the speaker encoder and pitch run on a voice thread: the real voices first, then each clip, then the
  benchmark set's similarities;
- the recognisers run on an ASR thread: the real recordings, then each clip, then the benchmark set.
  pocketsphinx decodes in a child process (asr.py), so this thread mostly waits, GIL released.
Every scorer but DNSMOS stays on its one thread (pocketsphinx's decoder is not thread-safe). Every clip is
scored by the same code on the same samples as when one step follows the other, so the figures are the
same; torch runs on one intra-op thread (step.py's CPU_THREADS). Waiting on a result raises the scorer's
error there.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import Any, TypeVar

from voxpipe.cores import usable_cores
from voxpipe.evaluate.costs import Costs
from voxpipe.evaluate.generation import Generated
from voxpipe.evaluate.metrics import (
    ClipMeasures,
    Scorers,
    Voice,
    clip_16k,
    clip_intelligibility,
    clip_quality,
    measure,
)

T = TypeVar("T")


class ScoringThreads:
    """DNSMOS threads (one per core), a voice thread and an ASR thread; `with` it: leaving waits for what
    was queued (or cancels it, on an error)."""

    def __init__(self, scorers: Scorers, costs: Costs) -> None:
        self.scorers, self.costs = scorers, costs
        self._quality = ThreadPoolExecutor(usable_cores(), thread_name_prefix="voxpipe-dnsmos")
        self._voice = ThreadPoolExecutor(1, thread_name_prefix="voxpipe-voice")
        self._asr = ThreadPoolExecutor(1, thread_name_prefix="voxpipe-asr")

    def __enter__(self) -> ScoringThreads:
        return self

    def __exit__(self, kind: Any, *_: Any) -> None:
        for pool in (self._quality, self._voice, self._asr):
            pool.shutdown(wait=True, cancel_futures=kind is not None)

    def voice(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """`fn(*args)` on the voice thread, after what was queued there before it."""
        return self._voice.submit(fn, *args)

    def asr(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """`fn(*args)` on the ASR thread, after what was queued there before it."""
        return self._asr.submit(fn, *args)

    def clip(self, clip: Generated, voices: dict[str, Future[Voice]]) -> Callable[[], ClipMeasures]:
        """Queue one clip's scoring; the returned call waits for it and gives its measures."""
        wav = clip_16k(clip)
        mos = self._quality.submit(clip_quality, wav, self.scorers, self.costs)
        heard = self._asr.submit(clip_intelligibility, clip, wav, self.scorers, self.costs)
        rest = self._voice.submit(
            lambda: measure(clip, wav, {name: v.result() for name, v in voices.items()}, self.scorers,
                            self.costs))

        def result() -> ClipMeasures:
            measures, (words, rate) = rest.result(), heard.result()
            return replace(measures, record={**measures.record, **words, "mos": mos.result()}, rate=rate)

        return result
