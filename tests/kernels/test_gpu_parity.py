"""Parity on CUDA with the kernels on: fp32 greedy outputs token-exact to the published samplers,
bf16 logits within tolerance of the fp32 reference. Run by benchmarks/gpu_check.sh."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dlm_backend import LLM, SamplingParams
from dlm_backend.engine.layers import AttentionContext, Segment, attention_context

PARITY = Path(__file__).resolve().parents[1] / "fixtures" / "parity"
pytestmark = pytest.mark.gpu


def _cases(name):
    data = json.loads((PARITY / name / "cases.json").read_text())
    return [pytest.param(name, c, id=f"{name}-{i}") for i, c in enumerate(data["cases"])]


def _params(case) -> SamplingParams:
    # Same mapping as tests/test_parity.py.
    kind = case["sampler"]
    if kind == "llada.generate":
        return SamplingParams(sampler="llada", max_tokens=case["gen_length"], block_length=case["block_length"],
                              steps=case["steps"], temperature=case["temperature"],
                              remasking=case["remasking"], cache="none", ignore_eos=True)
    if kind == "fast_dllm.generate(threshold)":
        return SamplingParams(sampler="threshold", max_tokens=case["gen_length"],
                              block_length=case["block_length"], threshold=case["threshold"],
                              cache="none", ignore_eos=True)
    return SamplingParams(sampler="dream", max_tokens=case["max_new_tokens"], steps=case["steps"],
                          alg=case["alg"], temperature=case["temperature"], cache="none", ignore_eos=True)


@pytest.mark.parametrize("name,case", _cases("llada-tiny") + _cases("dream-tiny"))
def test_fp32_cuda_matches_reference(name, case):
    if case.get("temperature", 0) > 0:
        pytest.skip("sampled cases draw from the CPU generator stream; greedy parity is the contract")
    llm = LLM(str(PARITY / name), device="cuda", dtype="float32")
    out = llm.generate(prompt_token_ids=[case["prompt"]], sampling_params=_params(case))[0]
    assert out.token_ids == case["output"]


@pytest.mark.parametrize("name", ["llada-tiny", "dream-tiny"])
@pytest.mark.parametrize("dtype,atol", [("float32", 1e-4), ("bfloat16", 0.15)])
def test_cuda_logits_match_reference(name, dtype, atol):
    expected = load_file(str(PARITY / name / "expected_logits.safetensors"))
    model = LLM(str(PARITY / name), device="cuda", dtype=dtype).engine.runner.model
    ids = expected["input_ids"][0].cuda()
    with attention_context(AttentionContext([Segment(slice(0, len(ids)), 0, None)])):
        hidden = model(ids, torch.arange(len(ids), device="cuda"))
    logits = model.compute_logits(hidden).float().cpu()
    torch.testing.assert_close(logits, expected["logits"][0], atol=atol, rtol=0.02 if dtype == "bfloat16" else 0)
