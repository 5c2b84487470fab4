"""Every Triton kernel compiles ahead of time for sm_80 and sm_90 at the configurations the engine
launches, on a CPU machine: a compile error shows here before a GPU is ever lent.

The compiles run in a subprocess (aot_compile.py) without TRITON_INTERPRET: the kernel tests' conftest
turns the interpreter on, and under it ``triton.jit`` kernels cannot be compiled.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("triton")

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
KERNELS = {"_attention_fwd_kernel", "_paged_attention_kernel", "_rotary_kernel", "_rmsnorm_kernel",
           "_swiglu_kernel", "_unmask_partial_kernel", "_gate_up_kernel", "_down_kernel"}
PTX_TARGET = {"sm_80": "sm_80", "sm_90": "sm_90a"}          # Triton compiles sm_90 as sm_90a
SHARED_LIMIT = {"sm_80": 166912, "sm_90": 232448}           # opt-in shared memory per block: A100, H100


def run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path / "cache"), TRITON_DEFAULT_FP_FUSION="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), str(HERE), env.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)


@pytest.mark.slow
def test_every_kernel_compiles_for_sm80_and_sm90(tmp_path):
    proc = run(tmp_path, str(HERE / "aot_compile.py"))
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    errors = [f"{r['kernel']} [{r['config']}] {r['target']}: {r['error']}" for r in rows if "error" in r]
    assert not errors, "\n".join(errors)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {r["kernel"] for r in rows} == KERNELS
    for r in rows:
        where = f"{r['kernel']} [{r['config']}] {r['target']}"
        assert r["stages"] == ["ttir", "ttgir", "llir", "ptx", "cubin"], where
        assert r["ptx_target"] == [PTX_TARGET[r["target"]]], where
        assert r["ptx_entries"] == [r["kernel"]], where
        assert r["cubin_bytes"] > 0, where
        assert r["shared"] <= SHARED_LIMIT[r["target"]], f"{where}: {r['shared']} bytes of shared memory"
    for kernel in KERNELS:                                    # both targets for every kernel
        assert {r["target"] for r in rows if r["kernel"] == kernel} == set(PTX_TARGET), kernel
    print(f"{len(rows)} (kernel, config, target) compiles, "
          f"{sum(r['seconds'] for r in rows):.1f}s compiling")


BROKEN = '''
import sys

import torch
import triton
import triton.language as tl
from triton.compiler.errors import CompilationError

from aot_compile import TARGETS, compile_launch


@triton.jit
def _broken_kernel(a_ptr, b_ptr, o_ptr, M: tl.constexpr, K: tl.constexpr, N: tl.constexpr):
    a = tl.load(a_ptr + tl.arange(0, M)[:, None] * K + tl.arange(0, K)[None, :])        # [M, K]
    b = tl.load(b_ptr + tl.arange(0, N)[:, None] * K + tl.arange(0, K)[None, :])        # [N, K]: not [K, N]
    o = tl.dot(a, b)
    tl.store(o_ptr + tl.arange(0, M)[:, None] * N + tl.arange(0, N)[None, :], o)


a = torch.empty(32, 64, dtype=torch.bfloat16, device="meta")
b = torch.empty(16, 64, dtype=torch.bfloat16, device="meta")
for name, target in TARGETS.items():
    try:
        compile_launch(_broken_kernel, (a, b, a), dict(M=32, K=64, N=16, num_warps=4), target)
    except CompilationError as e:
        print(name, "CompilationError", str(e).splitlines()[-1])
    else:
        sys.exit(f"{name}: the broken kernel compiled")
'''


def test_a_compile_error_fails_the_same_path(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text(textwrap.dedent(BROKEN))
    proc = run(tmp_path, str(script))
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert [line.split()[:2] for line in lines] == [["sm_80", "CompilationError"], ["sm_90", "CompilationError"]]
    assert all("must have equal reduction dimensions" in line for line in lines), lines   # tl.dot's check
