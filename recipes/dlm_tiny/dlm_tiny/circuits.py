"""A copy (induction) circuit written into dlm-tiny's first two layers before training starts.

Why: nearly every scored task copies an unseen name or value from the prompt, and copying at a
variable offset needs an induction circuit: one head writes "my left neighbour is X" at every
position, a later head at position p finds the earlier position i whose left neighbour is p's own
token and copies token i (Dream reads the prediction for p + 1 from position p). From random
weights neither head helps until the other exists, and next-token runs of this shape measured the
plateau: at chance for 600-1400 steps on 2 cores, longer than a CPU training run (findings.md). Here both heads
start built, and :func:`freeze_copy_circuit` keeps them as built while the rest trains around them.

Layout (hidden size D, head size hd; C = ``code_dims``, C2 = ``prev_dims``; class :class:`Layout`):
- residual dims ``[0, C)`` of every embedding but the mask's hold random signs: the token's *code*.
  RMSNorm makes them +-1, so codes of equal tokens score C and others score ~N(0, C).
- residual dims ``[D - C, D)`` (``P``) and below them ``[D - C - C2, D - C)`` (``P2``) are reserved:
  embeddings and layer 0's other writers are zero there. Layer 0's query head 0 writes its left
  neighbour's code into ``P``, query head 1 the first C2 dims of the code two to the left into
  ``P2``. Dim ``D - C - C2 - 1`` is the mask flag: nonzero on the mask token's embedding only.
- layer 0, kv head 0: keys are positions only (q/k biases under RoPE, as in
  :func:`neighbour_bias`); values are codes.
- layer 1, query head 0 (kv head 0): query = [own code, ``P``], key = [``P``, ``P2``], a bigram
  match: a key whose two left neighbours are the query's token and the one before it scores
  ``match``, one whose left neighbour alone matches scores half. Spaces and digits are tokens of
  their own here, so a one-token match after them finds hundreds of candidates; the bigram finds
  the one. All on the slowest rotary pairs, so the match barely depends on distance (at
  dlm-tiny's theta 1e6 the fastest code pair turns 0.03 rad over 100 tokens, the fastest bigram
  pair 0.9, so the bigram part fades beyond ~200 tokens); keys on masked tokens lose to the flag;
  the value is a 64-dim projection of the token, written back so the tied unembedding scores the
  copied token.
"""

from __future__ import annotations

import math

import torch

from dlm_backend.engine.models.dream import DreamModel
from dlm_backend.errors import DLMError


def neighbour_bias(head_dim: int, theta: float, pairs: int = 8, sharpness: float = 8.0,
                   offsets: tuple[int, ...] = (1, -1)) -> tuple[torch.Tensor, ...]:
    """q biases (one per offset d: attend to m - d) and the k bias that make attention a function of m - n.

    With k = a and q = a e^{-i d theta_j} on the ``pairs`` fastest rotary pairs, RoPE makes the score
    of key n for query m equal to a^2 sum_j cos((m - n - d) theta_j): largest at n = m - d and
    ``sharpness`` logits (after the 1/sqrt(hd) scale) above its neighbours. The default offsets
    give (previous, next, k).
    """
    freqs = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64)[:pairs] / head_dim)   # [pairs]
    margin = float(pairs - torch.cos(freqs).sum())      # the peak over the best other offset (d +- 1)
    a = math.sqrt(sharpness * math.sqrt(head_dim) / margin)
    k = torch.zeros(head_dim, dtype=torch.float64)
    k[:pairs] = a
    qs = []
    for d in offsets:
        q = torch.zeros(head_dim, dtype=torch.float64)
        q[:pairs] = a * torch.cos(d * freqs)
        q[head_dim // 2:head_dim // 2 + pairs] = -a * torch.sin(d * freqs)
        qs.append(q.float())
    return (*qs, k.float())


class Layout:
    """Where the circuit lives: residual dims, and the layer-1 copy head's dims on the slowest pairs."""

    def __init__(self, model: DreamModel, code_dims: int, prev_dims: int):
        layers = model.model.layers
        if len(layers) < 2:
            raise DLMError(f"the copy circuit needs 2 layers, the model has {len(layers)}: "
                           "train with --num-layers 2 or more, or --no-copy-circuit")
        self.D, self.hd = model.model.embed_tokens.weight.shape[1], layers[0].self_attn.head_dim
        # Both parts shrink together to fit: the copy head needs room for the flag pair, the
        # residual needs hd free dims beside the code, P, P2 and the flag for the head's read.
        room = min(self.hd - 2, self.D - self.hd - 1)
        scale = min(1.0, room / (code_dims + prev_dims))
        C, C2 = int(code_dims * scale) // 2 * 2, int(prev_dims * scale) // 2 * 2
        self.C, self.C2 = C, C2

    @property
    def P(self) -> slice:
        """The left neighbour's code, written by layer 0 head 0."""
        return slice(self.D - self.C, self.D)

    @property
    def P2(self) -> slice:
        """The first ``C2`` dims of the code two to the left, written by layer 0 head 1."""
        return slice(self.D - self.C - self.C2, self.D - self.C)

    @property
    def flag(self) -> int:
        """The mask flag dim, just below P2."""
        return self.D - self.C - self.C2 - 1

    @property
    def head_pairs(self) -> tuple[list[int], list[int], int]:
        """Copy-head dims, slowest pair first: (own code / P, own P / P2, the flag's dim).

        The flag takes the slowest pair: its penalty must not turn with distance, or a masked key
        200 tokens away would gain from it. The own code comes next (the match must hold at any
        distance), then the bigram part, which may fade a little with distance.
        """
        half = self.hd // 2
        code_pairs = range(half - 1 - self.C // 2, half - 1)
        prev_pairs = range(half - 1 - self.C // 2 - self.C2 // 2, half - 1 - self.C // 2)
        dims = lambda pairs: [*pairs, *(j + half for j in pairs)]       # noqa: E731
        return dims(code_pairs), dims(prev_pairs), half - 1


def build_copy_circuit(model: DreamModel, theta: float, seed: int, mask_id: int, code_dims: int = 24,
                       prev_dims: int = 16, match: float = 100.0, copy_gain: float = 3.0,
                       code_scale: float = 0.5) -> None:
    """Write the induction circuit described in the module docstring into ``model`` (in place).

    ``code_dims`` and ``prev_dims`` shrink in proportion where the shapes have no room for them
    (:class:`Layout`). ``prev_dims`` > 0 makes the match a bigram one: key i
    also scores when the code two to its left equals the query's left neighbour (first
    ``prev_dims`` dims), so after a space or a digit, tokens that precede hundreds of prompt
    positions, the head still finds the one continuation. ``match`` is the attention logit of a
    key that matches in full; ``copy_gain`` is the copied token's size in the stream relative to
    the position's own token, which the tied unembedding would otherwise repeat.

    ``code_scale`` is the size of a code entry (and of a ``P`` entry), 25x the embeddings' 0.02:
    RMSNorm divides the whole stream by its rms, so codes at embedding scale shrink as the rest of
    the stream grows in training. In run c2 the other embedding entries grew from 0.02
    to 0.05 in 250 steps, the normed codes fell to 0.3 and 0.14 of their design and the match logit
    from 30 to ~1.3: the frozen head no longer found anything. Codes that dominate the rms barely
    move with it, but not enough: by step 250 of run c3 the layer-0 branches had grown the rest of
    the stream so that the normed codes were at 0.6 of their design, the match logit at 0.35 of it
    and the head's weight on the copy source at 0.35. Hence ``match`` 100, not 30: a true match
    scores 100 against ~N(0, 20) for other keys, and stays ahead at a third of that.
    """
    lay = Layout(model, code_dims, prev_dims)
    D, hd, C, C2, F = lay.D, lay.hd, lay.C, lay.C2, lay.flag
    gen = torch.Generator().manual_seed(seed + 7919)
    emb = model.model.embed_tokens.weight                    # [V, D]
    layer0, layer1 = model.model.layers[0], model.model.layers[1]
    std = float(emb.detach().std())
    with torch.no_grad():
        # Every residual branch starts at zero (as modded-nanogpt does for its output projections),
        # so at initialisation the stream is exactly embedding + neighbour codes + copied token: the
        # random branches' outputs (rms ~0.07 against the embeddings' 0.02) would bury the codes.
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        emb[:, :C] = torch.randint(0, 2, (emb.shape[0], C), generator=gen).float().mul_(2).sub_(1) * code_scale
        emb[:, F:] = 0
        # The mask has no code: a query whose left neighbour is masked then matches on its own
        # code alone, not on "two to my left is masked", which every key just after a masked
        # stretch would share (bigram copy accuracy 0.33 against 0.48 without the bigram part,
        # with every other copied token masked, when the mask had a code).
        emb[mask_id, :C] = 0
        emb[mask_id, F] = code_scale
        rest = (F - C) * std ** 2
        rms0 = math.sqrt((C * code_scale ** 2 + rest) / D)              # of an embedding: layer 0's norm
        rms1 = math.sqrt(((2 * C + C2) * code_scale ** 2 + rest) / D)   # of layer 1's input: code + P + P2

        # Layer 0: kv head 0 is positional; query head 0 looks back one, head 1 two (or forward one
        # without the bigram part); values are codes.
        att = layer0.self_attn
        prev_q, second_q, k = neighbour_bias(hd, theta, offsets=(1, 2 if C2 else -1))
        att.q_proj.weight[:2 * hd] = 0
        att.q_proj.bias[:hd], att.q_proj.bias[hd:2 * hd] = prev_q, second_q
        att.k_proj.weight[:hd] = 0
        att.k_proj.bias[:hd] = k
        att.v_proj.weight[:hd] = 0
        att.v_proj.bias[:hd] = 0
        att.v_proj.weight[:C, :C] = torch.eye(C)
        att.o_proj.weight[lay.P, :C] = torch.eye(C) * rms0              # the neighbour's code, +-code_scale
        att.o_proj.weight[lay.P2, hd:hd + C2] = torch.eye(C2) * rms0    # and the one before it

        # Layer 1, query head 0: [own code, P] against the key's [P, P2]; copy the token.
        att = layer1.self_attn
        beta = math.sqrt(match * math.sqrt(hd) / (C + C2)) * rms1 / code_scale    # normed codes: code_scale/rms1
        att.q_proj.weight[:hd] = 0
        att.q_proj.bias[:hd] = 0
        att.k_proj.weight[:hd] = 0
        att.k_proj.bias[:hd] = 0
        code_dims_, prev_dims_, flag = lay.head_pairs
        for i, d in enumerate(code_dims_):
            att.q_proj.weight[d, i] = beta
            att.k_proj.weight[d, D - C + i] = beta
        for i, d in enumerate(prev_dims_):
            att.q_proj.weight[d, D - C + i] = beta
            att.k_proj.weight[d, D - C - C2 + i] = beta
        # Position p + 1 always matches (its neighbours are p's), and in diffusion training it is
        # usually masked: copying it copies the mask, and being nearest it out-scores the real
        # source once RoPE has turned the match pairs a little. A key on a masked token loses
        # 2 * match: a constant query bias against the mask flag.
        gamma = math.sqrt(2 * match * math.sqrt(hd) / (code_scale / rms1))
        att.q_proj.bias[flag] = -gamma
        att.k_proj.weight[flag, F] = gamma
        # Read and write back the code and hd - C random directions of the rest of the token.
        read = torch.zeros(hd, D)                                               # [hd, D], orthonormal rows
        read[:C, :C] = torch.eye(C)
        read[C:, C:F] = torch.linalg.qr(torch.randn(F - C, hd - C, generator=gen))[0].T
        att.v_proj.weight[:hd] = read
        att.v_proj.bias[:hd] = 0
        att.o_proj.weight[:, :hd] = read.T * (copy_gain * rms1)          # the copied token, copy_gain x its own


def circuit_parts(model: DreamModel, code_dims: int = 24, prev_dims: int = 16) -> dict[str, torch.Tensor]:
    """Parameter name -> boolean mask of the entries that make up the circuit.

    Besides the heads' own weights this covers every writer into the code dims, ``P`` and ``P2``
    before layer 1 reads them (layer 0's output projection and MLP rows there, zero from
    initialisation), and the two input norms' weights on them, so nothing else can blur the match.
    """
    lay = Layout(model, code_dims, prev_dims)
    hd, C = lay.hd, lay.C
    params = dict(model.named_parameters())
    parts = {name: torch.zeros_like(p, dtype=torch.bool) for name, p in params.items()}
    code, P = slice(0, C), slice(lay.flag, lay.D)           # P with P2 and the mask flag below it
    parts["model.embed_tokens.weight"][:, code] = True
    parts["model.embed_tokens.weight"][:, P] = True
    for layer, heads in ((0, slice(0, 2 * hd if lay.C2 else hd)), (1, slice(0, hd))):
        pre = f"model.layers.{layer}."
        parts[pre + "self_attn.q_proj.weight"][heads] = True
        parts[pre + "self_attn.q_proj.bias"][heads] = True
        parts[pre + "self_attn.k_proj.weight"][:hd] = True
        parts[pre + "self_attn.k_proj.bias"][:hd] = True
        parts[pre + "input_layernorm.weight"][code] = True
        parts[pre + "input_layernorm.weight"][P] = True
    pre = "model.layers.0."
    parts[pre + "self_attn.v_proj.weight"][code] = True
    parts[pre + "self_attn.v_proj.bias"][code] = True
    for name in ("self_attn.o_proj.weight", "mlp.down_proj.weight"):
        parts[pre + name][code] = True
        parts[pre + name][P] = True
    pre = "model.layers.1."
    parts[pre + "self_attn.v_proj.weight"][:hd] = True
    parts[pre + "self_attn.v_proj.bias"][:hd] = True
    parts[pre + "self_attn.o_proj.weight"][:, :hd] = True
    return {name: mask for name, mask in parts.items() if mask.any()}


def freeze_copy_circuit(model: DreamModel, code_dims: int = 24, prev_dims: int = 16) -> list:
    """Zero the gradient of the circuit's entries for the rest of training; returns the hook handles.

    Why: run c1 trained the built circuit for 1500 steps and lost it. The codes are
    +-0.02 embedding entries and Adam moves every entry by ~lr (2e-3) a step, so within ~100 steps
    the codes the layer-1 query reads had drifted from those layer 0 wrote, and the head's weight on
    the copy source fell from 1.0 to 0.03. With zero gradients Adam leaves those entries alone
    (AdamW's decay shrinks them by ~3% over a run); the rest of the model learns to use them.
    """
    return freeze_parts(model, circuit_parts(model, code_dims, prev_dims))


def freeze_parts(model: torch.nn.Module, parts: dict[str, torch.Tensor]) -> list:
    """Zero the gradient of the masked entries of each named parameter; returns the hook handles."""
    params = dict(model.named_parameters())
    return [params[name].register_hook(lambda g, keep=~mask: g * keep) for name, mask in parts.items()]
