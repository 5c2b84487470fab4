"""The kernel path under tensor parallelism: LLaDA2's MoE through the fused kernel with another rank's
experts skipped, and greedy decoding from the ranks' merged head statistics, give one device's tokens."""

from pathlib import Path

import pytest
import torch

from dlm_backend import LLM

LLADA2 = Path(__file__).resolve().parents[2] / "fixtures" / "parity-block" / "llada2-tiny"
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32]]


def _tokens(tp: int, device: str):
    with LLM(str(LLADA2), device=device, dtype="float32", kernels="triton", tensor_parallel_size=tp,
             config_overrides={"mask_token_id": 494}) as llm:
        params = llm.sampling_params(temperature=0.0, ignore_eos=True, max_tokens=8)
        assert llm.engine.runner.triton
        return [(o.token_ids, o.num_forward_passes) for o in llm.generate(prompt_token_ids=PROMPTS, sampling_params=params)]


def test_two_ranks_on_the_kernel_path_give_the_one_device_tokens():
    if torch.cuda.is_available() and torch.cuda.device_count() < 2:
        pytest.skip("two ranks on CUDA need two GPUs and this machine has one; on CPU this test runs through "
                    "the Triton interpreter")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    assert _tokens(2, device) == _tokens(1, device)
