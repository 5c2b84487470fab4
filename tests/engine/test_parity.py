"""Greedy outputs and logits match the published reference samplers on the tiny checkpoints."""


import pytest
import torch
from helpers import PARITY, forward, parity_cases, parity_params
from safetensors.torch import load_file

from dlm_backend import LLM


@pytest.mark.parametrize("name,case", parity_cases("llada-tiny") + parity_cases("dream-tiny"))
def test_sampler_matches_reference(name, case):
    llm = LLM(str(PARITY / name))
    out = llm.generate(prompt_token_ids=[case["prompt"]], sampling_params=parity_params(case))[0]
    assert out.token_ids == case["output"]
    if "nfe" in case:
        assert out.num_forward_passes == case["nfe"]


@pytest.mark.parametrize("name", ["llada-tiny", "dream-tiny"])
def test_forward_logits_match_reference(name):
    expected = load_file(str(PARITY / name / "expected_logits.safetensors"))
    model = LLM(str(PARITY / name), dtype="float32").engine.runner.model
    ids = expected["input_ids"][0]
    _, logits = forward(model, ids)
    torch.testing.assert_close(logits, expected["logits"][0], atol=1e-4, rtol=0)
