"""The pointer head dlm-tiny starts from (dlm_tiny/pointer.py)."""

import pytest
import torch

from dlm_backend.errors import DLMError
from dlm_tiny.circuits import Layout, freeze_copy_circuit, freeze_parts, neighbour_bias
from dlm_tiny.pointer import build_pointer_head, pointer_parts
from dlm_tiny.row_attention import rows
from test_circuits import CONFIG, _model, train_a_few_steps

LAYER, L = 2, 60


def _pointing_model(pointer: bool, offset: int = 3):
    """A 3-layer circuit model whose layer-2 pointer head is set by hand to attend ``offset`` to the left."""
    model = _model(circuit=True)
    if pointer:
        build_pointer_head(model, LAYER)
    att = model.model.layers[LAYER].self_attn
    hd = att.head_dim
    q, k = neighbour_bias(hd, CONFIG["rope_theta"], offsets=(offset,), sharpness=16.0)
    with torch.no_grad():
        att.q_proj.weight[3 * hd:] = 0
        att.q_proj.bias[3 * hd:] = q
        att.k_proj.weight[hd:] = 0
        att.k_proj.bias[hd:] = k
    return model


def _run(model, ids: torch.Tensor, capture: dict | None = None) -> torch.Tensor:
    hooks = []
    if capture is not None:      # each layer's input stream
        for i, block in enumerate(model.model.layers):
            hooks.append(block.register_forward_pre_hook(                 # args: (output, residual stream)
                lambda mod, args, i=i: capture.__setitem__(i, args[0] if args[1] is None else args[0] + args[1])))
    # Causal: bidirectionally the bigram copy head matches position p + 1 in full and copies it.
    attend = torch.ones(1, len(ids), len(ids), dtype=torch.bool).tril()
    with rows(1, len(ids), attend):
        hidden = model(ids, torch.arange(len(ids)))                       # [L, D]
    for h in hooks:
        h.remove()
    return model.compute_logits(hidden)                                   # [L, V]


def test_the_built_pointer_copies_the_token_left_of_where_it_looks():
    # Attending to m - 3 reads P there: the code of token m - 4. Random tokens, so the bigram
    # copy head has nothing to copy and the pointer is the only source of the answer.
    ids = torch.randint(10, CONFIG["vocab_size"], (L,), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        hit = lambda model: (_run(model, ids)[8:].argmax(-1) == ids[4:-4]).float().mean().item()   # noqa: E731
        assert hit(_pointing_model(pointer=True)) > 0.9
        assert hit(_pointing_model(pointer=False)) < 0.2        # 0.08: the same head, not built


def test_training_keeps_the_pointer_and_its_source_dims_as_built():
    model = _pointing_model(pointer=True)
    freeze_copy_circuit(model)
    parts = pointer_parts(model, LAYER)
    freeze_parts(model, parts)
    losses = []
    for seed in range(3):
        ids = torch.randint(10, CONFIG["vocab_size"], (L,), generator=torch.Generator().manual_seed(seed))
        losses.append(lambda ids=ids: torch.nn.functional.cross_entropy(_run(model, ids)[:-1], ids[1:]))
    before, after = train_a_few_steps(model, parts, losses)
    assert not torch.equal(after[f"model.layers.{LAYER}.self_attn.q_proj.weight"],
                           before[f"model.layers.{LAYER}.self_attn.q_proj.weight"])     # where it looks trains
    # Layer 1 wrote nothing into P: the pointer's layer reads there exactly what layer 0 wrote.
    streams = {}
    with torch.no_grad():
        _run(model, torch.randint(10, CONFIG["vocab_size"], (L,)), streams)
    P = Layout(model, 24, 16).P
    assert torch.equal(streams[LAYER][..., P], streams[1][..., P])


@pytest.mark.parametrize("layer", [1, 3])
def test_a_pointer_layer_out_of_range_is_a_clear_error(layer):
    with pytest.raises(DLMError, match="--pointer-layer"):
        build_pointer_head(_model(circuit=True), layer)
