"""Greedy outputs and logits match the published reference samplers on the tiny checkpoints."""

import json

import pytest
import torch
from helpers import PARITY
from safetensors.torch import load_file

from dlm_backend import LLM, SamplingParams
from dlm_backend.engine.layers import AttentionContext, Segment, attention_context


def _cases(name):
    data = json.loads((PARITY / name / "cases.json").read_text())
    return [pytest.param(name, c, id=f"{name}-{i}-{c['sampler']}") for i, c in enumerate(data["cases"])]


def _params(case) -> SamplingParams:
    kind = case["sampler"]
    if kind == "llada.generate":
        return SamplingParams(sampler="llada", max_tokens=case["gen_length"], block_length=case["block_length"],
                              steps=case["steps"], temperature=case["temperature"],
                              remasking=case["remasking"], cache="none", ignore_eos=True)
    if kind == "fast_dllm.generate(threshold)":
        return SamplingParams(sampler="threshold", max_tokens=case["gen_length"],
                              block_length=case["block_length"], threshold=case["threshold"],
                              cache="none", ignore_eos=True)
    assert kind == "dream.diffusion_generate", kind
    return SamplingParams(sampler="dream", max_tokens=case["max_new_tokens"], steps=case["steps"],
                          alg=case["alg"], temperature=case["temperature"], cache="none", ignore_eos=True)


@pytest.mark.parametrize("name,case", _cases("llada-tiny") + _cases("dream-tiny"))
def test_sampler_matches_reference(name, case):
    llm = LLM(str(PARITY / name))
    out = llm.generate(prompt_token_ids=[case["prompt"]], sampling_params=_params(case))[0]
    assert out.token_ids == case["output"]
    if "nfe" in case:
        assert out.num_forward_passes == case["nfe"]


@pytest.mark.parametrize("name", ["llada-tiny", "dream-tiny"])
def test_forward_logits_match_reference(name):
    expected = load_file(str(PARITY / name / "expected_logits.safetensors"))
    model = LLM(str(PARITY / name), dtype="float32").engine.runner.model
    ids = expected["input_ids"][0]
    with attention_context(AttentionContext([Segment(slice(0, len(ids)), 0, None)])):
        hidden = model(ids, torch.arange(len(ids)))
    logits = model.compute_logits(hidden)
    torch.testing.assert_close(logits, expected["logits"][0], atol=1e-4, rtol=0)
