"""Parity on CUDA with the kernels on: fp32 greedy outputs token-exact to the published samplers,
bf16 logits within tolerance of the fp32 reference. Run by benchmarks/gpu_check.sh."""

import pytest
import torch
from safetensors.torch import load_file

from dlm_backend import LLM
from helpers import PARITY, forward, parity_cases, parity_params
pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("name,case", parity_cases("llada-tiny") + parity_cases("dream-tiny"))
def test_fp32_cuda_matches_reference(name, case):
    if case.get("temperature", 0) > 0:
        pytest.skip("sampled cases draw from the CPU generator stream; greedy parity is the contract")
    llm = LLM(str(PARITY / name), device="cuda", dtype="float32")
    out = llm.generate(prompt_token_ids=[case["prompt"]], sampling_params=parity_params(case))[0]
    assert out.token_ids == case["output"]


@pytest.mark.parametrize("name", ["llada-tiny", "dream-tiny"])
@pytest.mark.parametrize("dtype,atol", [("float32", 1e-4), ("bfloat16", 0.15)])
def test_cuda_logits_match_reference(name, dtype, atol):
    expected = load_file(str(PARITY / name / "expected_logits.safetensors"))
    model = LLM(str(PARITY / name), device="cuda", dtype=dtype).engine.runner.model
    ids = expected["input_ids"][0].cuda()
    _, logits = forward(model, ids, triton=True)
    logits = logits.float().cpu()
    torch.testing.assert_close(logits, expected["logits"][0], atol=atol, rtol=0.02 if dtype == "bfloat16" else 0)
