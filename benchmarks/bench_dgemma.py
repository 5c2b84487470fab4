"""DiffusionGemma: the reference algorithm without a cache against the engine, in one run, same tokens.

The baseline is ``generate``'s loop written out plainly with nothing kept between steps: every
denoising step re-encodes the whole prefix (the prompt, then each committed canvas, in the same
pieces the engine encodes them, so the numbers and the tokens are the same) and then runs the
decoder over the canvas. The engine encodes each piece once into its paged KV cache and runs only
the decoder per step. Both use the same model object and the ``diffusiongemma`` sampler with the
same seed; the tokens are checked equal. Random DiffusionGemma-shaped checkpoint
(benchmarks/random_checkpoint.py), CPU, float32; random weights are never confident, so every canvas
takes ``max_denoising_steps`` steps (``confidence_threshold=0`` says so).

    python benchmarks/bench_dgemma.py              # hidden 256, 6 layers; prompt 512, 4 canvases of 32
    python benchmarks/bench_dgemma.py --quick      # smaller, for a smoke run
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from random_checkpoint import dgemma_config, write_checkpoint  # noqa: E402

from dlm_backend import LLM, SamplingParams  # noqa: E402
from dlm_backend.engine.samplers import DiffusionGemmaSampler, StepInput, TokenInfo  # noqa: E402
from dlm_backend.engine.samplers.random import TorchRandom  # noqa: E402
from dlm_backend.parity.forward import PagedRun  # noqa: E402


@torch.inference_mode()
def reference_loop(model, prompt: list[int], params: SamplingParams, canvas: int):
    """The reference ``generate`` with no cache: per step, encode every piece of the prefix again,
    then decode. Returns (tokens, forwards, positions fed)."""
    sampler, random = DiffusionGemmaSampler(), TorchRandom(torch.Generator().manual_seed(params.seed))
    vocab, pieces, out = model.args.vocab_size, [prompt], []
    forwards = fed = 0
    for _ in range(-(-params.max_tokens // canvas)):
        state, conditioning = sampler.begin_canvas(random, vocab, canvas, params), None
        start = sum(len(p) for p in pieces)
        while not state.done:
            run, at = PagedRun(model, start + canvas, block=1), 0
            for piece in pieces:                             # the whole prefix, every step
                run.hidden(torch.tensor(piece), at, at + len(piece))
                at += len(piece)
            logits = run.decode(torch.tensor(state.canvas), start, conditioning)
            forwards, fed = forwards + len(pieces) + 1, fed + start + canvas
            commit = sampler.step(StepInput(logits=logits, positions=list(range(canvas)), step=0, block_state=state,
                                            params=params, tokens=TokenInfo(mask_id=-1),
                                            current=state.canvas, masked=[True] * canvas, random=random))
            conditioning = model.conditioning_input(commit.conditioning)
        pieces.append(state.canvas)
        out += state.canvas
    return out[:params.max_tokens], forwards, fed


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--steps", type=int, default=8, help="max_denoising_steps (the reference default is 48)")
    a = ap.parse_args(argv)
    torch.manual_seed(0)
    hidden, layers, prompt_len, canvases, canvas = (128, 3, 64, 2, 16) if a.quick else (256, 6, 512, 4, 32)
    config = dgemma_config(hidden=hidden, layers=layers, canvas=canvas)
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_checkpoint(config, Path(tmp) / "dgemma")
        llm = LLM(str(folder), dtype="float32", device="cpu")
        params = llm.sampling_params(max_tokens=canvases * canvas, seed=7, max_denoising_steps=a.steps,
                                     confidence_threshold=0.0, ignore_eos=True)
        prompt = torch.randint(3, config["text_config"]["vocab_size"], (prompt_len,)).tolist()
        llm.generate(prompt_token_ids=[prompt[:8]], sampling_params=params.replace(max_tokens=canvas))  # warm-up
        t0 = time.perf_counter()
        got = llm.generate(prompt_token_ids=[prompt], sampling_params=params)[0]
        engine_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        want, forwards, fed = reference_loop(llm.engine.runner.model, prompt, params, canvas)
        loop_s = time.perf_counter() - t0
        llm.close()
    n = len(got.token_ids)
    engine_forwards = got.num_forward_passes + got.num_cache_passes
    engine_fed = got.num_forward_passes * canvas + prompt_len + (canvases - 1) * canvas
    print(f"DiffusionGemma shape: hidden {hidden}, {layers} layers, prompt {prompt_len}, {canvases} canvases of "
          f"{canvas}, {a.steps} steps each; CPU float32, {torch.get_num_threads()} threads")
    print(f"{'':24}{'wall s':>9}{'forwards/token':>16}{'positions/token':>17}")
    print(f"{'reference loop (no cache)':24}{loop_s:>9.2f}{forwards / n:>16.3f}{fed / n:>17.1f}")
    print(f"{'engine (paged KV)':24}{engine_s:>9.2f}{engine_forwards / n:>16.3f}{engine_fed / n:>17.1f}")
    print(f"speed-up {loop_s / engine_s:.2f}x; tokens equal: {got.token_ids == want}")
    if got.token_ids != want:
        sys.exit("bench_dgemma: the engine and the reference loop disagree")


if __name__ == "__main__":
    main()
