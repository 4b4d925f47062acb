"""VoxCPM2's text tokenizer on the `tokenizers` library alone (no transformers at run time).

Upstream turns text into ids with `LlamaTokenizerFast.tokenize` (no BOS/EOS) followed by its
multi-character-CJK splitting, in training and in inference alike. `VoxTokenizer.encode` gives
the same ids: it runs the pipeline transformers 5 builds for a Llama tokenizer (byte-fallback BPE
behind a Metaspace "▁" pre-tokenizer, no normaliser; for plain text this equals the legacy
Prepend+Replace normaliser older transformers read from tokenizer.json) and then replaces every
token made only of 2+ CJK ideographs by its single characters, looked up without byte fallback.

`train_tokenizer` makes the small English+Chinese tokenizer of the tiny/small presets, saved in a
layout that `transformers.LlamaTokenizerFast.from_pretrained` loads.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from voxpipe.files import read_json_object

# Raw ids VoxCPM2 puts into the LM sequence around audio (never produced from text by upstream).
AUDIO_START_ID, AUDIO_END_ID, REF_AUDIO_START_ID, REF_AUDIO_END_ID = 101, 102, 103, 104

UNK, BOS, EOS = "<unk>", "<s>", "</s>"
# Our tiny tokenizer reserves the four audio ids as special tokens so ordinary text never maps to them.
AUDIO_SPECIAL_TOKENS = {
    AUDIO_START_ID: "<|audio_start|>",
    AUDIO_END_ID: "<|audio_end|>",
    REF_AUDIO_START_ID: "<|ref_audio_start|>",
    REF_AUDIO_END_ID: "<|ref_audio_end|>",
}
METASPACE = "▁"
CORPUS_FILE = Path(__file__).with_name("tokenizer_corpus.txt")


def _is_multichar_cjk(token: str) -> bool:
    return len(token) >= 2 and all("\u4e00" <= c <= "\u9fff" for c in token)


def _token_content(value: Any) -> str | None:
    """tokenizer_config.json stores special tokens as a string or an AddedToken-like dict."""
    return value.get("content") if isinstance(value, dict) else value


def _added_token(spec: dict[str, Any]) -> AddedToken:
    return AddedToken(
        spec["content"],
        single_word=spec.get("single_word", False),
        lstrip=spec.get("lstrip", False),
        rstrip=spec.get("rstrip", False),
        normalized=spec.get("normalized", False),
        special=spec.get("special", True),
    )


def _added_token_spec(token: AddedToken) -> dict[str, Any]:
    return {
        "content": token.content,
        "lstrip": token.lstrip,
        "normalized": token.normalized,
        "rstrip": token.rstrip,
        "single_word": token.single_word,
        "special": token.special,
    }


class VoxTokenizer:
    """Text -> token ids exactly as upstream VoxCPM2 feeds them to its LM."""

    def __init__(self, tokenizer: Tokenizer, config: dict[str, Any]):
        """`tokenizer` already has its added tokens; `config` is tokenizer_config.json's content."""
        self.config = config
        self.unk_token = _token_content(config.get("unk_token")) or UNK
        # transformers 5 rebuilds a Llama tokenizer's pre-tokenizer from these two settings
        add_prefix_space = config.get("add_prefix_space")
        add_prefix_space = True if add_prefix_space is None else add_prefix_space
        scheme = ("always" if config.get("legacy", False) else "first") if add_prefix_space else "never"
        tokenizer.normalizer = None
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(
            replacement=METASPACE, prepend_scheme=scheme, split=False
        )
        self._tokenizer = tokenizer
        self._vocab = tokenizer.get_vocab(with_added_tokens=True)
        if self.unk_token not in self._vocab:
            raise ValueError(f"unk token {self.unk_token!r} is not in the vocabulary")
        self.unk_id = self._vocab[self.unk_token]
        self._multichar = {t for t in self._vocab if _is_multichar_cjk(t)}

    @property
    def vocab_size(self) -> int:
        return len(self._vocab)

    def token_to_id(self, token: str) -> int | None:
        return self._vocab.get(token)

    @classmethod
    def from_dir(cls, directory: str | Path) -> VoxTokenizer:
        """Load tokenizer.json (+ tokenizer_config.json and special_tokens_map.json when present)."""
        directory = Path(directory)
        path = directory / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(
                f"{path}: missing (a VoxCPM2 checkpoint ships its tokenizer as tokenizer.json)"
            )
        try:
            spec = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
            raise ValueError(f"{path}: not a tokenizer file ({e}); copy tokenizer.json again from the base "
                             "checkpoint") from None
        config_path = directory / "tokenizer_config.json"
        config = read_json_object(config_path, "the tokenizer config") if config_path.is_file() else {}
        special_map_path = directory / "special_tokens_map.json"
        special_map = (
            read_json_object(special_map_path, "the special tokens map") if special_map_path.is_file() else {}
        )

        # Like transformers 5: added tokens come from tokenizer_config's added_tokens_decoder when it
        # has one (else from tokenizer.json), plus the named special tokens.
        if "added_tokens_decoder" in config:
            added = [
                _added_token(t)
                for _, t in sorted(config["added_tokens_decoder"].items(), key=lambda x: int(x[0]))
            ]
            spec["added_tokens"] = []
        else:
            added = []
        try:
            tokenizer = Tokenizer.from_str(json.dumps(spec))
        except Exception as e:  # the tokenizers library raises a bare Exception for a bad spec
            raise ValueError(f"{path}: not a tokenizer the `tokenizers` library can load ({e}); copy "
                             "tokenizer.json again from the base checkpoint") from None
        named = [
            _token_content(config.get(key, special_map.get(key, default)))
            for key, default in (("unk_token", UNK), ("bos_token", BOS), ("eos_token", EOS))
        ]
        extra = config.get("extra_special_tokens") or special_map.get("additional_special_tokens") or []
        if isinstance(extra, dict):  # transformers 5 also allows named extra tokens
            extra = list(extra.values())
        present = {t.content for t in tokenizer.get_added_tokens_decoder().values()} | {
            t.content for t in added
        }
        added += [
            AddedToken(t, special=True, normalized=False)
            for t in [*named, *map(_token_content, extra)]
            if t and t not in present
        ]
        tokenizer.add_tokens(added)
        return cls(tokenizer, config)

    def _split_cjk(self, tokens: list[str], ids: list[int]) -> list[int]:
        out: list[int] = []
        for token, token_id in zip(tokens, ids, strict=True):
            bare = token.replace(METASPACE, "")
            if bare in self._multichar:
                out.extend(self._vocab.get(ch, self.unk_id) for ch in bare)
            else:
                out.append(token_id)
        return out

    def encode(self, text: str) -> list[int]:
        """Ids of `text` without BOS/EOS, multi-character CJK tokens split into characters."""
        if not isinstance(text, str):
            raise TypeError(f"expected a string, got {type(text).__name__}")
        enc = self._tokenizer.encode(text, add_special_tokens=False)
        return self._split_cjk(enc.tokens, enc.ids)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        for text in texts:
            if not isinstance(text, str):
                raise TypeError(f"expected strings, got {type(text).__name__}")
        encodings = self._tokenizer.encode_batch(texts, add_special_tokens=False)
        return [self._split_cjk(e.tokens, e.ids) for e in encodings]

    def decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=True)

    def save(self, directory: str | Path) -> None:
        """Write tokenizer.json, tokenizer_config.json, special_tokens_map.json (LlamaTokenizerFast style)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self._tokenizer.save(str(directory / "tokenizer.json"))
        added = self._tokenizer.get_added_tokens_decoder()
        config = {"tokenizer_class": "LlamaTokenizerFast", **self.config}
        config["added_tokens_decoder"] = {str(i): _added_token_spec(t) for i, t in sorted(added.items())}
        (directory / "tokenizer_config.json").write_text(
            json.dumps(config, ensure_ascii=False, indent=2) + "\n"
        )
        special_map = {
            k: _token_content(config[k]) for k in ("bos_token", "eos_token", "unk_token") if config.get(k)
        }
        named = set(special_map.values())
        extra = [t.content for _, t in sorted(added.items()) if t.special and t.content not in named]
        if extra:
            special_map["additional_special_tokens"] = extra
        (directory / "special_tokens_map.json").write_text(
            json.dumps(special_map, ensure_ascii=False, indent=2) + "\n"
        )


def default_corpus() -> list[str]:
    """The embedded English + Chinese sentences the tiny/small tokenizers are trained on."""
    lines = CORPUS_FILE.read_text(encoding="utf-8").splitlines()
    return [line for line in lines if line.strip() and not line.startswith("#")]


def _fixed_tokens() -> list[str]:
    """Tokens with fixed ids: <unk> <s> </s>, byte-fallback pieces, and the audio specials at 101-104."""
    tokens = [UNK, BOS, EOS]
    byte_pieces = iter(f"<0x{b:02X}>" for b in range(256))
    while len(tokens) < AUDIO_START_ID:
        tokens.append(next(byte_pieces))
    tokens += [AUDIO_SPECIAL_TOKENS[i] for i in sorted(AUDIO_SPECIAL_TOKENS)]
    tokens += list(byte_pieces)
    return tokens


def train_tokenizer(texts: Iterable[str] | None = None, vocab_size: int = 2048) -> VoxTokenizer:
    """Train a Llama-style byte-fallback BPE (deterministic for the same texts and size).

    Merges never cross word boundaries, so the "▁"-prefixed pieces behave the same whether the
    pre-tokenizer splits on spaces or not. Chinese text yields multi-character pieces, which is
    what exercises upstream's CJK splitting.
    """
    texts = default_corpus() if texts is None else list(texts)
    fixed = _fixed_tokens()
    if vocab_size <= len(fixed):
        raise ValueError(f"vocab_size must exceed the {len(fixed)} reserved tokens, got {vocab_size}")
    trainer_tok = Tokenizer(models.BPE(unk_token=UNK, byte_fallback=True, fuse_unk=True))
    trainer_tok.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement=METASPACE, prepend_scheme="first", split=True
    )
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=fixed, show_progress=False)
    trainer_tok.train_from_iterator(texts, trainer)

    trained = json.loads(trainer_tok.to_str())["model"]
    vocab, merges = (
        trained["vocab"],
        [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in trained["merges"]],
    )
    misplaced = [t for i, t in enumerate(fixed) if vocab.get(t) != i]
    if misplaced:  # the trainer is expected to number special tokens first, in order
        raise RuntimeError(f"reserved tokens got unexpected ids: {misplaced[:5]}")

    tokenizer = Tokenizer(
        models.BPE(vocab=vocab, merges=merges, unk_token=UNK, byte_fallback=True, fuse_unk=True)
    )
    tokenizer.decoder = decoders.Sequence(
        [
            decoders.Replace(METASPACE, " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    specials = [UNK, BOS, EOS, *(AUDIO_SPECIAL_TOKENS[i] for i in sorted(AUDIO_SPECIAL_TOKENS))]
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    config = {
        "tokenizer_class": "LlamaTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "unk_token": UNK,
        "pad_token": None,
        "add_bos_token": True,
        "add_eos_token": False,
        "legacy": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 8192,
    }
    return VoxTokenizer(tokenizer, config)
