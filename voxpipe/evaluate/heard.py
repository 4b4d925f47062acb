"""Can the recogniser hear a voice at all? Its WER (CER for Chinese) on the voice's own real recordings
says so.

A recogniser that gets most words of a speaker's real recordings wrong (pocketsphinx on a synthetic demo
voice, or on an accent it was not trained for: WER 0.92, 1.08) gets the generated clips of that voice
wrong too, whatever the model did: its WER there is the recogniser's failure, not the model's. So a voice
whose real clips in a language score above `evaluate.asr_max_real_rate` has no WER/CER in that language:
its generated clips' rates are null with the reason, and the flat figures are the mean over the voices
the recogniser can hear (null with the reason when it hears none). The promotion rule never reads these
rates (its forgetting criterion reads the benchmark's), so nothing else changes.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from voxpipe.evaluate.metrics import ClipMeasures
from voxpipe.evaluate.scoring import Rate, mean_rate


def real_rates_by_voice(records: list[dict[str, Any]], rates: list[Rate | None]) -> dict[str, dict[str, Any]]:
    """speaker -> language -> the recogniser's mean rate on that voice's real recordings (None: no clip
    could be scored), with its metric and how many clips it rests on."""
    out: dict[str, dict[str, Any]] = {}
    groups: dict[tuple[str, str], list[tuple[dict[str, Any], Rate | None]]] = {}
    for record, rate in zip(records, rates, strict=True):
        groups.setdefault((record["speaker"], record["language"]), []).append((record, rate))
    for (speaker, language), mine in sorted(groups.items()):
        out.setdefault(speaker, {})[language] = {
            "metric": mine[0][0]["metric"], "rate": mean_rate([rate for _, rate in mine]), "clips": len(mine),
        }
    return out


def unheard(by_voice: dict[str, dict[str, Any]], bound: float) -> dict[tuple[str, str], str]:
    """(speaker, language) -> why its generated clips get no WER/CER: the recogniser's rate on the
    speaker's real recordings is above `bound`."""
    out = {}
    for speaker, languages in by_voice.items():
        for language, real in languages.items():
            if real["rate"] is not None and real["rate"] > bound:
                metric = real["metric"].upper()
                # short: a summary line joins one per voice (the module docstring says why it follows)
                out[(speaker, language)] = (
                    f"the recogniser cannot hear voice {speaker!r} in {language}: its {metric} "
                    f"{real['rate']:.2f} on {real['clips']} real clip(s) > asr_max_real_rate {bound:g}")
    return out


def voice_report(by_voice: dict[str, dict[str, Any]], reasons: dict[tuple[str, str], str], speaker: str
                 ) -> dict[str, Any]:
    """eval.json's `voices.<speaker>.asr_real`: per language the real clips' rate, whether the recogniser
    hears the voice, and why not."""
    return {language: {**real, "heard": (speaker, language) not in reasons,
                       "reason": reasons.get((speaker, language))}
            for language, real in by_voice.get(speaker, {}).items()}


def without_unheard(clips: list[ClipMeasures], reasons: dict[tuple[str, str], str]) -> list[ClipMeasures]:
    """The clips with the rates of voices the recogniser cannot hear set to null with the reason (their
    transcripts stay, to read)."""
    out = []
    for clip in clips:
        r = clip.record
        reason = reasons.get((r["speaker"], r["language"]))
        if reason is None or r.get("metric") is None or r.get("asr") is None:
            out.append(clip)
            continue
        out.append(replace(clip, record={**r, r["metric"]: None, "asr_reason": reason}, rate=None))
    return out
