"""The block layout (``--block-size``): each example's noisy copy computes what a Fast-dLLM v2 denoise
pass computes, its clean copy what a cache pass computes, and a run converts a Dream checkpoint into
one the engine serves block by block."""

import json
import re
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from dlm_backend import LLM
from dlm_backend.engine.models.dream import DreamModel
from dlm_backend.errors import DLMError
from dlm_tiny.block_layout import lay_out
from dlm_tiny.objective import PackedBatches, diffusion_loss, sample_mask
from dlm_tiny.row_attention import rows
from dlm_tiny.train import init_weights, train
from test_objective import _packed_pairs
from test_train import TINY

BLOCK = 4
BLOCK_RUN = replace(TINY, block_size=BLOCK, prompt_mask_prob=0.0, ar_until=0.0, max_extra_pad=BLOCK)


def _block_causal(n: int) -> torch.Tensor:
    """[1, n, n]: position i sees its own block and every earlier one, written out the slow way."""
    return torch.tensor([[j // BLOCK <= i // BLOCK for j in range(n)] for i in range(n)])[None]


def test_an_example_is_its_tokens_then_a_copy_of_its_reply_blocks():
    ids, pos, noisy = lay_out(list(range(10, 21)), prompt_len=6, block_size=BLOCK)       # 11 tokens
    assert ids == list(range(10, 21)) + list(range(14, 21))           # the copy starts at block 1 (4..10)
    assert pos == list(range(11)) + list(range(4, 11))
    assert noisy == [False] * 11 + [True] * 7
    assert lay_out([1, 2, 3], 2, 0) == ([1, 2, 3], [0, 1, 2], [False] * 3)               # the Dream layout


def test_a_block_row_computes_the_engines_cache_and_denoise_passes(tmp_path):
    pairs, config = _packed_pairs(tmp_path, n=60, hidden_size=64, num_layers=2)
    batches = PackedBatches(pairs, 0, 512, 2, BLOCK, config["eos_token_id"], block_size=BLOCK)
    batch = batches(0)
    masked, _, _ = sample_mask(batch, torch.Generator().manual_seed(0), t_min=0.5, prompt_mask_prob=0.0)
    inputs = torch.where(masked, config["mask_token_id"], batch.ids)
    model = DreamModel.from_config(config)
    init_weights(model, 0)
    model.setup("cpu")
    with torch.no_grad(), rows(2, 512, batch.attend):
        packed = model(inputs.reshape(-1), batch.pos.reshape(-1)).view(2, 512, -1)
    for e in range(int(batch.ex.max()) + 1):
        r, cols = (batch.ex == e).nonzero(as_tuple=True)
        clean, copy = ~batch.noisy[r, cols], batch.noisy[r, cols]
        tokens, P = batch.ids[r, cols][clean], int(batch.prompt_len[e])
        assert not masked[r, cols][clean].any() and not masked[r, cols][copy][batch.pos[r, cols][copy] % BLOCK == 0].any()
        n = len(tokens)
        with torch.no_grad(), rows(1, n, _block_causal(n)):           # a cache pass over the clean example
            cached = model(tokens, torch.arange(n))
        torch.testing.assert_close(packed[r, cols][clean], cached, atol=1e-4, rtol=1e-4)
        for start in range(P // BLOCK * BLOCK, n, BLOCK):              # a denoise pass per reply block
            end = min(start + BLOCK, n)
            at = copy & (batch.pos[r, cols] >= start) & (batch.pos[r, cols] < end)
            seq = torch.cat([tokens[:start], inputs[r, cols][at]])
            with torch.no_grad(), rows(1, end, _block_causal(end)):
                denoised = model(seq, torch.arange(end))[start:]
            torch.testing.assert_close(packed[r, cols][at], denoised, atol=1e-4, rtol=1e-4)


def test_the_block_loss_is_what_explicit_cache_and_denoise_passes_give(tmp_path):
    """Hand-made examples, one prompt ending on a block boundary (4) and one inside a block (6): the
    loss read from the packed row equals the loss recomputed pass by pass, as the engine runs them."""
    _, config = _packed_pairs(tmp_path, n=20, hidden_size=64, num_layers=2)
    mask_id, pad_weight = config["mask_token_id"], 0.05
    pairs = [([5, 6, 7, 8], [9, 10, 11, 12, 13]), ([5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16, 17])] * 10
    batch = PackedBatches(pairs, 0, 96, 1, 3, config["eos_token_id"], block_size=BLOCK)(0)
    model = DreamModel.from_config(config)
    init_weights(model, 0)
    model.setup("cpu")
    masked, t, _ = sample_mask(batch, torch.Generator().manual_seed(5), 0.2, 0.0)
    loss = diffusion_loss(model, batch, mask_id, torch.Generator().manual_seed(5), 0.2, 0.0, pad_weight)
    assert masked.any()
    inputs = torch.where(masked, mask_id, batch.ids)
    per_example, prompts = [], set()
    with torch.no_grad():
        for e in range(int(batch.ex.max()) + 1):
            mine = batch.ex[0] == e
            clean = batch.ids[0][mine & ~batch.noisy[0]]
            P, R, n = int(batch.prompt_len[e]), int(batch.reply_len[e]), len(clean)
            prompts.add(P)
            assert n % BLOCK == 0 and clean[P + R:].eq(config["eos_token_id"]).all()   # EOS to the block's end
            copy_pos, copy_in = batch.pos[0][mine & batch.noisy[0]], inputs[0][mine & batch.noisy[0]]
            copy_masked = masked[0][mine & batch.noisy[0]]
            total = torch.zeros(())
            for start in range(P // BLOCK * BLOCK, n, BLOCK):
                end = min(start + BLOCK, n)
                weight = lambda p: 1.0 if p < P + R else pad_weight        # noqa: E731
                if start >= P and start >= 1:                              # the cache pass's first token
                    with rows(1, start, _block_causal(start)):
                        h = model(clean[:start], torch.arange(start))
                    ce = F.cross_entropy(model.compute_logits(h[start - 1:start]), clean[start:start + 1])
                    total += ce.sum() * weight(start)
                at = (copy_pos >= start) & (copy_pos < end)                # a denoise pass over the block
                with rows(1, end, _block_causal(end)):
                    h = model(torch.cat([clean[:start], copy_in[at]]), torch.arange(end))
                for p in copy_pos[at & copy_masked].tolist():
                    ce = F.cross_entropy(model.compute_logits(h[p - 1:p]), clean[p:p + 1])
                    total += ce.sum() * weight(p) / t[e]
            per_example.append(total / R)
    assert prompts == {4, 6}
    torch.testing.assert_close(loss.detach(), torch.stack(per_example).mean(), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="ar_prob must be 0"):
        diffusion_loss(model, batch, mask_id, torch.Generator().manual_seed(5), 0.2, 0.0, pad_weight, ar_prob=0.5)


def test_the_block_loss_is_the_same_through_length_buckets_and_row_masks(tmp_path):
    pairs, config = _packed_pairs(tmp_path, n=80, hidden_size=64, num_layers=2)
    batch = PackedBatches(pairs, 0, 512, 3, BLOCK, config["eos_token_id"], block_size=BLOCK)(0)
    model = DreamModel.from_config(config)
    init_weights(model, 0)
    model.setup("cpu")
    losses = [diffusion_loss(model, batch, config["mask_token_id"], torch.Generator().manual_seed(3), 0.2, 0.0,
                             0.05, per_example=per_example) for per_example in (True, False)]
    torch.testing.assert_close(losses[0], losses[1], atol=1e-5, rtol=1e-5)
    assert 0 < losses[0].item() < 20


def test_block_flags_that_cannot_make_a_run_are_refused(tmp_path):
    with pytest.raises(DLMError, match=re.escape("pass --prompt-mask-prob 0 --ar-until 0")):
        train(replace(TINY, out_dir=str(tmp_path / "x"), block_size=BLOCK))
    with pytest.raises(DLMError, match=re.escape("--block-size -1: give 0 (the Dream layout)")):
        train(replace(BLOCK_RUN, out_dir=str(tmp_path / "x"), block_size=-1))
    assert not (tmp_path / "x").exists()


def test_a_dream_checkpoint_converts_to_a_block_checkpoint_the_engine_serves(tmp_path):
    dream = train(replace(TINY, out_dir=str(tmp_path / "dream"), steps=2))
    block = train(replace(BLOCK_RUN, out_dir=str(tmp_path / "block"), init_from=str(dream), steps=0))
    assert all(torch.equal(a, b) for a, b in zip(load_file(str(dream / "model.safetensors")).values(),
                                                 load_file(str(block / "model.safetensors")).values()))
    config = json.loads((block / "config.json").read_text())
    assert config["architectures"] == ["Fast_dLLM_QwenForCausalLM"] and config["bd_size"] == BLOCK
    trained = train(replace(BLOCK_RUN, out_dir=str(tmp_path / "trained"), init_from=str(dream), steps=2))
    with LLM(str(trained)) as llm:
        assert llm.engine.model_args.block_size == BLOCK
        own = llm.sampling_params(max_tokens=8)
        assert own.sampler == "fastdllm2"
        out = llm.chat([{"role": "user", "content": "Hi!"}], own)
        assert out.num_forward_passes >= 1 and isinstance(out.text, str)
