"""One voice per model: which clips of a long recording are its main voice, another voice, or two at once.

Each clip cut from a recording gets a GE2E speaker embedding (Resemblyzer, through consent_voice's
helpers) and the embeddings of its 1.6 s windows. The recording's voice is the enrolment clip's
embedding when the user names one (`ingest.segment.enrolment`), else its dominant voice: the clip with
the most clips within `speaker_threshold` of it, and the mean of those neighbours. Then each clip:

- below `speaker_threshold` to that voice: `other_speaker` (an interviewer, a director);
- at or above it, but with a window below `overlap_threshold`: `overlap`, two voices in one clip (one
  talking over the other, or a second voice joined on with no pause the VAD could cut at);
- otherwise kept.

The thresholds' defaults were measured on the demo's sessions (data/sample/make_sessions.py: the sample's
spk_m with spk_f as the interloper; benchmarks/raw_recordings.py prints them): the main voice's 27 clips
score 0.895-0.975 against the dominant voice and the interloper's 6 clips 0.51-0.58, so
`speaker_threshold` 0.72 (consent_voice's, midway) splits them with room either side. The windows of a
main-voice clip score 0.83 at the lowest, those of the interloper 0.46-0.59, and a window where the
interloper talks over the main voice 0.57-0.66 (four of the sample's clips with another's mixed over their
second half), so `overlap_threshold` 0.75 catches the overlaps and leaves the main voice's windows 0.08
clear. The VAD cannot tell one voice from two, so overlap is judged by the windows alone. Other voices,
microphones and rooms spread these figures: measure yours with the benchmark's code before relying on
them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from voxpipe.data.audio import AudioDecodeError, decode_native, to_mono_resampled
from voxpipe.data.consent_voice import embed_samples
from voxpipe.errors import StepError, quoted_path
from voxpipe.voxcpm2_format import SAMPLE_RATE


@dataclass(frozen=True)
class Verdict:
    reason: str  # "" = the recording's voice; other_speaker; overlap
    similarity: float | None  # the clip's cosine to the recording's voice (None: not compared)
    lowest_window: float | None  # its least similar 1.6 s window's


@cache
def enrolment_voice(path: str) -> np.ndarray:
    """The unit-norm embedding of the enrolment clip the user named."""
    try:
        native, rate = decode_native(Path(path))
    except (AudioDecodeError, ValueError, OSError) as e:
        raise StepError(f"ingest.segment.enrolment {quoted_path(path)} cannot be read as audio "
                        f"({str(e)[:120]}): name a clip of the voice to keep (WAV, FLAC, OGG, MP3), or set "
                        "it to \"\" to keep each recording's dominant voice") from None
    return embed_samples(to_mono_resampled(native, rate, SAMPLE_RATE))


def dominant_voice(embeddings: np.ndarray, threshold: float) -> np.ndarray:
    """The unit mean of the largest group of clips around one clip (cosine at least `threshold`)."""
    sims = embeddings @ embeddings.T
    close = sims >= threshold
    counts = close.sum(axis=1)
    best = max(range(len(embeddings)), key=lambda i: (counts[i], sims[i][close[i]].mean()))
    mean = embeddings[close[best]].mean(axis=0)
    return mean / np.linalg.norm(mean)


def judge_clips(clips: list[np.ndarray], speaker_threshold: float, overlap_threshold: float,
                enrolment: str = "") -> list[Verdict]:
    """A Verdict per 16 kHz clip of one recording, in order; with both thresholds at -1 (keep every voice)
    nothing is embedded."""
    if speaker_threshold <= -1 and overlap_threshold <= -1:
        return [Verdict("", None, None) for _ in clips]
    if not clips:
        return []
    import torch  # the encoder's (loaded with it): one thread, since the decode pool is the parallelism

    torch.set_num_threads(1)
    embedded = [embed_samples(clip, partials=True) for clip in clips]
    wholes = np.stack([whole for whole, _ in embedded])
    voice = enrolment_voice(enrolment) if enrolment else dominant_voice(wholes, speaker_threshold)
    verdicts = []
    for whole, windows in embedded:
        score = float(whole @ voice)
        lowest = float((windows @ voice).min()) if len(windows) else score
        reason = ("other_speaker" if score < speaker_threshold
                  else "overlap" if lowest < overlap_threshold else "")
        verdicts.append(Verdict(reason, round(score, 4), round(lowest, 4)))
    return verdicts
