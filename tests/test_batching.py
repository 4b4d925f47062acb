"""Encoded-data batches equal upstream's packer batches; the token-budget sampler's guarantees."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from upstream import import_upstream, upstream_packer_class

from voxpipe.data.audio import decode
from voxpipe.data.batching import (
    EvalBatches,
    TokenBudgetSampler,
    fixed_size_batches,
    padding_waste,
)
from voxpipe.data.dataset import BATCH_KEYS, EncodedDataset, Sample, collate
from voxpipe.data.token_budget import TokenBudget

# ---------------------------------------------------------------------------------------------
# collate vs upstream's AudioFeatureProcessingPacker
# ---------------------------------------------------------------------------------------------


def _upstream_vae(base_model: Path):
    audiovae = import_upstream().modules.audiovae
    config = json.loads((base_model / "config.json").read_text())["audio_vae_config"]
    vae = audiovae.AudioVAEV2(audiovae.AudioVAEConfigV2(**config)).eval()
    vae.load_state_dict(load_file(str(base_model / "audiovae.safetensors")), strict=True)
    return vae


def _pad(seqs: list[torch.Tensor]) -> torch.Tensor:
    """Upstream's collate_fn: right-pad with -100, which its packer strips again."""
    width = max(s.shape[0] for s in seqs)
    return torch.stack([torch.nn.functional.pad(s, (0, width - s.shape[0]), value=-100) for s in seqs])


def _upstream_batch(packer, dataset: EncodedDataset, indices: list[int]) -> dict[str, torch.Tensor]:
    """What upstream trains on for these rows: its packer on the raw 16 kHz audio and the token ids."""
    texts, audios, refs = [], [], []
    for i in indices:
        row = dataset.rows[i]
        texts.append(dataset[i].text_ids.to(torch.int32))
        audios.append(torch.from_numpy(decode(dataset.root / row["audio"], 16000)))
        ref = row.get("ref_audio")
        refs.append(torch.from_numpy(decode(dataset.root / ref, 16000)) if ref else torch.tensor([-100.0]))
    n = len(indices)
    return packer(
        audio_tokens=_pad(audios),
        text_tokens=_pad(texts),
        task_ids=torch.ones(n, dtype=torch.int32),
        dataset_ids=torch.zeros(n, dtype=torch.int32),
        is_prompts=[False] * n,
        ref_audio_tokens=_pad(refs),
    )


@pytest.fixture(scope="module")
def parity(encoded_sample):
    dataset = EncodedDataset(encoded_sample.encoded, "train")
    with_ref = [i for i, r in enumerate(dataset.rows) if "ref_latents" in r][:2]
    without = [i for i, r in enumerate(dataset.rows) if "ref_latents" not in r][:2]
    indices = [without[0], with_ref[0], without[1], with_ref[1]]  # both layouts in one padded batch
    vae = _upstream_vae(encoded_sample.base_model)
    packer = upstream_packer_class()(dataset_cnt=1, max_len=1024, patch_size=4, feat_dim=64, audio_vae=vae)
    return dataset, indices, packer, _upstream_batch(packer, dataset, indices)


def _assert_same_batch(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor], atol: float) -> None:
    for key in BATCH_KEYS:
        assert ours[key].shape == theirs[key].shape, key
        if key == "audio_feats":
            torch.testing.assert_close(ours[key], theirs[key], atol=atol, rtol=0)
        else:
            assert torch.equal(ours[key], theirs[key].to(ours[key].dtype)), key


@pytest.mark.slow  # encodes rows through both AudioVAEs
def test_collate_of_encoded_rows_equals_upstream_packer(parity):
    dataset, indices, _, theirs = parity
    ours = collate([dataset[i] for i in indices], patch_size=4)
    assert set(BATCH_KEYS) <= set(ours)
    # our latents were encoded in length-sorted batches; upstream encodes one clip per call
    _assert_same_batch(ours, theirs, atol=1e-5)
    assert ours["text_tokens"].dtype == torch.int64 and ours["position_ids"].dtype == torch.int64
    assert all(ours[k].dtype == torch.int32 for k in ("text_mask", "audio_mask", "loss_mask", "labels"))
    assert ours["audio_feats"].dtype == torch.float32
    # lengths used for budgets are the real (unpadded) sequence lengths
    lengths = dataset.lengths()
    assert [lengths[i] for i in indices] == [int(p.max()) + 1 for p in ours["position_ids"]]
    assert [dataset.rows[i]["lm_tokens"] for i in indices] == [lengths[i] for i in indices]


def _upstream_latents(packer, path: Path) -> torch.Tensor:
    return packer.encode_audio(torch.from_numpy(decode(path, 16000)))[0]


def test_collate_is_exactly_upstreams_packing_for_the_same_latents(parity):
    dataset, indices, packer, theirs = parity
    samples = []
    for i in indices:
        row = dataset.rows[i]
        ref = row.get("ref_audio")
        samples.append(Sample(
            text_ids=dataset[i].text_ids,
            latents=_upstream_latents(packer, dataset.root / row["audio"]),
            ref_latents=_upstream_latents(packer, dataset.root / ref) if ref else None,
        ))
    _assert_same_batch(collate(samples, patch_size=4), theirs, atol=0)
    # upstream cuts rows at max_len; so do we (one row of each layout)
    packer.max_len = 40
    short = _upstream_batch(packer, dataset, indices[:2])
    assert short["text_tokens"].shape[1] == 40
    _assert_same_batch(collate(samples[:2], patch_size=4, max_len=40), short, atol=0)


def test_dataset_survives_pickling_for_dataloader_workers(encoded_sample):
    import pickle

    dataset = EncodedDataset(encoded_sample.encoded, "val")
    first = dataset[0]
    clone = pickle.loads(pickle.dumps(dataset))
    assert torch.equal(clone[0].latents, first.latents)
    assert dataset.patch_size == 4 and dataset.latent_dim == 64


# ---------------------------------------------------------------------------------------------
# TokenBudgetSampler / EvalBatches
# ---------------------------------------------------------------------------------------------

LENGTHS = np.random.default_rng(7).integers(20, 400, size=500).tolist() + [5000]  # one row too long


def _check_budget(batches: list[list[int]], max_tokens: int) -> None:
    for b in batches:
        assert b and len(b) * max(LENGTHS[i] for i in b) <= max_tokens


def test_every_batch_fits_the_budget_and_every_row_comes_once_per_epoch():
    sampler = TokenBudgetSampler(LENGTHS, 2048, seed=1, window=128)
    assert sampler.skipped == [500]
    for epoch in range(2):
        batches = sampler.epoch_batches(epoch)
        _check_budget(batches, 2048)
        assert sorted(i for b in batches for i in b) == list(range(500))
    # length bucketing keeps padding low compared with the same data in fixed-size batches
    bucketed = padding_waste(sampler.epoch_batches(0), LENGTHS)
    fixed = padding_waste(fixed_size_batches(500, 8, seed=1), LENGTHS)
    assert bucketed < 0.25 * fixed


def test_sampler_is_deterministic_and_reshuffles_per_epoch():
    a = TokenBudgetSampler(LENGTHS, 2048, seed=3, window=128)
    b = TokenBudgetSampler(LENGTHS, 2048, seed=3, window=128)
    assert a.epoch_batches(0) == b.epoch_batches(0) and a.epoch_batches(1) == b.epoch_batches(1)
    assert a.epoch_batches(0) != a.epoch_batches(1)
    assert TokenBudgetSampler(LENGTHS, 2048, seed=4, window=128).epoch_batches(0) != a.epoch_batches(0)


@pytest.mark.parametrize("drop_last", [False, True])
def test_rank_shards_are_equal_sized_disjoint_and_complete(drop_last):
    world = 3
    samplers = [
        TokenBudgetSampler(LENGTHS, 1024, seed=5, rank=r, world_size=world, window=64, drop_last=drop_last)
        for r in range(world)
    ]
    full = samplers[0].global_batches(2)
    shards = [s.epoch_batches(2) for s in samplers]
    assert len({len(s) for s in shards}) == 1
    assert len({len(s) for s in samplers}) == 1  # len() is the current epoch's (0) count on every rank
    dealt = [batch for step in zip(*shards, strict=True) for batch in step]  # in the global order
    if drop_last:
        assert dealt == full[: len(dealt)] and len(full) - len(dealt) < world
    else:
        padding = len(dealt) - len(full)
        assert 0 <= padding < world and dealt == full + full[:padding]
    rows = [i for b in dealt[: len(full)] for i in b]
    assert len(rows) == len(set(rows))


def test_state_round_trip_resumes_exactly_across_epochs():
    sampler = TokenBudgetSampler(LENGTHS, 2048, seed=9, rank=1, world_size=2, window=100)
    per_epoch = len(sampler)
    it = iter(sampler)
    seen = [next(it) for _ in range(per_epoch - 2)]
    state = sampler.state_dict()
    rest = list(it) + list(sampler)[:3]  # the end of epoch 0, then the start of epoch 1

    resumed = TokenBudgetSampler(LENGTHS, 2048, seed=9, rank=1, world_size=2, window=100)
    resumed.load_state_dict(json.loads(json.dumps(state)))  # survives a checkpoint's serialisation
    assert list(resumed) + list(resumed)[:3] == rest
    assert seen + rest[:2] == sampler.epoch_batches(0)
    assert state["epoch"] == 0 and state["position"] == per_epoch - 2

    other = TokenBudgetSampler(LENGTHS, 2048, seed=9, rank=1, world_size=4, window=100)
    with pytest.raises(ValueError, match="different data or settings"):
        other.load_state_dict(state)


def test_eval_batches_are_fixed_and_count_each_row_once_across_ranks():
    world = 4
    plans = [EvalBatches(LENGTHS, 1500, rank=r, world_size=world) for r in range(world)]
    again = EvalBatches(LENGTHS, 1500, rank=1, world_size=world)
    assert [b.indices for b in plans[1]] == [b.indices for b in again]
    assert len({len(p) for p in plans}) == 1
    counted = [i for p in plans for b in p if b.counted for i in b.indices]
    assert sorted(counted) == list(range(500)) and plans[0].skipped == [500]
    for p in plans:
        _check_budget([b.indices for b in p], 1500)


def test_padding_waste_counts_pad_positions_per_real_position():
    assert padding_waste([[0, 1], [2]], [10, 6, 5]) == pytest.approx(4 / 21)
    assert padding_waste([[0], [1], [2]], [10, 6, 5]) == 0.0


def test_the_token_budget_is_the_rule_every_batch_maker_asks():
    """rows × longest within max_tokens; a row longer than the budget fits nowhere; the planner's largest
    batch is the longest rows the budget and max_length allow; evaluate widens it for its longest row."""
    budget = TokenBudget(600)
    assert TokenBudget.cost(3, 200) == 600 and budget.fits(3, 200) and budget.fits(4, 150)
    assert not budget.fits(4, 151)
    assert budget.admits(600) and not budget.admits(601)
    assert budget.largest_batch(4096) == (1, 600) and budget.largest_batch(250) == (2, 250)
    assert budget.widened_to(500) is budget and budget.widened_to(900) == TokenBudget(900)
    with pytest.raises(ValueError, match="max_tokens must be positive, got 0"):
        TokenBudget(0)
    with pytest.raises(ValueError, match="max_tokens must be positive"):
        TokenBudgetSampler(LENGTHS, 0)
