"""`evaluate`'s section and step (a stage): the fixed-seed gate against the base.

The speaker encoders' own settings (evaluate.wavlm_model, ...) are composed in from voxpipe/backends.py;
the recognisers' (asr.whisper_model, ...) are the `asr` section's, which ingest reads too."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from voxpipe.backends import ASR, SPEAKER, backend_settings, listed
from voxpipe.section import Section
from voxpipe.steps import Out, Stage, Step


class EvaluateCore(Section):
    """evaluate's own settings: each backend's are its settings model's (voxpipe/backends.py)."""

    @field_validator("asr", mode="before")
    @classmethod
    def _asr_switch(cls, value: Any) -> Any:
        """`evaluate.asr=true|false` (the switch it used to be): the bundled recogniser, or none."""
        if isinstance(value, bool) or value in ("true", "false"):
            return ["pocketsphinx"] if value in (True, "true") else []
        return [value] if isinstance(value, str) else value

    model: str = Field(
        "work/train/exports", description="the fine-tune: a folder of step-N exports (train.export_every; "
        "each is scored and the promotion rule picks one) or one checkpoint folder (upstream layout)",
        json_schema_extra={"result": False, "wired": True},
    )
    data: str = Field("work/encoded", description="`encode` output folder (val.jsonl, train.jsonl, shards)",
                      json_schema_extra={"result": False, "wired": True})
    out: str = Field(
        "work/eval", description="output folder: eval.json, samples/*.wav, eval.png, report.json",
        json_schema_extra={"result": False, "wired": True},
    )
    device: Literal["auto", "cpu", "cuda", "npu"] = Field(
        "auto", description="auto = npu, else cuda, else cpu"
    )
    seeds: list[int] = Field(
        default_factory=lambda: [0, 1, 2], min_length=1,
        description="fixed-seed loss seeds (flow-matching t and noise); mean and spread over them",
    )
    texts_per_speaker: int = Field(
        8, ge=1, description="val texts generated per speaker, each with and without a reference (train "
        "texts fill in where val has fewer); the evidence behind the similarity CIs and the split flag"
    )
    similarity_tolerance: float = Field(
        0.05, ge=0, description="promotion rule: a speaker's mean similarity may fall at most this far "
        "below the baseline's (the evaluate.speaker encoder's cosine)"
    )
    max_len: int = Field(
        0, ge=0, description="generation limit in patches (160 ms each); 0 = twice the real clip + 2 s. "
        "Reaching it is a stop failure"
    )
    cfg_value: float = Field(2.0, gt=0, description="classifier-free guidance scale")
    inference_timesteps: int = Field(10, gt=0, description="Euler steps per patch")
    generation_seed: int = Field(0, description="seed of the generated samples")
    min_duration_ratio: float = Field(
        0.5, gt=0, lt=1, description="a generated clip shorter than this fraction of its expected length "
        "(the speaker's speaking rate, seconds per character, times the text's characters) stopped "
        "prematurely: a stop failure, as is reaching max_len"
    )
    # the choices are voxpipe/backends.py's registries: a backend registered there is a valid name here
    asr: list[Literal[*ASR]] = Field(  # type: ignore[valid-type]
        default_factory=lambda: ["pocketsphinx"], description="recognisers for WER/CER, each language takes "
        f"the first that covers it: {listed(ASR)}; a language none covers gets null. "
        "true = [pocketsphinx], false = []"
    )
    asr_max_real_rate: float = Field(
        0.5, gt=0, description="the most WER (CER for Chinese) a recogniser may have on a voice's real "
        "recordings in a language for it to score that voice's generated clips in it; above it the voice's "
        "WER/CER is null with the reason (the recogniser cannot hear that voice, so its figure means nothing)"
    )
    speaker: Literal[*SPEAKER] = Field(  # type: ignore[valid-type]
        "resemblyzer", description=f"speaker-similarity encoder: {listed(SPEAKER)}"
    )
    benchmark: str | None = Field(
        None, description="local folder of a standard test set in Seed-TTS-eval's layout (a folder with "
        "meta.lst, lines `utt|prompt_text|prompt_wav|infer_text`, prompt_wav relative to it; or a .lst file; "
        "e.g. seedtts_testset/en): "
        "every line is generated with the base and the fine-tune, same seeds, and scored with the protocol's "
        "WER/CER and SIM; the rule's forgetting criterion. None = no benchmark",
    )
    forget_tolerance: float = Field(
        0.02, ge=0, description="promotion rule: the fine-tune's benchmark WER/CER (a fraction, 0.02 = 2 "
        "points) may rise at most this far above the base's (evaluate.benchmark; null without one)"
    )
    mos_tolerance: float = Field(
        0.1, ge=0, description="promotion rule: the DNSMOS overall MOS (1-5) may fall at most this far below "
        "the baseline's"
    )
    listening: Literal["off", "advisory", "required"] = Field(
        "advisory", description="the blind listening test: advisory writes listen.html (the base's "
        "zero-shot clone vs the fine-tune, the real recording as anchor) and its sealed listen-key.json "
        "beside eval.json; required also keeps @champion where it is until `voxpipe listen-record` records a "
        "test that prefers the fine-tune or finds it no worse; off writes neither"
    )
    noise_runs: int = Field(
        0, ge=0, description="measure the noise floor: generate and score the chosen checkpoint's clips "
        "again under this many other generation seeds and record how far each figure's gain interval "
        "against itself reaches from zero (the worst seed) in <out>/noise.json (kept across runs); while "
        "it fits the evaluation (val set, encoder, generation settings) the rule takes its similarity and "
        "DNSMOS tolerances from it instead of the constants. 0 = measure nothing"
    )
    average_top_k: int = Field(
        0, ge=0, description="also score the uniform average of the k exports with the lowest fixed-seed "
        "loss (CosyVoice's average_model.py --val_best), written to out/average/, as one more candidate "
        "the promotion rule may choose (0 = off)",
    )
    rescore_champion: bool = Field(
        True, description="when the voice's registered @champion was scored on another val set (its data "
        "changed), re-score its export's fixed-seed loss on this one, so register decides on the same data",
        json_schema_extra={"result": False},
    )
    require_improvement: bool = Field(
        False, description="fail unless the promotion rule passes against the baseline (loss better by more "
        "than the seed spread, voice kept: docs/evaluation.md)",
        json_schema_extra={"result": False},
    )


# the core's fields, then every registered speaker backend's settings (voxpipe/backends.py): a backend with
# a setting is registered there and named nowhere here (the recognisers' are the `asr` section's)
class EvaluateParams(*backend_settings(SPEAKER), EvaluateCore):  # type: ignore[misc]
    """`evaluate`: fixed-seed loss and generation metrics of a fine-tuned model against its baseline."""


ORDER = 90
SECTIONS = {"evaluate": EvaluateParams}

STEPS = (
    Step("evaluate", "fixed-seed loss and voice metrics vs the base model: eval.json (DVC metric), samples/, "
         "eval.png", target="voxpipe.evaluate.step:evaluate",
         reads=("evaluate", "asr", "model.base", "model.kernels", "train.max_tokens", "register.model_name",
                "ingest.input", "tracking.uri", "tracking.work", "synthesize.watermark"),
         # the registry the voice's champion is fetched from, to re-score (voxpipe/track/champion.py)
         wires=(("champion", "voxpipe.track.champion:champion_export"),),
         untracked=("register.model_name", "ingest.input", "tracking.uri", "tracking.work"),
         stage=Stage(
             deps=("${evaluate.model}", "${model.base}", "${evaluate.data}", "${ingest.out}"),
             outs=(Out("${evaluate.out}/samples"), Out("${evaluate.out}/eval.png"),
                   Out("${evaluate.out}/exports.png"), Out("${evaluate.out}/report.json")),
             metrics=(Out("${evaluate.out}/eval.json", cache=False),
                      Out("${evaluate.out}/noise.json", persist=True, cache=False,
                          note="evaluate.noise_runs' noise floor: kept until measured again")),
             notes=(("${ingest.out}", "the speakers' real clips"),
                    ("train.max_tokens", "the val batches are the trainer's")))),
)
