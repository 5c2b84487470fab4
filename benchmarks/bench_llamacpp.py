"""The engine against llama.cpp's ``llama-diffusion-cli`` on CPU: the same GGUF files, the same LLaDA decode.

Both decode a canvas of ``--gen`` tokens after a ``--prompt-tokens`` prompt (its BOS included) in blocks of
``--block``, one confidence-ranked commit schedule of ``--steps`` passes (LLaDA's low-confidence remasking,
llama.cpp's confidence-based algorithm; greedy), on ``--threads`` threads. llama.cpp's time is the
"total time" it prints for the diffusion loop (model load excluded); the engine's is ``LLM.generate``'s
wall time, also after loading. Each is warmed up once, then the median of ``--runs``. llama.cpp recomputes
the whole canvas every pass, as the engine's ``cache="none"`` does; the engine's default cache is timed too.

llama.cpp's block schedule counts the prompt in its canvas (``max_length`` = prompt + gen, ``max_length /
block`` blocks starting after the prompt): the prompt length must be a multiple of ``--block``, and its
trailing empty blocks cost one pass each (``prompt / block`` extra passes, timed, not counted as tokens).

    # llama.cpp (examples/diffusion) built with: cmake -B build -G Ninja -DCMAKE_BUILD_TYPE=Release \\
    #   -DGGML_NATIVE=ON -DLLAMA_CURL=OFF && cmake --build build --target llama-diffusion-cli llama-quantize
    # GGUF files from a LLaDAModelLM folder: convert_hf_to_gguf.py DIR --outtype q8_0, then
    #   llama-quantize DIR-F16.gguf DIR-Q4_K_M.gguf Q4_K_M
    python benchmarks/bench_llamacpp.py --gguf model-Q8_0.gguf,model-Q4_K_M.gguf \\
        --cli build/bin/llama-diffusion-cli --prompt-tokens 32 --gen 64 --steps 64 --block 32 --threads 2
    python benchmarks/bench_llamacpp.py ... --profile      # also: the engine's top ops of one cache="none" run
"""

from __future__ import annotations

import argparse
import collections
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import gguf
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dlm_backend import LLM  # noqa: E402
from dlm_backend.engine.params import SamplingParams  # noqa: E402
from dlm_backend.engine.quant.int_weight import IntWeight  # noqa: E402

TOTAL_TIME = re.compile(r"total time: ([0-9.]+)ms")


def prompt_text(llm: LLM, n: int) -> tuple[str, list[int]]:
    """Text that llama.cpp tokenizes to ``n`` tokens, and those ids, from the file's own vocabulary (BOS first
    when it has one: LLaDA's converter writes ``add_bos_token = true``)."""
    tok = llm.tokenizer
    bos = tok.token_id(tok.special_tokens.get("bos_token"))
    body = n - (bos is not None)
    text = " the" * body
    ids = tok.encode(text)
    if len(ids) != body:
        raise SystemExit(f"' the' is not one token in this vocabulary ({len(ids)} tokens for {body} words)")
    return text, ([bos] if bos is not None else []) + ids


def quant_types(gguf_path: str) -> str:
    """The file's weight types by count (``Q4_K:49 Q6_K:9 F32:17``), read from its header."""
    count = collections.Counter(t.tensor_type.name for t in gguf.GGUFReader(gguf_path).tensors)
    return " ".join(f"{k}:{v}" for k, v in count.most_common())


def llamacpp_run(a, gguf_path: str, text: str) -> float:
    """Seconds of the diffusion loop of one llama-diffusion-cli run."""
    canvas = a.prompt_tokens + a.gen
    steps = canvas // a.block * (a.steps * a.block // a.gen)      # the same passes per block as the engine
    cmd = [a.cli, "-m", gguf_path, "-p", text, "-c", str(canvas), "-b", str(canvas), "-ub", str(canvas),
           "-t", str(a.threads), "-tb", str(a.threads), "--diffusion-steps", str(steps),
           "--diffusion-block-length", str(a.block), "--diffusion-algorithm", "4", "--temp", "0", "--top-k", "1",
           "--seed", "0"]
    out = subprocess.run(cmd, capture_output=True, text=True, errors="replace", check=True)
    log = out.stdout + out.stderr
    total = TOTAL_TIME.search(log)
    if total is None:
        raise SystemExit(f"no 'total time' in llama-diffusion-cli's output:\n{log[-2000:]}")
    return float(total.group(1)) / 1e3


def engine_run(llm: LLM, ids: list[int], params: SamplingParams) -> tuple[float, int]:
    """(seconds, forward passes) of one generation."""
    t0 = time.perf_counter()
    out = llm.generate(prompt_token_ids=ids, sampling_params=params)[0]
    seconds = time.perf_counter() - t0
    if len(out.token_ids) != params.max_tokens:
        raise SystemExit(f"the engine generated {len(out.token_ids)} tokens, not {params.max_tokens}")
    return seconds, out.num_forward_passes


def median_time(run, runs: int, warm_up: bool = True) -> float:
    if warm_up:
        run()
    return statistics.median(run() for _ in range(runs))


def exec_paths(llm: LLM) -> str:
    """How the quantized weights run: IntWeight.exec counts (int4pack, int4x2, int8pack, dequant)."""
    count = collections.Counter(m.exec for m in llm.engine.model.modules() if isinstance(m, IntWeight))
    return " ".join(f"{k}:{v}" for k, v in sorted(count.items())) or "none"


def profile(llm: LLM, ids: list[int], params: SamplingParams, top: int = 12) -> None:
    """The ops taking the most CPU time in one generation."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        llm.generate(prompt_token_ids=ids, sampling_params=params)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", required=True, help="comma-separated GGUF files")
    ap.add_argument("--cli", required=True, help="path to llama-diffusion-cli")
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--steps", type=int, default=None, help="passes over the whole generation (default: --gen)")
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args(argv)
    a.steps = a.steps or a.gen
    if a.gen % a.block or a.prompt_tokens % a.block or (a.steps * a.block) % a.gen:
        ap.error("--gen and --prompt-tokens must be multiples of --block, and --steps a multiple of --gen / --block")
    torch.set_num_threads(a.threads)
    print(f"prompt {a.prompt_tokens} tokens, gen {a.gen}, steps {a.steps}, block {a.block}, {a.threads} threads, "
          f"median of {a.runs} after a warm-up")
    rows = []
    for path in a.gguf.split(","):
        llm = LLM(path, device="cpu")
        try:
            text, ids = prompt_text(llm, a.prompt_tokens)
            lcpp = median_time(lambda: llamacpp_run(a, path, text), a.runs)
            row = {"file": Path(path).name, "type": quant_types(path), "exec": exec_paths(llm),
                   "llama.cpp": a.gen / lcpp}
            for cache in ("none", SamplingParams().cache):
                params = SamplingParams(sampler="llada", max_tokens=a.gen, steps=a.steps, block_length=a.block,
                                        temperature=0.0, ignore_eos=True, cache=cache)
                row[f"passes {cache}"] = engine_run(llm, ids, params)[1]          # also the warm-up
                row[f"cache={cache}"] = a.gen / median_time(lambda: engine_run(llm, ids, params)[0], a.runs, False)
            rows.append(row)
            if a.profile:
                profile(llm, ids, SamplingParams(sampler="llada", max_tokens=a.gen, steps=a.steps,
                                                 block_length=a.block, ignore_eos=True, cache="none"))
        finally:
            llm.close()
    modes = [k for k in rows[0] if k.startswith("cache=")]
    head = ["file", "type"] + [f"engine {m} tok/s" for m in modes] + ["llama.cpp tok/s"] + \
           [f"ratio {m}" for m in modes] + ["engine exec paths"]
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for r in rows:
        cells = [r["file"], r["type"]] + [f"{r[m]:.1f}" for m in modes] + [f"{r['llama.cpp']:.1f}"] + \
                [f"{r[m] / r['llama.cpp']:.2f}" for m in modes] + [r["exec"]]
        print("| " + " | ".join(cells) + " |")
    print("engine passes per generation: " + ", ".join(f"{m.split()[1]} {rows[0][m]}" for m in rows[0]
                                                        if m.startswith("passes")) +
          f"; llama.cpp: {a.steps + a.prompt_tokens // a.block} (one per trailing empty block included)")


if __name__ == "__main__":
    main()
