"""DiffusionGemma over two gloo ranks: its sliding and full layers' heads split apart (the full
layers' single key/value head replicated), its experts partitioned, its embedding (the tied head and
the self-conditioning table) whole on every rank. Encoder and decoder logits equal one device's
within fp32 rounding.

Its seeded canvases are not compared token for token: on this random-weight fixture they already
change with the thread count of one device (1 against 2 threads) or a request's batch, because its
entropy-ordered acceptance over near-uniform distributions turns on the last bits of fp32 sums; a
rank split changes those bits the same way. A two-rank run must finish every request as one device
does."""

import pytest
import torch
from tests.helpers import FIXTURES

from dlm_backend import LLM
from dlm_backend.engine.forward.batch import ForwardBatch

DGEMMA = FIXTURES / "parity-block" / "diffusiongemma-tiny"
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32], [40, 41, 42]]


@pytest.fixture(scope="module")
def pair():
    solo = LLM(str(DGEMMA), device="cpu", dtype="float32")
    split = LLM(str(DGEMMA), device="cpu", dtype="float32", tensor_parallel_size=2)
    yield solo, split
    split.close()
    solo.close()


def _run(llm, prompts, seed=7):
    """Each request draws from its own generator seeded ``seed``: its canvas does not depend on its batch."""
    params = llm.sampling_params(max_tokens=24, ignore_eos=True, seed=seed)
    return [(o.token_ids, o.num_forward_passes) for o in llm.generate(prompt_token_ids=prompts, sampling_params=params)]


def test_seeded_requests_on_two_ranks_finish_as_on_one_device(pair):
    solo, split = pair
    want = _run(solo, PROMPTS)
    got = _run(split, PROMPTS)
    vocab = solo.engine.model_args.vocab_size
    assert [len(t) for t, _ in got] == [len(t) for t, _ in want] == [24] * len(PROMPTS)
    assert all(0 <= t < vocab for tokens, _ in got for t in tokens)
    assert [n for _, n in got] == [n for _, n in want]            # the same canvases and steps a canvas


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    return (got - want).abs().max().item() <= 1e-5 * max(1.0, want.abs().max().item())


def test_encoder_and_decoder_logits_on_two_ranks_are_within_1e_5_of_their_scale(pair):
    solo, split = pair
    ids = list(range(3, 23))
    encoder = ForwardBatch(ids=ids, positions=list(range(len(ids))), plain=[(0, len(ids), 0, None)],
                           logit_rows=list(range(len(ids))))
    # A decoder pass: bidirectional rows whose input adds the self-conditioning of earlier logits.
    soft = solo.engine.runner.model.conditioning_input(torch.randn(12, solo.engine.model_args.vocab_size,
                                                                   generator=torch.Generator().manual_seed(0)))
    decoder = ForwardBatch(ids=ids, positions=list(range(len(ids))), plain=[(0, len(ids), 0, None)],
                           decoder_rows=list(range(8, 20)), conditioning=[(12, soft)], logit_rows=list(range(8, 20)))
    with torch.inference_mode():
        for batch in (encoder, decoder):
            (want, _), (got, _) = solo.engine.runner.execute(batch), split.engine.runner.execute(batch)
            assert got.shape == want.shape == (len(batch.logit_rows), solo.engine.model_args.vocab_size)
            assert _close(got, want), (got - want).abs().max().item()
        assert not _close(solo.engine.runner.execute(decoder)[0], solo.engine.runner.execute(encoder)[0][8:])


def test_each_rank_holds_its_heads_and_experts(pair):
    solo, split = pair
    full, mine = solo.engine.runner.model, split.engine.runner.model
    # sliding layers: 2 key/value heads, one a rank; the full layer's one head replicated
    assert [s for s, _ in full.kv_shapes] == [2, 2, 1] and [s for s, _ in mine.kv_shapes] == [1, 1, 1]
    assert [d for _, d in mine.kv_shapes] == [d for _, d in full.kv_shapes]
    layer, whole = mine.model.decoder.layers[0], full.model.decoder.layers[0]
    assert layer.experts.gate_up_proj.shape[0] == whole.experts.gate_up_proj.shape[0] // 2
    assert layer.self_attn.q_proj.weight.shape[0] == whole.self_attn.q_proj.weight.shape[0] // 2
    assert torch.equal(mine.model.decoder.embed_tokens.weight, full.model.decoder.embed_tokens.weight)
