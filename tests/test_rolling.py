"""Issue 46 (part 3): a row's audio does not depend on its batch-mates. Eight rows of different lengths and
Euler steps, with and without a reference, joining a rolling batch at different patches
(voxpipe/model/rolling.py), each say what they say alone, to float rounding (max abs difference <= 1e-4 on
the waveform)."""

from __future__ import annotations

import pytest
import torch

from voxpipe.model.rolling import RollingBatch, Row

TEXTS = ["Hi.", "A somewhat longer sentence than the first.", "Short one.", "Numbers, commas; more words.",
         "Eight rows in all, each its own.", "Go.", "The longest text of the eight, by a fair margin indeed.",
         "Last."]
MAX_LEN = [5, 9, 4, 8, 7, 3, 10, 6]  # rows of different lengths, whatever the random stop head says
MIN_LEN = [max(1, n - 2) for n in MAX_LEN]
STEPS = [2, 3, 2, 1, 3, 2, 1, 2]  # Euler steps: a row with fewer sits out the others' last ones
TOLERANCE = 1e-4
pytestmark = pytest.mark.usefixtures("one_thread")


def tone(seconds: float, freq: float) -> torch.Tensor:
    t = torch.arange(int(16000 * seconds)) / 16000
    return 0.3 * torch.sin(2 * torch.pi * freq * t)


def refs() -> list[torch.Tensor | None]:
    return [tone(0.4 + 0.1 * i, 150.0 + 20 * i) if i % 2 else None for i in range(len(TEXTS))]


def alone(model, i: int) -> torch.Tensor:
    return model.generate(TEXTS[i], refs()[i], max_len=MAX_LEN[i], min_len=MIN_LEN[i],
                          inference_timesteps=STEPS[i], seed=100 + i).audio[0]


def test_rows_joining_a_running_batch_say_what_they_say_alone(tiny_model):
    clips = refs()
    prompts = [tiny_model.prompts([t], [r])[0] for t, r in zip(TEXTS, clips, strict=True)]
    rows = [Row(p, max_len=MAX_LEN[i], min_len=MIN_LEN[i], inference_timesteps=STEPS[i],
                generator=torch.Generator().manual_seed(100 + i), owner=i) for i, p in enumerate(prompts)]
    batch = RollingBatch(tiny_model)
    done = {}
    batch.join(rows[:3])  # three start; the others join two, three and four patches later, as requests arrive
    for joining in ([], rows[3:5], rows[5:7], rows[7:], *[[]] * 20):
        batch.join(joining)
        for f in batch.step():
            assert f.error is None
            done[f.row.owner] = f
    assert not len(batch) and sorted(done) == list(range(8))
    lengths = {f.patches.size(0) for f in done.values()}
    assert len(lengths) > 3, lengths  # the rows stopped at different patches, so they left at different times
    for i, f in done.items():
        audio, _ = tiny_model.decode(f.patches)
        expected = alone(tiny_model, i)
        assert audio.shape == expected.shape, i
        assert (audio - expected).abs().max().item() <= TOLERANCE, i


def test_one_generate_call_of_eight_texts_says_each_as_alone(tiny_model):
    """generate's batch is a rolling batch joined at once: each text with its own generator of the seed."""
    clips = refs()
    out = tiny_model.generate(TEXTS, clips, max_len=10, min_len=1, inference_timesteps=2, seed=7)
    for i in range(len(TEXTS)):
        single = tiny_model.generate(TEXTS[i], clips[i], max_len=10, min_len=1, inference_timesteps=2, seed=7)
        assert out.audio[i].shape == single.audio[0].shape, i
        assert (out.audio[i] - single.audio[0]).abs().max().item() <= TOLERANCE, i


def test_a_row_whose_check_raises_leaves_and_the_others_go_on(tiny_model):
    clips = refs()

    class Gone(Exception):
        pass

    calls = {"n": 0}

    def leave_at_third() -> None:
        calls["n"] += 1
        if calls["n"] == 3:
            raise Gone("the client left")

    prompts = [tiny_model.prompts([t], [r])[0] for t, r in zip(TEXTS[:2], clips[:2], strict=True)]
    rows = [Row(prompts[0], max_len=8, min_len=8, generator=torch.Generator().manual_seed(1),
                check=leave_at_third),
            Row(prompts[1], max_len=MAX_LEN[1], min_len=MIN_LEN[1], inference_timesteps=STEPS[1],
                generator=torch.Generator().manual_seed(101))]
    first, second = RollingBatch(tiny_model).run(rows)
    assert isinstance(first.error, Gone) and first.patches is None
    assert len(first.row.patches) == 2  # it left before its third patch
    audio, _ = tiny_model.decode(second.patches)
    assert (audio - alone(tiny_model, 1)).abs().max().item() <= TOLERANCE
