"""Tokenizer (tokenizers library) and chat template (sandboxed Jinja) read from a checkpoint folder, or
built in memory from a GGUF file's metadata (:meth:`Tokenizer.from_parts`, checkpoint/gguf_tokenizer.py)."""

from __future__ import annotations

import bisect
import itertools
import json
import re
from pathlib import Path

import jinja2
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models

from dlm_backend.engine.checkpoint.chat_template import BoundedSandbox
from dlm_backend.engine.checkpoint.files import (MAX_JSON_BYTES, MAX_TEMPLATE_BYTES, MAX_TOKENIZER_BYTES,
                                                 read_checkpoint_file)
from dlm_backend.errors import TokenizerError

SPECIAL_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token", "mask_token")
_SENTINEL = "DLMTURNSENTINEL"


_SURROGATE = re.compile("[\ud800-\udfff]")


def _content(token) -> str | None:
    return token.get("content") if isinstance(token, dict) else token


def _valid(text: str) -> str:
    """``text`` with each lone surrogate as U+FFFD, one character for one, so offsets still hold (the
    tokenizers library takes only valid Unicode)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text)
    return text


class ControlTokens:
    """The control tokens of one tokenizer: where client text holds one, and text encoded as ordinary
    text with none of them coming out."""

    def __init__(self, tok: HFTokenizer, tokens: dict, reserved: frozenset):
        self._tok = tok
        #: the control tokens' ids, and the characters the chat templates themselves write
        self.ids, self.reserved = frozenset(tokens), reserved
        # The control tokens matched as the tokenizer matches them (leftmost-longest, with its normalizer
        # and each token's flags: a normalized token is found in its normalized forms too), in Rust:
        # 6,000 <unusedN> in 260 KB of "<unused" took 0.03 s here, 0.16 s as a Python regex.
        self._matcher = HFTokenizer(models.WordLevel({"\ufffe": 0}, unk_token="\ufffe"))
        self._matcher.normalizer = tok.normalizer
        self._matcher.add_special_tokens([t for t in tokens.values() if t.special])
        self._matcher.add_tokens([t for t in tokens.values() if not t.special])

    def spans(self, texts: list[str]) -> dict[int, list[tuple[int, int]]]:
        """The (start, end) of each control token the tokenizer would read in ``texts``, by the index of
        the text; texts with none are left out."""
        out: dict[int, list[tuple[int, int]]] = {}
        if not self.ids or not texts:
            return out
        # One pass over the texts joined by NUL, which no control token holds: 20 tools of 1,600
        # properties (64,000 strings) took 0.8 s encoded one by one, 0.1 s joined.
        starts = list(itertools.accumulate((len(t) + 1 for t in texts[:-1]), initial=0))
        found = self._matcher.encode(_valid("\0".join(texts)), add_special_tokens=False)
        for i, (start, end) in zip(found.ids, found.offsets):
            if i:
                k = bisect.bisect_right(starts, start) - 1
                if end > starts[k] + len(texts[k]):     # across a NUL the normalizer dropped: one by one
                    batch = self._matcher.encode_batch([_valid(t) for t in texts], add_special_tokens=False)
                    return {k: s for k, e in enumerate(batch) if (s := [o for i, o in zip(e.ids, e.offsets) if i])}
                out.setdefault(k, []).append((start - starts[k], end - starts[k]))
        return out

    def plain_ids(self, text: str) -> list[int]:
        """Ids of ``text`` as ordinary text: normalized, pre-tokenized and split by the model with no
        added token matched; a piece the model itself reads as a control token is cut in two."""
        text = _valid(text)
        tok = self._tok
        norm = tok.normalizer.normalize_str(text) if tok.normalizer is not None else text
        words = tok.pre_tokenizer.pre_tokenize_str(norm) if tok.pre_tokenizer is not None else [(norm, None)]
        ids = [t.id for word, _ in words for t in tok.model.tokenize(word)]
        if len(text) > 1 and not self.ids.isdisjoint(ids):
            half = len(text) // 2
            return self.plain_ids(text[:half]) + self.plain_ids(text[half:])
        return ids


class Tokenizer:
    """``tokenizer.json`` plus the special tokens and chat template from ``tokenizer_config.json``."""

    def __init__(self, folder: Path):
        # Read by us, confined to the folder and bounded in size (a CheckpointError otherwise), then parsed.
        data = read_checkpoint_file(folder, "tokenizer.json", MAX_TOKENIZER_BYTES)
        if data is None:
            raise TokenizerError(f"{folder} has no tokenizer.json, so text prompts cannot be encoded. "
                                 "Pass prompt_token_ids instead, or add the checkpoint's tokenizer.json.")
        config = read_checkpoint_file(folder, "tokenizer_config.json", MAX_JSON_BYTES)
        try:
            self._tok = HFTokenizer.from_str(data.decode("utf-8"))
            self.config = json.loads(config) if config is not None else {}
            if not isinstance(self.config, dict):
                raise ValueError("tokenizer_config.json must hold a JSON object")
        except (Exception, RecursionError) as exc:  # noqa: BLE001 - tokenizers raises a bare Exception on a bad file
            raise TokenizerError(f"{folder}'s tokenizer files do not load ({type(exc).__name__}: "
                                 f"{str(exc)[:200]}). Re-download the checkpoint or replace tokenizer.json / "
                                 "tokenizer_config.json.") from None
        self._setup(self._find_templates(folder))

    @classmethod
    def from_parts(cls, tok: HFTokenizer, config: dict, templates: dict[str, str]) -> Tokenizer:
        """A tokenizer built in memory (a GGUF file's vocabulary): ``config`` holds what
        tokenizer_config.json would (its special-token fields), ``templates`` name -> chat template,
        "default" the plain one."""
        self = cls.__new__(cls)
        self._tok, self.config = tok, config
        self._setup(dict(templates))
        return self

    def _setup(self, templates: dict[str, str]) -> None:
        self.special_tokens = {k: _content(self.config.get(k)) for k in SPECIAL_KEYS if self.config.get(k)}
        self.templates = templates
        self._compiled: dict[str, jinja2.Template] = {}
        self._special_ids = {i for i, t in self._tok.get_added_tokens_decoder().items() if t.special}
        self._env = BoundedSandbox()
        self._controls: dict[tuple, ControlTokens] = {}

    def _find_templates(self, folder: Path) -> dict[str, str]:
        """Name -> template; ``default`` is the plain one. A list in tokenizer_config.json names them
        (``[{"name": "default", ...}, {"name": "tool_use", ...}]``), as Hugging Face reads it."""
        jinja_file = read_checkpoint_file(folder, "chat_template.jinja", MAX_TEMPLATE_BYTES)
        if jinja_file is not None:
            return {"default": jinja_file.decode("utf-8", errors="replace")}
        template = self.config.get("chat_template")
        if isinstance(template, list):
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict) and t.get("template")}
            if named and "default" not in named:
                named["default"] = next(iter(named.values()))
        else:
            named = {"default": template} if template else {}
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in named.items()):
            raise TokenizerError(f"{folder / 'tokenizer_config.json'}: 'chat_template' must be a string or a list "
                                 "of {'name': str, 'template': str}. Fix the file.")
        return named

    @property
    def chat_template(self) -> str | None:
        return self.templates.get("default")

    @property
    def renders_tools(self) -> bool:
        """Whether a template here writes a tool listing (LLaDA's does not: tools go in as text)."""
        return any("tools" in t for t in self.templates.values())

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def to_json(self) -> str:
        """The tokenizer as tokenizer.json text (a GGUF file's, rebuilt from its metadata, included)."""
        return self._tok.to_str()

    def token_id(self, token: str | None) -> int | None:
        return None if token is None else self._tok.token_to_id(token)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; special-token strings in it map to their ids, nothing is added."""
        if not isinstance(text, str):
            raise TokenizerError(f"A prompt must be text (str), not {type(text).__name__}; pass token ids "
                                 "as prompt_token_ids.")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            # Lone surrogates: bytes that were not UTF-8 (stdin and argv keep them as \udcXX) or a bad
            # JSON escape. The tokenizer takes only valid Unicode; each becomes U+FFFD, as a decoder would.
            text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        return self._tok.encode(text, add_special_tokens=False).ids

    def control_tokens(self, markers: tuple[str, ...] = ()) -> ControlTokens:
        """The added tokens that are control tokens (computed once per ``markers``): the special ones,
        those tokenizer_config.json names, those named in ``markers`` (tags the caller writes itself),
        ``<|...|>`` ones (Qwen2.5's FIM tokens are not special) and those a chat template writes
        (Qwen's <tool_call>, <think>). Other added tokens read as text and stay tokens wherever they
        are, as in training: Gemma's vocabulary adds HTML tags and whitespace runs this way."""
        found = self._controls.get(markers)
        if found is None:
            extra = self.config.get("additional_special_tokens")
            extra = map(_content, extra) if isinstance(extra, list) else ()
            named = {c for c in (*self.special_tokens.values(), *extra) if isinstance(c, str)}
            written = "".join(self.templates.values())

            def control(token) -> bool:
                text = token.content
                if not text.strip():                    # whitespace runs ("\n\n") are text in any vocabulary
                    return False
                return (token.special or text in named or text in markers or (text[:2] == "<|" and text[-2:] == "|>")
                        or (text in written and not text.replace("_", "").isalnum()))

            tokens = {i: t for i, t in self._tok.get_added_tokens_decoder().items() if control(t)}
            found = self._controls[markers] = ControlTokens(self._tok, tokens, frozenset(written))
        return found

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict], tools: list[dict] | None = None,
                            add_generation_prompt: bool = True, **kwargs) -> str:
        """Render ``messages`` (and ``tools``) with the checkpoint's template in a Jinja sandbox."""
        if not self.chat_template:
            raise TokenizerError("This checkpoint has no chat template (tokenizer_config.json "
                                 "'chat_template' or chat_template.jinja). Use generate() with a raw "
                                 "prompt, or add a chat template to the checkpoint.")
        name = "tool_use" if tools and "tool_use" in self.templates else "default"
        if name not in self._compiled:
            self._compiled[name] = self._env.compile_template(self.templates[name])
        # the caller's values win over the checkpoint's special tokens, as in transformers
        return self._env.render(self._compiled[name], messages=messages, tools=tools or None,
                                add_generation_prompt=add_generation_prompt, **{**self.special_tokens, **kwargs})

    def end_of_turn_ids(self) -> list[int]:
        """Special tokens the template writes right after an assistant message (e.g. <|eot_id|>)."""
        if not self.chat_template:
            return []
        try:
            text = self.apply_chat_template(
                [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _SENTINEL}],
                add_generation_prompt=False)
        except TokenizerError:
            return []
        _, _, tail = text.partition(_SENTINEL)
        ids = [i for i in self.encode(tail) if i in self._special_ids]
        return ids[:1]
