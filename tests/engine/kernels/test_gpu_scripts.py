"""The CPU-checkable parts of benchmarks/gpu_check.sh: the random-weight model builder and the
end-to-end driver at tiny size, the benchmarks' clean exit without CUDA, the script's own guard."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_dgemma  # noqa: E402
import gpu_e2e  # noqa: E402
import gpu_moe  # noqa: E402

TINY = gpu_e2e.llada_config(64, 2, 4, 160, 320, 1024)


def test_random_llada_builder():
    a = gpu_e2e.build_random_llada(TINY, "cpu", torch.float32, seed=3)
    b = gpu_e2e.build_random_llada(TINY, "cpu", torch.float32, seed=3)
    c = gpu_e2e.build_random_llada(TINY, "cpu", torch.float32, seed=4)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)                  # a seed fixes the weights
    assert not torch.equal(sa["model.transformer.blocks.0.q_proj.weight"], sc["model.transformer.blocks.0.q_proj.weight"])
    assert all(torch.isfinite(t).all() for t in sa.values())
    assert torch.equal(sa["model.transformer.ln_f.weight"], torch.ones(64))
    std = sa["model.transformer.blocks.0.ff_out.weight"].std().item()
    assert abs(std - 160 ** -0.5) < 0.01                                # 1/sqrt(fan_in)
    assert a.rotary is not None and a.args.vocab_size == 320


def test_8b_config_shape():
    with torch.device("meta"):
        model = gpu_e2e.LLaDAModelLM.from_config(gpu_e2e.llada_config())
    n = sum(p.numel() for p in model.parameters())
    assert 7.9e9 < n < 8.1e9 and model.args.head_dim == 128


def test_end_to_end_driver_tiny_cpu(monkeypatch):
    monkeypatch.setenv("DLM_KERNELS", "torch")
    model = gpu_e2e.build_random_llada(TINY, "cpu", torch.float32)
    r = gpu_e2e.measure(model, "cpu", torch.float32, batch=2, prompt_len=6, new_tokens=8, block=4, hbm_tbps=4.8)
    assert r["tokens"] == 16 and 2 <= r["passes"] <= 8 and r["tokens_per_s"] > 0
    assert r["block_step_ms"] > 0 and r["refresh_ms"] > 0 and r["graphs"] is False


def test_moe_script_builds_the_llada2_mini_shape():
    from dlm_backend.engine.models.registry import resolve_model_class

    config = gpu_moe.mini_config()
    with torch.device("meta"):
        model = resolve_model_class(config).from_config(config)
    n = sum(p.numel() for p in model.parameters())
    assert 16.0e9 < n < 16.5e9                        # LLaDA2.0-mini: 16B, 32.5 GB in bf16
    assert model.moe.num_experts == 256 and model.moe.top_k == 8 and model.args.rotary_dim == 64


def test_moe_driver_tiny_cpu(monkeypatch):
    monkeypatch.setenv("DLM_KERNELS", "torch")
    model = gpu_moe.random_model(gpu_moe.tiny_config())
    r = gpu_moe.measure(model, "cpu", batch=2, prompt_len=12, new_tokens=16, block=8, hbm_tbps=4.8)
    assert r["tokens_per_s"] > 0 and r["step_ms"] > 0 and r["graphs"] is False
    assert 1 <= r["experts_per_pass"] <= 2 * 16          # two MoE layers of 16 experts
    always, per_expert = gpu_moe.weight_bytes(model)
    assert per_expert == 3 * 32 * 64 * 4 and always > 0   # gate, up, down of width 32 on hidden 64, fp32


def test_dgemma_script_builds_the_26b_a4b_shape():
    from dlm_backend.engine.models.registry import resolve_model_class

    config = gpu_dgemma.big_config()
    with torch.device("meta"):
        model = resolve_model_class(config).from_config(config)
    n = sum(p.numel() for p in model.parameters())
    experts = sum(p.numel() for m in model.modules() if isinstance(m, gpu_dgemma.GemmaExperts) for p in m.parameters())
    assert 25.0e9 < n < 25.5e9 and 3.7e9 < n - experts * (1 - 8 / 128) < 3.9e9     # 25.2B total, 3.8B active
    assert model.args.kv_shapes[:6] == ((8, 256),) * 5 + ((2, 512),) and model.args.block_size == 256


def test_dgemma_driver_tiny_cpu(monkeypatch):
    monkeypatch.setenv("DLM_KERNELS", "torch")
    model = gpu_dgemma.random_model(gpu_dgemma.tiny_config())
    r = gpu_dgemma.measure(model, "cpu", batch=2, prompt_len=10, new_tokens=20, steps=3, hbm_tbps=4.8)
    # 20 tokens: two canvases of 16, three decoder steps each, the prompt and the first canvas encoded
    assert r["tokens"] == 40 and r["passes"] == 2 * 3 + 2 and r["tokens_per_s"] > 0 and r["step_ms"] > 0
    assert 1 <= r["experts_per_step"] <= 3 * 8
    always, per_expert = gpu_dgemma.weight_bytes(model)
    assert per_expert == 3 * 32 * 64 * 4              # gate, up (fused) and down of width 32 on hidden 64, fp32
    embed = model.model.decoder.embed_tokens.weight
    assert always > 2 * embed.numel() * 4             # the tied embedding is read twice a step


def test_scripts_refuse_cpu_clearly(tmp_path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OUT": str(tmp_path), "PYTHON": sys.executable}
    bench = subprocess.run([sys.executable, str(ROOT / "benchmarks/kernels/bench_rmsnorm.py")], env=env,
                           capture_output=True, text=True, timeout=120, check=False)
    assert bench.returncode != 0 and "needs a CUDA GPU" in bench.stderr
    if torch.cuda.is_available():
        pytest.skip("the gpu_check.sh guard only triggers on a machine without CUDA")
    check = subprocess.run(["bash", str(ROOT / "benchmarks/gpu_check.sh")], env=env, capture_output=True,
                           text=True, timeout=120, check=False)
    assert check.returncode == 100
    assert "no Python with torch + triton + a CUDA device" in (tmp_path / "gpu_check.txt").read_text()
