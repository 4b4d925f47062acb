"""`evaluate.speaker: wavlm-ecapa` (voxpipe/evaluate/ecapa.py) against seed-tts-eval's own model.

A random-init checkpoint in wavlm_large_finetune.pth's layout is made here from seed-tts-eval's
ECAPA_TDNN_SMALL (tests/seedtts_reference/, verbatim copies) with a small WavLM trunk (UniSpeech's WavLM,
as s3prl's hub expert wraps it: tests/seedtts_reference/s3prl_wavlm.py), saved with torch.save, then
loaded through voxpipe's real path (torch.load(weights_only=True), the trunk renamed onto transformers'
WavLMModel). Both embed the same real clips (the shipped sample's espeak voices at 16 kHz) and must give
the same cosines to 1e-4. Bad files get one-paragraph errors.
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import numpy as np
import pytest
import torch

from voxpipe.backends import SPEAKER
from voxpipe.data.audio import decode
from voxpipe.data.dataset import EncodedDataset
from voxpipe.errors import StepError
from voxpipe.evaluate.ecapa import WavLMEcapaEncoder
from voxpipe.evaluate.speaker import cosine, speaker_encoder

# WavLM-Large's layout (layer-norm conv extractor, layer norm first, gated relative position bias,
# input normalisation), small widths so the test runs on a CPU in seconds
SMALL_WAVLM = {
    "extractor_mode": "layer_norm", "encoder_layers": 2, "encoder_embed_dim": 64,
    "encoder_ffn_embed_dim": 128, "encoder_attention_heads": 4, "layer_norm_first": True,
    "conv_bias": False, "normalize": True,
    "conv_pos": 16, "conv_pos_groups": 4, "relative_position_embedding": True, "num_buckets": 320,
    "max_distance": 800, "gru_rel_pos": True, "dropout": 0.0, "attention_dropout": 0.0,
    "activation_dropout": 0.0, "encoder_layerdrop": 0.0, "dropout_input": 0.0, "dropout_features": 0.0,
}


@pytest.fixture(scope="module")
def reference_model(clips):
    """seed-tts-eval's ECAPA_TDNN_SMALL(feat_type="wavlm_large"), its hub trunk built locally, random-init
    (BatchNorm statistics and the layer mix too, so every loaded tensor matters). The last BatchNorm's
    statistics are then those of the clips' pooled features, as training leaves them: without that a random
    head maps every clip to nearly one vector (cosines all ~0.99) and the comparison would prove little."""
    from tests.seedtts_reference import ecapa_tdnn
    from tests.seedtts_reference.s3prl_wavlm import WavLMExpert

    torch.manual_seed(0)
    hub_load = torch.hub.load
    torch.hub.load = lambda repo, name, *a, **k: WavLMExpert(SMALL_WAVLM)  # what s3prl's hub would return
    try:
        model = ecapa_tdnn.ECAPA_TDNN_SMALL(feat_dim=64, feat_type="wavlm_large").eval()
    finally:
        torch.hub.load = hub_load
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if name.endswith("running_var"):
                tensor.copy_(torch.rand_like(tensor) + 0.5)
            elif name.endswith(("running_mean", "feature_weight")):
                tensor.copy_(torch.randn_like(tensor) * 0.3)
        pooled: list[torch.Tensor] = []
        hook = model.bn.register_forward_hook(lambda _m, args, _out: pooled.append(args[0]))
        for clip in clips:
            model(torch.from_numpy(clip)[None])
        hook.remove()
        model.bn.running_mean.copy_(torch.cat(pooled).mean(0))
        model.bn.running_var.copy_(torch.cat(pooled).var(0) + 1e-4)
    return model


@pytest.fixture(scope="module")
def checkpoint(reference_model, tmp_path_factory):
    """The random-init model saved as UniSpeech saves wavlm_large_finetune.pth: {"model": state_dict}."""
    path = tmp_path_factory.mktemp("ecapa") / "wavlm_large_finetune.pth"
    torch.save({"model": reference_model.state_dict()}, path)
    return path


@pytest.fixture(scope="module")
def clips(encoded_sample) -> list[np.ndarray]:
    """Two real clips of each of the sample's voices, 16 kHz mono."""
    data = EncodedDataset(encoded_sample.encoded, "train")
    out: dict[str, list[np.ndarray]] = {}
    for row in sorted(data.rows, key=lambda r: r["id"]):
        mine = out.setdefault(row["speaker"], [])
        if len(mine) < 2:
            mine.append(decode(data.root / row["audio"], 16000))
    return [clip for speaker in sorted(out) for clip in out[speaker]]


def test_wavlm_ecapa_is_registered_with_its_checkpoint_field():
    backend = SPEAKER["wavlm-ecapa"]
    assert backend.fields == ("ecapa_model",)
    assert backend.factory == "voxpipe.evaluate.ecapa:WavLMEcapaEncoder"


def test_cosines_match_seed_tts_evals_ecapa_tdnn(reference_model, checkpoint, clips):
    encoder = speaker_encoder("wavlm-ecapa", {"ecapa_model": str(checkpoint)})
    assert isinstance(encoder, WavLMEcapaEncoder)
    with torch.no_grad():
        theirs = [reference_model(torch.from_numpy(c)[None]) for c in clips]
    ours = [encoder.embed(c, 16000) for c in clips]
    assert all(e is not None and e.shape == (256,) for e in ours)
    expected = {}
    for i, j in itertools.combinations(range(len(clips)), 2):
        expected[i, j] = float(torch.nn.functional.cosine_similarity(theirs[i], theirs[j])[0])
        assert cosine(ours[i], ours[j]) == pytest.approx(expected[i, j], abs=1e-4), (i, j)
    assert max(expected.values()) - min(expected.values()) > 0.1, expected  # the clips do differ
    # the embeddings themselves, not just their angles: one direction
    for o, t in zip(ours, theirs, strict=True):
        assert cosine(o, t[0].numpy()) > 1 - 1e-5


def test_a_clip_resampled_from_48k_scores_like_its_16k_original(checkpoint, clips):
    import soxr

    encoder = WavLMEcapaEncoder(str(checkpoint))
    up = soxr.resample(clips[0], 16000, 48000)
    assert cosine(encoder.embed(up, 48000), encoder.embed(clips[0], 16000)) > 0.99
    assert encoder.embed(np.zeros(16000, np.float32), 16000) is None  # silence: no voice to embed


def test_a_safetensors_copy_loads_the_same(checkpoint, clips, tmp_path):
    from safetensors.torch import save_file

    state = torch.load(checkpoint, weights_only=True)["model"]
    save_file({k: v.contiguous() for k, v in state.items()}, tmp_path / "ecapa.safetensors")
    a = WavLMEcapaEncoder(str(checkpoint)).embed(clips[0], 16000)
    b = WavLMEcapaEncoder(str(tmp_path / "ecapa.safetensors")).embed(clips[0], 16000)
    np.testing.assert_allclose(a, b, atol=1e-6)


def test_bad_checkpoints_get_one_paragraph_errors(checkpoint, tmp_path):
    with pytest.raises(StepError, match="needs evaluate.ecapa_model"):
        WavLMEcapaEncoder(None)
    with pytest.raises(StepError, match="is not a file"):
        WavLMEcapaEncoder(str(tmp_path / "missing.pth"))
    pickled = tmp_path / "pickled.pth"
    torch.save({"model": {}, "args": argparse.Namespace(lr=1e-4)}, pickled)  # weights_only refuses objects
    with pytest.raises(StepError, match="weights_only=True.*safetensors"):
        WavLMEcapaEncoder(str(pickled))
    state = torch.load(checkpoint, weights_only=True)["model"]
    headless = tmp_path / "headless.pth"
    torch.save({"model": {k: v for k, v in state.items() if not k.startswith("layer4.")}}, headless)
    with pytest.raises(StepError, match="ECAPA head lacks"):
        WavLMEcapaEncoder(str(headless))
    trunkless = tmp_path / "trunkless.pth"
    torch.save({"model": {k: v for k, v in state.items() if not k.startswith("feature_extract.")}}, trunkless)
    with pytest.raises(StepError, match="no WavLM trunk"):
        WavLMEcapaEncoder(str(trunkless))



def test_a_full_size_wavlm_large_trunk_maps_name_for_name_and_shape_for_shape(monkeypatch):
    """At WavLM-Large's real size (UniSpeech's WavLM at the released model's config, on the meta device: no
    memory, no weights), the trunk config read from the tensors is WavLM-Large's, and every renamed
    checkpoint tensor is one of transformers' WavLMModel's, with its shape."""
    from transformers import WavLMModel

    from tests.seedtts_reference import WavLM as unispeech
    from voxpipe.evaluate.ecapa import _trunk_config, _trunk_key

    monkeypatch.setattr(unispeech, "init_bert_params", lambda module: None)  # it copies data: not on meta
    large = {"extractor_mode": "layer_norm", "encoder_layers": 24, "encoder_embed_dim": 1024,
             "encoder_ffn_embed_dim": 4096, "encoder_attention_heads": 16, "layer_norm_first": True,
             "conv_bias": False, "normalize": True, "relative_position_embedding": True, "num_buckets": 320,
             "max_distance": 800, "gru_rel_pos": True}
    with torch.device("meta"):
        trunk = unispeech.WavLM(unispeech.WavLMConfig(large)).state_dict()
        config = _trunk_config(trunk, Path("wavlm_large_finetune.pth"))
        ours = WavLMModel(config).state_dict()
    shape = (config.hidden_size, config.num_hidden_layers, config.num_attention_heads,
             config.intermediate_size, config.num_conv_pos_embeddings, config.num_conv_pos_embedding_groups)
    assert shape == (1024, 24, 16, 4096, 128, 16)
    assert sum(t.numel() for t in trunk.values()) > 3e8  # WavLM-Large's ~315 M parameters
    renamed = {_trunk_key(k): t.shape for k, t in trunk.items()}
    wanted = {k.replace("parametrizations.weight.original0", "weight_g")
              .replace("parametrizations.weight.original1", "weight_v"): t.shape for k, t in ours.items()}
    assert renamed == wanted
