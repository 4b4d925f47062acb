"""Error messages quote at most about 80 characters of a user's value (voxpipe.errors.quoted): a refused
300,000-character text is one short paragraph, not 300 KB of message."""

from __future__ import annotations

import pytest

from voxpipe.cli import main
from voxpipe.data.manifest import _parse_clip
from voxpipe.errors import QUOTE_CHARS, StepError, quoted
from voxpipe.params import load_params
from voxpipe.serve.request import RequestError, generation
from voxpipe.track.sweep import parse_grid

LONG = "a" * 300_000
LIMIT = QUOTE_CHARS + 200  # the message around the quote


def test_quoted_keeps_a_short_value_and_cuts_a_long_one_saying_how_long_it_was():
    assert quoted("anna") == "'anna'" and quoted(3.5) == "3.5" and quoted(None) == "None"
    cut = quoted(LONG)
    assert cut.startswith("'aaa") and cut.endswith("... (300,000 characters)") and len(cut) < 110
    assert quoted(list(range(100_000))).endswith("characters written out)")


def test_a_300000_character_synthesize_text_is_refused_in_a_short_message(capsys):
    assert main(["synthesize", "--text", LONG]) != 0
    err = capsys.readouterr().err
    assert "synthesize.text" in err and "300,000 characters" in err and len(err) < 1000


@pytest.mark.parametrize("override", [LONG, f"train.{LONG}", f"train.lr={LONG}", f"train.lr=[{LONG}"])
def test_a_long_set_override_is_quoted_short(override):
    with pytest.raises(StepError) as e:
        load_params(None, [override])
    assert len(str(e.value)) < 2 * LIMIT and "300,0" in str(e.value)


@pytest.mark.parametrize("field", ["id", "speaker", "audio", "text", "duration"])
def test_a_manifest_row_with_a_long_wrong_value_is_quoted_short(tmp_path, field):
    row = {"id": "r1", "audio": "a.wav", "text": "hi", "speaker": None, "duration": 1.0,
           field: [LONG] if field != "id" else {"x": LONG}}
    with pytest.raises(StepError) as e:
        _parse_clip(row, "bad", "m.jsonl:1", tmp_path)
    assert len(str(e.value)) < LIMIT and "characters written out" in str(e.value)


def test_a_long_request_param_and_sweep_grid_entry_are_quoted_short():
    with pytest.raises(RequestError) as e:
        generation({"cfg_value": LONG})
    assert len(str(e.value)) < LIMIT and "300,000 characters" in str(e.value)
    with pytest.raises(StepError) as e:
        parse_grid([f"{LONG}=1,2"])
    assert len(str(e.value)) < 2 * LIMIT
