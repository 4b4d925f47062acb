"""One typed schema for every step's parameters.

params.yaml, `--set section.key=value` overrides and step flags all land here, so DVC stages,
KFP components and make targets see the same validated values. Unknown keys and wrong types are
rejected with a message that names the key.

A field's `json_schema_extra` says what kind of setting it is; every list of keys that depends on it is
derived from these marks (voxpipe/paramspec.py), never written down again:
- unmarked: the value changes the step's result (DVC tracks it as a param: voxpipe/dvcgen.py);
- `{"result": False}`: it does not: logging, progress, worker counts, guards that only fail a run, and
  paths (what a path holds is a DVC dep or out; the path itself is not). A checkpoint resumes across it;
- `{"weights": False}`: it changes the outputs but not the weights at a step (`train.max_steps`,
  `train.export_dtype`), so a checkpoint still resumes across it (voxpipe/train/resume.py);
- `{"wired": True}`: an orchestrator sets it from earlier steps' outputs (KFP: no pipeline parameter);
- `{"shard": True}`: one shard's setting (`ingest-shard`, `ingest-merge`; no flag of `voxpipe ingest`).
"""

from __future__ import annotations

import re
import typing
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from voxpipe.accelerators import DEVICE_MEMORY_GIB
from voxpipe.backends import ASR, SPEAKER, listed
from voxpipe.errors import StepError, quoted
from voxpipe.voxcpm2_format import SAMPLE_RATE

DEFAULT_PARAMS = Path("params.yaml")
MODEL_NAME_CHARS = 100  # a registered model name derived from the data is cut here
RECIPE_DIRS = (Path("recipes"), Path(__file__).resolve().parents[1] / "recipes")


class _Loader(yaml.SafeLoader):
    """YAML with YAML 1.2 floats: PyYAML's 1.1 rules read `3e-4` (no dot) as a string."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$|^[-+]?\.(inf|Inf|INF)$|^\.(nan|NaN|NAN)$"),
    list("-+0123456789."),
)


def _yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)


class Section(BaseModel):
    # allow_inf_nan=False: every float key must be finite (`train.lr=.inf` would export NaN weights)
    model_config = ConfigDict(extra="forbid", strict=True, validate_assignment=True, allow_inf_nan=False)


Locale = Literal["en-US", "en-GB", "zh-CN"]  # text_rules.LOCALES: how a speaker says what is written
Locales = Locale | dict[str, Locale]  # ingest.locale: one for every row, or per speaker / input


class IngestParams(Section):
    """`ingest`: your audio and transcripts, checked and decoded once to 16 kHz mono FLAC + raw.jsonl."""

    input: list[str] = Field(
        default_factory=lambda: ["data/sample"], description="parquet files, .csv/.tsv/.jsonl manifests "
        "(path, text, speaker columns), LJSpeech-layout folders (metadata.csv + wavs/), or folders of them",
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
    max_text_chars: int = Field(
        2000, ge=1, le=1_000_000, description="longest transcript kept, in characters: a longer row is "
        "quarantined (text_too_long) before its text is normalized, so no row can stall ingest (one clip "
        "of at most max_seconds says a few hundred)"
    )
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


class ManifestParams(Section):
    """`manifest`: raw.jsonl split into train.jsonl / val.jsonl (upstream format), same-speaker references."""

    input: list[str] = Field(
        default_factory=lambda: ["work/ingest/raw.jsonl"], description="raw.jsonl files from ingest",
        json_schema_extra={"result": False, "wired": True},
    )
    out: str = Field(
        "work/manifest", description="output folder: train.jsonl and val.jsonl (upstream VoxCPM format), "
        "report.json",
        json_schema_extra={"result": False, "wired": True},
    )
    val_fraction: float = Field(
        0.05, ge=0, lt=1, description="share of rows held out for validation (by id hash: a row keeps its "
        "side as the set grows)"
    )
    min_val: int = Field(2, ge=0, description="top val up to this many rows (the lowest-hash ones)")
    min_speaker_rows_for_val: int = Field(
        4, ge=1, description="a speaker with at least this many rows gets one held out"
    )
    ref_fraction: float = Field(
        0.3, ge=0, le=1, description="share of train rows given a same-speaker ref_audio (upstream advice: "
        "30-50 %)"
    )
    seed: int = Field(0, description="seed of the reference choice")


class ValidateParams(Section):
    """`validate`: a manifest checked against ingest's sample rate and duration bounds."""

    manifest: str = Field("work/manifest/train.jsonl", description="manifest .jsonl to check",
                          json_schema_extra={"result": False})
    out: str = Field(
        "work/validate", description="output folder: validate.json (rows, hours, every problem); under DVC "
        "and KFP encode starts only after a usable manifest",
        json_schema_extra={"result": False},
    )


class ModelParams(Section):
    """The base model: `base` is read by encode, train, evaluate and mfu; `init-model` writes `out`."""

    base: str = Field(
        "work/base_model", description="base checkpoint folder (upstream VoxCPM2 layout: config.json, "
        "weights, AudioVAE, tokenizer) that encode, train, evaluate (as the baseline) and mfu read. The "
        "real model: the folder you downloaded (openbmb/VoxCPM2); the demo: init-model's out",
        json_schema_extra={"result": False, "wired": True},
    )
    preset: Literal["tiny", "small", "voxcpm2"] = Field(
        "tiny", description="init-model's size (and `voxpipe plan`'s model when model.base has no "
        "config.json): tiny (tests, the demo), small (CPU benchmarks) or voxcpm2 (the real 2.29 B shape)"
    )
    out: str = Field("work/base_model", description="init-model's output folder (a random-init checkpoint)",
                     json_schema_extra={"result": False, "wired": True})
    seed: int = Field(0, description="seed of init-model's random weights")
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="dtype of the saved weights (upstream ships bfloat16)"
    )
    kernels: Literal["auto", "fused", "eager"] = Field(
        "auto", description="model kernels of train, evaluate and the served model: auto = torch_npu's fused "
        "RMSNorm + SwiGLU and bf16 RoPE on an Ascend NPU, eager PyTorch elsewhere; fused = force them "
        "(needs torch_npu); eager = never (docs/accelerators.md)"
    )


class EncodeParams(Section):
    """`encode`: AudioVAE latents + token ids of every manifest row, computed once, offline."""

    manifest: list[str] = Field(
        default_factory=lambda: ["work/manifest/train.jsonl", "work/manifest/val.jsonl"],
        description="manifest .jsonl files to encode (train, val); the outputs are named after them",
        json_schema_extra={"result": False, "wired": True},
    )
    out: str = Field(
        "work/encoded", description="output folder: safetensors shards, train.jsonl / val.jsonl pointing "
        "at them, report.json",
        json_schema_extra={"result": False, "wired": True},
    )
    device: Literal["auto", "cpu", "cuda", "npu"] = Field(
        "auto", description="AudioVAE device: auto = npu, else cuda, else cpu"
    )
    batch_seconds: float = Field(
        0.0, ge=0, description="padded audio seconds per AudioVAE batch; 0 = auto: 60 on accelerators, "
        "8 on CPU (memory-bound there: bigger batches fall out of cache, see benchmarks/encode.py)"
    )
    shard_mb: float = Field(256.0, gt=0, description="latent megabytes per safetensors shard")
    cpu_threads: int = Field(
        1, ge=1, description="torch threads per encode process on CPU. Latents depend on it (by ~1e-7), "
        "so it is fixed, not the core count: use more processes (torchrun, local.nproc) for more cores"
    )


def default_lr(lora: bool) -> float:
    """train.lr when not given: upstream's recipes, 1e-5 for a full fine-tune and 1e-4 for LoRA."""
    return 1e-4 if lora else 1e-5


LORA_ATTENTION = ["q_proj", "v_proj", "k_proj", "o_proj"]  # upstream LoRAConfig's defaults, in its order
LORA_PROJ = ["enc_to_lm_proj", "lm_to_dit_proj", "res_to_dit_proj", "fusion_concat_proj"]


class LoraParams(Section):
    """LoRA adapters for `train` (embedded as `train.lora`); names mirror upstream's LoRAConfig."""

    enabled: bool = Field(False, description="train LoRA adapters on a frozen base instead of every weight")
    r: int = Field(32, gt=0, description="adapter rank")
    alpha: int = Field(
        32, gt=0, description="scaling = alpha / r (an int, as upstream's LoRAConfig). Not given: alpha = r "
        "(upstream's LoRA recipe, scaling 1)"
    )
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapter input")
    target_lm: bool = Field(True, description="adapters in base_lm and residual_lm (target_modules_lm)")
    target_dit: bool = Field(True, description="adapters in the local DiT (target_modules_dit)")
    target_proj: bool = Field(False, description="adapters on the projections in target_proj_modules")
    target_modules_lm: list[str] = Field(
        default_factory=lambda: list(LORA_ATTENTION), min_length=1,
        description="Linear layer names wrapped in the LMs (also e.g. gate_proj, up_proj, down_proj)",
    )
    target_modules_dit: list[str] = Field(
        default_factory=lambda: list(LORA_ATTENTION), min_length=1,
        description="Linear layer names wrapped in the local DiT",
    )
    target_proj_modules: list[str] = Field(
        default_factory=lambda: list(LORA_PROJ), min_length=1,
        description="top-level projections wrapped when target_proj is on",
    )

    @model_validator(mode="after")
    def _alpha_follows_r(self) -> LoraParams:
        """alpha not given = r (model_fields_set: what the user wrote, not what defaulted)."""
        if "alpha" not in self.model_fields_set and self.alpha != self.r:
            self.alpha = self.r
        return self


# bounds that keep a typo from taking the machine (`voxpipe plan --train-max-tokens 1e9` allocated 18 GB,
# `--local-nproc 1e6` never returned): refused by the schema before anything is built
MAX_TOKENS = 1 << 20  # LM positions per micro-batch: 250x the default, far past any device's memory
MAX_LOCAL_NPROC = 64  # torchrun processes on one box: as many as a pod may have devices (MAX_DEVICES_PER_POD)
MAX_DEVICE_MEMORY_GIB = 4096.0  # one device's (or one CPU rank's) memory: 4 TiB


class TrainParams(Section):
    """`train`: FSDP2 fine-tuning on encoded data, one process or under torchrun."""

    data: str = Field("work/encoded", description="`encode` output folder (train.jsonl, val.jsonl, shards)",
                      json_schema_extra={"result": False, "wired": True})
    out: str = Field(
        "work/train", description="output folder: checkpoints/, export/, metrics.jsonl, train_curve.csv, "
        "report.json",
        json_schema_extra={"result": False, "wired": True},
    )
    device: Literal["auto", "cpu", "cuda", "npu"] = Field(
        "auto", description="auto = npu, else cuda, else cpu"
    )
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="compute dtype of the parameters (FSDP2 mixed precision; fp32 masters and "
        "fp32 gradient reduction). auto = bfloat16 on accelerators, float32 on CPU"
    )
    max_steps: int = Field(
        40, gt=0, description="optimizer steps (40: the demo on the sample; a real fine-tune wants 1000s)",
        json_schema_extra={"weights": False},
    )
    lr: float | None = Field(
        None, gt=0, description="peak learning rate. Not given or null: 1e-5, or 1e-4 with lora.enabled "
        "(upstream's full and LoRA recipes)"
    )
    min_lr: float = Field(1e-6, ge=0, description="cosine decay floor, reached at max_steps")
    warmup_steps: int = Field(4, ge=0, description="linear warm-up steps (about 10 % of max_steps)")
    weight_decay: float = Field(0.01, ge=0, description="AdamW decay on matrices (not norms/biases)")
    grad_accum: int = Field(1, ge=1, description="micro-batches per optimizer step")
    max_tokens: int = Field(4096, gt=0, le=MAX_TOKENS, description="token budget: LM positions per "
                            f"micro-batch (padded); at most {MAX_TOKENS} (2^20)")
    clip_norm: float = Field(1.0, gt=0, description="gradient norm clipping threshold")
    max_bad_steps: int = Field(5, ge=1, description="stop after this many non-finite steps in a row",
                               json_schema_extra={"result": False})
    log_every: int = Field(
        10, ge=1, description="off a terminal (a pod, a pipe): one log line every N steps (step, loss, lr, "
        "tokens/s, MFU, peak memory) from rank 0, instead of a progress bar",
        json_schema_extra={"result": False},
    )
    val_every: int = Field(10, ge=0, description="fixed-seed validation every N steps (0 = only at the end)",
                           json_schema_extra={"result": False})
    val_batches: int = Field(8, ge=0, description="val micro-batches per validation (0 = all)",
                             json_schema_extra={"result": False})
    checkpoint_every: int = Field(500, ge=0, description="DCP checkpoint every N steps (0 = only at the end)",
                                  json_schema_extra={"result": False})
    keep_checkpoints: int = Field(2, ge=1, description="newest complete checkpoints kept",
                                  json_schema_extra={"result": False})
    export_every: int = Field(
        20, ge=0, description="also export exports/step-N/ every N steps and at the last (0 = only export/): "
        "evaluate scores them all and keeps the best. 20: the demo; a real fine-tune wants 100s",
        json_schema_extra={"result": False},
    )
    keep_exports: int = Field(3, ge=1, description="newest exports/step-N/ kept",
                              json_schema_extra={"result": False})
    resume: bool = Field(
        True, description="continue from the newest verified checkpoint in out/checkpoints; it must come "
        "from the same params (only max_steps, checkpoint and logging keys may differ). false: start fresh "
        "(old checkpoints are moved aside, not deleted)",
        json_schema_extra={"result": False},
    )
    fresh_on_change: bool = Field(
        False, description="when the checkpoint's params differ: start fresh (old checkpoints moved aside) "
        "instead of stopping with an error; for `dvc repro`, which reruns train when a tracked key changes",
        json_schema_extra={"result": False},
    )
    activation_checkpointing: bool = Field(False, description="recompute each decoder layer in backward",
                                           json_schema_extra={"result": False})
    compile: bool = Field(
        False, description="torch.compile each transformer block (first steps pay the compile; measured in "
        "docs/accelerators.md: 0.97x on CPU)",
        json_schema_extra={"result": False},
    )
    export_dtype: Literal["float32", "bfloat16"] = Field(
        "bfloat16", description="dtype of the exported model.safetensors (upstream ships bfloat16)",
        json_schema_extra={"weights": False},
    )
    peak_tflops: float = Field(
        0.0, ge=0,
        description="per-device peak for live MFU; 0 = device table (CPU: none, `voxpipe mfu` measures)",
        json_schema_extra={"result": False},
    )
    seed: int = Field(0, description="seed of the noise, dropout and data order")
    track: bool = Field(
        False,
        description="MLflow while training: params and every step's metrics live from rank 0, into the "
        "run `register` then completes (off: metrics.jsonl only; `register` logs it afterwards)",
        json_schema_extra={"result": False},
    )
    lora: LoraParams = Field(default_factory=LoraParams)

    @model_validator(mode="after")
    def _default_lr(self) -> TrainParams:
        """lr not given (or null): upstream's recipe for the kind of run. LoRA's B starts at zero, and
        1e-5 barely moves it, so LoRA gets 1e-4."""
        if self.lr is None:
            self.lr = default_lr(self.lora.enabled)
        return self


class EvaluateParams(Section):
    """`evaluate`: fixed-seed loss and generation metrics of a fine-tuned model against its baseline."""

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
    whisper_model: str | None = Field(
        None, description="local folder of a transformers Whisper model (e.g. whisper-large-v3), for asr "
        "whisper"
    )
    paraformer_model: str | None = Field(
        None, description="local folder of a sherpa-onnx Paraformer (model.onnx, tokens.txt), for asr "
        "paraformer-zh"
    )
    speaker: Literal[*SPEAKER] = Field(  # type: ignore[valid-type]
        "resemblyzer", description=f"speaker-similarity encoder: {listed(SPEAKER)}"
    )
    wavlm_model: str | None = Field(None, description="local folder of a transformers WavLMForXVector model")
    ecapa_model: str | None = Field(
        None, description="local path of UniSpeech's wavlm_large_finetune.pth (or a .safetensors copy of its "
        "`model` state dict), for speaker wavlm-ecapa: Seed-TTS-eval's SIM model (docs/evaluation.md)"
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


class MfuParams(Section):
    """`mfu`: model FLOPs utilisation of a training run, from its report.json and metrics.jsonl."""

    train_report: str = Field("work/train/report.json", description="the train step's report.json",
                              json_schema_extra={"result": False, "wired": True})
    metrics: str | None = Field(None, description="metrics.jsonl (None: next to train_report)",
                                json_schema_extra={"result": False, "wired": True})
    out: str = Field("work/mfu", description="output folder: mfu.json, mfu.md, report.json",
                     json_schema_extra={"result": False, "wired": True})
    peak_tflops: float | None = Field(
        None, gt=0, description="peak dense TFLOP/s of one device (None: table by device name; CPU: measured)"
    )
    dtype: Literal["float32", "bfloat16"] | None = Field(
        None, description="training compute dtype (None: the train report's)"
    )
    warmup_steps: int = Field(1, ge=0, description="first optimizer steps left out (allocation, warm-up)")


# MLflow's credentials (manifests/namespaced/mlflow-deployment.yaml) and the checkpoint signing key
# (voxpipe/integrity.py): the Secrets docs/cluster.md has you create
# the sizes a Job may ask for: a typo (pods=100000000) is refused, not rendered
MAX_PODS = 1024
MAX_DEVICES_PER_POD = 64
# a Kubernetes resource quantity (apimachinery's resource.Quantity): a decimal number with an optional
# binary (Ki..Ei), decimal (n, u, m, k, M, G, T, P, E) or exponent suffix; "" = not set
QUANTITY = re.compile(r"^$|^[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?$")

DEFAULT_SECRET_ENV = {
    "MLFLOW_TRACKING_USERNAME": "voxpipe-mlflow/username",
    "MLFLOW_TRACKING_PASSWORD": "voxpipe-mlflow/password",
    "VOXPIPE_CHECKPOINT_KEY": "voxpipe-checkpoint/key",
}


class LaunchParams(Section):
    """`launch-train` / `launch-encode`: the step run on a cluster as gang-scheduled pods, torchrun in every
    pod, through launch.backend (a Volcano Job or a Kubeflow Trainer TrainJob)."""

    backend: Literal["volcano", "trainjob"] = Field(
        "volcano", description="what runs the pods: volcano = a Volcano Job (batch.volcano.sh), trainjob = a "
        "Kubeflow Trainer v2 TrainJob (trainer.kubeflow.org) gang-scheduled by Volcano (docs/cluster.md)",
        json_schema_extra={"wired": True},
    )
    runtime: str = Field(
        "", description='trainjob only: the ClusterTrainingRuntime to train on ("" = voxpipe renders its '
        "own TrainingRuntime next to the TrainJob); it must mount the workspace PVC and meet \"restricted\" "
        "itself (docs/cluster.md)"
    )
    namespace: str = Field("", description='"" = the launcher pod\'s own namespace ("default" outside a pod)')
    queue: str = Field("voxpipe", description="Volcano queue (manifests/queue.yaml), for both backends: the "
                       "Job's spec.queue, the TrainJob's PodGroup (through a runtimePatches annotation)")
    image: str = Field("voxpipe:0.1.0-npu", description="training image (images/Dockerfile.npu, .cuda, .cpu)",
                       json_schema_extra={"wired": True})
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        "IfNotPresent", description="the pods' imagePullPolicy"
    )
    pods: int = Field(2, ge=1, le=MAX_PODS, description="pods (nodes): one master + pods-1 workers, "
                      f"scheduled all or none (at most {MAX_PODS})")
    devices_per_pod: int = Field(8, ge=1, le=MAX_DEVICES_PER_POD, description="accelerators per pod = "
                                 f"torchrun processes per pod (at most {MAX_DEVICES_PER_POD})")
    encode_devices: int = Field(
        1, ge=1, le=MAX_PODS * MAX_DEVICES_PER_POD, description="accelerators for `launch-encode` (one "
        "encode process each): one pod when they fit in devices_per_pod, else whole pods of "
        "devices_per_pod. `pods` is train's"
    )
    accelerator: str = Field(
        "huawei.com/Ascend910",
        description='device resource: huawei.com/Ascend910 (adds the HCCL env), nvidia.com/gpu, "" = CPU',
        json_schema_extra={"wired": True},
    )
    cpu: str = Field("", description='CPU request per pod, a Kubernetes quantity, e.g. "32" or "500m" '
                     '("" = none)')
    memory: str = Field("", description='memory request = limit per pod, a Kubernetes quantity, e.g. '
                        '"512Gi" ("" = none)')
    shm_size: str = Field("64Gi", min_length=1, description="size limit of the memory-backed /dev/shm (a "
                          "Kubernetes quantity)")
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="the pods' nodeSelector, e.g. {accelerator-type: module-910b-8}",
        json_schema_extra={"wired": True},
    )
    tolerations: list[dict[str, Any]] = Field(default_factory=list, description="as in a pod spec",
                                              json_schema_extra={"wired": True})
    pvc: str = Field("voxpipe-workspace", description="ReadWriteMany PVC: data, checkpoints, exports",
                     json_schema_extra={"wired": True})
    mount_path: str = Field(
        "/workspace", description="PVC mount and working directory: relative train paths land on the PVC",
        json_schema_extra={"wired": True},
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="extra env, e.g. MLFLOW_TRACKING_URI; no secrets: see secret_env"
    )
    env_not_secret: list[str] = Field(
        default_factory=list,
        description="names of launch.env entries whose values only look like secrets (a public certificate, "
        "a random-looking build id): launch-train does not refuse them by value shape, and MLflow params "
        "keep them; a secret-shaped name or a URI password is refused all the same (docs/security.md)",
    )
    secret_env: dict[str, str] = Field(
        default_factory=lambda: dict(DEFAULT_SECRET_ENV),
        description="env from Kubernetes Secrets, by reference: {ENV_NAME: secret-name/key} (never a value)",
    )
    max_retry: int = Field(3, ge=0, description="whole-job restarts after an evicted or failed pod (Volcano "
                           "Job maxRetry; with trainjob, the JobSet failurePolicy.maxRestarts of voxpipe's "
                           "own TrainingRuntime: refused with launch.runtime, whose own policy applies)")
    ttl_seconds: int = Field(
        86400, ge=60, description="a finished job (and its pods) is deleted after this; >= 60 so the watcher "
        "still reads the final phase and the failed pod's log (Volcano Job, or the JobSet of voxpipe's own "
        "TrainingRuntime: refused with launch.runtime)"
    )
    grace_seconds: Annotated[int, Field(ge=0)] | Literal["auto"] = Field(
        "auto", description="SIGTERM-to-SIGKILL grace in seconds: time for a last checkpoint. auto = the "
        "plan's per-rank checkpoint save time (plan.checkpoint_write_gbps, launch's world) x 1.5 + 120 s, "
        "at least 120; a number wins as it is"
    )
    progress_every_s: float = Field(
        30.0, ge=5, description="trainjob only: rank 0 writes the progress percentage, estimated remaining "
        "seconds and headline metrics into the TrainJob's status.trainerStatus at most this often, and "
        "once at the end (seconds; Trainer's floor is 5; docs/cluster.md)"
    )
    timeout_seconds: int = Field(7 * 86400, gt=0, description="then the watcher deletes the job and fails")
    poll_seconds: float = Field(15.0, gt=0, description="job status poll interval")
    log_tail_lines: int = Field(50, gt=0, description="lines of the failing pod's log put in the error")
    hccl_connect_timeout: int = Field(1200, gt=0, description="HCCL_CONNECT_TIMEOUT seconds (Ascend)")
    hccl_exec_timeout: int = Field(1800, gt=0, description="HCCL_EXEC_TIMEOUT seconds (Ascend)")
    dry_run: bool = Field(False, description="print the YAML of what would be created, submit nothing",
                          json_schema_extra={"wired": True})

    @field_validator("cpu", "memory", "shm_size")
    @classmethod
    def _quantity(cls, value: str) -> str:
        if not QUANTITY.match(value):
            raise ValueError(f"{value!r} is not a Kubernetes quantity (e.g. 512Gi, 64Gi, 500m, 32)")
        return value


class RegisterParams(Section):
    """`register`: the pipeline run into MLflow, the export as a registered pyfunc model version."""

    model: str | None = Field(
        None, description="exported checkpoint folder (upstream layout); None: the one evaluate chose "
        "(eval.json `chosen.path`). Given, it must be the checkpoint eval.json judged",
        json_schema_extra={"result": False, "wired": True},
    )
    eval: str = Field("work/eval/eval.json", description="evaluate's eval.json (samples/ next to it)",
                      json_schema_extra={"result": False, "wired": True})
    mfu: str = Field("work/mfu/mfu.json", description="the mfu step's mfu.json",
                     json_schema_extra={"result": False, "wired": True})
    train: str = Field("work/train", description="the train step's folder: report.json, metrics.jsonl",
                       json_schema_extra={"result": False, "wired": True})
    ingest: str | None = Field("work/ingest", description="ingest folder: the data version (None: none)",
                               json_schema_extra={"result": False, "wired": True})
    out: str = Field("work/register", description="output folder: registered.json",
                     json_schema_extra={"result": False, "wired": True})
    run_name: str | None = Field(
        None, description="the MLflow run's name; None: what the run is (`voxpipe-sample · full · 40 steps · "
        "lr 0.0001`)")
    model_name: str | None = Field(
        None, description="registered model name; None: `voxpipe-<voice>`, named after the data "
        "(ingest.input's folders or files: `voxpipe-sample` for the demo's data/sample), so each voice is a "
        "model of its own with its own @champion, and a new voice's first run is judged against its base only"
    )
    lock_timeout_s: float = Field(
        600.0, gt=0, le=86400, description="longest wait for the registry-wide register lock (another "
        "register holding it) before register stops", json_schema_extra={"result": False}
    )


class PromoteParams(Section):
    """`promote`: move @champion to a version by hand, recording who, when and why on it."""

    model: str | None = Field(None, description="registered model name; None: register.model_name's")
    version: int = Field(0, ge=0, description="the version to make @champion (required)")
    reason: str = Field("", description="why, recorded on the version (required)")


class CompareParams(Section):
    """`compare`: the runs of an experiment (or of one sweep) side by side: a table of the settings that
    differ, the headline figures and the verdict, and compare.html to hear the same sentence from each."""

    format: Literal["table", "markdown", "csv", "json"] = Field(
        "table", description="output format of compare.<format> (csv/json: every column on one line)"
    )
    out: str = Field("work/compare", description="compare.<format>, compare.html and val_curves.png",
                     json_schema_extra={"result": False})
    max_runs: int = Field(50, gt=0, description="newest runs with figures compared (lock runs, sweep parents "
                          "and runs still training count not)")
    sweep: str | None = Field(
        None, description="compare only this sweep's runs: the MLflow run id of its parent (the children's "
        "`mlflow.parentRunId`); the table and compare.html are also logged to the parent")
    kfp_run: str | None = Field(
        None, description="compare only the runs of this KFP pipeline run (its id), as KFP's MLflow plugin "
        "nests them: the run tagged kfp.pipeline_run_id and every run below it (tasks, loop iterations), "
        "in any experiment (docs/cluster.md)")


class SweepParams(Section):
    """`sweep-open` / `sweep-close`: one MLflow parent run per sweep, its children the grid's points; only
    the best child by the promotion rule is registered (voxpipe/track/sweep.py)."""

    grid: list[str] = Field(
        default_factory=list, description="the swept settings, one `section.key=v1,v2,...` each; the sweep "
        "runs every combination (recorded on the parent run)"
    )
    out: str = Field("work/sweep", description="sweep.json (the parent run id, the grid and, once closed, "
                     "the best child)", json_schema_extra={"result": False})
    workers: int = Field(0, ge=0, description="experiments run at once by the local sweep (`dvc queue start "
                         "-j`); 0: one per two cores, at least one")


class SynthesizeParams(Section):
    """`synthesize`: text to a WAV file with a registered model or a checkpoint folder, optionally in the
    voice of a reference clip (the pyfunc model's `reference_audio`). Same seed, same audio."""

    model: str = Field(
        "@champion", description="a registered model (models:/NAME@ALIAS, models:/NAME/VERSION, or @ALIAS / "
        "a version number of register.model_name: the voice's own model by default, from tracking.uri) or a "
        "checkpoint folder (upstream layout)"
    )
    text: str = Field("", max_length=2000, description="what to say (at most 2000 characters; the served "
                      "model takes the same)")
    normalize: bool = Field(
        True, description="spell out numbers, dates and money before speaking, as ingest did for training "
        "(the same function and language detection; the summary shows what was said); --no-normalize: "
        "the text as written. The served model takes the same as its `normalize` param"
    )
    locale: str = Field(  # checked by the request schema (serve/request.py), as the served model does
        "", description="how the text is read: en-US, en-GB or zh-CN (as ingest.locale); \"\": the "
        "locale the model's training text was read in, recorded at register (en-US, said so, for a model "
        "that recorded none). The served model takes the same as its `locale` param"
    )
    reference: str | None = Field(
        None, description="an audio file of the voice to speak in (a few seconds is enough; at most "
        "max_reference_seconds); None: the voice the model learned"
    )
    max_reference_seconds: float = Field(
        30.0, gt=0, le=600, description="longest reference clip accepted, here and by the served model (a "
        "longer one costs memory and time, not quality)"
    )
    out: str = Field("work/synthesize/out.wav", description="the WAV file written (48 kHz, 16 bit)",
                     json_schema_extra={"result": False})
    device: Literal["auto", "cpu", "cuda", "npu"] = Field(
        "auto", description="auto = npu, else cuda, else cpu"
    )
    seed: int = Field(0, ge=0, le=2**53, description="generation seed (0 to 2^53): the same seed and "
                      "inputs give the same audio")
    cfg_value: float = Field(2.0, gt=0, le=20, description="classifier-free guidance scale (finite, (0, 20])")
    inference_timesteps: int = Field(10, ge=1, le=100, description="Euler steps per patch (1-100)")
    max_len: int | None = Field(None, ge=1, le=4096, description="generation limit in patches (160 ms each; "
                                "1-4096); None: sized for the text, 25 + 2 per character (a request that "
                                "leaves it out never runs to the 4096 maximum)")
    deadline_s: float = Field(
        50.0, gt=0, le=3600, description="the most seconds one request may take (`synthesize`, the served "
        "pyfunc, `voxpipe serve`): generation stops at it, its memory is freed and the answer is a 503 "
        "naming it; below MLflow's 60 s scoring timeout, so the work ends before that server gives up on "
        "the client"
    )


class ServeParams(Section):
    """`serve`: the registered model (or a checkpoint folder) behind OpenAI's speech API on HTTP
    (docs/serving.md). Requests are checked by the `synthesize` section's bounds and deadline."""

    model: str = Field("@champion", description="what to serve, as synthesize.model names it: @ALIAS, a "
                       "version number, models:/NAME@ALIAS or a checkpoint folder")
    host: str = Field("127.0.0.1", description="the address to listen on; 127.0.0.1 = this machine only "
                      "(0.0.0.0 in a pod, with VOXPIPE_API_KEY set)")
    port: int = Field(8000, ge=1, le=65535, description="the TCP port")
    device: Literal["auto", "cpu", "cuda", "npu"] = Field("auto", description="auto = cuda when available, "
                                                          "else cpu")
    base: str | None = Field(None, description="a LoRA run's base checkpoint folder: serve it with the "
                             "model's lora/ adapter applied unmerged (None: the model's merged weights)")
    voices: str = Field("work/serve/voices", description="the folder the voices that clients add "
                        "(POST /v1/audio/voices) are kept in, across restarts")
    max_voices: int = Field(32, ge=0, le=1000, description="most voices clients may add")
    max_voice_bytes: int = Field(64 * 2**20, ge=0, le=2**34, description="most bytes of added voice clips "
                                 "together")
    concurrency: int = Field(8, ge=1, le=64, description="requests generating at once, each a row of one "
                             "batch (the batch size): a row joins between patches and leaves when its "
                             "sentence ends; each holds its KV caches")
    queue: int = Field(16, ge=0, le=256, description="requests waiting for a row of the batch (the waiting "
                       "room); past them a 429, and a 503 when one waits past its deadline")
    batch_window_ms: float = Field(10.0, ge=0, le=1000, description="milliseconds an idle batcher waits "
                                   "after a request arrives for others to start with it (later ones join "
                                   "between patches)")
    max_connections: int = Field(64, ge=1, le=10000, description="open connections at most; past it a new "
                                 "one closes the oldest still waiting for its request (/health still "
                                 "answers)")
    header_timeout_s: float = Field(10.0, gt=0, le=300, description="seconds a connection has to send a "
                                    "request's line and headers; then it is closed (slow clients, slowloris)")
    body_timeout_s: float = Field(60.0, gt=0, le=3600, description="seconds a request has to send its body "
                                  "once its headers are in; then a 408")
    stall_timeout_s: float = Field(30.0, gt=0, le=3600, description="seconds a client may leave its answer "
                                   "unread (the send buffer full); then it is cut off, its request stopped")
    keep_alive_s: float = Field(5.0, gt=0, le=300, description="seconds an idle kept-alive connection stays "
                                "open between requests (uvicorn's timeout_keep_alive)")


class TrackingParams(Section):
    """MLflow, as train (`train.track`), register and compare see it: one run, one experiment."""

    uri: str | None = Field(
        None, description="None: $MLFLOW_TRACKING_URI, else sqlite:///<work>/mlflow.db. No credentials here: "
        "they come from MLFLOW_TRACKING_USERNAME/PASSWORD or MLFLOW_TRACKING_TOKEN",
        json_schema_extra={"wired": True},
    )
    experiment: str = Field("voxpipe", description="MLflow experiment of the runs")
    parent_run: str | None = Field(
        None, description="a sweep's MLflow parent run id (`voxpipe sweep-open` makes it): register logs the "
        "run as its child (`mlflow.parentRunId`, the swept keys tagged) and registers no model version; "
        "`voxpipe sweep-close` registers the sweep's best. None: no sweep, register registers the run"
    )
    work: str = Field(
        "work", description="mlflow_run.json (the pipeline run's MLflow run); with no tracking URI also "
        "mlflow.db and mlruns/",
        json_schema_extra={"wired": True},
    )


class PlanParams(Section):
    """`plan`: the per-device memory of a training configuration, planned on fake tensors."""

    device: Literal["cpu", *DEVICE_MEMORY_GIB] = Field(
        "cpu", description="the accelerator the run is planned for (its memory: voxpipe/device.py's "
        "table); cpu = this host's free RAM"
    )
    device_memory_gib: float = Field(
        0.0, ge=0, le=MAX_DEVICE_MEMORY_GIB, description="memory of one device in GiB, at most "
        f"{MAX_DEVICE_MEMORY_GIB}; 0 = plan.device's figure from the table"
    )
    headroom: float = Field(
        0.1, ge=0, lt=1, description="fraction of the device memory kept free (allocator fragmentation, "
        "the CUDA/HCCL context, communication buffers): fits = peak <= (1 - headroom) x device memory"
    )
    missing_base: Literal["error", "preset"] = Field(
        "error", description="when model.base does not exist: error (a mistyped folder is not planned as "
        "another model), or preset = plan model.preset's shape (a recipe planned before its checkpoint is "
        "downloaded)"
    )
    checkpoint_write_gbps: float = Field(
        0.1, gt=0, description="checkpoint bandwidth of one rank, in GB/s (1e9 bytes): writing its share to "
        "the checkpoint volume and hashing it for the signed manifest. The plan's checkpoint save time is "
        "each rank's bytes over it, and launch.grace_seconds: auto renders that time plus a margin. The "
        "default is a conservative network volume's; set it from the write_gbps that train logs and "
        "writes in report.json (checkpoint_save) after a save"
    )
    launcher: Literal["local", "launch"] = Field(
        "local", description="whose world size the plan uses: local = local.nproc (torchrun on one box, "
        "`make repro`), launch = launch.pods x launch.devices_per_pod (`voxpipe launch-train`)"
    )
    json_: bool = Field(
        False, alias="json", description="print one JSON object instead of the table",
        json_schema_extra={"result": False},
    )


class LocalParams(Section):
    """This machine under `dvc repro` / make (not the cluster: that is `launch`)."""

    nproc: int = Field(
        2, ge=1, le=MAX_LOCAL_NPROC, description="torchrun processes per step (train, encode): CPU processes "
        "here, one per GPU/NPU on an accelerator box; at most "
        f"{MAX_LOCAL_NPROC}. The world size changes the data order, so DVC tracks it"
    )


class Params(Section):
    ingest: IngestParams = Field(default_factory=IngestParams)
    manifest: ManifestParams = Field(default_factory=ManifestParams)
    validate_: ValidateParams = Field(default_factory=ValidateParams, alias="validate")
    model: ModelParams = Field(default_factory=ModelParams)
    encode: EncodeParams = Field(default_factory=EncodeParams)
    train: TrainParams = Field(default_factory=TrainParams)
    evaluate: EvaluateParams = Field(default_factory=EvaluateParams)
    mfu: MfuParams = Field(default_factory=MfuParams)
    launch: LaunchParams = Field(default_factory=LaunchParams)
    register_: RegisterParams = Field(default_factory=RegisterParams, alias="register")
    promote: PromoteParams = Field(default_factory=PromoteParams)
    compare: CompareParams = Field(default_factory=CompareParams)
    sweep: SweepParams = Field(default_factory=SweepParams)
    synthesize: SynthesizeParams = Field(default_factory=SynthesizeParams)
    serve: ServeParams = Field(default_factory=ServeParams)
    tracking: TrackingParams = Field(default_factory=TrackingParams)
    plan: PlanParams = Field(default_factory=PlanParams)
    local: LocalParams = Field(default_factory=LocalParams)

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    def section(self, name: str) -> Section:
        return getattr(self, _attr(name))

    def registered_model_name(self) -> str:
        """register.model_name, or the voice's own name derived from ingest.input (`voice_model_name`)."""
        return self.register_.model_name or voice_model_name(self.ingest.input)

    def flat(self) -> dict[str, Any]:
        """`section.key` (and `section.sub.key`) → value, for logging params as flat key/value pairs."""
        out: dict[str, Any] = {}

        def walk(prefix: str, node: dict[str, Any]) -> None:
            for key, value in node.items():
                if isinstance(value, dict):
                    walk(f"{prefix}{key}.", value)
                else:
                    out[f"{prefix}{key}"] = value

        walk("", self.model_dump(by_alias=True))
        return out


def voice_model_name(inputs: list[str]) -> str:
    """`voxpipe-<voice>`: each input's folder or file name (`data/my-voice` -> my-voice, `s3://b/anna.parquet`
    -> anna; a glob names its folder), joined by `-`, in the characters every MLflow store takes."""
    names = []
    for entry in inputs:
        path = PurePosixPath(entry.rstrip("/").split("://")[-1])
        if any(c in path.name for c in "*?["):
            path = path.parent
        name = re.sub(r"[^A-Za-z0-9_.-]+", "-", path.stem if path.suffix else path.name).strip("-.")
        if name and name not in names:
            names.append(name)
    return "-".join(["voxpipe", *names])[:MODEL_NAME_CHARS].rstrip("-")


def _attr(section: str) -> str:
    return f"{section}_" if section in ("validate", "register") else section  # BaseModel names


def _parse_override(item: str) -> tuple[list[str], Any]:
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise StepError(f"--set {quoted(item)}: expected section.key=value")
    parts = key.strip().split(".")
    if len(parts) < 2:
        raise StepError(f"--set {quoted(item)}: the key must be section.key (or section.sub.key), got "
                        f"{quoted(key)}")
    try:
        return parts, _yaml(raw) if raw.strip() else ""
    except yaml.YAMLError as e:
        problem = str(e).splitlines()[0]
        raise StepError(f"--set {quoted(item)}: not valid YAML ({problem}); quote the value as a "
                        "string") from None


def _field(loc: tuple[Any, ...] | list[str]) -> Any:
    """The schema's field at `loc` (`("ingest", "input")`), or None when there is no such key."""
    model: Any = Params
    field = None
    for part in loc:
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
        field = ({f.alias or n: f for n, f in model.model_fields.items()} | model.model_fields).get(str(part))
        if field is None:
            return None
        model = field.annotation
    return field


def _one_value_is_a_list(keys: list[str], value: Any) -> Any:
    """A list key given one value (`--set ingest.input=data/my-voice`) is the list of that one value."""
    field = _field(keys)
    scalar = isinstance(value, str | int | float) and not isinstance(value, bool)
    return [value] if scalar and field is not None and typing.get_origin(field.annotation) is list else value


def _example(loc: tuple[Any, ...]) -> str:
    """`; e.g. KEY: DEFAULT`: the key's default in the params file's own spelling, the shape it takes."""
    field = _field(loc)
    if field is None:
        return ""
    default = field.get_default(call_default_factory=True)
    if default is None or isinstance(default, BaseModel):
        return ""
    shown = yaml.dump(default, Dumper=_FileDumper, default_flow_style=True, width=200).strip()
    shown = shown.removesuffix("...").strip()
    key = ".".join(map(str, loc))
    return f"; the right shape, e.g. {key}: {shown} (on the command line: --set '{key}={shown}')"


def _format_error(err: ValidationError, origin: str) -> str:
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"])
        if e["type"] == "extra_forbidden":
            lines.append(f"{key}: unknown key")
        else:
            lines.append(f"{key}: {e['msg']} (got {quoted(e.get('input'))}){_example(e['loc'])}")
    return f"invalid params ({origin}):\n  " + "\n  ".join(lines)


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = _yaml(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        raise StepError(f"{path}: not valid YAML: {e}") from e
    except UnicodeDecodeError as e:
        raise StepError(f"{path}: not UTF-8 text (byte {e.start}); save the file as UTF-8") from None
    if not isinstance(data, dict):
        raise StepError(f"{path}: expected a mapping of sections at the top level")
    return data


def recipe_names() -> list[str]:
    """The recipes shipped in recipes/ (found from the working directory, else next to the package)."""
    return sorted({p.stem for folder in RECIPE_DIRS if folder.is_dir() for p in folder.glob("*.yaml")})


def recipe_path(name: str) -> Path:
    """`--recipe NAME`: recipes/NAME.yaml, or a YAML file of the same shape given by its path."""
    if name.endswith((".yaml", ".yml")) and Path(name).is_file():
        return Path(name)
    for folder in RECIPE_DIRS:
        if (folder / f"{name}.yaml").is_file():
            return folder / f"{name}.yaml"
    raise StepError(f"no recipe {name!r}: the recipes are {', '.join(recipe_names()) or 'none here'} "
                    "(recipes/*.yaml), or give the path of a .yaml file")


def _merge(base: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    """`overlay` layered on `base`: mappings merge key by key, anything else replaces."""
    out = dict(base)
    for key, value in overlay.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = _merge(out[key], value) if both else value
    return out


class _FileDumper(yaml.SafeDumper):
    """Mappings as blocks, lists of plain values on one line (`input: [data/sample]`)."""


_FileDumper.add_representer(
    list,
    lambda dumper, value: dumper.represent_sequence(
        "tag:yaml.org,2002:seq", value, flow_style=all(not isinstance(v, dict | list) for v in value)
    ),
)


def file_values(params: Params) -> dict[str, Any]:
    """Every key as a params file should hold it. train.lora.alpha is left out when it equals r (what
    leaving it out gives), so it keeps following r; train.lr is null when it is the default for the
    run's kind, so it keeps following lora.enabled (it stays in the file: DVC tracks it and fails on a
    tracked key the file lacks)."""
    data = params.model_dump(by_alias=True)
    train = data["train"]
    if train["lora"]["alpha"] == train["lora"]["r"]:
        del train["lora"]["alpha"]
    if train["lr"] == default_lr(train["lora"]["enabled"]):
        train["lr"] = None  # null: follows lora.enabled (DVC still finds the key it tracks)
    return data


def params_yaml(params: Params) -> str:
    """`params` as a params file (what `voxpipe params` prints and writes)."""
    header = ("# voxpipe params: every key, as `voxpipe params --write params.yaml` writes them. What each\n"
              "# means: docs/params.md or `voxpipe <step> --help`. Recipes (recipes/) layer on this file.\n")
    defaults = Params().flat()
    changed = [f"#   {key}: {value} (default {defaults[key]})\n" for key, value in params.flat().items()
               if defaults.get(key) != value]
    if changed:
        header += "# Not the schema's defaults here:\n" + "".join(changed)
    sections = [yaml.dump({name: values}, Dumper=_FileDumper, sort_keys=False, allow_unicode=True, width=110)
                for name, values in file_values(params).items()]
    return header + "\n".join(sections)


def load_params(
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    flags: dict[str, Any] | None = None,
    recipe: str | None = None,
) -> Params:
    """Read params.yaml (if present), layer the recipe over it, then `--set` overrides, then step flags.

    `flags` maps `section.key` to a value already typed by argparse; None means "not given".
    """
    explicit = path is not None
    path = Path(path) if path is not None else DEFAULT_PARAMS
    data: dict[str, Any] = {}
    if path.exists():
        data = _read_yaml(path)
    elif explicit:
        raise StepError(f"params file {path} does not exist")
    origin = str(path)
    if recipe:
        overlay = recipe_path(recipe)
        data = _merge(data, _read_yaml(overlay))
        origin = f"{path} + recipe {overlay}"
    updates = [_parse_override(o) for o in overrides or []]
    updates += [(k.split("."), v) for k, v in (flags or {}).items() if v is not None]
    for keys, value in updates:
        node = data
        for depth, name in enumerate(keys[:-1]):
            node = node.setdefault(name, {})
            if not isinstance(node, dict):
                raise StepError(f"{path}: {'.'.join(keys[: depth + 1])!r} must be a mapping")
        node[keys[-1]] = _one_value_is_a_list(keys, value)
    try:
        return Params.model_validate(data)
    except ValidationError as e:
        raise StepError(_format_error(e, origin)) from None
