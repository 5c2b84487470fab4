"""Fast-dLLM v2's eval sampler, ``batch_sample``, decodes a batch's rows together (issue 53): requests
joined into one batch (``BlockSequence.join_batch``) come out as the reference's rows.

``fastdllm2-batch-tiny`` was made by running the published reference on the ``fastdllm2-tiny`` weights
(recipes/fixtures/fastdllm2_batch.py; provenance in its cases.json): four prompts of different
lengths with the block cache, threshold 0.9, sub-blocks of 8 in blocks of 16 (the issue's set-up),
the same without the block cache, a shortest prompt longer than a block, a prompt ending on a block
end, and an early stop. Each case is mapped onto engine requests as ``dlm parity`` maps it
(dlm_backend/parity/cases.py), and its rows are joined into one batch.
"""

import json

import pytest
import torch
from tests.helpers import FIXTURES

from dlm_backend.engine.requests.batch_sample import BatchSample
from dlm_backend.errors import DLMError
from dlm_backend.parity import _engine, _generate
from dlm_backend.parity.cases import SAMPLERS

BATCH = FIXTURES / "parity-block" / "fastdllm2-batch-tiny"
PUBLIC = FIXTURES / "parity-block" / "fastdllm2-tiny"
SAMPLER = "v2/generation_functions.py:batch_sample"
MASK = 500


def _fixture(folder):
    return json.loads((folder / "cases.json").read_text())


def _cases(folder):
    return [c for c in _fixture(folder)["cases"] if c["sampler"] == SAMPLER]


@pytest.fixture(scope="module")
def engine():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)                     # the reference ran with one thread
    eng = _engine(BATCH, _fixture(BATCH), None)
    yield eng
    eng.close()
    torch.set_num_threads(threads)


def _run(engine, case, fixture, joined=True, rows=None):
    """The case as ``dlm parity`` asks it (its rows joined into one batch: ``rows``, they land there;
    ``joined=False``: independent requests); the check's mismatches."""
    run = SAMPLERS[case["sampler"]](case, fixture)
    rows = [] if rows is None else rows
    run.prepare = [lambda seq, _engine: seq.join_batch(rows)] * len(run.prompts) if joined else []
    return run.check(_generate(engine, run, replay=False))


def test_the_fixture_is_the_published_reference_on_the_public_weights():
    batch, public = _fixture(BATCH), _fixture(PUBLIC)
    for key in ("generation_functions_sha256", "modeling_sha256", "configuration_sha256", "transformers_version"):
        assert batch["reference"][key] == public["reference"][key]
    for name in ("config.json", "model.safetensors"):
        assert (BATCH / name).read_bytes() == (PUBLIC / name).read_bytes()
    issue = batch["cases"][0]
    assert [len(p) for p in issue["prompts"]] == [5, 11, 23, 30]
    assert {k: issue["kwargs"][k] for k in ("block_size", "small_block_size", "threshold", "use_block_cache")} == \
        {"block_size": 16, "small_block_size": 8, "threshold": 0.9, "use_block_cache": True}
    assert all(c["robust_to_logit_noise"]["same_outputs"] for c in batch["cases"])


@pytest.mark.parametrize("case", _cases(BATCH), ids=lambda c: c["name"])
def test_every_batch_of_the_reference_comes_out_of_joined_requests_exactly(engine, case):
    assert _run(engine, case, _fixture(BATCH)) == []


def test_the_batches_decoded_as_independent_requests_leave_the_reference(engine):
    """What issue 53 saw: a row alone rebuilds its block cache only while its own sub-block starts
    with a mask, the reference while any row's does; without the block cache the rows are independent
    but for the first token of a block that starts right after a prompt (the 32-token row)."""
    fixture = _fixture(BATCH)
    for case in _cases(BATCH):
        errors = _run(engine, case, fixture, joined=False)
        if case["kwargs"]["use_block_cache"] or 32 in [len(p) for p in case["prompts"]]:
            assert errors and all(e.startswith("row ") and " tokens: got" in e for e in errors), case["name"]
        else:
            assert errors == [], case["name"]


@pytest.mark.parametrize("case", _cases(PUBLIC), ids=lambda c: c["name"])
def test_the_public_fixtures_batches_stay_exact_joined(engine, case):
    """Blocks of 8, sub-blocks of 4, prompts of 13, 9 and 16 (the longest ending on a block end),
    with and without the block cache and with an early stop."""
    assert _run(engine, case, _fixture(PUBLIC)) == []


def test_the_block_cache_is_rebuilt_for_every_row_while_any_rows_sub_block_starts_masked(engine, monkeypatch):
    """Lines 101-109 of the reference, on the engine's own passes: in each step every row forwards the
    same span, the whole block while some row's sub-block starts with a mask (or before the block's
    first full pass), else only the sub-block."""
    plans = []
    plan = BatchSample.plan

    def spy(self, seq):
        step = plan(self, seq)
        if step.kind == "denoise":
            plans.append((self.block * 16, self.s0, step.start, step.end,
                          any(r.canvas[self.s0] == MASK for r in self.live), self.block_cache))
        return step
    monkeypatch.setattr(BatchSample, "plan", spy)
    assert _run(engine, _fixture(BATCH)["cases"][0], _fixture(BATCH)) == []
    full = [(start, end) == (block, block + 16) for block, _, start, end, _, _ in plans]
    for is_full, (block, s0, start, end, some_masked, cached) in zip(full, plans):
        if is_full:
            assert some_masked or not cached
        else:
            assert (start, end) == (s0, s0 + 8) and not some_masked and cached
    steps = [plans[i:i + 4] for i in range(0, len(plans), 4)]             # four rows, none stops
    assert all(len({p[2:4] for p in step}) == 1 for step in steps)
    # both kinds occur, and full passes after the block's first one: the rule, not the first pass, made them
    assert not all(full) and any(f and p[5] for f, p in zip(full, plans))


def test_a_row_whose_prompt_ends_on_a_block_end_decodes_that_blocks_first_slot(engine, monkeypatch):
    """Lines 130-141: a commit's argmax reaches only the rows whose prompt ended before the block end
    (the padded batch being longer), so the 32-token row of a batch whose longest prompt is 40 starts
    block 2 with a mask, which a denoising pass fills, while the 9- and 21-token rows get the argmax."""
    written = []
    apply = BatchSample.apply

    def spy(self, seq, step, commit=None, ar_tokens=None):
        at = [step.candidates[i] for i in commit.indices] if commit is not None else step.candidates
        written.extend((seq.prompt_len, step.kind, p) for p in (at if ar_tokens or commit else []))
        apply(self, seq, step, commit, ar_tokens)
    monkeypatch.setattr(BatchSample, "apply", spy)
    case = next(c for c in _cases(BATCH) if [len(p) for p in c["prompts"]] == [9, 32, 21, 40])
    assert _run(engine, case, _fixture(BATCH)) == []
    filled = {(n, kind) for n, kind, p in written if p == 32}
    assert filled == {(32, "denoise"), (9, "cache"), (21, "cache")}
    first = next(c for c in case["result"]["forward_calls"] if c["kind"] != "commit" and c["past_len"] == 32)
    assert [row[0] == MASK for row in first["input_ids"]] == [False, True, False, False]


def test_rows_that_cannot_run_in_the_same_steps_are_an_error():
    threads = torch.get_num_threads()
    eng = _engine(BATCH, _fixture(BATCH), None)
    try:
        eng.set_limits(max_num_seqs=2)
        with pytest.raises(DLMError, match="same engine steps"):
            _run(eng, _fixture(BATCH)["cases"][0], _fixture(BATCH))
    finally:
        eng.close()
        torch.set_num_threads(threads)
