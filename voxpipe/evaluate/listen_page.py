"""The blind listening test evaluate writes beside its figures: `listen.html` and its sealed key.

Figures move within noise, and teams decide by ear, so evaluate also asks people. Each trial plays the
speaker's real recording of a sentence (the labelled anchor), then two generated clips of it, A and B: the
base model's zero-shot clone (with the speaker's reference clip) and the fine-tune's clip made with the same
text, reference and seed. The listener answers "which is closer to the speaker" and "which sounds more
natural" on a comparative (CMOS) scale from -3 (A much better) to +3 (B much better), 0 when equal.

Blind: the trials' order and which side is the fine-tune are shuffled (seeded, so the page is reproducible,
and each side holds the fine-tune in half the trials); the page holds only trial ids and the letters A/B
(no checkpoint, run, path or model name), its audio embedded as data URIs (it fetches nothing). Which side
is which lives in `listen-key.json`, never in the page; the key names the page by an id the answers carry
and by the page's sha256, so answers saved from another page, or a page changed since, are refused by
`voxpipe listen-record` (voxpipe/evaluate/listen_answers.py).
"""

from __future__ import annotations

import hashlib
import html
import io
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import soundfile as sf

from voxpipe.files import atomic_write
from voxpipe.report import write_json

if TYPE_CHECKING:
    from voxpipe.evaluate.generation import SpeakerPlan

PAGE, KEY = "listen.html", "listen-key.json"
KEY_FORMAT, ANSWERS_FORMAT = "voxpipe-listening-key/1", "voxpipe-listening-answers/1"
QUESTIONS = {"speaker": "Which is closer to the speaker?", "natural": "Which sounds more natural?"}
SCALE = ((-3, "A much better"), (-2, "A better"), (-1, "A slightly better"), (0, "equal"),
         (1, "B slightly better"), (2, "B better"), (3, "B much better"))


@dataclass(frozen=True)
class Pair:
    """One sentence's clips: the real recording, the base's zero-shot clone and the fine-tune's clip."""

    utterance: str  # the sample name (generation.Utterance.name)
    text: str
    real: Path
    base: Path
    fine_tune: Path


def listening_pairs(plans: list[SpeakerPlan], tag: str, samples: Path) -> list[Pair]:
    """Every text generated with the speaker's reference: the base's clip and the fine-tune's (`tag`, the
    checkpoint the rule chose), with the same text, reference and seed, and the text's real recording."""
    return [Pair(u.name, u.text, u.real_audio, samples / f"baseline-{u.name}.wav",
                 samples / f"{tag}-{u.name}.wav")
            for plan in plans for u in plan.utterances if u.with_reference]


def wav_uri(path: Path) -> str:
    """The clip as a 16-bit WAV data URI, whatever its file's format (a real recording may be FLAC)."""
    import base64

    audio, rate = sf.read(path, dtype="float32", always_2d=False)
    buffer = io.BytesIO()
    sf.write(buffer, audio, rate, subtype="PCM_16", format="WAV")
    return "data:audio/wav;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def shuffled(pairs: list[Pair], seed: str) -> list[tuple[str, Pair, str]]:
    """(trial id, pair, the fine-tune's side) in the page's order: the order shuffled and the sides
    balanced (half the trials each, the odd one drawn), both from `seed`."""
    rng = random.Random(seed)
    order = sorted(pairs, key=lambda p: p.utterance)
    rng.shuffle(order)
    sides = ["A", "B"] * (len(order) // 2) + ([rng.choice("AB")] if len(order) % 2 else [])
    rng.shuffle(sides)
    return [(f"t{i + 1:02d}", pair, side) for i, (pair, side) in enumerate(zip(order, sides, strict=True))]


def _choices(trial: str, question: str) -> str:
    return "".join(f"<label><input type='radio' name='{trial}-{question}' value='{value}'>{html.escape(text)}"
                   "</label>" for value, text in SCALE)


def _trial(trial: str, number: int, total: int, pair: Pair, a: Path, b: Path) -> str:
    players = "".join(
        f"<figure><figcaption>{label}</figcaption><audio controls preload='none' data-side='{side}' "
        f"src='{wav_uri(clip)}'></audio></figure>"
        for label, side, clip in (("real recording (anchor)", "anchor", pair.real), ("A", "A", a),
                                  ("B", "B", b)))
    questions = "".join(f"<fieldset data-question='{q}'><legend>{html.escape(text)}</legend>"
                        f"{_choices(trial, q)}</fieldset>" for q, text in QUESTIONS.items())
    return (f"<section class='trial' data-trial='{trial}'><h2>Trial {number} of {total} ({trial})</h2>"
            f"<p class='text'>{html.escape(pair.text)}</p><div class='players'>{players}</div>{questions}"
            "</section>")


SCRIPT = """<script>
const PAGE = document.body.dataset.page;
function answers() {
  const trials = [...document.querySelectorAll('section.trial')].map(s => {
    const t = s.dataset.trial, one = q => {
      const c = s.querySelector(`input[name="${t}-${q}"]:checked`);
      return c ? Number(c.value) : null;
    };
    return {id: t, speaker: one('speaker'), natural: one('natural')};
  });
  return {format: 'ANSWERS_FORMAT', page: PAGE, listener: document.getElementById('listener').value.trim(),
          saved_at: new Date().toISOString(), scale: 'SCALE_TEXT', trials};
}
document.getElementById('save').addEventListener('click', () => {
  const a = answers(), status = document.getElementById('status');
  if (!a.listener) { status.textContent = 'Type your listener id first.'; return; }
  const open = a.trials.filter(t => t.speaker === null || t.natural === null).map(t => t.id);
  const blob = new Blob([JSON.stringify(a, null, 1)], {type: 'application/json'});
  const link = document.createElement('a');
  link.href = URL.createObjectURL(blob);
  link.download = `listen-answers-${a.listener.replace(/[^A-Za-z0-9_.-]/g, '_')}.json`;
  document.body.appendChild(link); link.click(); link.remove();
  status.textContent = open.length ? `Saved, but ${open.length} unanswered: ${open.join(', ')}.`
                                   : `Saved ${a.trials.length} trials as ${link.download}.`;
});
</script>"""


def listen_page(trials: list[tuple[str, Pair, str]], page_id: str) -> str:
    """The page: instructions, a listener id box, every trial and a save button (a Blob download)."""
    scale = ", ".join(f"{v:+d} {t}" if v else f"0 {t}" for v, t in SCALE)
    head = ("<!doctype html><html><head><meta charset='utf-8'><title>Listening test</title><style>"
            "body{font-family:sans-serif;margin:1.5em;max-width:60em}section{border-top:1px solid #ccc;"
            "padding:.5em 0}figure{display:inline-block;margin:0 1em .5em 0}fieldset{margin:.3em 0}"
            "label{margin-right:.8em}</style></head>")
    intro = ("<h1>Listening test</h1><p>Each trial plays the speaker's real recording of a sentence first, "
             "then two other clips of the same sentence, A and B, in no fixed order. Listen to all three, "
             "then answer both questions: how much better A or B is, or <b>equal</b> when you cannot tell "
             "them apart. Use headphones, and answer every trial.</p>")
    parts = [head, f"<body data-page='{page_id}'>", intro,
             "<p><label>Listener id <input id='listener' autocomplete='off'></label></p>"]
    total = len(trials)
    for number, (trial, pair, side) in enumerate(trials, 1):
        a, b = (pair.fine_tune, pair.base) if side == "A" else (pair.base, pair.fine_tune)
        parts.append(_trial(trial, number, total, pair, a, b))
    parts += ["<p><button id='save' type='button'>Save answers</button> <span id='status'></span></p>",
              SCRIPT.replace("ANSWERS_FORMAT", ANSWERS_FORMAT).replace("SCALE_TEXT", scale),
              "</body></html>"]
    return "\n".join(parts) + "\n"


def write_listening_test(out: Path, mode: str, pairs: list[Pair], seed: str, export_md5: str,
                         checkpoint: str) -> dict[str, Any] | None:
    """`listen.html` and `listen-key.json` in `out` (mode off: neither, and stale ones removed); what the
    key holds but the trials, or None."""
    for name in (PAGE, KEY):
        (out / name).unlink(missing_ok=True)
    if mode == "off" or not pairs:
        return None
    trials = shuffled(pairs, seed)
    sealed = json.dumps([(t, p.utterance, side, _digest(p.base), _digest(p.fine_tune))
                         for t, p, side in trials])
    page_id = hashlib.sha256(f"{seed}:{export_md5}:{sealed}".encode()).hexdigest()[:16]
    page = listen_page(trials, page_id).encode("utf-8")
    atomic_write(out / PAGE, lambda tmp: Path(tmp).write_bytes(page))
    key = {"format": KEY_FORMAT, "page": page_id, "page_sha256": hashlib.sha256(page).hexdigest(),
           "mode": mode, "export_md5": export_md5, "checkpoint": checkpoint,
           "questions": QUESTIONS, "scale": dict((str(v), t) for v, t in SCALE)}
    write_json(out / KEY, {**key, "trials": {
        trial: {"utterance": pair.utterance, "text": pair.text, "fine_tune": side, "real": str(pair.real),
                "base_clip": pair.base.name, "fine_tune_clip": pair.fine_tune.name}
        for trial, pair, side in trials}})
    return key
