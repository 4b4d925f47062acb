"""The voice's noise floor: how far each figure moves when only the generation seed changes.

Speaker similarity on a few dozen clips moves by about a point between runs of the same checkpoint, so a
tolerance picked by hand is either looser or stricter than the noise. With `evaluate.noise_runs N`,
evaluate generates and scores the chosen checkpoint's clips again under N other generation seeds
(`generation_seed + 1..N`; no loss, no benchmark) and records, per figure, how far the rule's own
statistic reaches from zero when nothing but the seed changed: the paired gain of each reseeded run
against the evaluation's clips, its 95 % interval's farther end from zero (the gain itself where there
is no interval), the worst of the N runs (`spreads`) in `<evaluate.out>/noise.json`, a DVC metric kept
across reruns (persist). A candidate whose low bound stays within that is within what the seed alone does.
The promotion rule then takes its similarity and quality tolerances from it (promotion.Floor), but only
while the file fits the evaluation: the same val set and seeds, speaker encoder and generation settings;
otherwise the constants, and eval.json's `tolerance_source` says why.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from voxpipe.errors import StepError
from voxpipe.evaluate.gains import paired_gains
from voxpipe.evaluate.promotion import Floor
from voxpipe.files import read_json_object
from voxpipe.report import write_json

NOISE_FILE = "noise.json"
# the settings a floor is measured under: another value of any of them measures other noise
FITS = ("speaker", "texts_per_speaker", "max_len", "cfg_value", "inference_timesteps", "min_duration_ratio",
        "asr")


def spreads(runs: list[dict[str, dict[str, Any]]]) -> dict[str, float]:
    """Per figure, the farthest from zero the paired gain's interval of a reseeded run (runs[1:]) against
    the first (runs[0]) reaches, over the runs: a candidate no worse than that low bound is within what the
    seed alone does. Figures with no pair in any run are left out."""
    out: dict[str, float] = {}
    for other in runs[1:]:
        for figure, gain in paired_gains(other, runs[0]).items():
            ends = [abs(x) for x in (gain.gain, gain.low, gain.high) if x is not None]
            if ends:
                out[figure] = max(out.get(figure, 0.0), *ends)
    return out


def fits(settings: dict[str, Any], val_digest: str) -> dict[str, Any]:
    """What a floor must share with an evaluation to stand for its noise."""
    return {"val_digest": val_digest, **{k: settings[k] for k in FITS}}


def write_floor(path: Path, runs: list[dict[str, dict[str, Any]]], seeds: list[int],
                checkpoint: dict[str, Any], fit: dict[str, Any]) -> dict[str, Any]:
    """noise.json: the spreads of runs (the evaluation's clips first), the seeds and checkpoint they came
    from, and what the floor fits."""
    document = {"measured": True, "runs": len(runs) - 1, "generation_seeds": seeds, "checkpoint": checkpoint,
                "fits": fit, "spreads": spreads(runs),
                "definition": "per figure (gains.FIGURES), the farthest from zero that the paired gain's "
                              "95 % interval of the same checkpoint's clips under another generation seed "
                              "against its own reaches, the worst over the seeds"}
    write_json(path, document)
    return document


def keep_or_mark(path: Path, noise_runs: int) -> None:
    """With no measurement this run: a floor measured before stays (DVC persists it); without one, a file
    that says none was measured (DVC expects the output)."""
    if not path.is_file():
        write_json(path, {"measured": False, "spreads": None, "spreads_null_reason":
                          f"evaluate.noise_runs is {noise_runs}: no noise floor measured"})


def read_floor(path: Path, fit: dict[str, Any]) -> tuple[Floor | None, str]:
    """The measured floor when `path` holds one that fits this evaluation, and a sentence on which
    tolerances the rule takes and why."""
    if not path.is_file():
        return None, f"no measured noise floor ({path} missing; evaluate.noise_runs measures one)"
    try:
        found = read_json_object(path, "evaluate's noise floor")
    except StepError as e:
        raise StepError(f"{e}. Delete it (the rule then takes the constant tolerances) or measure the floor "
                        "again with evaluate.noise_runs N") from e
    if not found.get("measured") or not isinstance(found.get("spreads"), dict):
        return None, f"no measured noise floor in {path} (evaluate.noise_runs measures one)"
    differ = sorted(k for k in fit if (found.get("fits") or {}).get(k) != fit[k])
    if differ:
        return None, (f"the noise floor in {path} was measured under another {', '.join(differ)}: it does "
                      "not stand for this evaluation's noise (evaluate.noise_runs measures it again)")
    source = f"the noise floor of {path} ({found['runs']} other seed(s))"
    return Floor({k: float(v) for k, v in found["spreads"].items()}, source), source
