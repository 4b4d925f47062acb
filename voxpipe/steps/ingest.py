"""`ingest`'s section and steps (one pass as a stage, or plan / shard / merge for a fan-out)."""

from __future__ import annotations

import typing
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from voxpipe.backends import ASR, listed
from voxpipe.section import Section
from voxpipe.steps import Out, Stage, Step
from voxpipe.voxcpm2_format import SAMPLE_RATE

Locale = Literal["en-US", "en-GB", "zh-CN"]  # text_rules.LOCALES: how a speaker says what is written
Locales = Locale | dict[str, Locale]  # ingest.locale: one for every row, or per speaker / input


class SegmentParams(Section):
    """How long recordings (audio files with no transcript) are cut into clips (embedded as
    `ingest.segment`); voxpipe/data/segment.py and one_voice.py say how, and where the defaults come from."""

    min_seconds: float = Field(2.0, ge=0, description="speech longer than max_seconds is cut where both "
                               "parts are at least this long, when a pause allows; a shorter stretch "
                               "between two pauses stays a clip of its own (never joined across a pause)")
    max_seconds: float = Field(15.0, gt=0, description="longest clip: longer speech is cut at its longest "
                               "internal pause; speech this long with no pause is quarantined (no_pause), "
                               "never cut mid-word")
    pad_seconds: float = Field(0.2, ge=0, description="silence kept before and after each clip, at most "
                               "half the pause it lies in")
    min_pause_seconds: float = Field(0.4, gt=0, description="a pause at least this long ends a clip")
    vad_threshold: float = Field(0.5, gt=0, lt=1, description="Silero VAD speech probability a frame needs "
                                 "to count as speech")
    speaker_threshold: float = Field(
        0.72, ge=-1, le=1, description="a clip whose speaker embedding (Resemblyzer GE2E) matches the "
        "recording's dominant voice (or the enrolment clip's) less than this (cosine) is quarantined "
        "(other_speaker); -1 = keep every voice (with overlap_threshold -1 too, no clip is embedded). "
        "Measured: docs/data-at-scale.md"
    )
    overlap_threshold: float = Field(
        0.75, ge=-1, le=1, description="a clip of the recording's voice with a 1.6 s window matching it less "
        "than this holds a second voice (overlap: quarantined); -1 = never"
    )
    enrolment: str = Field("", description='a clip of the voice to keep; "" = each recording\'s dominant '
                           "voice")


class IngestParams(Section):
    """`ingest`: your audio and transcripts, checked and decoded once to 16 kHz mono FLAC + raw.jsonl."""

    input: list[str] = Field(
        default_factory=lambda: ["data/sample"], description="parquet files, .csv/.tsv/.jsonl manifests "
        "(path, text, speaker columns), LJSpeech-layout folders (metadata.csv + wavs/), or folders of them; "
        "a folder with none of these: its audio files are long recordings, cut into clips (segment)",
        json_schema_extra={"result": False},
    )
    out: str = Field(
        "work/ingest", description="output folder: raw.jsonl, the decoded 16 kHz FLAC audio, the "
        "quarantined rows, report.json",
        json_schema_extra={"result": False, "wired": True},
    )
    text_column: str = Field(
        "text", description="column with the transcript (`transcription` / `sentence` style sets: name it "
        "here)"
    )
    audio_column: str = Field(
        "audio", description="column with the audio: a HF struct {bytes, path}, plain bytes, or a path "
        "string"
    )
    speaker_column: str = Field(
        "speaker", description='speaker id column; a file without it (or "") is one speaker named after the '
        "folder that holds it (data/my-voice -> my-voice), with a notice"
    )
    sample_rate: int = Field(
        SAMPLE_RATE, gt=0,
        description="Hz every clip is resampled to (the AudioVAE's 16 kHz); validate checks against it",
    )
    min_seconds: float = Field(
        0.3, ge=0, description="shortest clip kept (shorter: quarantined, too_short); validate checks "
        "against it"
    )
    max_seconds: float = Field(
        30.0, gt=0, description="longest clip kept (longer: quarantined, too_long); validate checks "
        "against it"
    )
    silence_threshold: float = Field(
        1e-3, ge=0, description="a clip whose peak amplitude is at most this is silent and quarantined"
    )
    max_bad_fraction: float = Field(
        0.5, ge=0, le=1, description="fail, after writing the good rows, when a larger share of rows is "
        "quarantined",
        json_schema_extra={"result": False},
    )
    trim_silence: bool = Field(
        True, description="cut leading and trailing silence to at most max_edge_silence (the original "
        "duration and the cut are kept in raw.jsonl)"
    )
    max_edge_silence: float = Field(
        0.5, ge=0, description="seconds of silence kept at each end of a clip when trimming (upstream "
        "advises under 0.5 s: longer trailing silence teaches the model not to stop)"
    )
    max_internal_pause: float = Field(
        1.0, gt=0, description="a silence inside a clip longer than this many seconds flags the row "
        "(long_pause); it is not cut"
    )
    normalize_loudness: bool = Field(
        True, description="bring every clip to target_lufs (ITU-R BS.1770), held under a -0.26 dBFS peak"
    )
    target_lufs: float = Field(-23.0, ge=-70, le=-5, description="integrated loudness every clip is "
                               "brought to, in LUFS (EBU R128's -23 by default)")
    max_clipped_fraction: float = Field(
        0.001, ge=0, le=1, description="a clip with a larger share of samples at full scale is quarantined "
        "(clipped); 1 = never"
    )
    score_quality: bool = Field(
        True, description="score every kept clip with DNSMOS P.835 (sig, bak, ovrl in raw.jsonl; about "
        "0.3 s of CPU per clip of up to 9 s)"
    )
    min_quality: float = Field(
        2.0, ge=0, le=5, description="a clip whose DNSMOS quality_score (1-5) is below this is quarantined "
        "(low_quality); 0 = keep all. Needs score_quality"
    )
    quality_score: Literal["bak", "sig", "ovrl"] = Field(
        "bak", description="the DNSMOS score min_quality bounds: bak (background noise; it separates "
        "noisy from clean recordings even for synthetic voices, whose sig and ovrl are low however "
        "clean), sig (the voice), ovrl (overall; natural-speech corpora filter on ovrl >= 3)"
    )
    normalize_text: bool = Field(
        True, description="spell out numbers, dates, money and units in the row's language (zh, en: "
        "wetext); raw.jsonl keeps the original as text_raw"
    )
    language: str = Field(
        "", pattern=r"^([a-z]{2})?$", description='ISO 639-1 code of every row ("zh", "en"); "" = detected '
        "per row from the script of its text. Travels with the row to evaluate"
    )
    locale: Locales = Field(
        "en-US", description="how the speaker says what is written (text normalization): en-GB reads "
        "12/05/2026 as 12 May, spells metres, says 0 in a digit string as oh (en-US: zero) and £5.25 as five "
        "pounds twenty five; a row of another language is read in that language's default (zh-CN). Per "
        "voice: a mapping {speaker or input file/folder: locale} (a speaker outranks its source; one named "
        "by neither is en-US). Each row records its locale; register records the voices' with the model"
    )
    asr: list[Literal[*ASR]] = Field(  # type: ignore[valid-type]
        default_factory=list, description="recognisers that transcribe a row with no text, as evaluate.asr "
        f"names them: {listed(ASR)}, models from the asr section's folders. A row's language "
        "(ingest.language, else its locale's) takes the first that covers it; one none covers is quarantined "
        "(no_recogniser). [] = a row with no text is quarantined (missing_text)"
    )
    asr_second: list[Literal[*ASR]] = Field(  # type: ignore[valid-type]
        default_factory=list, description="a second opinion on each transcribed row (the first of these "
        "that covers its language): a CER against the first's transcript above asr_max_cer marks the row "
        "needs_review. [] = none"
    )
    asr_min_confidence: float = Field(
        -1.0, le=0, description="a transcript whose confidence (the recogniser's average natural-log "
        "probability per word or token; Whisper's avg_logprob) is below this marks its row needs_review"
    )
    asr_max_cer: float = Field(
        0.2, ge=0, description="the most the asr_second transcript may differ from the first (character "
        "error rate) before the row is marked needs_review"
    )
    max_text_chars: int = Field(
        2000, ge=1, le=1_000_000, description="longest transcript kept, in characters: a longer row is "
        "quarantined (text_too_long) before its text is normalized, so no row can stall ingest (one clip "
        "of at most max_seconds says a few hundred)"
    )
    consent: Literal["required", "not_required"] = Field(
        "required", description="required: a speaker's rows are kept only with a valid consent record (not "
        "expired or revoked, scope tts) in the voices.yaml of its input folder, else quarantined "
        "(no_consent); not_required: no check, and consent_reason says why (report.json, the cards)"
    )
    consent_reason: str = Field(
        "", max_length=500, description="why consent is not required (e.g. a licensed corpus whose "
        "licence covers training); needed with consent: not_required, recorded in report.json"
    )
    consent_voice_threshold: float = Field(
        0.72, ge=-1, le=1, description="a consent record of kind person: its recording's speaker embedding "
        "(Resemblyzer GE2E) must match the mean of the speaker's clips at least this well (cosine), else "
        "the speaker's rows are quarantined (consent_voice_mismatch). 0.72: midway between same voice "
        "(>= 0.816) and other voice (<= 0.618) on the shipped sample"
    )
    corrections: str = Field(
        "data/corrections.jsonl", description="the proofreading page's corrections (JSON lines: row id, the "
        "old text's sha256, keep / fix with the new text / drop), applied on the next run: a fix is "
        "normalized as typed text, a drop quarantined (dropped_in_review), a line whose row or old text no "
        "longer matches reported, not applied. A missing file: nothing proofread. A DVC dep of ingest",
        json_schema_extra={"result": False},
    )
    segment: SegmentParams = Field(default_factory=SegmentParams)
    workers: int = Field(0, ge=0, description="decode processes; 0 = all cores; more than the usable cores "
                         "is refused", json_schema_extra={"result": False})
    shards: int = Field(
        1, ge=1, description="shards of about equal audio volume: `voxpipe ingest` plans, ingests them one "
        "by one and merges (same raw.jsonl as 1); the KFP pipeline runs one task per shard in parallel",
        json_schema_extra={"result": False},
    )
    plan: str = Field("", description="ingest-shard / ingest-merge: the plan.json of ingest-plan",
                      json_schema_extra={"wired": True, "shard": True})
    shard: int = Field(0, ge=0, description="ingest-shard: which shard of the plan to ingest",
                       json_schema_extra={"wired": True, "shard": True})
    shard_dirs: list[str] = Field(
        default_factory=list, description="ingest-merge: the ingest-shard output folders, any order",
        json_schema_extra={"wired": True, "shard": True},
    )

    @field_validator("locale", mode="before")
    @classmethod
    def _one_locale_or_a_mapping(cls, value: Any) -> Any:
        """One line naming the wrong value, not one per member of the union."""
        known = typing.get_args(Locale)
        given = list(value.values()) if isinstance(value, dict) else [value]
        bad = [v for v in given if not isinstance(v, str) or v not in known]
        if bad:
            raise ValueError(f"{str(bad[0])[:40]!r} is not a locale: give one of {', '.join(known)}, or a "
                             "mapping {speaker or input: locale}")
        return value

    @model_validator(mode="after")
    def _a_reason_without_consent(self) -> IngestParams:
        if self.consent == "not_required" and not self.consent_reason.strip():
            raise ValueError("ingest.consent is not_required but ingest.consent_reason is empty: say why "
                             "these voices may be trained on without a consent record (it goes into the "
                             "report and the cards), or set ingest.consent: required")
        return self


# the per-shard keys (marked `shard`): set by ingest-shard / ingest-merge, no flag of `voxpipe ingest`
SHARD_KEYS = tuple(f"ingest.{name}" for name, info in IngestParams.model_fields.items()
                   if isinstance(info.json_schema_extra, dict) and info.json_schema_extra.get("shard"))


ORDER = 10
SECTIONS = {"ingest": IngestParams}

STEPS = (
    Step("ingest", "parquet / CSV / JSONL / LJSpeech folder → 16 kHz mono FLAC + raw.jsonl, bad rows "
         "quarantined", target="voxpipe.data.ingest_step:ingest_step", reads=("ingest", "asr"),
         hide=SHARD_KEYS,
         stage=Stage(
             deps=("${ingest.input[0]}", "${ingest.corrections}"),
             outs=(Out("${ingest.out}", persist=True, note="a rerun reuses the audio already written"),),
             notes=(("${ingest.input[0]}", "more than one ingest.input: list the others here too"),
                    ("${ingest.corrections}", "the proofreading page's decisions (an empty file: none)")))),
    Step("ingest-plan", "sharded ingest, 1/3: split the inputs into shards of equal audio volume: "
         "out/plan.json", target="voxpipe.data.ingest_shards:plan", section="ingest",
         reads=("ingest.input", "ingest.out", "ingest.shards", "ingest.text_column", "ingest.audio_column",
                "ingest.speaker_column", "ingest.consent", "ingest.consent_reason", "ingest.corrections")),
    Step("ingest-shard", "sharded ingest, 2/3: ingest one shard of a plan into its own folder",
         target="voxpipe.data.ingest_shards:ingest_shard_step",
         reads=("ingest.plan", "ingest.shard", "ingest.out", "ingest.workers", "asr")),
    Step("ingest-merge", "sharded ingest, 3/3: merge the shards into one output, as `voxpipe ingest` "
         "writes it", target="voxpipe.data.ingest_shards:merge", section="ingest",
         reads=("ingest.plan", "ingest.shard_dirs", "ingest.out")),
)
