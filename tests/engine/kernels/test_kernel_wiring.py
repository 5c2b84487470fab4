"""Dispatch, the layers' kernel path on the tiny checkpoints, and the static-shape block step."""

import json
from pathlib import Path

import pytest
import torch

from dlm_backend import LLM, SamplingParams
from dlm_backend.engine.kv import KVPool
from dlm_backend.engine.layers.paged_attention import PagedBatch
from dlm_backend.engine.forward.cuda_graphs import BlockGraphs, bucket_for
from dlm_backend.engine.engine_config import EngineConfig
from dlm_backend.engine.kernels import interpreting, resolve_kernels
from dlm_backend.engine.kernels._common import dot_upcast
from dlm_backend.engine.layers import ForwardContext, PackedAttention, Segment, forward_context
from dlm_backend.errors import DLMError

PARITY = Path(__file__).resolve().parents[2] / "fixtures" / "parity"
PROMPT = json.loads((PARITY / "llada-tiny" / "cases.json").read_text())["cases"][0]["prompt"]
FAMILIES = ["llada-tiny", "dream-tiny"]


@pytest.fixture
def interpret_env(monkeypatch):
    """Sets TRITON_INTERPRET and forgets the cached answer; the process's own answer is restored after."""
    def set_to(value: str):
        monkeypatch.setenv("TRITON_INTERPRET", value)
        interpreting.cache_clear()

    yield set_to
    monkeypatch.undo()
    interpreting.cache_clear()


def test_dispatch_modes(monkeypatch, interpret_env):
    assert resolve_kernels("torch", "cpu") is False
    assert resolve_kernels("auto", "cpu") is False
    interpret_env("1")
    assert resolve_kernels("triton", "cpu") is True
    bf16 = torch.zeros(1, dtype=torch.bfloat16)
    assert dot_upcast(bf16) and not dot_upcast(bf16.float())        # the interpreter's bf16 dot workaround
    monkeypatch.setenv("TRITON_INTERPRET", "0")                     # read once: a later change is not seen
    assert resolve_kernels("triton", "cpu") is True and dot_upcast(bf16)
    interpret_env("0")
    assert not dot_upcast(bf16)
    with pytest.raises(DLMError, match="TRITON_INTERPRET=1"):
        resolve_kernels("triton", "cpu")
    with pytest.raises(DLMError, match="auto, triton, torch"):
        resolve_kernels("fast", "cpu")
    monkeypatch.setenv("DLM_KERNELS", "fast")       # the environment is read once, by EngineConfig
    with pytest.raises(DLMError, match="not a kernel mode"):
        EngineConfig(model="x")


def _mixed_forward(model, ids, length, triton):
    # A paged segment (writes into / reads its pages) first, then two unpaged ones at other row
    # offsets: the kernel path runs the paged kernel and packs the two others into one launch.
    a, dev = model.args, ids.device
    pool = KVPool(a.kv_shapes, 16, 1, torch.float32, dev)
    plain = PackedAttention([Segment(slice(length, length + 5), 0), Segment(slice(length + 5, 26), 0)])
    backend = PagedBatch(pool, plain, [0, length], [0], [length], [[0]], [0], dev)
    pos = torch.cat([torch.arange(length), torch.arange(5), torch.arange(26 - 5 - length)]).to(dev)
    with forward_context(ForwardContext(backend, triton)):
        hidden = model(ids, pos)
        return hidden, model.compute_unmask_stats(hidden[:7], exclude_id=model.args.mask_token_id)


@pytest.mark.parametrize("family", FAMILIES)
@torch.inference_mode()
def test_model_forward_kernel_path_matches_torch(family):
    model = LLM(str(PARITY / family), dtype="float32", kernels="torch").engine.runner.model
    ids = torch.tensor((PROMPT * 3)[:26], device=next(model.parameters()).device)
    want, want_stats = _mixed_forward(model, ids, 9, triton=False)
    got, stats = _mixed_forward(model, ids, 9, triton=True)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert torch.equal(stats.token, want_stats.token)
    torch.testing.assert_close(stats.prob, want_stats.prob, atol=1e-5, rtol=1e-5)


def test_engine_on_kernel_path_uses_fused_unmasking(monkeypatch):
    # The whole engine through the interpreter: greedy threshold requests take the fused stats path
    # (compute_logits is never called for them) and produce the torch path's tokens.
    params = SamplingParams(sampler="threshold", max_tokens=8, block_length=4, threshold=0.3, cache="dual",
                            ignore_eos=True)
    want = LLM(str(PARITY / "llada-tiny"), kernels="torch").generate(prompt_token_ids=[PROMPT, PROMPT[:5]],
                                                                     sampling_params=params)
    llm = LLM(str(PARITY / "llada-tiny"), kernels="triton")
    model = llm.engine.runner.model
    monkeypatch.setattr(model, "compute_logits", lambda h: pytest.fail("logits built on the fused path"))
    got = llm.generate(prompt_token_ids=[PROMPT, PROMPT[:5]], sampling_params=params)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]


def test_kernel_dispatch_is_decided_once_per_engine(monkeypatch):
    """Layers follow the engine's decision, not the environment at call time; outside a forward
    context (a training loop, a notebook) they run the torch code."""
    import dlm_backend.engine.kernels.rmsnorm as rms

    calls = []
    monkeypatch.setattr(rms, "rmsnorm", lambda *a: calls.append(1) or pytest.fail("kernel on a torch engine"))
    llm = LLM(str(PARITY / "llada-tiny"), kernels="torch")
    monkeypatch.setenv("DLM_KERNELS", "triton")
    llm.generate(prompt_token_ids=[PROMPT], sampling_params=SamplingParams(max_tokens=4, ignore_eos=True))
    norm = llm.engine.runner.model.model.transformer.ln_f
    norm(torch.ones(2, norm.weight.shape[0]))
    assert calls == []


def test_buckets():
    assert [bucket_for(n) for n in (1, 2, 3, 5, 16, 17, 32, 33)] == [1, 2, 4, 8, 16, 32, 32, None]


@pytest.mark.parametrize("family", FAMILIES)
def test_static_block_step_equals_varlen_path(family, monkeypatch):
    """The fixed-shape padded step (what a CUDA graph replays), run eagerly on CPU, gives the packed
    path's hidden states at every pass (to fp32 rounding: masked vs sliced keys, other GEMM shapes)
    and the same tokens. Three requests pad to a bucket of 4; padding rows use the scratch page."""
    prompts = [PROMPT, PROMPT[:5], PROMPT[3:] + [7, 8, 9]]
    params = SamplingParams(sampler="threshold", max_tokens=16, block_length=8, threshold=0.2, cache="dual",
                            ignore_eos=True)
    llm = LLM(str(PARITY / family), device="cpu", kernels="torch")
    want = llm.generate(prompt_token_ids=prompts, sampling_params=params)
    runner = llm.engine.runner
    runner.graphs = BlockGraphs(runner.model, runner.pool, runner.device, capture=False, triton=False)
    static_forward, compared = runner.graphs.forward, []

    def checked(seqs, steps, shift):
        hidden, rows = static_forward(seqs, steps, shift)
        snapshot = [(k.clone(), v.clone()) for k, v in runner.pool.groups]   # the packed path writes the same keys
        batch, ref_rows = runner.pack(seqs, steps, shift)
        ref = runner.forward(batch)
        for (k, v), (k0, v0) in zip(runner.pool.groups, snapshot):
            k.copy_(k0)
            v.copy_(v0)
        for r, rr in zip(rows, ref_rows):
            torch.testing.assert_close(hidden[r], ref[rr], atol=1e-4, rtol=1e-4)
        compared.append(len(seqs))
        return hidden, rows

    monkeypatch.setattr(runner.graphs, "forward", checked)
    got = llm.generate(prompt_token_ids=prompts, sampling_params=params)
    runner.graphs = None
    # The static path really ran, with all three (padded to a bucket of 4) and, once their blocks fell
    # out of step, with fewer beside a packed forward for the sequences at a block start.
    assert 3 in compared and min(compared) < 3
    assert [o.token_ids for o in got] == [o.token_ids for o in want]


@pytest.mark.gpu
@pytest.mark.parametrize("family", FAMILIES)
def test_cuda_graph_capture_matches_eager(family):
    prompts = [PROMPT, PROMPT[:5], PROMPT[3:] + [7, 8, 9]]
    params = SamplingParams(sampler="threshold", max_tokens=16, block_length=8, threshold=0.2, cache="dual",
                            ignore_eos=True)
    want = LLM(str(PARITY / family), device="cuda", dtype="float32", cuda_graphs=False).generate(
        prompt_token_ids=prompts, sampling_params=params)
    llm = LLM(str(PARITY / family), device="cuda", dtype="float32", cuda_graphs=True)
    got = llm.generate(prompt_token_ids=prompts, sampling_params=params)
    graphs = llm.engine.runner.graphs
    assert graphs is not None and any(s.graph is not None for s in graphs.steps.values())
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
