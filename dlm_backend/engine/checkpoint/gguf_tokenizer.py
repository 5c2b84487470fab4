"""A GGUF file's vocabulary and chat template as the engine's Tokenizer, built in memory (no files
written): a byte-level BPE ``tokenizers.Tokenizer`` like the ``tokenizer.json`` the file was converted
from, and the special tokens and templates ``tokenizer_config.json`` would name.

llama.cpp's converter (``_set_vocab_gpt2``) writes ``tokenizer.ggml.model = "gpt2"``, the tokens by
id (ids the HF vocabulary lacks as ``[PAD{i}]``, type UNUSED), their types (added special tokens
CONTROL, other added tokens USER_DEFINED), the merges as ``"a b"`` strings, the special token ids,
and ``tokenizer.ggml.pre``: a name for the pre-tokenizer (the regex is not stored; llama.cpp keeps one
per name in src/llama-vocab.cpp). The names here map to the regex the HF ``tokenizer.json`` of those
models holds, which llama.cpp's own table rewrites by hand for its regex engine.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers
from tokenizers import Regex
from tokenizers import Tokenizer as HFTokenizer

from dlm_backend.engine.checkpoint.files import MAX_TEMPLATE_BYTES
from dlm_backend.engine.checkpoint.gguf_names import Meta
from dlm_backend.engine.checkpoint.tokenizer import Tokenizer
from dlm_backend.engine.models.config_reader import MAX_VOCAB
from dlm_backend.errors import CheckpointError

NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5           # gguf.TokenType
#: Qwen2's tokenizer.json split (Dream's): one digit per piece
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
         r"|\s+(?!\S)|\s+")
#: Llama 3's: digits in runs of up to three
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
          r"|\s+(?!\S)|\s+")


@dataclass(frozen=True)
class Split:
    """How one ``tokenizer.ggml.pre`` name splits text before BPE."""

    regex: str | None           # None: GPT-2's own, the one ByteLevel applies itself
    nfc: bool = False           # Qwen2's tokenizer.json normalizes to NFC first
    ignore_merges: bool = False  # Llama 3 takes a word that is a token whole (llama.cpp: ignore_merges)


#: ``tokenizer.ggml.pre`` -> split, grouped as src/llama-vocab.cpp groups the names (its QWEN2, LLAMA3,
#: DBRX/SMAUG and GPT2 pre-tokenizer types); Dream's files say "qwen2".
PRE_TOKENIZERS = {
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen"), Split(QWEN2, nfc=True)),
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"),
                    Split(LLAMA3, ignore_merges=True)),
    **dict.fromkeys(("smaug-bpe", "dbrx"), Split(LLAMA3)),
    **dict.fromkeys(("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0",
                     "mellum", "exaone4"), Split(None)),
}
SPECIAL_IDS = {"bos_token": "bos_token_id", "eos_token": "eos_token_id", "pad_token": "padding_token_id",
               "unk_token": "unknown_token_id", "mask_token": "mask_token_id"}


def _merge(text: str, where: str) -> tuple[str, str]:
    """``"a b"`` -> (a, b), split at the first space after the first character, as llama.cpp reads it."""
    cut = text.find(" ", 1)
    if cut < 0:
        raise CheckpointError(f"{where}: GGUF merge {text!r:.40} is not two tokens joined by a space. The file is "
                              "damaged; re-download it.")
    return text[:cut], text[cut + 1:]


def build_tokenizer(meta: Meta) -> Tokenizer | None:
    """The tokenizer the metadata describes; None when the file carries no vocabulary (token ids only)."""
    where = meta.where
    if "tokenizer.ggml.tokens" not in meta:
        return None
    kind = meta.get("tokenizer.ggml.model", str, "gpt2")
    if kind != "gpt2":
        raise CheckpointError(f"{where}: GGUF tokenizer model {kind!r:.40} is not read; this engine builds byte-level "
                              "BPE vocabularies ('gpt2') only. Pass prompt_token_ids with the model's safetensors "
                              "release, or use that release's tokenizer.json.")
    pre_name = meta.get("tokenizer.ggml.pre", str, "default")
    split = PRE_TOKENIZERS.get(pre_name)
    if split is None:
        raise CheckpointError(f"{where}: GGUF pre-tokenizer {pre_name!r:.40} is not one this engine rebuilds "
                              f"({', '.join(PRE_TOKENIZERS)}), so text would split differently from the model's "
                              "training. Use the model's safetensors release (its tokenizer.json).")
    tokens = meta.get("tokenizer.ggml.tokens", list)
    types = meta.get("tokenizer.ggml.token_type", list, None) or [NORMAL] * len(tokens)
    if len(tokens) > MAX_VOCAB or len(types) != len(tokens):
        raise CheckpointError(f"{where}: GGUF vocabulary of {len(tokens)} tokens with {len(types)} token types; "
                              f"expected one type per token and at most {MAX_VOCAB}. Re-download the file.")
    vocab: dict[str, int] = {}
    for i, (text, kind) in enumerate(zip(tokens, types)):
        if kind == UNUSED:          # ids the HF vocabulary never had ([PAD{i}]): absent there too
            continue
        if vocab.setdefault(text, i) != i:
            raise CheckpointError(f"{where}: GGUF token {text!r:.40} appears twice (ids {vocab[text]} and {i}). The "
                                  "file is damaged; re-download it.")
    merges = [_merge(m, where) for m in meta.get("tokenizer.ggml.merges", list, [])]
    try:
        tok = HFTokenizer(models.BPE(vocab, merges, ignore_merges=split.ignore_merges))
    except Exception as exc:  # noqa: BLE001 - tokenizers raises a bare Exception (a merge of unknown tokens)
        raise CheckpointError(f"{where}: the GGUF vocabulary does not make a BPE tokenizer ({str(exc)[:200]}). "
                              "Re-download the file.") from None
    if split.nfc:
        tok.normalizer = normalizers.NFC()
    bytes_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=split.regex is None)
    tok.pre_tokenizer = bytes_level if split.regex is None else pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(split.regex), "isolated"), bytes_level])
    tok.decoder = decoders.ByteLevel()
    # Added tokens keep their ids: each is in the BPE vocabulary already, so tokenizers reuses it.
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, k in zip(tokens, types) if k == CONTROL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t, k in zip(tokens, types) if k == USER_DEFINED])
    config = {}
    for name, key in SPECIAL_IDS.items():
        i = meta.get(f"tokenizer.ggml.{key}", int, None)
        if i is not None and 0 <= i < len(tokens):
            config[name] = tokens[i]
    return Tokenizer.from_parts(tok, config, _templates(meta))


def _templates(meta: Meta) -> dict[str, str]:
    """``tokenizer.chat_template`` as "default" and each ``tokenizer.chat_template.{name}`` that
    ``tokenizer.chat_templates`` lists (how the converter writes a tokenizer_config.json list)."""
    keys = {"default": "tokenizer.chat_template"}
    keys.update({n: f"tokenizer.chat_template.{n}" for n in meta.get("tokenizer.chat_templates", list, [])
                 if isinstance(n, str)})
    out = {}
    for name, key in keys.items():
        text = meta.get(key, str, None)
        if text is None:
            continue
        if len(text) > MAX_TEMPLATE_BYTES:
            raise CheckpointError(f"{meta.where}: GGUF metadata {key!r} is {len(text)} characters, over the "
                                  f"{MAX_TEMPLATE_BYTES >> 20} MiB this engine reads for a chat template.")
        out[name] = text
    if out and "default" not in out:
        out["default"] = next(iter(out.values()))
    return out
