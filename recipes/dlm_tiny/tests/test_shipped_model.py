"""The embedded dlm-tiny on held-out prompts of the recipe's corpus: what `dlm eval` measures, in
slices small enough for every test run (the full figures are in findings.md)."""

import pytest

from dlm_backend import LLM, SamplingParams
from dlm_tiny.corpus import NOT_IN_CONTEXT
from dlm_tiny.evaluate import held_out, score

# the eval's reference decoding: llada one token per pass on a 64-token canvas, blocks of 32
GREEDY = SamplingParams(sampler="llada", max_tokens=64, block_length=32, steps=64, cache="none")


def _answers(llm: LLM, examples, params=GREEDY) -> list[str]:
    prompts = [llm.encode_chat(e.messages, tools=e.tools) for e in examples]
    return [o.text for o in llm.generate(prompt_token_ids=prompts, sampling_params=params)]


@pytest.mark.parametrize("family", ["chat", "qa", "tool_call", "json", "tool_result"])
def test_answers_held_out_prompts(family):
    with LLM() as llm:
        examples = [e for e in held_out(8) if e.family == family][:4]
        texts = _answers(llm, examples)
    hits = [score(e, t)["exact"] for e, t in zip(examples, texts)]
    assert sum(hits) >= 3, [(e.target, t) for e, t in zip(examples, texts)]


def test_says_so_when_the_answer_is_not_in_the_context():
    """The 10 held-out questions (of 200) about an attribute nobody in the context has: the shipped
    model refuses 9 at its own decoding defaults (s5, shipped before s6, refused 5)."""
    with LLM() as llm:
        examples = [e for e in held_out(200) if e.family == "qa" and e.target == NOT_IN_CONTEXT
                    and not e.expected["distractor"]]
        texts = _answers(llm, examples, llm.sampling_params(max_tokens=64))
    assert len(examples) == 10 and sum(t.strip() == NOT_IN_CONTEXT for t in texts) >= 6, texts
