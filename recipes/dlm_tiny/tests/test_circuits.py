"""The copy circuit dlm-tiny starts from (dlm_tiny/circuits.py)."""

import pytest
import torch

from dlm_backend.engine.layers.rotary import RotaryTable, apply_rotary
from dlm_backend.engine.models.dream import DreamModel
from dlm_backend.errors import DLMError
from dlm_tiny.checks import bf16_is_native
from dlm_tiny.circuits import build_copy_circuit, circuit_parts, freeze_copy_circuit
from dlm_tiny.row_attention import rows
from dlm_tiny.train import init_weights

# dlm-tiny's attention shape (head_dim 64: the match uses the slowest rotary pairs); a smaller vocabulary.
CONFIG = {"architectures": ["DreamModel"], "model_type": "Dream", "hidden_act": "silu", "hidden_size": 256,
          "intermediate_size": 256, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
          "vocab_size": 1024, "max_position_embeddings": 512, "rope_theta": 1e6, "rms_norm_eps": 1e-6,
          "tie_word_embeddings": True, "mask_token_id": 3, "eos_token_id": 0, "pad_token_id": 0,
          "torch_dtype": "float32"}


def _model(circuit: bool, prev_dims: int = 16, **config) -> DreamModel:
    model = DreamModel.from_config({**CONFIG, **config})
    init_weights(model, 0)
    if circuit:
        build_copy_circuit(model, CONFIG["rope_theta"], seed=0, mask_id=CONFIG["mask_token_id"], prev_dims=prev_dims)
    model.setup("cpu")
    return model


def _repeat_spans(ids: torch.Tensor, gen: torch.Generator, n: int = 12, skip: int = 1) -> tuple[torch.Tensor, list[int]]:
    """Copy ``n``-token spans from random offsets of the first half over the second half; returns
    the ids and the positions that can be predicted by copying (every span token after the first ``skip``)."""
    L, targets = len(ids), []
    for dst in range(L // 2, L - n + 1, n):
        src = int(torch.randint(0, L // 2 - n, (), generator=gen))
        ids[dst:dst + n] = ids[src:src + n]
        targets += range(dst + skip, dst + n)
    return ids, targets


def _induction(seed: int, L: int = 160) -> tuple[torch.Tensor, list[int]]:
    """Random tokens with repeated spans: a one-token match is unique."""
    gen = torch.Generator().manual_seed(seed)
    return _repeat_spans(torch.randint(10, CONFIG["vocab_size"], (L,), generator=gen), gen)


SPACE, DIGITS = 5, range(10, 20)


def _text(seed: int, L: int = 400) -> tuple[torch.Tensor, list[int]]:
    """Words of 1-3 pieces and numbers of 1-4 single digits, each followed by a space token, as
    dlm-tiny's tokenizer writes text: after a space or a digit a one-token match is ambiguous."""
    gen = torch.Generator().manual_seed(seed)
    ids = []
    while len(ids) < L:
        if torch.rand((), generator=gen) < 0.3:
            ids += torch.randint(DIGITS.start, DIGITS.stop, (int(torch.randint(1, 5, (), generator=gen)),), generator=gen).tolist()
        else:
            ids += torch.randint(30, CONFIG["vocab_size"], (int(torch.randint(1, 4, (), generator=gen)),), generator=gen).tolist()
        ids.append(SPACE)
    return _repeat_spans(torch.tensor(ids[:L]), gen, skip=2)     # the bigram needs two span tokens


def _copy_accuracy(model: DreamModel, bidirectional: bool, masked: bool = False, data=_induction) -> float:
    """The share of copyable tokens the model predicts from the token before them.

    ``masked``: every other copyable token is replaced by the mask and scored, as in diffusion
    training (the token before each stays visible, which is what the copy keys on).
    """
    ids, targets = data(seed=1)
    L = len(ids)
    if masked:
        targets = targets[1::2]
        ids = ids.clone()
        truth = ids[targets].clone()
        ids[targets] = CONFIG["mask_token_id"]
    attend = torch.ones(L, L, dtype=torch.bool)
    if not bidirectional:
        attend = attend.tril()
    with torch.no_grad(), rows(1, L, attend[None]):
        hidden = model(ids, torch.arange(L))                                        # [L, D]
        pred = model.compute_logits(hidden[torch.tensor(targets) - 1]).argmax(-1)   # shift 1: i-1 predicts i
    return (pred == (truth if masked else ids[targets])).float().mean().item()


@pytest.mark.parametrize("bidirectional,masked", [(False, False), (True, False), (True, True)])
def test_the_built_circuit_copies_before_any_training(bidirectional, masked):
    # Bidirectional and masked is the diffusion case: the copied token is masked where it is
    # predicted, and the masked position after the query must not win the match.
    assert _copy_accuracy(_model(circuit=True), bidirectional, masked) > 0.9
    assert _copy_accuracy(_model(circuit=False), bidirectional, masked) < 0.05


@pytest.mark.skipif(not bf16_is_native(), reason="--precision bf16 needs AVX512-BF16 or AMX, which this CPU lacks (float32 training is tested)")
@pytest.mark.parametrize("data", [_induction, _text])
def test_the_circuit_copies_as_well_under_bf16_autocast(data):
    # --precision bf16 runs the frozen circuits' matches in bf16 (rotary included) while inference
    # runs float32: the copy they were built for must survive the rounding.
    model = _model(circuit=True)
    full = _copy_accuracy(model, bidirectional=True, masked=True, data=data)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        half = _copy_accuracy(model, bidirectional=True, masked=True, data=data)
    assert half > full - 0.03, (full, half)


def _layer0_attention(model: DreamModel, head: int, L: int) -> torch.Tensor:
    """Layer 0's attention weights of query ``head`` on random tokens: [L, L]."""
    att = model.model.layers[0].self_attn
    captured = {}
    att.register_forward_hook(lambda mod, args, out: captured.setdefault("x", args[0]))
    ids = torch.randint(10, 1000, (L,))
    with torch.no_grad(), rows(1, L, torch.ones(1, L, L, dtype=torch.bool)):
        model(ids, torch.arange(L))
    cos, sin = RotaryTable(att.head_dim, CONFIG["rope_theta"], L, "cpu").lookup(torch.arange(L))
    x = captured["x"]
    q = apply_rotary(att.q_proj(x).view(L, -1, att.head_dim), cos, sin, False)[:, head]   # [L, hd]
    kv_head = head * att.k_proj.out_features // att.q_proj.out_features
    k = apply_rotary(att.k_proj(x).view(L, -1, att.head_dim), cos, sin, False)[:, kv_head]
    return (q @ k.T / att.head_dim ** 0.5).softmax(-1)


def test_layer_zero_head_zero_attends_to_the_previous_token():
    weights = _layer0_attention(_model(circuit=True), head=0, L=40)
    assert (weights[1:].argmax(-1) == torch.arange(39)).all()
    assert weights[1:].max(-1).values.min() > 0.99


def test_the_bigram_match_copies_after_spaces_and_digits():
    # One-token induction picks any word after a space; the bigram part keys on the word before
    # the space too. Causal, so the key right after the query (which matches in full and holds the
    # answer) is out of sight. Measured at init: 0.46 one-token, 0.73 bigram.
    bigram, unigram = _model(circuit=True), _model(circuit=True, prev_dims=0)
    one, two = (_copy_accuracy(m, bidirectional=False, data=_text) for m in (unigram, bigram))
    assert one < 0.6 and two > one + 0.15, (one, two)
    # With the left neighbour masked the bigram part has nothing to match (the mask has no code)
    # and must not do worse than one token alone (0.44 and 0.53).
    one, two = (_copy_accuracy(m, bidirectional=True, masked=True, data=_text) for m in (unigram, bigram))
    assert two > one - 0.05, (one, two)


def test_layer_zero_head_one_attends_two_to_the_left():
    model = _model(circuit=True)
    weights = _layer0_attention(model, head=1, L=40)
    assert (weights[2:].argmax(-1) == torch.arange(38)).all()
    assert weights[2:].max(-1).values.min() > 0.99


def test_too_small_a_model_is_a_clear_error():
    with pytest.raises(DLMError, match="--no-copy-circuit"):
        _model(circuit=True, num_hidden_layers=1)


def train_a_few_steps(model, parts: dict, losses) -> tuple[dict, dict]:
    """AdamW at dlm train's peak rate, one step per loss closure; asserts the ``parts`` did not move.
    Returns the parameters (before, after)."""
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.0)
    for loss_of in losses:
        loss = loss_of()
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = dict(model.named_parameters())
    for name, mask in parts.items():
        assert torch.equal(after[name][mask], before[name][mask]), name
    return before, after


def _induction_loss(model, seed: int) -> torch.Tensor:
    ids, _ = _induction(seed)
    L = len(ids)
    with rows(1, L, torch.ones(1, L, L, dtype=torch.bool)):
        return torch.nn.functional.cross_entropy(model.compute_logits(model(ids, torch.arange(L))[:-1]), ids[1:])


def test_training_leaves_the_frozen_circuit_as_built():
    model = _model(circuit=True)
    freeze_copy_circuit(model)
    before, after = train_a_few_steps(model, circuit_parts(model),
                                      [lambda s=s: _induction_loss(model, s) for s in range(2, 5)])
    assert not torch.equal(after["model.embed_tokens.weight"], before["model.embed_tokens.weight"])
    assert _copy_accuracy(model, bidirectional=True) > 0.7       # 1.0 before; the free weights moved too
