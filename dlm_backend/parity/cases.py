"""How each reference sampler's recorded call is asked of the engine, and what must come back.

A fixture's ``cases.json`` records calls of a published sampler (LLaDA's ``generate``, LLaDA2's,
SDAR's ``block_diffusion_generate``, Fast-dLLM v2's ``generate`` and ``batch_sample``, ...) with
their arguments and outputs; each function here turns one such case into the engine request(s)
with the same meaning and a check of what the engine returns. The case semantics are the ones the
fixture READMEs define (``tests/fixtures/parity*/README-*.md``); where a reference's arithmetic is
unusual (how many blocks Fast-dLLM v2 generates, what it does with a prompt exactly one block long)
the mapping says so, and the engine itself stays the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from dlm_backend.engine.outputs import GenerationOutput
from dlm_backend.engine.params import SamplingParams


@dataclass
class Run:
    """Engine requests standing for one case, and the check of their outputs (mismatch messages)."""

    prompts: list[list[int]]
    params: list[SamplingParams]
    check: Callable[[list[GenerationOutput]], list[str]]
    #: per prompt, the random draws the reference recorded (``dlm parity --replay`` injects them)
    recorded: list[list[dict] | None] = field(default_factory=list)
    note: str = ""
    #: per prompt, what to set on the queued request before it runs, ``f(sequence, engine)`` (a
    #: reference's given starting canvas); None: nothing
    prepare: list[Callable | None] = field(default_factory=list)


def tokens(out: GenerationOutput) -> list[int]:
    """The output with its stop token, as the references return it."""
    return out.token_ids + ([out.stop_reason] if out.finish_reason == "stop" and isinstance(out.stop_reason, int)
                            else [])


def _same(name: str, got, want) -> list[str]:
    return [] if got == want else [f"{name}: got {got}, reference {want}"]


def _exact(want: list[int], passes: int | None = None, count=lambda o: o.num_forward_passes):
    def check(outs: list[GenerationOutput]) -> list[str]:
        out = outs[0]
        return _same("tokens", tokens(out), want) + (_same("passes", count(out), passes) if passes is not None else [])
    return check


# -- the full-sequence references (fixtures/parity) ---------------------------------------------


def llada_generate(case: dict, fixture: dict) -> Run:
    p = SamplingParams(sampler="llada", max_tokens=case["gen_length"], block_length=case["block_length"],
                       steps=case["steps"], temperature=case["temperature"], remasking=case["remasking"],
                       cache="none", ignore_eos=True)
    return Run([case["prompt"]], [p], _exact(case["output"], case.get("nfe")))


def fast_dllm_threshold(case: dict, fixture: dict) -> Run:
    p = SamplingParams(sampler="threshold", max_tokens=case["gen_length"], block_length=case["block_length"],
                       threshold=case["threshold"], cache="none", ignore_eos=True)
    return Run([case["prompt"]], [p], _exact(case["output"], case.get("nfe")))


def dream_generate(case: dict, fixture: dict) -> Run:
    p = SamplingParams(sampler="dream", max_tokens=case["max_new_tokens"], steps=case["steps"], alg=case["alg"],
                       temperature=case["temperature"], cache="none", ignore_eos=True)
    return Run([case["prompt"]], [p], _exact(case["output"], case.get("nfe")))


# -- the block references (fixtures/parity-block) ------------------------------------------------


def llada2_generate(case: dict, fixture: dict) -> Run:
    """LLaDA2.0: ``steps`` is capped by ``gen_length // minimal_topk`` as the reference caps it."""
    G = case["gen_length"]
    p = SamplingParams(sampler="llada2", max_tokens=G, block_length=case["block_length"],
                       steps=min(case["steps"], G // case["minimal_topk"]), threshold=case["threshold"],
                       temperature=case["temperature"], eos_early_stop=case["eos_early_stop"], cache="prefix",
                       ignore_eos=True, stop_token_ids=[case["eos_id"]])
    return Run([case["prompt"]], [p], _exact(case["output"], case["nfe"]))


def llada21_generate(case: dict, fixture: dict) -> Run:
    p = SamplingParams(sampler="llada2_edit", max_tokens=case["gen_length"], block_length=case["block_length"],
                       threshold=case["threshold"], editing_threshold=case["editing_threshold"],
                       max_post_steps=case["max_post_steps"], num_to_transfer=case["num_to_transfer"],
                       temperature=case["temperature"], eos_early_stop=case["eos_early_stop"], cache="prefix",
                       ignore_eos=True, stop_token_ids=[case["eos_id"]])
    return Run([case["prompt"]], [p], _exact(case["output"], case["nfe"]))


SDAR_RULES = {"low_confidence_static": "low_confidence"}


def sdar_generate(case: dict, fixture: dict) -> Run:
    """SDAR stops after the block holding a stop id (no early stop). Its store-KV pass of the last
    block is one the engine skips (nothing reads it), so cache passes are one fewer."""
    p = SamplingParams(sampler="sdar", max_tokens=case["gen_length"], block_length=case["block_length"],
                       steps=case["denoising_steps"], threshold=case["confidence_threshold"],
                       remasking=SDAR_RULES.get(case["remasking_strategy"], case["remasking_strategy"]),
                       temperature=case["temperature"], eos_early_stop=False, cache="prefix", ignore_eos=True,
                       stop_token_ids=list(case["stopping_criteria_idx"]))

    def check(outs):
        out = outs[0]
        return (_same("tokens", tokens(out), case["output"])
                + _same("denoising passes", out.num_forward_passes, case["nfe_denoise"])
                + _same("cache passes (+1: the reference caches its last block too)", out.num_cache_passes + 1,
                        case["nfe_store_kv"]))
    return Run([case["prompt"]], [p], check)


def _fastdllm_tokens(prompt_len: int, block: int, max_new_tokens: int) -> int:
    """How many tokens Fast-dLLM v2's ``generate`` returns: ``max_new_tokens // block`` blocks after
    the prompt's own block, then the next block's autoregressive first token."""
    return (prompt_len // block + max_new_tokens // block) * block + 1 - prompt_len


def _fastdllm_params(kw: dict, max_tokens: int, seed) -> SamplingParams:
    sampled = kw["temperature"] > 0           # the greedy branch ignores top_p
    return SamplingParams(sampler="fastdllm2", max_tokens=max_tokens, block_length=kw["block_size"],
                          sub_block_length=kw["small_block_size"], threshold=kw["threshold"],
                          temperature=kw["temperature"], top_p=kw["top_p"] if sampled else None, seed=seed,
                          stop_token_ids=[kw["stop_token"]], ignore_eos=True,
                          cache="dual" if kw["use_block_cache"] else "prefix")


def fastdllm2_generate(case: dict, fixture: dict) -> Run:
    """A prompt exactly one block long is not read by the reference (it forwards the block after it
    alone, at positions 0..), so the engine gets the empty prompt such a call really decodes."""
    kw, prompt = case["kwargs"], case["prompt"]
    note = ""
    if len(prompt) == kw["block_size"]:
        prompt, note = [], "prompt of one block: the reference decodes it as an empty prompt"
    p = _fastdllm_params(kw, _fastdllm_tokens(len(prompt), kw["block_size"], kw["max_new_tokens"]), case["seed"])
    result = case["result"]
    return Run([prompt], [p], _exact(result["outputs"], result["nfe"],
                                     count=lambda o: o.num_forward_passes + o.num_cache_passes),
               [result["rng_calls"] or None], note)


def fastdllm2_batch_sample(case: dict, fixture: dict) -> Run:
    """``batch_sample`` decodes every row up to the block count of the batch's longest prompt and
    pads a row after its first stop token (``tokenizer_pad_token_id``); forward counts are the
    batch's, so only tokens are compared."""
    kw, prompts, pad = case["kwargs"], case["prompts"], case["tokenizer_pad_token_id"]
    L, longest = kw["block_size"], max(len(p) for p in prompts)
    total = (longest // L + kw["max_new_tokens"] // L) * L + 1
    params = [_fastdllm_params(kw, total - len(p), case["seed"]) for p in prompts]
    want_rows = case["result"]["outputs"]

    def check(outs):
        errors = []
        for i, (out, want) in enumerate(zip(outs, want_rows)):
            got = tokens(out)
            errors += _same(f"row {i} tokens", got, want[:len(got)])
            if want[len(got):] != [pad] * (len(want) - len(got)):
                errors.append(f"row {i}: the reference goes on past the engine's output: {want[len(got):]}")
        return errors
    rows: list = []         # the rows decode as one batch_sample batch (engine/requests/batch_sample.py)
    return Run(prompts, params, check, prepare=[lambda seq, engine: seq.join_batch(rows)] * len(prompts))


def wedlm_generate(case: dict, fixture: dict) -> Run:
    """WeDLM's ``generate_wedlm`` generates all ``max_new_tokens`` (no stop token); its threshold 0 is
    one slot a pass (``remasking="low_confidence"``), above 0 every slot at least that confident."""
    threshold = case["confidence_threshold"]
    p = SamplingParams(sampler="wedlm", max_tokens=case["max_new_tokens"], block_length=case["block_size"],
                       remasking="low_confidence_dynamic" if threshold > 0 else "low_confidence",
                       threshold=threshold if threshold > 0 else 1.0, temperature=case["temperature"],
                       cache="prefix", ignore_eos=True)
    return Run([case["prompt"]], [p], _exact(case["output"], case["total_steps"]))


# -- the uniform-noise reference (fixtures/parity-block/diffusiongemma-tiny) ---------------------


def _dg_row_draws(result: dict, row: int, rows: int, length: int, finished: list[int | None]) -> list[dict]:
    """Row ``row``'s part of a batch's recorded draws: each call drew ``rows`` slices of ``length``,
    row by row. A row takes its slices while it runs: canvases up to the one where it ended, and in
    each canvas the steps before its denoising finished (the reference draws for finished rows too)."""
    calls, out = iter(result["rng_calls"]), []

    def take(call):
        return {**call, "out": call["out"][row * length:(row + 1) * length]}
    by_canvas: dict[int, list[dict]] = {}
    for step in result["steps"]:
        by_canvas.setdefault(step["canvas_index"], []).append(step)
    for c in sorted(by_canvas):
        init = next(calls)
        live = finished[row] is None or c <= finished[row]
        if live:
            out.append(take(init))
        for step in by_canvas[c]:
            draws = (next(calls), next(calls))
            if live and not step["finished_before"][row]:
                out += [take(d) for d in draws]
    return out


def diffusiongemma_generate(case: dict, fixture: dict) -> Run:
    """transformers' DiffusionGemma ``generate``: whole canvases come back (``ceil(max_new_tokens / L)``
    of them), pad after the first EOS of a canvas. The engine is asked for whole canvases too and its
    output (cut at the stop token) is padded the same way to compare. A batch's rows are requests of
    their own; replay hands each its slices of the batch's draws (``_dg_row_draws``)."""
    kw = {**fixture["generation_config_defaults"], **case["generate_kwargs"]}
    L, prompts, result = fixture["canvas_length"], case["prompts"], case["result"]
    eos = kw.get("eos_token_id", fixture["eos_token_id"])
    eos, pad = (eos if isinstance(eos, list) else [eos]), kw.get("pad_token_id", fixture["pad_token_id"])
    bound = kw["entropy_bound"] if "entropy_bound" in kw else kw["sampler_config"]["entropy_bound"]
    canvases = -(-kw["max_new_tokens"] // L)
    p = SamplingParams(sampler="diffusiongemma", max_tokens=canvases * L, block_length=L, t_min=kw["t_min"],
                       t_max=kw["t_max"], gamma=bound, stability_threshold=kw["stability_threshold"],
                       confidence_threshold=kw["confidence_threshold"],
                       max_denoising_steps=kw["max_denoising_steps"], seed=case["seed"], ignore_eos=True,
                       stop_token_ids=list(eos))
    want = result["outputs"]
    ended = [next((i // L for i, t in enumerate(row) if t in eos), None) for row in want]
    B = len(prompts)

    def check(outs):
        errors = []
        for b, out in enumerate(outs):
            got = tokens(out)
            got += [pad] * (-len(got) % L)
            name = f"row {b} " if B > 1 else ""
            errors += _same(f"{name}tokens", got, want[b])
            valid = sum(t != pad for t in want[b])
            passes = result["decoder_forward_calls"] if B == 1 else round(valid / result["tokens_per_forward"][b])
            errors += _same(f"{name}decoder passes", out.num_forward_passes, passes)
            if B == 1:
                errors += _same("encoder passes", out.num_cache_passes, len(result["encoder_calls"]))
        return errors

    def start(b: int):
        canvas = case.get("decoder_input_ids")
        key = case.get("self_conditioning_logits_key")
        if canvas is None and key is None:
            return None

        def prepare(seq, engine):
            from safetensors.torch import load_file

            if canvas is not None:
                seq.start_canvas = canvas[b]
            if key is not None:
                logits = load_file(str(engine.checkpoint.folder / "expected_logits.safetensors"))[key][b]
                seq.conditioning = engine.model.conditioning_input(logits.to(engine.device))
        return prepare

    recorded = [_dg_row_draws(result, b, B, L, ended) for b in range(B)] if result["rng_calls"] else [None] * B
    note = "whole canvases asked for" if kw["max_new_tokens"] % L else ""
    return Run(prompts, [p] * B, check, recorded, note, [start(b) for b in range(B)])


#: reference sampler name (``case["sampler"]``) -> its mapping
SAMPLERS: dict[str, Callable[..., Run]] = {
    "transformers.DiffusionGemmaForBlockDiffusion.generate": diffusiongemma_generate,
    "llada.generate": llada_generate,
    "fast_dllm.generate(threshold)": fast_dllm_threshold,
    "dream.diffusion_generate": dream_generate,
    "llada2.0.generate": llada2_generate,
    "llada2.1.generate": llada21_generate,
    "sdar.block_diffusion_generate": sdar_generate,
    "Fast_dLLM_QwenForCausalLM.generate": fastdllm2_generate,
    "v2/generation_functions.py:batch_sample": fastdllm2_batch_sample,
    "WeDLMForCausalLM.generate_wedlm": wedlm_generate,
}
