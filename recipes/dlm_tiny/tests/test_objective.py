"""Packed batches, masks and the masked-diffusion loss: each example computed as if alone."""

import json
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from dlm_backend.engine.models.dream import DreamModel
from dlm_backend.engine.checkpoint.tokenizer import Tokenizer as ChatTokenizer
from dlm_backend.errors import DLMError
from dlm_tiny import corpus
from dlm_tiny.checkpoint import build_tokenizer, model_config, write_checkpoint_files
from dlm_tiny.objective import PackedBatches, diffusion_loss, sample_mask
from dlm_tiny.row_attention import RowAttention, rows
from dlm_tiny.train import ar_share, encode_examples, init_weights
from test_train import TINY


def test_too_few_examples_for_one_step_is_an_error_not_a_hang():
    with pytest.raises(DLMError, match="do not fill one step of 4 rows"):
        PackedBatches([([1] * 50, [2] * 5)] * 3, 0, 512, 4, 40, 0)(0)


def test_log_eos_runs_reach_every_length_for_a_third_of_the_tokens():
    pairs = [([1] * 30, [2] * 5)] * 4000
    runs = {}
    for dist in ("uniform", "log"):
        batches = PackedBatches(pairs, seed=0, max_len=512, rows=4, max_extra_pad=256, eos=0, pad_dist=dist)
        runs[dist] = [extra for batch in batches._plan(0) for row in batch for _, extra in row]
    log, uniform = runs["log"], runs["uniform"]
    assert min(log) == 1 and max(log) == 256
    assert sum(r > 200 for r in log) / len(log) > 0.02                # long canvases still appear
    assert sum(log) / len(log) < 0.45 * sum(uniform) / len(uniform)   # at well under half the EOS tokens


def test_packed_batches_run_across_epochs_of_different_lengths():
    import random

    rng = random.Random(0)
    pairs = [([1] * rng.randint(5, 60), [2] * rng.randint(1, 20)) for _ in range(200)]
    batches = PackedBatches(pairs, seed=0, max_len=128, rows=2, max_extra_pad=40, eos=0)
    lengths = [len(batches._plan(e)) for e in range(4)]
    assert len(set(lengths)) > 1                     # the EOS runs change how many batches fit
    steps = sum(lengths)
    first = [batches(s).ids for s in range(steps)]   # every step of four epochs, none out of range
    assert all(torch.equal(a, batches(s).ids) for s, a in list(enumerate(first))[::7])


def _packed_pairs(folder, n=120, seed=3, **model):
    """A corpus slice encoded with its own small tokenizer, and the model config for it."""
    examples = corpus.generate(n, seed=seed)
    tok = build_tokenizer([e.target + json.dumps(e.messages) for e in examples], 512)
    config = model_config(replace(TINY, **model), tok)
    write_checkpoint_files(folder, config, tok)
    return encode_examples(examples, ChatTokenizer(folder), 512), config


def test_packed_rows_compute_each_example_as_if_alone(tmp_path):
    pairs, config = _packed_pairs(tmp_path, hidden_size=64, num_layers=2)
    batches = PackedBatches(pairs, seed=0, max_len=512, rows=3, max_extra_pad=8, eos=config["eos_token_id"])
    batch = batches(1)
    assert torch.equal(batches(1).ids, batch.ids)                            # a pure function of the step
    assert batch.ids.shape == (3, 512)
    assert (batch.ex >= 0).float().mean() > 0.7                              # little of a row unused
    model = DreamModel.from_config(config)
    init_weights(model, 0)
    model.setup("cpu")
    with torch.no_grad(), rows(3, 512, batch.attend):
        packed = model(batch.ids.reshape(-1), batch.pos.reshape(-1)).view(3, 512, -1)
    for e in range(int(batch.ex.max()) + 1):
        r, cols = (batch.ex == e).nonzero(as_tuple=True)
        ids = batch.ids[r, cols]
        assert batch.pos[r, cols].tolist() == list(range(len(ids)))          # positions restart
        assert ids[:batch.prompt_len[e]].tolist() == pairs[[p for p, _ in pairs].index(
            ids[:batch.prompt_len[e]].tolist())][0]
        with torch.no_grad(), rows(1, len(ids)):
            alone = model(ids, torch.arange(len(ids)))
        torch.testing.assert_close(packed[r, cols], alone, atol=1e-4, rtol=1e-4)


def test_a_row_computes_what_the_engine_serves(tmp_path):
    """Training attends through the recipe's RowAttention, serving through the engine's packed
    attention: on one unmasked row they agree, so the model trained is the model the engine runs."""
    from dlm_backend.engine.layers import ForwardContext, PackedAttention, Segment, forward_context

    pairs, config = _packed_pairs(tmp_path, n=20, hidden_size=64, num_layers=2)
    model = DreamModel.from_config(config)
    init_weights(model, 0)
    model.setup("cpu")
    ids = torch.tensor(pairs[0][0] + pairs[0][1])
    pos = torch.arange(len(ids))
    with torch.no_grad():
        with rows(1, len(ids)):
            trained = model(ids, pos)
        with forward_context(ForwardContext(PackedAttention([Segment(slice(0, len(ids)), 0)]))):
            served = model(ids, pos)
    torch.testing.assert_close(trained, served, atol=1e-6, rtol=1e-6)
    with pytest.raises(ValueError, match=r"mask must be \[B, L, L\] = \[2, 4, 4\]"):
        RowAttention(2, 4, torch.ones(2, 4, 5, dtype=torch.bool))


def test_mask_covers_replies_or_whole_examples_at_ratio_t(tmp_path):
    pairs, config = _packed_pairs(tmp_path, n=400)
    batch = PackedBatches(pairs, 0, 512, 16, 8, config["eos_token_id"])(0)
    masked, t, whole = sample_mask(batch, torch.Generator().manual_seed(0), t_min=0.3, prompt_mask_prob=0.25)
    assert t.min() >= 0.3 and t.max() <= 1 and 0 < whole.float().mean() < 0.6
    assert not masked[batch.ex < 0].any() and not masked[batch.pos == 0].any()
    in_prompt = batch.pos < batch.prompt_len[batch.ex.clamp_min(0)]
    prompt_masked = (masked & in_prompt & (batch.ex >= 0))
    hit = torch.zeros_like(whole).index_add_(0, batch.ex[prompt_masked], torch.ones_like(batch.ex[prompt_masked]).bool())
    assert not hit[~whole].any()                                             # SFT prompts stay clean
    eligible = (batch.ex >= 0) & (batch.pos >= torch.where(whole, 1, batch.prompt_len)[batch.ex.clamp_min(0)])
    ratio = torch.zeros_like(t).index_add_(0, batch.ex[masked], torch.ones_like(t)[batch.ex[masked]])
    ratio = ratio / torch.zeros_like(t).index_add_(0, batch.ex[eligible], torch.ones_like(t)[batch.ex[eligible]])
    assert abs(float((ratio - t).mean())) < 0.05                             # masked at ratio t


def test_length_buckets_give_the_row_masks_loss_and_gradients(tmp_path):
    pairs, config = _packed_pairs(tmp_path, n=80, hidden_size=64, num_layers=2)
    batch = PackedBatches(pairs, 0, 512, 3, 64, config["eos_token_id"], pad_dist="log")(0)
    model = DreamModel.from_config(config)
    init_weights(model, 0)
    model.setup("cpu")
    results = []
    for per_example in (True, False):       # half the examples causal: both masks in one batch
        loss = diffusion_loss(model, batch, config["mask_token_id"], torch.Generator().manual_seed(3), 0.2, 0.3,
                              0.05, ar_prob=0.5, per_example=per_example)
        results.append((loss, torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)))
    (loss, grads), (row_loss, row_grads) = results
    torch.testing.assert_close(loss, row_loss, atol=1e-5, rtol=1e-5)
    for g, w in zip(grads, row_grads):
        if w is not None:
            torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)


def test_autoregressive_examples_are_causal_next_token_prediction(tmp_path):
    pairs, config = _packed_pairs(tmp_path, n=60, hidden_size=64, num_layers=2)
    batch = PackedBatches(pairs, 0, 512, 2, 8, config["eos_token_id"])(0)
    model = DreamModel.from_config(config)
    init_weights(model, 0)
    model.setup("cpu")
    with torch.no_grad():
        loss = diffusion_loss(model, batch, config["mask_token_id"], torch.Generator(), 0.2, 0.5, 0.05, ar_prob=1.0)
        expected = []
        for e in range(len(batch.prompt_len)):
            r, cols = (batch.ex == e).nonzero(as_tuple=True)
            ids, n = batch.ids[r, cols], int(batch.prompt_len[e] + batch.reply_len[e])
            causal = torch.ones(len(ids), len(ids), dtype=torch.bool).tril()[None]
            with rows(1, len(ids), causal):
                hidden = model(ids, torch.arange(len(ids)))
            ce = F.cross_entropy(model.compute_logits(hidden[:-1]), ids[1:], reduction="none")
            weight = torch.where(torch.arange(1, len(ids)) < n, 1.0, 0.05)
            expected.append((ce * weight).sum() / (n - 1))
    torch.testing.assert_close(loss, torch.stack(expected).mean(), atol=1e-4, rtol=1e-4)
    cfg = replace(TINY, steps=100, ar_until=0.5)
    assert [ar_share(s, cfg) for s in (0, 25, 50, 99)] == [1.0, 0.5, 0.0, 0.0]
