"""Tokenizer (tokenizers library) and chat template (sandboxed Jinja) read from a checkpoint folder."""

from __future__ import annotations

import json
from pathlib import Path

import jinja2
from tokenizers import Tokenizer as HFTokenizer

from dlm_backend.engine.checkpoint.chat_template import BoundedSandbox
from dlm_backend.engine.checkpoint.files import (MAX_JSON_BYTES, MAX_TEMPLATE_BYTES, MAX_TOKENIZER_BYTES,
                                                 read_checkpoint_file)
from dlm_backend.errors import TokenizerError

SPECIAL_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token", "mask_token")
_SENTINEL = "DLMTURNSENTINEL"


def _content(token) -> str | None:
    return token.get("content") if isinstance(token, dict) else token


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
        self.special_tokens = {k: _content(self.config.get(k)) for k in SPECIAL_KEYS if self.config.get(k)}
        self.templates = self._find_templates(folder)
        self._compiled: dict[str, jinja2.Template] = {}
        self._special_ids = {i for i, t in self._tok.get_added_tokens_decoder().items() if t.special}
        self._env = BoundedSandbox()

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
