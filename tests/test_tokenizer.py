"""Tokenizer parity with upstream: LlamaTokenizerFast.from_pretrained + mask_multichar_chinese_tokens."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from upstream import import_upstream

from voxpipe.model.tokenizer import (
    AUDIO_END_ID,
    AUDIO_START_ID,
    REF_AUDIO_END_ID,
    REF_AUDIO_START_ID,
    VoxTokenizer,
    default_corpus,
    train_tokenizer,
)

TEXTS = [
    "Good morning, everyone.",
    "The recipe calls for two eggs, a cup of flour and a pinch of salt.",
    "今天天气很好，我们一起去公园散步吧。",
    "我们的生活越来越好了。",
    "我们明天用 Python 写一个新的程序。",
    "She said 你好 to everyone, then left at 8:30 p.m.",
    "  leading,  doubled   and trailing spaces  ",
    "tabs\tand\nnew lines",
    "unseen: Zürich, 😀, 龘, Ελληνικά",
    "<|audio_start|>a special token in text<|ref_audio_end|> and <s> too",
    "",
    " ",
]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tok")
    tokenizer = train_tokenizer()
    tokenizer.save(directory)
    return tokenizer, directory


@pytest.fixture(scope="module")
def upstream_tokenizer(saved):
    """Exactly what upstream VoxCPM2Model.from_local builds from a checkpoint directory."""
    import_upstream()
    from transformers import LlamaTokenizerFast
    from voxcpm.model.utils import mask_multichar_chinese_tokens

    return mask_multichar_chinese_tokens(LlamaTokenizerFast.from_pretrained(str(saved[1])))


def test_ids_equal_upstream(saved, upstream_tokenizer):
    trained, directory = saved
    loaded = VoxTokenizer.from_dir(directory)
    for text in TEXTS:
        expected = upstream_tokenizer(text)
        assert loaded.encode(text) == expected, text
        assert trained.encode(text) == expected, text
    assert loaded.encode_batch(TEXTS) == [upstream_tokenizer(t) for t in TEXTS]


def test_multichar_cjk_splitting_is_exercised(saved, upstream_tokenizer):
    """Upstream's raw tokenizer emits multi-character Chinese pieces; both sides split them."""
    tokenizer, _ = saved
    text = "我们今天学习了很多新的汉字"
    raw = upstream_tokenizer.tokenizer.tokenize(text)
    assert any(
        len(t.replace("▁", "")) >= 2 and t.replace("▁", "") in upstream_tokenizer.multichar_tokens
        for t in raw
    )
    ids = tokenizer.encode(text)
    assert len(ids) > len(raw) and ids == upstream_tokenizer(text)
    assert [tokenizer.token_to_id(ch) for ch in text] == ids  # every character is its own piece here


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("我们今天很好的学习 Hello world, 。!\t\n龘é")), max_size=40))
def test_random_text_matches_upstream(saved, upstream_tokenizer, text):
    assert saved[0].encode(text) == upstream_tokenizer(text)


def test_no_bos_and_audio_ids_reserved(saved, upstream_tokenizer):
    tokenizer, directory = saved
    assert tokenizer.vocab_size == 2048
    assert tokenizer.encode("Hello")[0] != tokenizer.token_to_id("<s>")
    hf = upstream_tokenizer.tokenizer
    assert hf.convert_ids_to_tokens([0, 1, 2]) == ["<unk>", "<s>", "</s>"]
    audio_ids = [AUDIO_START_ID, AUDIO_END_ID, REF_AUDIO_START_ID, REF_AUDIO_END_ID]
    assert hf.convert_ids_to_tokens(audio_ids) == [
        "<|audio_start|>",
        "<|audio_end|>",
        "<|ref_audio_start|>",
        "<|ref_audio_end|>",
    ]
    corpus_ids = {i for ids in tokenizer.encode_batch(default_corpus()) for i in ids}
    assert corpus_ids.isdisjoint({0, 1, 2, *audio_ids})
    assert max(corpus_ids) < 2048
    special_map = json.loads((directory / "special_tokens_map.json").read_text())
    assert special_map["additional_special_tokens"] == hf.convert_ids_to_tokens(audio_ids)


def test_save_load_round_trip_is_stable(saved, tmp_path):
    tokenizer, directory = saved
    VoxTokenizer.from_dir(directory).save(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert (tmp_path / name).read_text() == (directory / name).read_text(), name
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "LlamaTokenizerFast" and config["unk_token"] == "<unk>"


def test_training_is_deterministic_and_sized(saved):
    again = train_tokenizer()
    assert all(again.encode(t) == saved[0].encode(t) for t in TEXTS)
    small = train_tokenizer(vocab_size=1024)
    assert small.vocab_size == 1024
    with pytest.raises(ValueError, match="must exceed"):
        train_tokenizer(vocab_size=200)


def test_legacy_config_prepends_after_special_tokens_like_transformers(saved, tmp_path):
    """legacy=true switches transformers 5 to prepend "▁" after every special token; we follow it."""
    import_upstream()
    from transformers import LlamaTokenizerFast

    _, directory = saved
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config["legacy"] = True
    for name in ("tokenizer.json", "special_tokens_map.json"):
        (tmp_path / name).write_text((directory / name).read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    text = "<|audio_start|>hello there"
    hf = LlamaTokenizerFast.from_pretrained(str(tmp_path))
    ours = VoxTokenizer.from_dir(tmp_path)
    assert ours.encode(text) == hf.convert_tokens_to_ids(hf.tokenize(text))
    assert ours.encode(text) != VoxTokenizer.from_dir(directory).encode(text)


def test_bad_input():
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        VoxTokenizer.from_dir("/nonexistent")
    with pytest.raises(TypeError):
        train_tokenizer(vocab_size=300).encode(None)  # type: ignore[arg-type]


def test_legacy_layout_tokenizer_json_matches_upstream(saved, tmp_path):
    """Checkpoints like VoxCPM2's ship the older Llama layout (Prepend+Replace normaliser, no
    pre-tokenizer) and may lack tokenizer_config.json's added_tokens_decoder."""
    import_upstream()
    from transformers import LlamaTokenizerFast
    from voxcpm.model.utils import mask_multichar_chinese_tokens

    _, directory = saved
    spec = json.loads((directory / "tokenizer.json").read_text())
    spec["normalizer"] = {
        "type": "Sequence",
        "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
        ],
    }
    spec["pre_tokenizer"] = None
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False))
    config = json.loads((directory / "tokenizer_config.json").read_text())
    del config["added_tokens_decoder"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "special_tokens_map.json").write_text((directory / "special_tokens_map.json").read_text())

    expected = mask_multichar_chinese_tokens(LlamaTokenizerFast.from_pretrained(str(tmp_path)))
    ours = VoxTokenizer.from_dir(tmp_path)
    for text in TEXTS:
        assert ours.encode(text) == expected(text), text
