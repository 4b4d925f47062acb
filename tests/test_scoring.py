"""Scores in the row's language: the Seed-TTS-eval text rules on fixed strings (results worked out by hand
from its definitions), the choice of recogniser per language, and the Whisper / WavLM / Paraformer wiring.

The Whisper and WavLM models here are tiny and random-init, built from configs and `save_pretrained` to a
folder, then loaded through the same path a user's real folder takes: this checks the wiring, not the
accuracy. No Chinese ASR weights exist on PyPI, so paraformer-zh is checked up to its folder checks.
"""

from __future__ import annotations

import string

import jiwer
import numpy as np
import pytest
import torch
import zhconv
from small_sample import speech_16k
from zhon.hanzi import punctuation

from voxpipe.data.asr import ParaformerZh, Recognisers
from voxpipe.errors import StepError
from voxpipe.evaluate.metrics import intelligibility
from voxpipe.evaluate.scoring import mean_rate, scoring_text, text_units, utterance_rate
from voxpipe.evaluate.speaker import WavLMEncoder, cosine


def test_english_is_lowercased_words_with_ascii_punctuation_deleted_and_apostrophes_kept():
    assert scoring_text("Hello, World -- it's me!", "en") == "hello world it's me"
    # deleted, not replaced by a space (Seed-TTS-eval's str.replace): a hyphenated word becomes one word
    assert scoring_text("A well-known fact.", "en") == "a wellknown fact"
    # the curly apostrophe is in zhon's punctuation (only the ASCII one is kept)
    assert scoring_text("It’s “quoted”", "en") == "its quoted"
    # ref: hello world it's me (4 words); hyp: hello word its me -> 2 substitutions -> 2/4
    rate = utterance_rate("Hello, world -- it's me!", "hello word its me", "en")
    assert (rate.metric, rate.rate, rate.substitutions, rate.units) == ("wer", 0.5, 2, 4)
    assert utterance_rate("Same words.", "SAME WORDS", "en").rate == 0.0


def test_chinese_is_cer_over_characters_with_hanzi_punctuation_deleted():
    assert scoring_text("你好，世界！", "zh") == "你 好 世 界"
    assert scoring_text("他说：“好的”。 OK", "zh") == "他 说 好 的 O K"
    # ref 今天天气很好 (6 chars); hyp 今天天汽很好 -> 1 substitution -> 1/6
    rate = utterance_rate("今天天气很好。", "今天天汽很好", "zh")
    assert (rate.metric, rate.substitutions, rate.units) == ("cer", 1, 6)
    assert rate.rate == pytest.approx(1 / 6)
    # ref 你好世界 (4); hyp 你好世界啊 -> 1 insertion -> 1/4; spaces in the hypothesis do not count
    rate = utterance_rate("你好，世界！", "你好 世界 啊", "zh")
    assert (rate.insertions, rate.rate) == (1, 0.25)
    assert utterance_rate("你好", "", "zh").rate == 1.0  # nothing heard: every character deleted


def _run_wer(truth: str, hypo: str, lang: str) -> float:
    """Seed-TTS-eval's run_wer.py on one pair, as it reads: zhconv on a zh hypothesis (done there right
    after paraformer), then process_one (its jiwer compute_measures is process_words in jiwer 4)."""
    if lang == "zh":
        hypo = zhconv.convert(hypo, "zh-cn")
    for x in punctuation + string.punctuation:
        if x != "'":
            truth, hypo = truth.replace(x, ""), hypo.replace(x, "")
    truth, hypo = truth.replace("  ", " "), hypo.replace("  ", " ")
    if lang == "zh":
        truth, hypo = " ".join(list(truth)), " ".join(list(hypo))
    else:
        truth, hypo = truth.lower(), hypo.lower()
    return jiwer.process_words(truth, hypo).wer


# (reference, hypothesis, language, rate worked by hand from run_wer.py's rules)
SEED_TTS_PAIRS = [
    ("我们的朋友。", "我們的朋友", "zh", 0.0),  # the hypothesis goes to simplified: 們 -> 们
    ("这个软件很好用", "這個軟體很好用", "zh", 0.0),  # zh-cn conversion is by phrase: 軟體 -> 软件
    ("我們", "我們", "zh", 0.5),  # only the hypothesis is converted: 們 vs 们, 1 of 2
    ("他说：“好的”", "他说好的", "zh", 0.0),  # hanzi punctuation ignored
    ("用AI写诗", "用ai写诗", "zh", 0.4),  # letters are characters in zh and keep their case: 2 of 5
    ("你 好", "你好", "zh", 0.0),  # spaces are not characters
    ("Hello, World!", "hello world", "en", 0.0),  # English: punctuation and case ignored
    ("It's here.", "its here", "en", 0.5),  # the ASCII apostrophe is kept: 1 of 2
    ("A well-known fact", "a well known fact", "en", 2 / 3),  # wellknown vs well known: 1 sub + 1 ins of 3
    ("Hello\u00a0world", "hello world", "en", 2.0),  # a lone no-break space joins: 1 sub + 1 ins of 1
    ("hello  world", "hello\tworld", "en", 1.0),  # so does a lone tab in the hypothesis: 1 sub + 1 del of 2
    ("我們", "我們", "en", 0.0),  # no zhconv outside Chinese
]


@pytest.mark.parametrize(("reference", "hypothesis", "language", "expected"), SEED_TTS_PAIRS)
def test_rates_follow_seed_tts_eval_run_wer(reference, hypothesis, language, expected):
    assert _run_wer(reference, hypothesis, language) == pytest.approx(expected)  # the hand-worked figure
    assert utterance_rate(reference, hypothesis, language).rate == pytest.approx(expected)


class _Traditional:
    """A recogniser that writes traditional characters, as Whisper often does for Mandarin."""

    backend, model = "fake", "fake"

    def covers(self, language: str) -> bool:
        return True

    def transcribe(self, wav: np.ndarray, language: str) -> str:
        return "我們說「你好」"


def test_every_chinese_hypothesis_is_simplified_whichever_recogniser_heard_it():
    recognisers = Recognisers([])
    recognisers.loaded = [_Traditional()]
    heard, rate = intelligibility(np.zeros(16000, np.float32), "我们说：“你好”。", "zh", recognisers)
    assert heard["transcript"] == "我們說「你好」"  # recorded as heard; scored as simplified
    assert (rate.rate, heard["cer"]) == (0.0, 0.0)


def test_the_figure_is_the_mean_of_per_utterance_rates_and_an_empty_reference_has_none():
    rates = [utterance_rate("a b c d", "a b c x", "en"), utterance_rate("one", "one", "en")]
    assert mean_rate(rates) == pytest.approx((0.25 + 0.0) / 2)  # total edits / words would be 1/5
    assert utterance_rate("…！", "anything", "zh") is None and mean_rate([None]) is None
    assert text_units("Hi, you!") == 5 and text_units("你好，世界。") == 4


def test_a_language_without_a_configured_recogniser_gets_null_with_the_reason():
    silence = np.zeros(16000, dtype=np.float32)
    heard, rate = intelligibility(silence, "你好世界", "zh", Recognisers([]))
    assert rate is None and heard["cer"] is None and heard["metric"] == "cer" and heard["asr"] is None
    assert "evaluate.asr is empty" in heard["asr_reason"]
    recognisers = Recognisers(["pocketsphinx"])
    heard, rate = intelligibility(np.zeros(16000, dtype=np.float32), "你好世界", "zh", recognisers)
    assert rate is None and "no configured recogniser covers language 'zh'" in heard["asr_reason"]
    assert recognisers.for_language("en").recogniser.backend == "pocketsphinx"


SPECIALS = ["<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|zh|>", "<|translate|>", "<|transcribe|>",
            "<|notimestamps|>"]


def tiny_whisper(folder) -> None:
    """A random-init Whisper with a word-level tokenizer: the files a real whisper folder has."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import (
        GenerationConfig,
        PreTrainedTokenizerFast,
        WhisperConfig,
        WhisperFeatureExtractor,
        WhisperForConditionalGeneration,
    )

    vocab = {w: i for i, w in enumerate(["hello", "world", "你", "好", *SPECIALS])}
    words = Tokenizer(models.WordLevel(vocab, unk_token="hello"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=words, additional_special_tokens=SPECIALS,
                            eos_token="<|endoftext|>", pad_token="<|endoftext|>").save_pretrained(folder)
    eos = vocab["<|endoftext|>"]
    config = WhisperConfig(vocab_size=len(vocab), d_model=16, encoder_layers=1, decoder_layers=1,
                           encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                           decoder_ffn_dim=32, max_target_positions=32, pad_token_id=eos, eos_token_id=eos,
                           bos_token_id=eos, decoder_start_token_id=vocab["<|startoftranscript|>"])
    torch.manual_seed(0)
    model = WhisperForConditionalGeneration(config)
    model.generation_config = GenerationConfig(
        decoder_start_token_id=config.decoder_start_token_id, eos_token_id=eos, pad_token_id=eos,
        max_length=16, is_multilingual=True, no_timestamps_token_id=vocab["<|notimestamps|>"],
        lang_to_id={"<|en|>": vocab["<|en|>"], "<|zh|>": vocab["<|zh|>"]},
        task_to_id={"transcribe": vocab["<|transcribe|>"], "translate": vocab["<|translate|>"]},
    )
    model.save_pretrained(folder)
    WhisperFeatureExtractor(feature_size=config.num_mel_bins).save_pretrained(folder)


def test_whisper_from_a_folder_hears_the_languages_its_generation_config_lists(tmp_path):
    tiny_whisper(tmp_path / "whisper")
    recognisers = Recognisers(["pocketsphinx", "whisper"], {"whisper_model": str(tmp_path / "whisper")})
    assert recognisers.for_language("en").recogniser.backend == "pocketsphinx"  # the first that covers it
    whisper = recognisers.for_language("zh").recogniser
    assert whisper.backend == "whisper" and whisper.model == str(tmp_path / "whisper")
    wav = np.random.default_rng(0).standard_normal(16000).astype(np.float32) * 0.1
    heard, _ = intelligibility(wav, "你好", "zh", recognisers)
    assert heard["asr"] == "whisper" and isinstance(heard["transcript"], str) and heard["metric"] == "cer"
    assert heard["cer"] is not None and heard["cer"] >= 0
    assert recognisers.for_language("ko").recogniser is None  # not in its lang_to_id
    with pytest.raises(StepError, match="asr.whisper_model is not set"):
        Recognisers(["whisper"], {})


def test_paraformer_needs_its_folder_and_says_which_files(tmp_path):
    with pytest.raises(StepError, match="asr.paraformer_model is not set"):
        ParaformerZh(None)
    (tmp_path / "model.onnx").write_bytes(b"")
    with pytest.raises(StepError, match=r"not a model folder \(no tokens.txt\)"):
        ParaformerZh(str(tmp_path))


def test_sensevoice_needs_its_folder_and_says_which_files(tmp_path):
    from voxpipe.data.asr import SenseVoice

    with pytest.raises(StepError, match="asr.sensevoice_model is not set"):
        SenseVoice(None)
    with pytest.raises(StepError, match=r"asr.sensevoice_model \S*nowhere: no such folder"):
        SenseVoice(str(tmp_path / "nowhere"))
    (tmp_path / "model.int8.onnx").write_bytes(b"")
    with pytest.raises(StepError, match=r"not a model folder \(no tokens.txt\)"):
        SenseVoice(str(tmp_path))


def test_wavlm_from_a_folder_embeds_a_clip_and_not_silence(tmp_path):
    from transformers import Wav2Vec2FeatureExtractor, WavLMConfig, WavLMForXVector

    config = WavLMConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                         conv_dim=(16, 16), conv_kernel=(10, 3), conv_stride=(5, 2),
                         num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2, tdnn_dim=(16, 16),
                         tdnn_kernel=(3, 1), tdnn_dilation=(1, 1), xvector_output_dim=8)
    torch.manual_seed(0)
    WavLMForXVector(config).save_pretrained(tmp_path / "wavlm")
    Wav2Vec2FeatureExtractor(return_attention_mask=True).save_pretrained(tmp_path / "wavlm")
    encoder = WavLMEncoder(str(tmp_path / "wavlm"))
    assert encoder.backend == "wavlm" and encoder.model == str(tmp_path / "wavlm")
    wav = np.random.default_rng(1).standard_normal(16000).astype(np.float32) * 0.1
    e = encoder.embed(wav, 16000)
    assert e.shape == (8,) and cosine(e, encoder.embed(wav, 16000)) == pytest.approx(1.0)
    assert encoder.embed(np.zeros(16000, dtype=np.float32), 16000) is None
    with pytest.raises(StepError, match="evaluate.wavlm_model"):
        WavLMEncoder(str(tmp_path / "nothing"))


def test_each_registered_backend_names_a_factory_and_params_fields_that_exist():
    """voxpipe/backends.py is the one registration: its factories import, its fields are asr / evaluate
    params, and evaluate.asr / evaluate.speaker admit exactly its names."""
    import importlib
    import typing

    from voxpipe.backends import ASR, QUALITY, QUALITY_BACKEND, SPEAKER
    from voxpipe.steps.asr import AsrParams
    from voxpipe.steps.evaluate import EvaluateParams

    for registry, section in ((ASR, AsrParams), (SPEAKER, EvaluateParams), (QUALITY, EvaluateParams)):
        for name, backend in registry.items():
            module, attr = backend.factory.split(":")
            made = getattr(importlib.import_module(module), attr)
            assert backend.name == name and getattr(made, "backend", name) == name
            assert all(f in section.model_fields for f in backend.fields), backend
    assert QUALITY_BACKEND in QUALITY
    fields = EvaluateParams.model_fields
    assert typing.get_args(typing.get_args(fields["asr"].annotation)[0]) == tuple(ASR)
    assert typing.get_args(fields["speaker"].annotation) == tuple(SPEAKER)


def test_a_backend_not_registered_is_a_one_line_error_naming_the_registered_ones():
    from pydantic import ValidationError

    from voxpipe.steps.evaluate import EvaluateParams

    for key, value in (("asr", ["nemo"]), ("speaker", "ecapa")):
        with pytest.raises(ValidationError) as e:
            EvaluateParams(**{key: value})
        line = e.value.errors()[0]["msg"]
        assert "\n" not in line and all(f"'{n}'" in line for n in (
            ("pocketsphinx", "whisper", "paraformer-zh") if key == "asr" else ("resemblyzer", "wavlm")))


def test_speaker_encoder_loads_the_registered_one_with_its_fields(tmp_path):
    from voxpipe.evaluate.speaker import speaker_encoder

    with pytest.raises(StepError, match="evaluate.wavlm_model"):
        speaker_encoder("wavlm", {"wavlm_model": str(tmp_path / "nothing")})


def test_pocketsphinx_in_its_own_process_hears_what_it_heard_in_ours():
    """asr.PocketSphinx decodes in a child (it holds the GIL for a whole utterance): the same decoder and
    settings in this process give the same transcripts, utterance after utterance (the decoder carries its
    cepstral mean from one to the next, so the order matters and is kept); an empty clip is heard as
    nothing; the child's CPU time is counted, and it ends with its object."""
    import gc

    from pocketsphinx import Decoder

    from voxpipe.data.asr import PocketSphinx
    from voxpipe.data.pocketsphinx_worker import MAX_HMM_PER_FRAME

    wav = speech_16k(1)[0]
    decoder = Decoder(samprate=16000, maxhmmpf=MAX_HMM_PER_FRAME, loglevel="FATAL")
    expected = []
    for _ in range(2):
        decoder.start_utt()
        decoder.process_raw((np.clip(wav, -1, 1) * 32767).astype(np.int16).tobytes(), full_utt=True)
        decoder.end_utt()
        expected.append(decoder.hyp().hypstr)
    recogniser = PocketSphinx()
    heard = [recogniser.transcribe(w, "en") for w in (wav, np.zeros(0, dtype=np.float32), wav)]
    assert all(expected) and heard == [expected[0], "", expected[1]] and recogniser.cpu_seconds > 0
    child = recogniser._child
    del recogniser
    gc.collect()
    assert child.wait(timeout=10) == 0


def test_a_dead_pocketsphinx_process_is_one_paragraph_naming_the_way_out():
    from voxpipe.data.asr import PocketSphinx

    recogniser = PocketSphinx()
    recogniser._child.kill()
    recogniser._child.wait()
    with pytest.raises(StepError, match=r"pocketsphinx process ended \(exit code -9.*leave pocketsphinx out"):
        recogniser.transcribe(speech_16k(1)[0], "en")
