"""Forward checks: the engine's logits (and router choices) against a fixture's recorded tensors.

Each check runs the loaded model the way the engine runs it: whole sequences packed with the
family's attention (bidirectional, or block-causal with blocks aligned to position 0), or passes
over a KV pool exactly as a cached request's passes go (the prompt's pages, then a block reading
them, then a sub-block reading the block's own stale keys). Tensors are compared at
``atol = rtol = 1e-4`` in float32, the fixtures' stated tolerance.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dlm_backend.engine.kv import KVPool
from dlm_backend.engine.layers import DecoderRows, ForwardContext, PackedAttention, Segment, forward_context
from dlm_backend.engine.layers.paged_attention import PagedBatch

TOL = 1e-4


@dataclass
class Check:
    name: str
    errors: list[str]


def compare(name: str, got: torch.Tensor, want: torch.Tensor) -> Check:
    got, want = got.float().cpu(), want.float().cpu()
    if got.shape != want.shape:
        return Check(name, [f"shape {tuple(got.shape)}, reference {tuple(want.shape)}"])
    diff = (got - want).abs()
    bad = diff > TOL + TOL * want.abs()
    return Check(name, [f"max |diff| {diff.max():.2e} over the tolerance at {int(bad.sum())} values"] if bad.any()
                 else [])


@torch.inference_mode()
def packed_logits(model, rows: torch.Tensor, block: int | None) -> torch.Tensor:
    """Logits ``[B, T, V]`` of each row of ``rows [B, T]`` at positions 0.., packed in one forward."""
    B, T = rows.shape
    segments = [Segment(slice(i * T, (i + 1) * T), 0, block) for i in range(B)]
    with forward_context(ForwardContext(PackedAttention(segments))):
        hidden = model(rows.reshape(-1), torch.arange(T, device=rows.device).repeat(B))
        return model.compute_logits(hidden).view(B, T, -1)


class PagedRun:
    """One sequence's passes over a KV pool of its own, as the runner makes them (``block`` 0:
    bidirectional attention over the pool, the full-sequence families' caches)."""

    def __init__(self, model, length: int, block: int = 0, page_size: int = 16):
        a, p = model.args, next(model.parameters())
        self.model, self.block = model, block
        pages = -(-length // page_size)
        self.pool = KVPool(a.kv_shapes, page_size, pages, p.dtype, p.device)
        self.pages = list(range(pages))

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, start: int, kv_end: int, triton: bool = False) -> torch.Tensor:
        """Feed ``ids`` at positions ``start..`` (their keys and values go into the pool), attending
        to the pool's positions ``0..kv_end``; logits ``[n, V]``."""
        return self.model.compute_logits(self.hidden(ids, start, kv_end, triton))

    @torch.inference_mode()
    def hidden(self, ids: torch.Tensor, start: int, kv_end: int, triton: bool = False, block: int | None = None,
               decoder: DecoderRows | None = None) -> torch.Tensor:
        """The hidden states ``[n, D]`` of :meth:`forward` (``block``: this pass's own; ``decoder``: its
        decoder rows, DiffusionGemma)."""
        n = ids.shape[0]
        backend = PagedBatch(self.pool, PackedAttention([]), [0, n], [start], [kv_end], [self.pages],
                             [self.block if block is None else block], ids.device)
        with forward_context(ForwardContext(backend, triton, decoder)):
            return self.model(ids, torch.arange(start, start + n, device=ids.device))

    @torch.inference_mode()
    def decode(self, ids: torch.Tensor, start: int, conditioning: torch.Tensor | None = None) -> torch.Tensor:
        """DiffusionGemma's decoder over a canvas at ``start..``: bidirectional over the cache and the
        canvas, every row a decoder row (``conditioning [n, D]``, None: zeros); logits ``[n, V]``."""
        n, hidden = ids.shape[0], self.model.args.hidden_size
        rows = DecoderRows(torch.arange(n, device=ids.device), conditioning if conditioning is not None else
                           torch.zeros(n, hidden, dtype=next(self.model.parameters()).dtype, device=ids.device))
        return self.model.compute_logits(self.hidden(ids, start, start + n, block=0, decoder=rows))


def router_checks(model, ids: torch.Tensor, block: int, expected: dict) -> list[Check]:
    """The routers' expert choices and weights against ``router.<layer>.*`` (LLaDA2's gate returns
    its whole decision, so a forward hook sees it)."""
    layers = sorted({int(k.split(".")[1]) for k in expected if k.startswith("router.")})
    seen: dict[int, tuple] = {}
    hooks = [model.model.layers[i].mlp.gate.register_forward_hook(
        lambda mod, inp, out, i=i: seen.__setitem__(i, out)) for i in layers]
    try:
        packed_logits(model, ids[None], block)
    finally:
        for h in hooks:
            h.remove()
    checks = []
    for i in layers:
        idx, weight, logits = seen[i]
        want_idx = expected[f"router.{i}.topk_idx"]
        errors = [] if torch.equal(idx.cpu(), want_idx) else ["another expert choice"]
        errors += compare("", weight, expected[f"router.{i}.topk_weight"]).errors
        errors += compare("", logits, expected[f"router.{i}.logits"]).errors
        checks.append(Check(f"router of layer {i}", errors))
    return checks


def fixture_checks(model, cases: dict, expected: dict, device) -> list[Check]:
    """Every forward tensor a fixture records, by its layout (see the fixture READMEs)."""
    t = {k: v.to(device) for k, v in expected.items()}
    if "canvas_length" in cases:                      # DiffusionGemma
        return [check for case in cases["forward_cases"] for check in _dgemma_checks(model, case, t)]
    if "forward_cases" in cases:                      # Fast-dLLM v2
        return _fastdllm_checks(model, cases, t)
    if "forward" not in cases:                         # the full-sequence fixtures: one bidirectional forward
        return [compare("logits", packed_logits(model, t["input_ids"], None), t["logits"])]
    block = cases["forward"]["block_length"]
    checks = [compare("logits", packed_logits(model, t["input_ids"], block), t["logits"]),
              compare("batch of two", packed_logits(model, t["batch_input_ids"], block), t["batch_logits"])]
    if "cached_block_logits" in t:                     # SDAR's denoise pass: the last block over cached keys
        ids, T = t["input_ids"][0], t["input_ids"].shape[1]
        run = PagedRun(model, T, block)
        run.forward(ids[:T - block], 0, T - block)
        checks.append(compare("last block over the cache", run.forward(ids[T - block:], T - block, T)[None],
                              t["cached_block_logits"]))
    return checks + router_checks(model, t["input_ids"][0], block, t)


def _fastdllm_checks(model, cases: dict, t: dict) -> list[Check]:
    bd, ids = cases["bd_size"], t["blockcausal.input_ids"]
    checks = [compare("block-causal logits", packed_logits(model, ids, bd), t["blockcausal.logits"]),
              compare("block-causal logits, blocks of 32", packed_logits(model, ids, 32),
                      t["blockcausal_default_bs32.logits"])]
    seq = ids[0]
    run = PagedRun(model, len(seq), bd)
    checks.append(compare("prefill", run.forward(seq[:2 * bd], 0, 2 * bd)[None], t["cached.prefill_logits"]))
    checks.append(compare("block over the cache", run.forward(seq[2 * bd:3 * bd], 2 * bd, 3 * bd)[None],
                          t["cached.block_logits"]))
    # The block cache: a full-block pass wrote the block's keys; a sub-block of changed tokens then
    # replaces its own rows and reads the rest as they were.
    checks.append(compare("full block (block cache)", run.forward(seq[2 * bd:3 * bd], 2 * bd, 3 * bd)[None],
                          t["blockcache.full_block_logits"]))
    sub = t["blockcache.subblock_input_ids"][0]
    start = 3 * bd - len(sub)
    checks.append(compare("sub-block over the block cache", run.forward(sub, start, 3 * bd)[None],
                          t["blockcache.subblock_logits"]))
    return checks


def _encode_checks(model, run: PagedRun, name: str, start: int, t: dict) -> list[Check]:
    """DiffusionGemma's encoder over ``<name>.input_ids`` at ``start..``: logits, last hidden state,
    each router's choice and weights, and what the cache then holds per layer (a sliding layer's
    reference cache keeps the last window - 1 positions; the pool keeps all, the window is a mask)."""
    ids = t[f"{name}.input_ids"][0]
    end, seen = start + len(ids), {}
    layers = model.model.decoder.layers
    hooks = [layer.router.register_forward_hook(lambda mod, inp, out, i=i: seen.__setitem__(i, out))
             for i, layer in enumerate(layers)]
    try:
        hidden = run.hidden(ids, start, end, block=1)
    finally:
        for h in hooks:
            h.remove()
    checks = [compare(f"{name} logits", model.compute_logits(hidden)[None], t[f"{name}.logits"]),
              compare(f"{name} last hidden state", model.model.decoder.norm(hidden)[None],
                      t[f"{name}.last_hidden_state"])]
    for i in range(len(layers)):
        idx, weight, _ = seen[i]
        errors = [] if torch.equal(idx, t[f"{name}.router.{i}.top_k_index"]) else ["another expert choice"]
        errors += compare("", weight, t[f"{name}.router.{i}.top_k_weights"]).errors
        checks.append(Check(f"{name} router of layer {i}", errors))
        for kind, cache in (("keys", run.pool.k[i]), ("values", run.pool.v[i])):
            want = t[f"{name}.cache.{i}.{kind}"]                                   # [1, Hkv, n, D]
            rows = cache.reshape(-1, *cache.shape[2:])[end - want.shape[2]:end]      # [n, Hkv, D]
            checks.append(compare(f"{name} cache {kind} of layer {i}", rows.transpose(0, 1)[None], want))
    return checks


def _dgemma_checks(model, case: dict, t: dict) -> list[Check]:
    """One forward case: the encoder over a prompt (``enc0``), or a prompt (and a committed canvas)
    encoded and then the decoder over a canvas (``dec*``), as ``generate`` calls them."""
    name = case["name"]
    length = sum(v.shape[-1] for k, v in t.items() if k.startswith(name) and k.endswith("input_ids"))
    run = PagedRun(model, length, block=1)
    if case["kind"] == "encoder":
        return _encode_checks(model, run, name, case.get("position_offset", 0), t)
    checks = _encode_checks(model, run, f"{name}.enc", 0, t)
    start = t[f"{name}.enc.input_ids"].shape[1]
    if f"{name}.commit.input_ids" in t:
        checks += _encode_checks(model, run, f"{name}.commit", start, t)
        start += t[f"{name}.commit.input_ids"].shape[1]
    sc = t.get(f"{name}.self_conditioning_logits")
    logits = run.decode(t[f"{name}.decoder_input_ids"][0], start,
                        model.conditioning_input(sc[0]) if sc is not None else None)
    return checks + [compare(f"{name} decoder logits", logits[None], t[f"{name}.logits"])]
