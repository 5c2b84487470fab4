"""The checks a request passes before it is queued (engine/requests/admission.py): each refusal a DLMError
saying what to change, and the engine serving on after it."""

import pytest
from tests.helpers import PARITY

from dlm_backend import LLM, DLMError, SamplingParams
from dlm_backend.errors import ContextLengthError, SamplingParamsError, TokenizerError

PROMPT = [5, 6, 7, 8]


def test_stop_strings_need_a_tokenizer_and_template_tokens_the_vocabulary():
    llm = LLM(str(PARITY / "dream-tiny"))                   # token ids only: no tokenizer.json
    with pytest.raises(TokenizerError, match="Stop strings need the checkpoint's tokenizer.json"):
        llm.generate(prompt_token_ids=[PROMPT], sampling_params=SamplingParams(max_tokens=4, stop=["."]))
    with pytest.raises(DLMError, match=r"Response template tokens must be None or integers in \[0, 320\)"):
        llm.generate(prompt_token_ids=[PROMPT], sampling_params=SamplingParams(max_tokens=4),
                     response_template=[None, 320])
    with pytest.raises(SamplingParamsError, match="sampling_params must be a SamplingParams, not dict"):
        llm.engine.add_request(PROMPT, {"max_tokens": 4})
    assert not llm.engine.has_unfinished                    # nothing refused was queued


def test_unknown_sampler_lists_registered():
    llm = LLM(str(PARITY / "llada-tiny"))
    with pytest.raises(SamplingParamsError, match="Unknown sampler 'nope'.*dream.*llada.*threshold"):
        llm.generate(prompt_token_ids=[[1, 2, 3]], sampling_params=SamplingParams(sampler="nope"))


def test_prompt_over_context_window():
    llm = LLM(str(PARITY / "llada-tiny"))            # max_sequence_length 512
    with pytest.raises(ContextLengthError, match="over the model's context of 512"):
        llm.generate(prompt_token_ids=[[1] * 500], sampling_params=SamplingParams(max_tokens=64))


def test_bad_prompt_ids_and_empty_prompt():
    llm = LLM(str(PARITY / "llada-tiny"))
    with pytest.raises(DLMError, match=r"\[0, 320\)"):
        llm.generate(prompt_token_ids=[[1, 999]])
    with pytest.raises(DLMError, match="empty"):
        llm.generate(prompt_token_ids=[[]])


def test_engine_keeps_serving_after_bad_requests():
    llm = LLM(str(PARITY / "llada-tiny"))
    with pytest.raises(DLMError):
        llm.generate(prompt_token_ids=[[1] * 600])
    out = llm.generate(prompt_token_ids=[[1, 2, 3]], sampling_params=SamplingParams(max_tokens=8))[0]
    assert len(out.token_ids) <= 8 and out.num_forward_passes >= 1


def test_response_template_validation():
    from dlm_backend.errors import SamplingParamsError
    llm = LLM(str(PARITY / "dream-tiny"))
    with pytest.raises(SamplingParamsError, match="raise max_tokens"):
        llm.generate(prompt_token_ids=[PROMPT], sampling_params=SamplingParams(max_tokens=2),
                     response_template=[1, 2, 3])
    full = llm.generate(prompt_token_ids=[PROMPT], sampling_params=SamplingParams(max_tokens=3, ignore_eos=True),
                        response_template=[1, 2, 3])[0]
    assert full.token_ids == [1, 2, 3] and full.num_forward_passes == 0


def test_a_request_larger_than_the_whole_cache_is_refused_up_front():
    llm = LLM(str(PARITY / "llada-tiny"), dtype="float32", kv_cache_memory=1 << 20,       # 64 pages of 16 positions
              config_overrides={"max_sequence_length": 4096})
    pages = llm.engine.allocator.num_pages
    too_long = pages * llm.engine.allocator.page_size + 1
    with pytest.raises(ContextLengthError, match="KV pages.*kv_cache_memory"):
        llm.generate(prompt_token_ids=[[5] * 8], sampling_params=SamplingParams(
            max_tokens=min(too_long, llm.engine.max_model_len - 8), cache="prefix"))


def test_admission_builds_the_one_sequence_a_request_is_decoded_as(monkeypatch):
    from dlm_backend.engine.requests.sequence import Sequence

    built = []
    init = Sequence.__init__
    monkeypatch.setattr(Sequence, "__init__", lambda self, *a, **k: (built.append(self), init(self, *a, **k))[1])
    llm = LLM(str(PARITY / "llada-tiny"))
    params = SamplingParams(sampler="llada", max_tokens=8, block_length=4, ignore_eos=True)
    chunks = llm.stream(prompt_token_ids=PROMPT, sampling_params=params)       # admitted here, at the call
    assert len(built) == 1 and not llm.engine.has_unfinished
    final = list(chunks)[-1]
    assert len(built) == 1 and final.output.request_id == built[0].request_id     # the one admitted is the one run
    seq = llm.engine.admit(PROMPT, params)                  # admission checks and builds; nothing is queued
    assert len(built) == 2 and not llm.engine.has_unfinished
    assert llm.engine.enqueue(seq) is seq and llm.engine.has_unfinished
    llm.generate(prompt_token_ids=[PROMPT], sampling_params=params)
    assert len(built) == 3                                  # one more request, one more sequence
