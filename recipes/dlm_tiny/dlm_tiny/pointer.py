"""A pointer head: a deep attention head that copies a token from wherever it learns to look.

Why: the bigram copy head (circuits.py) finds a source by matching the two tokens left of it, so
it cannot start a copy whose left context differs from the prompt's. The first piece of a JSON
value follows ``"`` (``"date": "November 9"`` from "on November 9"), the first piece of a tool
argument follows ``"`` too, and a QA answer follows the reply header. Those pieces came out guessed
in dlm-tiny b1's held-out outputs: a month for the month (November -> January), a name piece
("Riomvil" -> "Reathvil"), an hour ("7:00 pm" -> "1:00 pm"); they make up nearly all of its JSON
and tool-call misses. Choosing the source is a question of meaning (the value that belongs under
this key), which a deep layer can learn; copying a token's identity through a 64-dim head is what
a model of this size does not learn in a CPU run. So the head's value and output paths are built
and frozen to copy the token, and its query and key stay trainable: training only has to teach it
where to look, with a gradient that rewards exactly that.

Layout (see circuits.Layout): layer 0 writes every position's left neighbour's code into the
reserved dims ``P``. Here every writer into ``P`` in layers 1 to L - 1 is zeroed and frozen, so
at layer L's input ``P`` still holds exactly that code; the pointer head (the last query head of
layer L, on the last kv head) reads ``P`` of the key it attends to and writes it into the code
dims, which the tied unembedding scores. Attending to position j + 1 thus predicts token j.
Its kv head's other value dims stay trainable for the query head that shares it.
"""

from __future__ import annotations

import torch

from dlm_backend.engine.models.dream import DreamModel
from dlm_backend.errors import DLMError
from dlm_tiny.circuits import Layout
from dlm_tiny.row_attention import rows


def _heads(model: DreamModel, layer: int) -> tuple[int, int]:
    """(first q dim of the pointer head, first kv dim of its kv head)."""
    layers = model.model.layers
    if not 2 <= layer < len(layers):
        raise DLMError(f"the pointer head needs a layer from 2 to {len(layers) - 1}, got {layer}: "
                       "pass --pointer-layer in that range, or 0 for none")
    att = layers[layer].self_attn
    hd = att.head_dim
    heads, kv_heads = att.q_proj.weight.shape[0] // hd, att.k_proj.weight.shape[0] // hd
    return (heads - 1) * hd, (kv_heads - 1) * hd


def _normed_source_size(model: DreamModel, layer: int, P: slice, seed: int) -> float:
    """rms of ``P`` in layer ``layer``'s normed input on random tokens: what the head's value reads."""
    block, seen = model.model.layers[layer], {}
    # The attention's first argument is the input norm's output. A hook on the norm itself sees
    # nothing: the layer calls its fused ``add_forward``, not ``forward``.
    hook = block.self_attn.register_forward_pre_hook(lambda mod, args: seen.__setitem__("a", args[0]))
    ids = torch.randint(0, model.model.embed_tokens.weight.shape[0], (64,), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad(), rows(1, 64, torch.ones(1, 64, 64, dtype=torch.bool)):
        model(ids, torch.arange(64))
    hook.remove()
    return float(seen["a"][:, P].pow(2).mean().sqrt())        # [64, D]: the torch norm's output (CPU)


def build_pointer_head(model: DreamModel, layer: int, code_dims: int = 24, prev_dims: int = 16,
                       copy_gain: float = 3.0, code_scale: float = 0.5, strength: float = 1.5, seed: int = 0) -> None:
    """Write the pointer head of the module docstring into ``model`` (after build_copy_circuit).

    The copied code enters the code dims ``strength`` times as large as the layer-1 copy head's
    (``copy_gain`` times a token's own code), measured on the stream at initialisation. At 1.0, on
    random tokens where the copy head copies noise, a pointer set by hand to one position wins
    80% of positions, at 1.5 all of them (tests/test_pointer.py). Layer L's input norm weights on
    ``P`` stay trainable, so training can rescale it as the stream grows.
    """
    lay = Layout(model, code_dims, prev_dims)
    q0, kv0 = _heads(model, layer)
    C, hd = lay.C, lay.hd
    with torch.no_grad():
        for i in range(1, layer):
            block = model.model.layers[i]
            block.self_attn.o_proj.weight[lay.P] = 0
            block.mlp.down_proj.weight[lay.P] = 0
        att = model.model.layers[layer].self_attn
        att.v_proj.weight[kv0:kv0 + C] = 0
        att.v_proj.weight[kv0:kv0 + C, lay.P] = torch.eye(C)
        att.v_proj.bias[kv0:kv0 + C] = 0
        att.o_proj.weight[:, q0:q0 + hd] = 0
        gain = strength * copy_gain * code_scale / _normed_source_size(model, layer, lay.P, seed)
        att.o_proj.weight[:C, q0:q0 + C] = torch.eye(C) * gain


def pointer_parts(model: DreamModel, layer: int, code_dims: int = 24, prev_dims: int = 16) -> dict[str, torch.Tensor]:
    """Parameter name -> boolean mask of the pointer head's frozen entries (module docstring)."""
    lay = Layout(model, code_dims, prev_dims)
    q0, kv0 = _heads(model, layer)
    params = dict(model.named_parameters())
    parts: dict[str, torch.Tensor] = {}

    def mark(name: str, index) -> None:
        mask = parts.setdefault(name, torch.zeros_like(params[name], dtype=torch.bool))
        mask[index] = True

    for i in range(1, layer):
        mark(f"model.layers.{i}.self_attn.o_proj.weight", lay.P)
        mark(f"model.layers.{i}.mlp.down_proj.weight", lay.P)
    pre = f"model.layers.{layer}.self_attn."
    mark(pre + "v_proj.weight", slice(kv0, kv0 + lay.C))
    mark(pre + "v_proj.bias", slice(kv0, kv0 + lay.C))
    mark(pre + "o_proj.weight", (slice(None), slice(q0, q0 + lay.hd)))
    return parts
