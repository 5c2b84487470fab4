"""The greedy statistics of a vocabulary-parallel head (four numbers a row per rank, merged) equal
one device's over the whole vocabulary: padded last shards, the excluded id on any rank, ties across
ranks. The ranks are simulated in one process; the two-process path is in test_tensor_parallel.py."""

import pytest
import torch

from dlm_backend.engine.layers.head import greedy_from_logits, vocab_parallel_stats
from dlm_backend.engine.parallel.group import TPGroup


class _Sent(Exception):
    pass


def _stats_on_every_rank(full: torch.Tensor, world: int, exclude_id: int):
    """Each rank's result, given only its shard ``[N, ceil(V / world)]`` (zero-padded, as the head's
    padded rows give); the gather returns what every rank sent."""
    V = full.shape[1]
    groups = [TPGroup(r, world, torch.device("cpu")) for r in range(world)]
    shards = []
    for g in groups:
        lo, hi = g.vocab(V)
        shard = torch.zeros(full.shape[0], -(-V // world))
        shard[:, :hi - lo] = full[:, lo:hi]
        shards.append(shard)
    sent = []
    for g, shard in zip(groups, shards):                   # what each rank puts on the wire

        def capture(x):
            sent.append(x)
            raise _Sent

        g.gather_last = capture
        with pytest.raises(_Sent):
            vocab_parallel_stats(g, shard, V, exclude_id)
    gathered = torch.cat(sent, dim=-1)
    results = []
    for g, shard in zip(groups, shards):
        g.gather_last = lambda x: gathered
        results.append(vocab_parallel_stats(g, shard, V, exclude_id))
    return results


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("vocab", [37, 64])
def test_merged_statistics_equal_the_whole_vocabulary(world, vocab):
    torch.manual_seed(world * vocab)
    full = torch.randn(6, vocab) * 4
    full[1, vocab - 1] = 50.0                              # the best id in the last (padded) shard
    full[2, 0] = full[2, vocab - 2] = 40.0                 # a tie across ranks: the lower id wins
    full[3] = -30.0 + torch.rand(vocab)                    # every logit below the padding's zeros
    for exclude_id in (-1, 0, vocab - 1, int(full[4].argmax())):
        want = greedy_from_logits(full, exclude_id)
        for got in _stats_on_every_rank(full, world, exclude_id):
            assert torch.equal(got.token, want.token)
            torch.testing.assert_close(got.prob, want.prob, rtol=1e-6, atol=1e-7)
    assert int(_stats_on_every_rank(full, world, -1)[0].token[2]) == 0
