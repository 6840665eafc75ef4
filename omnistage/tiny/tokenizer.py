"""An offline byte-level BPE tokenizer shaped like Qwen's, for the tiny checkpoint.

Trained deterministically on a small embedded corpus with the same normaliser,
pre-tokeniser and decoder that transformers' ``Qwen2Tokenizer`` builds, so the
saved ``vocab.json``/``merges.txt``/``tokenizer.json`` load unchanged through
``AutoTokenizer``. Qwen's special tokens follow the BPE vocabulary in Qwen's own
order, so each tiny id is ``first_special_id + (real_id - 151643)``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

# The same split rule Qwen2Tokenizer uses; a tokenizer trained with another rule
# would be re-split differently when transformers rebuilds it from vocab+merges.
PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# Qwen3-Omni's special tokens in id order, starting at the real id 151643.
SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>",
    "</think>", "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>",
    "<tts_text_eod>", "<tts_text_bos_single>", "<|audio_pad|>",
)
REAL_FIRST_SPECIAL_ID = 151643
# Added tokens that Qwen's tokenizer marks ``special: false``: decoding keeps them, so the text of an answer
# shows its ``<tool_call>`` markup (what a tool-call parser reads) and its ``<think>`` tags.
TEXT_TOKENS = frozenset({"<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
                         "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
                         "<think>", "</think>"})
# Tokens that are plain text in chat turns but must be single BPE tokens,
# because the model config names their ids (system/user/assistant).
ROLE_WORDS = ("system", "user", "assistant")

_CORPUS = """
The quick brown fox jumps over the lazy dog. A small model speaks and listens.
Hello, how are you today? I am fine, thank you. What is in this picture?
Describe the audio clip. The weather is sunny and warm, with a light breeze.
Please answer in one sentence. Numbers like 1, 2, 3, 42 and 2026 appear too.
You are a helpful assistant that can hear, see and talk. Tell me a short story.
Once upon a time there was a little robot who loved music and long walks.
Speech synthesis turns text into sound; recognition turns sound into text.
The image shows a red square on a white background next to a blue circle.
Streaming audio arrives in chunks so playback can start before the end.
"""


@dataclass(frozen=True)
class TokenizerLayout:
    """Where the special tokens landed in the tiny vocabulary."""

    bpe_size: int
    vocab_size: int

    @property
    def first_special_id(self) -> int:
        return self.bpe_size

    def special_id(self, token: str) -> int:
        return self.bpe_size + SPECIAL_TOKENS.index(token)

    def from_real(self, real_id: int) -> int:
        """Maps a real Qwen3-Omni special-token id to its tiny id."""
        offset = real_id - REAL_FIRST_SPECIAL_ID
        if not 0 <= offset < len(SPECIAL_TOKENS):
            raise ValueError(f"{real_id} is not a Qwen3-Omni special token id")
        return self.bpe_size + offset


def _training_text() -> list[str]:
    # Role words are repeated so the trainer merges each into one token.
    roles = [f"{word}\n" for word in ROLE_WORDS for _ in range(64)]
    return [line for line in _CORPUS.strip().splitlines()] * 8 + roles


def train_tokenizer(bpe_size: int) -> Tokenizer:
    """Trains the byte-level BPE; deterministic for a given size.

    The small corpus may run out of merges before ``bpe_size``: the special
    tokens then start right after the learned vocabulary.
    """
    tok = Tokenizer(models.BPE(unk_token=None, continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=bpe_size,
        min_frequency=1,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(_training_text(), trainer=trainer)
    for word in ROLE_WORDS:
        ids = tok.encode(word).ids
        if len(ids) != 1:
            raise RuntimeError(f"tiny tokenizer failed to make {word!r} one token: {ids}")
    for token in SPECIAL_TOKENS:  # one at a time, so ids follow Qwen's order
        if token in TEXT_TOKENS:
            tok.add_tokens([AddedToken(token, special=False, normalized=False)])
        else:
            tok.add_special_tokens([token])
    return tok


def save_tokenizer(out_dir: Path, bpe_size: int, chat_template: str) -> TokenizerLayout:
    """Writes tokenizer.json, vocab.json, merges.txt and tokenizer_config.json."""
    tok = train_tokenizer(bpe_size)
    learned = tok.get_vocab_size() - len(SPECIAL_TOKENS)
    layout = TokenizerLayout(bpe_size=learned, vocab_size=tok.get_vocab_size())
    tok.save(str(out_dir / "tokenizer.json"))
    model_json = json.loads(tok.to_str())["model"]
    vocab = {k: v for k, v in model_json["vocab"].items() if v < learned}
    (out_dir / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False, sort_keys=True))
    merges = [m if isinstance(m, str) else " ".join(m) for m in model_json["merges"]]
    (out_dir / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    (out_dir / "tokenizer_config.json").write_text(json.dumps(_tokenizer_config(layout, chat_template), indent=2))
    (out_dir / "chat_template.jinja").write_text(chat_template)
    return layout


def _tokenizer_config(layout: TokenizerLayout, chat_template: str) -> dict[str, object]:
    added = {
        str(layout.special_id(t)): {
            "content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
            "special": t not in TEXT_TOKENS,
        }
        for t in SPECIAL_TOKENS
    }
    return {
        "tokenizer_class": "Qwen2Tokenizer",
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 32768,
        "errors": "replace",
        "split_special_tokens": False,
        "extra_special_tokens": {
            "image_token": "<|image_pad|>",
            "audio_token": "<|audio_pad|>",
            "video_token": "<|video_pad|>",
            "vision_bos_token": "<|vision_start|>",
            "vision_eos_token": "<|vision_end|>",
            "audio_bos_token": "<|audio_start|>",
            "audio_eos_token": "<|audio_end|>",
        },
        "chat_template": chat_template,
    }
