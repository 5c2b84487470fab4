"""Prompts (chat/prompt.py): messages through the checkpoint's chat template, tools written in for a
template that has none, and a prompt that cannot fit refused by its length before it is tokenized."""

from __future__ import annotations

import random

import pytest
from tests.chat.chat_cases import WEATHER

from dlm_backend.chat import ChatRequest, Plan
from dlm_backend.chat.prompt import COMPOSITION, check_length, longest_token
from dlm_backend.engine.params import SamplingParams
from dlm_backend.errors import ContextLengthError
from dlm_backend.llm import LLM


@pytest.fixture(scope="module")
def llms(dream_chat, llada_chat):
    return [LLM(str(dream_chat)), LLM(str(llada_chat))]


def test_an_overlong_prompt_is_refused_before_it_is_tokenized(llms, monkeypatch):
    """900 KB was tokenized whole (900,000 ids checked one by one) before the context check."""
    for llm in llms:
        seen = []
        encode = llm.tokenizer.encode
        monkeypatch.setattr(llm.tokenizer, "encode", lambda text: seen.append(len(text)) or encode(text))
        request = ChatRequest([{"role": "user", "content": "x " * 450_000}], SamplingParams(max_tokens=8))
        with pytest.raises(ContextLengthError, match="characters long") as err:
            Plan(llm, request)
        assert err.value.param == "messages" and max(seen, default=0) < 10_000
        with pytest.raises(ContextLengthError, match="server's prompt limit of 20"):
            Plan(llm, ChatRequest([{"role": "user", "content": "x " * 5000}], SamplingParams(max_tokens=8)),
                 max_prompt_tokens=20)


def test_the_length_bound_never_refuses_a_prompt_that_fits(llms):
    """Texts built to pack the most characters into each token still have at least
    len / (longest * COMPOSITION) tokens, so only prompts that cannot fit are refused."""
    rng = random.Random(0)
    for llm in llms:
        tok = llm.tokenizer
        longest = longest_token(tok)
        assert longest is not None and longest <= 30
        pieces = [tok.decode([i], skip_special_tokens=False) for i in range(tok.vocab_size)]
        pieces.sort(key=len, reverse=True)
        for trial in range(40):
            long_ones = [rng.choice(pieces[:20]) for _ in range(rng.randint(1, 400))]
            text = "".join(long_ones) + "".join(rng.choice("aé\u0301 \n{}\"") for _ in range(rng.randint(0, 50)))
            tokens = len(tok.encode(text))
            assert tokens * longest * COMPOSITION >= len(text), (trial, tokens, len(text))
            check_length(tok, text, tokens, "the test's limit")          # the exact count always passes
        with pytest.raises(ContextLengthError):
            check_length(tok, "x" * (100 * longest * COMPOSITION + 1), 100, "the test's limit")


def test_template_without_tools_gets_a_tool_prompt(llada_chat):
    llm = LLM(str(llada_chat))
    plan = Plan(llm, ChatRequest([{"role": "user", "content": "weather?"}], tools=[WEATHER]))
    text = llm.tokenizer.decode(plan.prompt_ids, skip_special_tokens=False)
    assert "get_weather" in text and "<tool_call>" in text


def test_template_without_tools_keeps_the_tool_turns(llada_chat):
    """An agent's second turn on LLaDA: its own call and the result must reach the prompt as text."""
    llm = LLM(str(llada_chat))
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "weather in Oslo?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "sunny, 21 C"}]
    for tools in ([WEATHER], None):         # frameworks may drop the tools on the turn after the result
        text = llm.tokenizer.decode(Plan(llm, ChatRequest(messages, tools=tools)).prompt_ids,
                                    skip_special_tokens=False)
        assert text.count("system<|end_header_id|>") == 1 and "Be brief." in text
        assert ("You can call these tools" in text) == bool(tools)
        assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>' in text
        assert "user<|end_header_id|>\n\n<tool_response>\nsunny, 21 C\n</tool_response>" in text
        assert "tool<|end_header_id|>" not in text
