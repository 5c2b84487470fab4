"""Splits beyond two even halves: four ranks over llada2-tiny's two key/value heads (each head
replicated on two ranks) and sixteen experts (four per rank), and Fast-dLLM v2 through Dream's
layers; greedy tokens and passes equal one device's."""

import pytest
from tests.helpers import FIXTURES

from dlm_backend import LLM

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32], [40, 41, 42]]


@pytest.mark.parametrize("folder, mask, size", [("llada2-tiny", 494, 4), ("fastdllm2-tiny", 500, 2)])
def test_more_ranks_than_key_value_heads_and_another_family_give_the_one_device_tokens(folder, mask, size):
    outs = []
    for tp in (1, size):
        with LLM(str(FIXTURES / "parity-block" / folder), device="cpu", dtype="float32", tensor_parallel_size=tp,
                 config_overrides={"mask_token_id": mask}) as llm:
            if tp > 1:
                assert llm.engine.runner.model.kv_shapes[0][0] == max(1, llm.engine.model_args.num_kv_heads // tp)
            params = llm.sampling_params(temperature=0.0, ignore_eos=True, max_tokens=12)
            outs.append([(o.token_ids, o.num_forward_passes)
                         for o in llm.generate(prompt_token_ids=PROMPTS, sampling_params=params)])
    assert outs[0] == outs[1]
