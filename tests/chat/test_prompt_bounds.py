"""A prompt that cannot fit is refused by its length, before it is tokenized; the bound is sound."""

from __future__ import annotations

import random

import pytest

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
