"""Compile every Triton kernel ahead of time for sm_80 and sm_90, no GPU needed (run as a script).

Each launcher in dlm_backend/engine/kernels/ is called on meta tensors of the shapes the engine runs
(the families' head dims, the benchmarks' LLaDA2-mini and DiffusionGemma MoE shapes, bf16/fp16/fp32)
with its kernel swapped for a recorder, so the configurations compiled are exactly what the launchers
pass. Each recorded launch is then specialised by Triton's own binder for a CUDA target and compiled
by ``triton.compile`` down to PTX and cubin (ptxas ships in the triton wheel). Prints one JSON line
per compile; exits non-zero if any failed. Must run without TRITON_INTERPRET (the test sees to it).
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import make_backend
from triton.runtime.jit import create_function_from_signature

from dlm_backend.engine.kernels import attention, moe, paged_attention, rmsnorm, rotary, swiglu, unmask

TARGETS = {"sm_80": GPUTarget("cuda", 80, 32), "sm_90": GPUTarget("cuda", 90, 32)}
BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32


def meta(*shape, dtype=BF16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def i32(*values):
    return torch.tensor(values, dtype=torch.int32).to("meta")


class Recorder:
    """Stands in for a kernel: ``kernel[grid](*args, **kwargs)`` records the launch instead."""

    def __init__(self, kernel, launches: list):
        self.kernel, self.launches = kernel, launches

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append((self.kernel, args, kwargs))


def record(module, names: tuple[str, ...], call) -> list:
    """The launches ``call()`` makes of ``module``'s kernels ``names``."""
    launches: list = []
    saved = {n: getattr(module, n) for n in names}
    try:
        for n in names:
            setattr(module, n, Recorder(saved[n], launches))
        call()
    finally:
        for n, k in saved.items():
            setattr(module, n, k)
    return launches


def attention_launches(D, dtype, max_q, hq=16, hkv=4, L=1024):
    B = 2
    return record(attention, ("_attention_fwd_kernel",), lambda: attention.attention(
        meta(B * max_q, hq, D, dtype=dtype), meta(B, hkv, L, D, dtype=dtype), meta(B, hkv, L, D, dtype=dtype),
        i32(0, max_q, 2 * max_q), i32(0, 0), i32(L, L), max_q))


def paged_launches(D, dtype, page, max_q, hq=16, hkv=4, pages=64):
    B = 2
    kc = meta(pages, page, hkv, D, dtype=dtype)
    return record(paged_attention, ("_paged_attention_kernel",), lambda: paged_attention.paged_attention(
        meta(B * max_q, hq, D, dtype=dtype), kc, kc, i32(0, max_q, 2 * max_q), i32(0, 0), i32(max_q, max_q),
        torch.zeros(B, 16, dtype=torch.int32, device="meta"), i32(32, 0), max_q))


def rotary_launches(D, dtype, hq, hk, full, T=64):
    return record(rotary, ("_rotary_kernel",), lambda: rotary.rotary_(
        meta(T, hq, D, dtype=dtype), meta(T, hk, D, dtype=dtype), meta(T, D, dtype=FP32), meta(T, D, dtype=FP32),
        full))


def rmsnorm_launches(D, dtype, residual, T=64):
    return record(rmsnorm, ("_rmsnorm_kernel",), lambda: rmsnorm.rmsnorm(
        meta(T, D, dtype=dtype), meta(T, D, dtype=dtype) if residual else None, meta(D, dtype=dtype), 1e-6))


def swiglu_launches(dtype, T=64, inter=5120):
    return record(swiglu, ("_swiglu_kernel",), lambda: swiglu.swiglu(meta(T, inter, dtype=dtype),
                                                                      meta(T, inter, dtype=dtype)))


def unmask_launches(dtype, N, D=2048, V=157184):
    return record(unmask, ("_unmask_partial_kernel",), lambda: unmask.unmask_stats(
        meta(N, D, dtype=dtype), meta(V, D, dtype=dtype), exclude_id=156895))


def moe_launches(dtype, T, E, I, D, k=8, act="silu"):
    w = meta(E, I, D, dtype=dtype)
    idx = torch.zeros(T, k, dtype=torch.int64, device="meta")
    return record(moe, ("_gate_up_kernel", "_down_kernel"), lambda: moe.fused_moe(
        meta(T, D, dtype=dtype), idx, meta(T, k, dtype=FP32), w, w, meta(E, D, I, dtype=dtype), act))


def configurations() -> list[tuple[str, list]]:
    """(label, launches) for every configuration compiled: what the engine runs on GPU."""
    out = []
    for D in (64, 128, 256):                                   # the families' head dims
        out.append((f"attention D={D} bf16 q=512", attention_launches(D, BF16, 512)))
        out.append((f"paged D={D} bf16 page=32 q=32", paged_launches(D, BF16, 32, 32)))
    out += [("attention D=128 fp16 q=8", attention_launches(128, FP16, 8)),
            ("attention D=128 fp32 q=64", attention_launches(128, FP32, 64)),
            ("paged D=128 bf16 page=18 q=6", paged_launches(128, BF16, 18, 6)),      # blocks of 6: crosses pages
            ("paged D=64 bf16 page=16 q=512", paged_launches(64, BF16, 16, 512)),
            ("paged D=128 fp16 page=64 q=1", paged_launches(128, FP16, 64, 1)),
            ("paged D=128 fp32 page=32 q=64", paged_launches(128, FP32, 32, 64)),
            ("rotary LLaDA D=128 bf16", rotary_launches(128, BF16, 32, 32, True)),
            ("rotary Dream D=128 bf16", rotary_launches(128, BF16, 28, 4, False)),
            ("rotary D=64 fp16", rotary_launches(64, FP16, 16, 4, False)),
            ("rotary D=128 fp32", rotary_launches(128, FP32, 16, 4, True)),
            ("rmsnorm D=2048 bf16 residual", rmsnorm_launches(2048, BF16, True)),
            ("rmsnorm D=4096 bf16", rmsnorm_launches(4096, BF16, False)),
            ("rmsnorm D=2048 fp16 residual", rmsnorm_launches(2048, FP16, True)),
            ("rmsnorm D=2048 fp32 residual", rmsnorm_launches(2048, FP32, True)),
            ("swiglu bf16", swiglu_launches(BF16)), ("swiglu fp16", swiglu_launches(FP16)),
            ("swiglu fp32", swiglu_launches(FP32)),
            ("unmask N=32 D=2048 bf16", unmask_launches(BF16, 32)),
            ("unmask N=1 D=2048 fp16", unmask_launches(FP16, 1)),
            ("unmask N=256 D=2048 fp32", unmask_launches(FP32, 256)),
            # LLaDA2-mini (benchmarks/gpu_moe.py): E=256, I=512, D=2048, top-8: T=1, 512, 1024, 4096 take
            # each of _tiles' row tiles (16 narrow, 16, 32, 64).
            *[(f"moe LLaDA2-mini T={T} bf16", moe_launches(BF16, T, 256, 512, 2048)) for T in (1, 512, 1024, 4096)],
            # DiffusionGemma (benchmarks/gpu_dgemma.py): E=128, I=704, D=2816, top-8, gelu_tanh, canvas 256.
            ("moe DGemma T=256 bf16", moe_launches(BF16, 256, 128, 704, 2816, act="gelu_tanh")),
            ("moe LLaDA2-mini T=64 fp16", moe_launches(FP16, 64, 256, 512, 2048)),
            ("moe LLaDA2-mini T=64 fp32", moe_launches(FP32, 64, 256, 512, 2048))]
    return out


def compile_launch(kernel, args, kwargs, target: GPUTarget):
    """``kernel[grid](*args, **kwargs)`` as Triton's launcher would compile it for ``target``."""
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, opts = binder(*args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, specialization, opts)
    src = triton.compiler.ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=target, options=options.__dict__)


def main() -> int:
    assert not os.environ.get("TRITON_INTERPRET"), "AOT compiles need TRITON_INTERPRET unset"
    failed = 0
    for label, launches in configurations():
        for kernel, args, kwargs in launches:
            for name, target in TARGETS.items():
                t0 = time.perf_counter()
                row = {"config": label, "kernel": kernel.__name__, "target": name}
                try:
                    ck = compile_launch(kernel, args, kwargs, target)
                    ptx = ck.asm["ptx"].splitlines()
                    row.update(stages=[s for s in ck.asm if s != "source"], cubin_bytes=len(ck.asm.get("cubin", b"")),
                               ptx_target=[ln.split()[1] for ln in ptx if ln.startswith(".target")],
                               ptx_entries=[ln.split()[-1].rstrip("(") for ln in ptx if ".entry" in ln],
                               shared=ck.metadata.shared)
                except Exception as e:  # noqa: BLE001 - reported, then the script fails
                    failed += 1
                    row["error"] = f"{type(e).__name__}: {e}"
                row["seconds"] = round(time.perf_counter() - t0, 2)
                print(json.dumps(row), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
