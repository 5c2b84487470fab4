#!/usr/bin/env bash
# One-shot GPU check (target: an H200 with no network, a plain copy of the repo, no .venv), < 9.5 min:
#   1. environment   2. kernel tests on CUDA   3. parity on CUDA: the full-sequence fixtures (fp32 exact,
#   bf16 within tolerance) and `dlm parity` on every block fixture (paged attention, fused MoE)
#   4. end-to-end: an LLaDA2.0-mini-shaped MoE (16B, random bf16), a DiffusionGemma-26B-A4B-shaped one
#      (25B: decoder step, committed tokens/s, weight-read bound at batch 1 and 8) and an LLaDA-8B dense model
#   5. quantized: int4 LLaDA2-mini, FP8 DiffusionGemma, an LLaDA-8B block pass at bf16/int8/int4/fp8
#   6. tensor parallelism, when more than one GPU is visible   7. per-kernel benchmarks vs torch
# Results go to $OUT/gpu_check.txt when $OUT is set, else ./gpu_results/gpu_check.txt.
# Uses the first Python that has torch + triton + a CUDA device ($PYTHON, .venv, python3, python).
# Every section has a time limit and the whole script a budget (most valuable first); a failing
# section does not stop the ones after it; the exit code is the number of failed sections.
set -u
cd "$(dirname "$0")/.."
RESULTS="${OUT:-./gpu_results}"
mkdir -p "$RESULTS"
LOG="$RESULTS/gpu_check.txt"
: > "$LOG"
BUDGET="${GPU_CHECK_BUDGET:-560}"          # seconds for everything
START=$SECONDS
FAILED=0

say() { echo "$*" | tee -a "$LOG"; }
remaining() { echo $(( BUDGET - (SECONDS - START) )); }

# section NAME LIMIT_SECONDS CMD...: run CMD under min(LIMIT, what is left of the budget).
section() {
    local name=$1 limit=$2; shift 2
    local left; left=$(remaining)
    (( left < limit )) && limit=$left
    say ""
    say "=== $name (limit ${limit}s, elapsed $((SECONDS - START))s)"
    if (( limit < 10 )); then say "SKIPPED: time budget spent"; FAILED=$((FAILED + 1)); return; fi
    local t0=$SECONDS
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$LOG"
    local rc=${PIPESTATUS[0]}
    say "--- $name: rc=$rc in $((SECONDS - t0))s"
    (( rc != 0 )) && FAILED=$((FAILED + 1))
    return 0
}

PROBE='import torch, triton; assert torch.cuda.is_available(), "no CUDA device"; print(torch.__version__, triton.__version__, torch.cuda.get_device_name(0))'
PY=""
for cand in "${PYTHON:-}" ./.venv/bin/python python3 python /usr/bin/python3 /opt/conda/bin/python; do
    [ -n "$cand" ] || continue
    command -v "$cand" >/dev/null 2>&1 || [ -x "$cand" ] || continue
    if out=$("$cand" -c "$PROBE" 2>&1); then PY=$cand; say "python: $cand ($out)"; break; fi
    say "python: $cand unusable: $(echo "$out" | tail -n 1)"
done
if [ -z "$PY" ]; then
    say "FAILED: no Python with torch + triton + a CUDA device. Set PYTHON=/path/to/python."
    exit 100
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"     # the package straight from the checkout
export DLM_DISABLE_PLUGIN_AUTOLOAD=1

# The package's own dependencies: install what is missing if an index is reachable, else say so.
need_missing() {
    "$PY" - <<'PYEOF'
import importlib.util
mods = {"safetensors": "safetensors", "tokenizers": "tokenizers", "huggingface_hub": "huggingface_hub",
        "jinja2": "jinja2", "pluggy": "pluggy", "tqdm": "tqdm", "pytest": "pytest", "pytest_asyncio": "pytest-asyncio"}
print(" ".join(pkg for mod, pkg in mods.items() if importlib.util.find_spec(mod) is None))
PYEOF
}
MISSING=$(need_missing)
if [ -n "$MISSING" ]; then
    say "missing: $MISSING; trying pip (fails fast offline)"
    timeout 60 "$PY" -m pip install --quiet --retries 0 --timeout 5 $MISSING >>"$LOG" 2>&1 \
        || say "pip could not install them (offline?); sections that need them will fail"
    MISSING=$(need_missing)
    [ -n "$MISSING" ] && say "still missing: $MISSING"
fi

section "environment" 30 bash -c "nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; \
    '$PY' -c 'import torch, sys; print(sys.version); print(torch.__version__, torch.version.cuda)'"

PYTEST=("$PY" -m pytest -q -p no:cacheprovider -o addopts="")
section "kernel tests on CUDA" 150 "${PYTEST[@]}" tests/engine/kernels -m "not slow" -k "not parity"
section "parity on CUDA: LLaDA, Dream (fp32 exact, bf16 within tolerance)" 60 "${PYTEST[@]}" tests/engine/kernels/test_gpu_parity.py
section "parity on CUDA: dlm parity on the block fixtures (fp32 exact)" 60 "${PYTEST[@]}" tests/parity -m gpu

section "end-to-end: LLaDA2.0-mini MoE shape, random bf16 weights" 150 "$PY" benchmarks/gpu_moe.py
section "end-to-end: DiffusionGemma 26B-A4B shape, random bf16 weights, batch 1 and 8" 150 "$PY" benchmarks/gpu_dgemma.py
section "end-to-end: LLaDA-8B shape, random bf16 weights" 100 "$PY" benchmarks/gpu_e2e.py
# Quantized paths (engine/quant): tinygemm int4 experts on the LLaDA2-mini shape, FP8 weights with
# per-token FP8 activations (torch._scaled_mm on sm_89+) on the DiffusionGemma shape, then the quantized
# tests' CUDA paths and an LLaDA-8B-shaped block pass at bf16 / int8 / int4 / fp8.
section "quantized: the CUDA paths against their torch reference" 60 "${PYTEST[@]}" tests/engine/quant -m gpu
section "quantized: LLaDA2.0-mini shape, int4 experts (tinygemm), batch 1 and 8" 120 \
    "$PY" benchmarks/gpu_moe.py --quantization int4 --batches 1,8 --new 128
section "quantized: DiffusionGemma 26B-A4B shape, FP8 weights and activations, batch 1 and 8" 120 \
    "$PY" benchmarks/gpu_dgemma.py --quantization fp8
section "quantized: LLaDA-8B shape block pass, bf16 vs int8 / int4 / fp8" 120 \
    "$PY" benchmarks/bench_quant.py --device cuda --dims 4096,32,11008 --vocab 126464 --precisions bfloat16,int8,int4,fp8

# Tensor parallelism needs more than one GPU: NCCL equality tests, then throughput at TP 1/2(/4).
NGPU=$("$PY" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
if (( NGPU > 1 )); then
    SIZES=1,2
    (( NGPU >= 4 )) && SIZES=1,2,4
    section "tensor parallel on $NGPU GPUs: TP 2 tokens equal TP 1 (NCCL)" 90 "${PYTEST[@]}" tests/engine/parallel/test_tensor_parallel.py -m gpu
    section "tensor parallel: LLaDA-8B and LLaDA2.0-mini shapes (2 layers each, random bf16), TP $SIZES" 240 \
        "$PY" benchmarks/bench_tp.py --device cuda --models llada-8b,llada2-mini --sizes "$SIZES" --layers 2
else
    say ""
    say "=== tensor parallel: $NGPU GPU visible, section skipped (needs more than one)"
fi

for k in paged_attention moe unmask rmsnorm rotary swiglu attention; do
    section "bench_$k" 30 "$PY" "benchmarks/kernels/bench_$k.py"
done

say ""
say "gpu_check: $FAILED failed section(s), $((SECONDS - START))s total; log: $LOG"
exit "$FAILED"
