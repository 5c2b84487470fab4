"""Messages to prompt token ids through the checkpoint's chat template, refused before tokenizing
when they cannot fit.

A 900 KB message was tokenized whole (900,000 tokens with the test tokenizer, then as many Python
ints checked one by one) before the length check said no; four at once held ``/health`` for 2.6 s.
A token covers at most ``longest_token`` characters of the text it came from, so a text of more than
``limit * longest_token * COMPOSITION`` characters has more than ``limit`` tokens, and is refused by
its length.

Why the bound holds: each character of the text is covered by at least one token (byte-level BPE
covers every byte, and one character is at least one byte), and no token covers more characters
than the longest token decodes to (a byte-level token of ``b`` bytes touches at most ``b``
characters and decodes to at least that many: a partial character becomes one U+FFFD). Two things
can shrink text before it is split: Unicode normalization folds at most four code points into one
(U+1F87 is alpha and three combining marks), hence :data:`COMPOSITION`; and a tokenizer that
deletes or collapses text (stripped accents, collapsed spaces, fused unknowns) has no such bound,
so :func:`longest_token` probes for those and turns the check off for such a tokenizer.
"""

from __future__ import annotations

import contextlib
import threading
import weakref

from dlm_backend.chat.messages import normalize_messages
from dlm_backend.chat.tool_calls import fallback_messages, normalize_tools, tool_choice_name
from dlm_backend.errors import ContextLengthError

COMPOSITION = 4
#: Texts a tokenizer that deletes or merges input shrinks past the bound: runs of spaces, combining
#: marks, control characters, private-use characters (unknown to most vocabularies).
_PROBES = (" " * 2048, "a" + "\u0301" * 2047, "\x00" * 2048, "\U000f0000" * 2048, "\n" * 2048)
_LONGEST: "weakref.WeakKeyDictionary[object, int | None]" = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def longest_token(tokenizer) -> int | None:
    """The most characters one token of ``tokenizer`` stands for (computed once per tokenizer), or
    None when the tokenizer shrinks text past that bound, so the length check cannot be trusted."""
    with _LOCK:
        known = _LONGEST.get(tokenizer, False)
    if known is not False:
        return known
    # +1: a Metaspace decoder drops the space that a word's first token stands for.
    longest = 1 + max((len(tokenizer.decode([i], skip_special_tokens=False)) for i in range(tokenizer.vocab_size)),
                      default=0)
    if any(len(tokenizer.encode(p)) * longest * COMPOSITION < len(p) for p in _PROBES):
        longest = None
    with _LOCK, contextlib.suppress(TypeError):      # a tokenizer without weak references: not cached
        _LONGEST[tokenizer] = longest
    return longest


def check_length(tokenizer, text: str, max_prompt_tokens: int, why: str, param: str = "messages") -> None:
    """A ContextLengthError when ``text`` is provably over ``max_prompt_tokens`` tokens, without
    tokenizing it (see the module's docstring for why the bound holds); ``why`` says where the limit
    comes from."""
    if max_prompt_tokens < 1:
        raise ContextLengthError(f"No prompt fits: {why}. Lower max_tokens.", param="max_tokens")
    longest = longest_token(tokenizer)
    if longest is None:
        return
    most = max_prompt_tokens * longest * COMPOSITION
    if len(text) > most:
        raise ContextLengthError(
            f"The prompt is {len(text)} characters long, so over {max_prompt_tokens} tokens (no token of this "
            f"model stands for more than {longest} characters), the most this request can send: {why}. Shorten the "
            "prompt (fewer documents or turns) or lower max_tokens.", param=param)


def prompt_limit(llm, max_tokens: int, max_prompt_tokens: int | None = None) -> tuple[int, str]:
    """The most prompt tokens a request asking for ``max_tokens`` can send, and why: the model's
    context less ``max_tokens``, or a server's ``max_prompt_tokens`` when lower."""
    context = llm.engine.max_model_len
    if max_prompt_tokens is not None and max_prompt_tokens < context - max_tokens:
        return max_prompt_tokens, f"this server's prompt limit of {max_prompt_tokens} tokens"
    return context - max_tokens, f"the model's context of {context} less max_tokens {max_tokens}"


def prompt_ids(tokenizer, messages: list[dict], tools: list[dict] | None = None,
               limit: tuple[int, str] | None = None, **template_kwargs) -> list[int]:
    """The prompt every caller sends, built here only: ``messages`` (OpenAI shapes accepted) and
    ``tools`` (as :func:`normalize_tools` returns them) through the chat template, ready for the
    assistant's turn; where the template writes no tool listing (LLaDA's), tools and tool turns are
    written in as text. With ``limit`` (most prompt tokens, where that limit comes from), a rendered
    prompt that cannot fit is refused before it is tokenized."""
    messages = normalize_messages(messages)
    has_tool_turns = any(m["role"] == "tool" or m.get("tool_calls") for m in messages)
    if (tools or has_tool_turns) and not tokenizer.renders_tools:
        messages, tools = fallback_messages(messages, tools), None
    text = tokenizer.apply_chat_template(messages, tools=tools, **template_kwargs)
    if limit is not None:
        check_length(tokenizer, text, *limit)
    return tokenizer.encode(text)


def count_prompt_tokens(tokenizer, messages: list[dict], tools: list[dict] | None = None, tool_choice=None) -> int:
    """Tokens of the prompt these messages and tools make, as a request sends it: what the
    engine reports as ``usage.prompt_tokens``. Never refused for length (a trimmer counts the
    conversation it is about to shorten)."""
    tools = normalize_tools(tools)
    if tool_choice_name(tool_choice, tools) == "none":
        tools = None
    return len(prompt_ids(tokenizer, messages, tools))
