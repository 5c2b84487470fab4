"""Dispatch, the layers' kernel path on the tiny checkpoints, and the static-shape block step."""

import json
from pathlib import Path

import pytest
import torch

from dlm_backend import LLM, SamplingParams
from dlm_backend.engine.cache import KVCache
from dlm_backend.engine.graphs import BlockGraphs, bucket_for
from dlm_backend.engine.kernels import use_triton
from dlm_backend.engine.layers import AttentionContext, Segment, attention_context
from dlm_backend.errors import DLMError

PARITY = Path(__file__).resolve().parents[1] / "fixtures" / "parity"
PROMPT = json.loads((PARITY / "llada-tiny" / "cases.json").read_text())["cases"][0]["prompt"]
FAMILIES = ["llada-tiny", "dream-tiny"]


def test_dispatch_modes(monkeypatch):
    monkeypatch.setenv("DLM_KERNELS", "torch")
    assert not use_triton("cpu")
    monkeypatch.setenv("DLM_KERNELS", "auto")
    assert use_triton("cpu") is False
    monkeypatch.setenv("DLM_KERNELS", "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert use_triton("cpu") is True
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(DLMError, match="TRITON_INTERPRET=1"):
        use_triton("cpu")
    monkeypatch.setenv("DLM_KERNELS", "fast")
    with pytest.raises(DLMError, match="auto, triton, torch"):
        use_triton("cpu")


def _mixed_forward(model, ids, length):
    # An uncached segment, a cached one (writes into / reads its whole cache), another uncached one:
    # the kernel path packs the two uncached ones into one launch through an index.
    a = model.args
    cache = KVCache(a.num_layers, a.num_kv_heads, length, a.head_dim, torch.float32, "cpu")
    segs = [Segment(slice(0, 5), 0), Segment(slice(5, 5 + length), 0, cache), Segment(slice(5 + length, 26), 0)]
    pos = torch.cat([torch.arange(5), torch.arange(length), torch.arange(26 - 5 - length)])
    with attention_context(AttentionContext(segs)):
        return model(ids, pos)


@pytest.mark.parametrize("family", FAMILIES)
@torch.inference_mode()
def test_model_forward_kernel_path_matches_torch(family, monkeypatch):
    model = LLM(str(PARITY / family), dtype="float32").engine.runner.model
    ids = torch.tensor((PROMPT * 3)[:26])
    monkeypatch.setenv("DLM_KERNELS", "torch")
    want = _mixed_forward(model, ids, 9)
    want_stats = model.compute_unmask_stats(want[:7], exclude_id=model.args.mask_token_id)
    with attention_context(AttentionContext(rows=(2, 13))):
        want_rows = model(ids, torch.arange(13).repeat(2))
    monkeypatch.setenv("DLM_KERNELS", "triton")
    got = _mixed_forward(model, ids, 9)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    stats = model.compute_unmask_stats(want[:7], exclude_id=model.args.mask_token_id)
    assert torch.equal(stats.token, want_stats.token)
    for name in ("prob", "margin", "entropy"):
        torch.testing.assert_close(getattr(stats, name), getattr(want_stats, name), atol=1e-5, rtol=1e-5)
    with attention_context(AttentionContext(rows=(2, 13))):
        torch.testing.assert_close(model(ids, torch.arange(13).repeat(2)), want_rows, atol=1e-4, rtol=1e-4)


def test_engine_on_kernel_path_uses_fused_unmasking(monkeypatch):
    # The whole engine through the interpreter: greedy threshold requests take the fused stats path
    # (compute_logits is never called for them) and produce the torch path's tokens.
    params = SamplingParams(sampler="threshold", max_tokens=8, block_length=4, threshold=0.3, cache="dual",
                            ignore_eos=True)
    llm = LLM(str(PARITY / "llada-tiny"))
    monkeypatch.setenv("DLM_KERNELS", "torch")
    want = llm.generate(prompt_token_ids=[PROMPT, PROMPT[:5]], sampling_params=params)
    monkeypatch.setenv("DLM_KERNELS", "triton")
    model = llm.engine.runner.model
    monkeypatch.setattr(model, "compute_logits", lambda h: pytest.fail("logits built on the fused path"))
    got = llm.generate(prompt_token_ids=[PROMPT, PROMPT[:5]], sampling_params=params)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]


def test_autograd_passes_run_the_torch_code(monkeypatch):
    # Training (grad enabled) must never reach a forward-only kernel, even with DLM_KERNELS=triton.
    monkeypatch.setenv("DLM_KERNELS", "triton")
    from dlm_backend.engine.models.llada import LLaDAModelLM

    model = LLaDAModelLM.from_config(json.loads((PARITY / "llada-tiny" / "config.json").read_text()))
    model.setup("cpu")                                      # fresh trainable parameters
    calls = []
    import dlm_backend.engine.kernels.rmsnorm as rms

    monkeypatch.setattr(rms, "rmsnorm", lambda *a: calls.append(1) or rms.rmsnorm_ref(*a))
    ids = torch.tensor(PROMPT[:8])
    with attention_context(AttentionContext(rows=(1, 8))):
        model(ids, torch.arange(8)).sum().backward()
    assert calls == [] and model.model.transformer.blocks[0].q_proj.weight.grad is not None
    with torch.no_grad(), attention_context(AttentionContext(rows=(1, 8))):
        model(ids, torch.arange(8))
    assert calls                                            # without autograd the kernel runs


def test_buckets():
    assert [bucket_for(n) for n in (1, 2, 3, 5, 16, 17, 32, 33)] == [1, 2, 4, 8, 16, 32, 32, None]


@pytest.mark.parametrize("family", FAMILIES)
def test_static_block_step_equals_varlen_path(family, monkeypatch):
    """The fixed-shape padded step (what a CUDA graph replays), run eagerly on CPU, gives the varlen
    path's hidden states at every pass (to fp32 rounding: masked vs sliced keys, other GEMM shapes)
    and the same tokens. Three requests pad to a bucket of 4."""
    monkeypatch.setenv("DLM_KERNELS", "torch")
    prompts = [PROMPT, PROMPT[:5], PROMPT[3:] + [7, 8, 9]]
    params = SamplingParams(sampler="threshold", max_tokens=16, block_length=8, threshold=0.2, cache="dual",
                            ignore_eos=True)
    llm = LLM(str(PARITY / family))
    want = llm.generate(prompt_token_ids=prompts, sampling_params=params)
    runner = llm.engine.runner
    runner.graphs = BlockGraphs(runner.model, runner.dtype, runner.device, capture=False)
    static_forward, compared = runner._forward_static, []

    def checked(seqs, shift, q_len):
        hidden, plans = static_forward(seqs, shift, q_len)
        ref, ref_plans = runner._forward_packed(seqs, shift)
        for (_, rows, _), (_, ref_rows, _) in zip(plans, ref_plans):
            torch.testing.assert_close(hidden[rows], ref[ref_rows], atol=1e-4, rtol=1e-4)
        compared.append(len(seqs))
        return hidden, plans

    monkeypatch.setattr(runner, "_forward_static", checked)
    got = llm.generate(prompt_token_ids=prompts, sampling_params=params)
    # The static path really ran, with all three (padded to a bucket of 4) and, once their blocks fell
    # out of step, with fewer beside a varlen forward for the sequences at a block start.
    assert 3 in compared and min(compared) < 3
    assert [o.token_ids for o in got] == [o.token_ids for o in want]


@pytest.mark.gpu
@pytest.mark.parametrize("family", FAMILIES)
def test_cuda_graph_capture_matches_eager(family, monkeypatch):
    prompts = [PROMPT, PROMPT[:5], PROMPT[3:] + [7, 8, 9]]
    params = SamplingParams(sampler="threshold", max_tokens=16, block_length=8, threshold=0.2, cache="dual",
                            ignore_eos=True)
    monkeypatch.setenv("DLM_CUDA_GRAPHS", "0")
    want = LLM(str(PARITY / family), device="cuda", dtype="float32").generate(
        prompt_token_ids=prompts, sampling_params=params)
    monkeypatch.setenv("DLM_CUDA_GRAPHS", "1")
    llm = LLM(str(PARITY / family), device="cuda", dtype="float32")
    got = llm.generate(prompt_token_ids=prompts, sampling_params=params)
    graphs = llm.engine.runner.graphs
    assert graphs is not None and any(s.graph is not None for s in graphs.steps.values())
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
