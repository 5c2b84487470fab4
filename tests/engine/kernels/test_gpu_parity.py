"""Parity on CUDA with the kernels on: fp32 greedy outputs token-exact to the published samplers, fp32
logits within 1e-4, bf16 logits as close to the fp32 reference as torch's own bf16 path. Run by
benchmarks/gpu_check.sh. Sampled cases are left out: they draw from the CPU generator's stream."""

import pytest
import torch
from safetensors.torch import load_file

from dlm_backend import LLM
from tests.helpers import PARITY, forward, parity_cases, parity_params
pytestmark = pytest.mark.gpu


GREEDY = [p for p in parity_cases("llada-tiny") + parity_cases("dream-tiny") if not p.values[1].get("temperature")]


@pytest.mark.parametrize("name,case", GREEDY)
def test_fp32_cuda_matches_reference(name, case):
    llm = LLM(str(PARITY / name), device="cuda", dtype="float32")
    out = llm.generate(prompt_token_ids=[case["prompt"]], sampling_params=parity_params(case))[0]
    assert out.token_ids == case["output"]


@pytest.mark.parametrize("name", ["llada-tiny", "dream-tiny"])
def test_cuda_fp32_logits_match_reference(name):
    expected = load_file(str(PARITY / name / "expected_logits.safetensors"))
    model = LLM(str(PARITY / name), device="cuda", dtype="float32").engine.runner.model
    _, logits = forward(model, expected["input_ids"][0].cuda(), triton=True)
    torch.testing.assert_close(logits.float().cpu(), expected["logits"][0], atol=1e-4, rtol=0)


@pytest.mark.parametrize("name", ["llada-tiny", "dream-tiny"])
def test_cuda_bf16_kernels_are_as_close_to_the_reference_as_torch_bf16(name):
    """bf16 rounds every layer, so no fixed tolerance says whether a kernel is right (a first H200
    run saw 0.31 on 30 of 7680 logits). The kernels must stay as close to the fp32 reference logits
    as the same model on the torch path in bf16."""
    expected = load_file(str(PARITY / name / "expected_logits.safetensors"))
    want = expected["logits"][0]
    model = LLM(str(PARITY / name), device="cuda", dtype="bfloat16").engine.runner.model
    ids = expected["input_ids"][0].cuda()
    err = {}
    for triton in (False, True):
        _, logits = forward(model, ids, triton=triton)
        err[triton] = (logits.float().cpu() - want).abs()
    assert float(err[True].max()) <= 1.5 * float(err[False].max()) + 0.02, (err[True].max(), err[False].max())
    assert float(err[True].mean()) <= 1.2 * float(err[False].mean()) + 1e-3
