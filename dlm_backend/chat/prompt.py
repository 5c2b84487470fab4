"""Messages to prompt token ids through the checkpoint's chat template."""

from __future__ import annotations

from dlm_backend.chat.messages import normalize_messages


def encode_chat(tokenizer, messages: list[dict], tools: list[dict] | None = None, **template_kwargs) -> list[int]:
    """Token ids of ``messages`` (OpenAI shapes accepted) rendered for the assistant's turn."""
    messages = normalize_messages(messages)
    return tokenizer.encode(tokenizer.apply_chat_template(messages, tools=tools, **template_kwargs))
