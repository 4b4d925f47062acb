"""A listening test's answers, checked against its sealed key, and what they say about the fine-tune.

`listen.html` (listen_page.py) saves each listener's answers as a JSON file; only the key says which side
was the fine-tune. Here the answers are checked (the same page, every trial answered, values on the
scale), turned into fine-tune-relative scores (+3: the fine-tune much better than the base's zero-shot
clone) and summed up over every listener's judgements, per question:
- the mean CMOS, with a Wilcoxon signed-rank p-value (scipy; equal answers drop out, and with fewer than
  MIN_NONZERO others it is null with the reason: no p-value could fall below 0.05);
- the preference rate (how often the fine-tune was preferred when the listener heard a difference), with its
  exact binomial 95 % interval and p-value (scipy's binomtest).

The verdict `evaluate.listening: required` waits for: on both questions the mean CMOS is at least 0 and the
base is not significantly preferred (the preference interval's upper bound is not below 0.5): the test
prefers the fine-tune, or finds it no worse.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from pathlib import Path
from typing import Any

from voxpipe.errors import StepError, quoted
from voxpipe.evaluate.listen_page import ANSWERS_FORMAT, KEY_FORMAT, PAGE, QUESTIONS, SCALE
from voxpipe.files import read_json_object

CONFIDENCE = 0.95
MIN_NONZERO = 6  # the fewest non-equal answers whose two-sided signed-rank p-value can fall below 0.05
VALUES = {v for v, _ in SCALE}
PASSED, FAILED = "listening test passed", "listening test failed"


def read_key(path: Path) -> dict[str, Any]:
    """The key evaluate wrote; refused when the page beside it is not the page it was written for."""
    key = read_json_object(path, "the listening test's key (listen-key.json, written by evaluate)")
    if key.get("format") != KEY_FORMAT or not isinstance(key.get("trials"), dict):
        raise StepError(f"{path}: not a listening-test key ({KEY_FORMAT}); name the listen-key.json that "
                        "evaluate wrote beside listen.html with --key")
    page = path.with_name(PAGE)
    if page.is_file() and hashlib.sha256(page.read_bytes()).hexdigest() != key.get("page_sha256"):
        raise StepError(f"{page} is not the page {path} was written with (its sha256 differs): the page was "
                        "changed or rewritten since, so which side is which is unknown; rerun evaluate and "
                        "take the test again on the new page")
    return key


def read_answers(path: Path, key: dict[str, Any], key_path: Path) -> dict[str, Any]:
    """One listener's answers, checked against the key: same page, every trial answered on the scale."""
    if not path.is_file():
        raise StepError(f"{path}: no such answers file; name the file listen.html's 'Save answers' button "
                        "downloaded (--answers FILE)")
    answers = read_json_object(path, "listening-test answers (saved by listen.html)")
    if answers.get("format") != ANSWERS_FORMAT or not isinstance(answers.get("trials"), list):
        raise StepError(f"{path}: not a listening test's answers ({ANSWERS_FORMAT}); give the file the "
                        "page's 'Save answers' button downloaded")
    if answers.get("page") != key["page"]:
        raise StepError(f"{path} was saved from another listening page (page "
                        f"{quoted(answers.get('page'))}) than {key_path} seals (page {key['page']}): its "
                        "trials cannot be matched. Record it with the listen-key.json of the evaluation it "
                        "came from (--key), or take the test on that evaluation's listen.html")
    listener = answers.get("listener")
    if not isinstance(listener, str) or not listener.strip():
        raise StepError(f"{path}: no listener id; type it into the page's 'Listener id' box and save again "
                        "(the answers already given stay in the page)")
    given = {t.get("id"): t for t in answers["trials"] if isinstance(t, dict)}
    unknown = sorted(str(t) for t in given if t not in key["trials"])
    if unknown:
        raise StepError(f"{path}: trials {', '.join(quoted(t, 20) for t in unknown[:5])} are not on the page "
                        f"{key_path} seals; the file was edited or comes from another page")
    for trial, item in sorted(given.items()):
        for q in QUESTIONS:
            value = item.get(q)
            if value is not None and (isinstance(value, bool) or value not in VALUES):
                raise StepError(f"{path}: trial {trial} answers {q} with {quoted(value)}, not on the scale "
                                f"{min(VALUES)}..{max(VALUES)}; save the answers from the page again")
    missing = sorted(t for t in key["trials"] if t not in given or any(given[t].get(q) is None
                                                                         for q in QUESTIONS))
    if missing:
        raise StepError(f"{path}: {len(missing)} of {len(key['trials'])} trials unanswered "
                        f"({', '.join(missing[:10])}{', ...' if len(missing) > 10 else ''}); answer them on "
                        "the page (both questions each) and save again: a partial test is not recorded")
    return {"listener": listener.strip(), "saved_at": answers.get("saved_at"), "trials": given}


def judgements(key: dict[str, Any], answers: dict[str, Any]) -> list[dict[str, Any]]:
    """Per trial: the raw answers (-3 A .. +3 B), the fine-tune's side and the fine-tune-relative scores."""
    out = []
    for trial, meta in sorted(key["trials"].items()):
        raw = answers["trials"][trial]
        sign = 1 if meta["fine_tune"] == "B" else -1
        out.append({"trial": trial, "utterance": meta["utterance"], "fine_tune_side": meta["fine_tune"],
                    "listener": answers["listener"],
                    **{f"{q}_answer": raw[q] for q in QUESTIONS},
                    **{q: sign * raw[q] for q in QUESTIONS}})
    return out


def _question(scores: list[int]) -> dict[str, Any]:
    from scipy.stats import binomtest, wilcoxon

    wins, losses = sum(s > 0 for s in scores), sum(s < 0 for s in scores)
    figures: dict[str, Any] = {"answers": len(scores), "preferred": wins, "against": losses,
                               "equal": len(scores) - wins - losses,
                               "cmos_mean": statistics.fmean(scores) if scores else None}
    if wins + losses:
        test = binomtest(wins, wins + losses, 0.5)
        ci = test.proportion_ci(confidence_level=CONFIDENCE)
        figures.update(preference=wins / (wins + losses), preference_low=float(ci.low),
                       preference_high=float(ci.high), preference_p=float(test.pvalue))
    else:
        figures.update(preference=None, preference_low=None, preference_high=None, preference_p=None,
                       preference_null_reason="every answer was 'equal': no preference to count")
    nonzero = [s for s in scores if s]
    if len(nonzero) >= MIN_NONZERO:
        figures["wilcoxon_p"] = float(wilcoxon(nonzero).pvalue)
    else:
        figures.update(wilcoxon_p=None, wilcoxon_null_reason=(
            f"{len(nonzero)} non-equal answers, fewer than {MIN_NONZERO}: no two-sided signed-rank p-value "
            "could fall below 0.05; more listeners or trials give one"))
    return figures


def summarize(all_judgements: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures of every listener's judgements pooled, per question, and the verdict."""
    listeners = sorted({j["listener"] for j in all_judgements})
    figures = {q: _question([j[q] for j in all_judgements]) for q in QUESTIONS}
    per_listener = {who: {q: statistics.fmean(j[q] for j in all_judgements if j["listener"] == who)
                          for q in QUESTIONS} for who in listeners}
    passed, sentence = verdict(figures, listeners)
    return {"listeners": listeners, "judgements": len(all_judgements), "questions": figures,
            "cmos_by_listener": per_listener, "passed": passed, "verdict": sentence,
            "confidence": CONFIDENCE}


def _says(q: str, f: dict[str, Any]) -> tuple[bool, str]:
    mean = f["cmos_mean"]
    worse = f["preference_high"] is not None and f["preference_high"] < 0.5
    rate = ("no preference (all equal)" if f["preference"] is None else
            f"preferred {f['preference']:.0%} [{f['preference_low']:.0%}, {f['preference_high']:.0%}]")
    p = "n/a" if f["wilcoxon_p"] is None else f"{f['wilcoxon_p']:.3g}"
    detail = f"{q}: CMOS {mean:+.2f} (Wilcoxon p {p}), {rate}"
    if mean < 0 or worse:
        return False, f"{detail}: the base's zero-shot clone is preferred"
    significant = f["preference_low"] is not None and f["preference_low"] > 0.5
    return True, f"{detail}: {'prefers the fine-tune' if significant or mean > 0 else 'no worse'}"


def verdict(figures: dict[str, dict[str, Any]], listeners: list[str]) -> tuple[bool, str]:
    """Passed when, on every question, the fine-tune is preferred or found no worse."""
    said = [_says(q, figures[q]) for q in QUESTIONS]
    passed = all(ok for ok, _ in said)
    return passed, (f"{PASSED if passed else FAILED} ({len(listeners)} listener"
                    f"{'s' if len(listeners) != 1 else ''}: {', '.join(listeners)}): "
                    + "; ".join(text for _, text in said))


def dump(judged: list[dict[str, Any]]) -> str:
    """One listener's per-trial judgements as the artifact listen-record logs."""
    return json.dumps(judged, indent=1, sort_keys=True) + "\n"
