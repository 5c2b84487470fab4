"""Engine behaviour: batching, caches, early stop, seeds, streaming, async, cancellation, failures."""

import asyncio
import json
import shutil

import pytest
import torch
from helpers import PARITY, forward

from dlm_backend import LLM, SamplingParams
from dlm_backend.parity.forward import PagedRun
from dlm_backend.errors import EngineError

PROMPT = json.loads((PARITY / "llada-tiny" / "cases.json").read_text())["cases"][0]["prompt"]
PROMPTS = [PROMPT, PROMPT[:4], PROMPT[2:] + [7, 8, 9, 10, 11, 12, 13]]
SAMPLERS = ["llada", "dream", "threshold", "factor", "entropy_bounded"]


@pytest.mark.parametrize("family", ["llada-tiny", "dream-tiny"])
@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
@pytest.mark.parametrize("sampler", SAMPLERS)
def test_batch_invariance(family, cache, sampler):
    llm = LLM(str(PARITY / family))
    params = SamplingParams(sampler=sampler, max_tokens=20, block_length=8, threshold=0.1, cache=cache,
                            ignore_eos=True)
    alone = [llm.generate(prompt_token_ids=[p], sampling_params=params)[0] for p in PROMPTS]
    together = llm.generate(prompt_token_ids=PROMPTS, sampling_params=params)
    for a, b in zip(alone, together):
        assert a.token_ids == b.token_ids
        assert a.num_forward_passes == b.num_forward_passes
        assert len(a.token_ids) == 20


@pytest.mark.parametrize("family", ["llada-tiny", "dream-tiny"])
def test_cached_window_on_unchanged_canvas_equals_full_pass(family):
    """The cache plumbing is exact: with nothing changed since the block-start pass, the prefix and
    dual windows see the same keys as a full pass and produce the same hidden states."""
    model = LLM(str(PARITY / family)).engine.runner.model
    a = model.args
    canvas = torch.tensor(PROMPT + [a.mask_token_id] * 16)
    L, bs, be = len(canvas), len(PROMPT) + 8, len(PROMPT) + 16
    run = PagedRun(model, L)
    with torch.inference_mode():
        full = run.hidden(canvas, 0, L)
        for start, end in [(bs, L), (bs - 1, be)]:      # prefix window, shifted dual window
            part = run.hidden(canvas[start:end], start, L)
            # A plumbing error moves logits by 0.1 or more; a window of other length can take another
            # float32 matmul kernel (a fresh clone on 2 threads saw 3.8e-5 on one of 576 logits).
            torch.testing.assert_close(part, full[start:end], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_cache_reduces_tokens_per_pass_not_passes(cache):
    llm = LLM(str(PARITY / "llada-tiny"))
    seq = llm.engine.add_request(PROMPT, SamplingParams(sampler="llada", max_tokens=24, block_length=8,
                                                        cache=cache, ignore_eos=True))
    fed = []
    while llm.engine.has_unfinished:
        step = seq.plan(0)
        start, end = step.start, step.end
        fed.append(end - start)
        llm.engine.step()
    assert len(fed) == 24
    assert fed[0] == len(PROMPT) + 24 and min(fed) < fed[0]
    if cache == "dual":
        assert min(fed) == 8


def test_eos_stops_early_and_cuts_output(tmp_path):
    base = LLM(str(PARITY / "llada-tiny"))
    params = SamplingParams(sampler="llada", max_tokens=32, block_length=8, ignore_eos=True)
    full = base.generate(prompt_token_ids=[PROMPT], sampling_params=params)[0].token_ids
    eos = full[5]                      # pretend a token the model writes early is EOS
    ckpt = tmp_path / "eos"
    shutil.copytree(PARITY / "llada-tiny", ckpt)
    config = json.loads((ckpt / "config.json").read_text())
    config["eos_token_id"] = eos
    (ckpt / "config.json").write_text(json.dumps(config))
    (ckpt / "generation_config.json").unlink()
    out = LLM(str(ckpt)).generate(prompt_token_ids=[PROMPT], sampling_params=params.replace(ignore_eos=False))[0]
    assert out.finish_reason == "stop" and out.stop_reason == eos
    assert out.token_ids == full[:full.index(eos)]
    assert out.num_forward_passes <= 8          # only the first block was denoised


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_max_tokens_not_multiple_of_block(sampler):
    llm = LLM(str(PARITY / "dream-tiny"))
    out = llm.generate(prompt_token_ids=[PROMPT], sampling_params=SamplingParams(
        sampler=sampler, max_tokens=13, block_length=5, steps=7, ignore_eos=True))[0]
    assert len(out.token_ids) == 13 and out.finish_reason == "length"
    assert 300 not in out.token_ids           # no mask left behind


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_seed_fixes_sampled_output(sampler):
    llm = LLM(str(PARITY / "llada-tiny"))
    params = SamplingParams(sampler=sampler, max_tokens=16, block_length=8, temperature=1.0, seed=7,
                            ignore_eos=True, alg="origin" if sampler == "dream" else "maskgit_plus")
    a = llm.generate(prompt_token_ids=[PROMPT], sampling_params=params)[0].token_ids
    b = llm.generate(prompt_token_ids=[PROMPT], sampling_params=params)[0].token_ids
    others = [llm.generate(prompt_token_ids=[PROMPT], sampling_params=params.replace(seed=s))[0].token_ids
              for s in (8, 9, 10)]
    assert a == b
    assert any(o != a for o in others)


def test_forward_passes_reported_and_threshold_needs_fewer():
    llm = LLM(str(PARITY / "llada-tiny"))
    slow = llm.generate(prompt_token_ids=[PROMPT], sampling_params=SamplingParams(
        sampler="llada", max_tokens=32, block_length=8, ignore_eos=True))[0]
    fast = llm.generate(prompt_token_ids=[PROMPT], sampling_params=SamplingParams(
        sampler="threshold", threshold=0.05, max_tokens=32, block_length=8, ignore_eos=True))[0]
    assert slow.num_forward_passes == 32
    assert 4 <= fast.num_forward_passes < 32


def test_classifier_free_guidance_changes_output():
    llm = LLM(str(PARITY / "llada-tiny"))
    params = SamplingParams(sampler="llada", max_tokens=16, block_length=8, cache="none", ignore_eos=True)
    plain = llm.generate(prompt_token_ids=[PROMPT], sampling_params=params)[0]
    guided = llm.generate(prompt_token_ids=[PROMPT], sampling_params=params.replace(cfg_scale=2.0))[0]
    assert len(guided.token_ids) == 16 and guided.token_ids != plain.token_ids


def test_chat_text_and_stop_strings(dream_chat):
    llm = LLM(str(dream_chat))
    params = SamplingParams(sampler="llada", max_tokens=24, block_length=8, ignore_eos=True)
    out = llm.chat([{"role": "user", "content": "Name three prime numbers."}], params)
    assert isinstance(out.text, str) and out.text == llm.tokenizer.decode(out.token_ids)
    assert len(out.text) > 3
    stop = out.text[2:4]
    cut = llm.chat([{"role": "user", "content": "Name three prime numbers."}], params.replace(stop=[stop]))
    assert cut.finish_reason == "stop" and cut.stop_reason == stop
    assert cut.text == out.text[:out.text.index(stop)]
    # The output ends at the token that completes the stop string, not at the end of its pass:
    # threshold 0.01 commits the whole 8-slot block at once.
    fast = params.replace(sampler="threshold", threshold=0.01)
    messages = [{"role": "user", "content": "Name three prime numbers."}]
    full = llm.chat(messages, fast).token_ids
    decode = llm.tokenizer.decode
    i, stop = next((i, decode(full[i:i + 1])) for i in range(1, 7)       # a whole character, first seen at i
                   if decode(full[i:i + 1]).strip("\ufffd") and decode(full[i:i + 1]) not in decode(full[:i]))
    cut = llm.chat(messages, fast.replace(stop=[stop]))
    assert cut.token_ids == full[:i + 1] and cut.usage["completion_tokens"] == i + 1 < 8


def test_stream_yields_committed_text_in_order(dream_chat):
    llm = LLM(str(dream_chat))
    params = SamplingParams(sampler="llada", max_tokens=24, block_length=8, ignore_eos=True)
    messages = [{"role": "user", "content": "hello"}]
    chunks = list(llm.stream_chat(messages, params))
    assert chunks[-1].finished and chunks[-1].output is not None
    assert len(chunks) >= 3                       # at least one chunk per block
    assert "".join(c.delta_text for c in chunks) == chunks[-1].output.text
    assert sum((c.delta_token_ids for c in chunks), []) == chunks[-1].output.token_ids
    assert chunks[-1].output.text == llm.chat(messages, params).text


def test_async_api_does_not_block_the_event_loop(dream_chat):
    llm = LLM(str(dream_chat))
    params = SamplingParams(sampler="llada", max_tokens=32, block_length=8, ignore_eos=True)
    messages = [{"role": "user", "content": "hello"}]

    async def main():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.001)

        task = asyncio.create_task(ticker())
        out = await llm.achat(messages, params)
        streamed = [c async for c in llm.astream_chat(messages, params)]
        many = await asyncio.gather(*(llm.achat(messages, params) for _ in range(4)))
        task.cancel()
        return ticks, out, streamed, many

    ticks, out, streamed, many = asyncio.run(main())
    assert ticks > 5
    assert out.text == llm.chat(messages, params).text == streamed[-1].output.text
    assert all(m.token_ids == out.token_ids for m in many)


def test_abandoned_stream_frees_its_slot(dream_chat):
    llm = LLM(str(dream_chat))
    stream = llm.stream_chat([{"role": "user", "content": "hi"}],
                             SamplingParams(sampler="llada", max_tokens=64, block_length=8, ignore_eos=True))
    next(stream)
    stream.close()
    for _ in range(200):
        if not llm.engine.has_unfinished:
            break
        import time
        time.sleep(0.01)
    assert not llm.engine.has_unfinished


def test_concurrent_threads_share_forward_passes(monkeypatch):
    import threading

    llm = LLM(str(PARITY / "llada-tiny"))
    params = SamplingParams(sampler="llada", max_tokens=16, block_length=8, ignore_eos=True)
    solo = [llm.generate(prompt_token_ids=[p], sampling_params=params)[0].token_ids for p in PROMPTS]
    steps = []
    original = llm.engine.runner.step
    monkeypatch.setattr(llm.engine.runner, "step", lambda seqs: (steps.append(len(seqs)), original(seqs)))
    results = {}
    barrier = threading.Barrier(len(PROMPTS))

    def worker(i):
        barrier.wait()
        results[i] = llm.generate(prompt_token_ids=[PROMPTS[i]], sampling_params=params)[0].token_ids

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [results[i] for i in range(len(PROMPTS))] == solo
    assert max(steps) > 1 and len(steps) < 16 * len(PROMPTS)     # passes were shared


def run_to_end(engine) -> dict:
    """Step ``engine`` until idle; the final chunk of every request, by request id."""
    chunks = []
    while engine.has_unfinished:
        chunks += engine.step()
    return {c.request_id: c for c in chunks if c.finished}


def test_failing_request_in_a_batch_fails_alone(monkeypatch):
    llm = LLM(str(PARITY / "dream-tiny"))
    engine = llm.engine
    original = engine.runner._random_for

    def random_for(seq):
        if seq.params.seed == 13:
            raise RuntimeError("injected failure")
        return original(seq)

    params = SamplingParams(sampler="llada", max_tokens=8, block_length=8, ignore_eos=True)
    solo = llm.generate(prompt_token_ids=[PROMPT], sampling_params=params)[0].token_ids
    monkeypatch.setattr(engine.runner, "_random_for", random_for)
    good = engine.add_request(PROMPT, params)
    bad = engine.add_request(PROMPT, params.replace(seed=13))
    final = run_to_end(engine)
    assert final[bad.request_id].finish_reason == "error" and "injected" in final[bad.request_id].error
    assert final[good.request_id].error is None and final[good.request_id].output.token_ids == solo


def test_nan_logits_fail_only_the_request_that_caused_them(monkeypatch):
    llm = LLM(str(PARITY / "dream-tiny"))
    engine, model = llm.engine, llm.engine.runner.model
    poison = 299                                     # a token only the bad prompt carries
    original = model.forward

    def forward(input_ids, positions):
        hidden = original(input_ids, positions)
        return hidden.masked_fill((input_ids == poison)[:, None].any(0, keepdim=True), float("nan"))

    params = SamplingParams(sampler="threshold", cache="dual", max_tokens=8, block_length=8, ignore_eos=True)
    solo = llm.generate(prompt_token_ids=[PROMPT], sampling_params=params)[0].token_ids
    monkeypatch.setattr(model, "forward", forward)
    good = engine.add_request(PROMPT, params)
    bad = engine.add_request(PROMPT[:2] + [poison] + PROMPT[2:], params)
    final = run_to_end(engine)
    assert final[bad.request_id].finish_reason == "error" and "NaN" in final[bad.request_id].error
    assert final[good.request_id].error is None and final[good.request_id].output.token_ids == solo


def test_request_aborted_by_another_thread_returns_abort():
    import threading

    llm = LLM(str(PARITY / "llada-tiny"))
    params = SamplingParams(sampler="llada", max_tokens=256, block_length=8, ignore_eos=True)
    seen = []
    original = llm.engine.runner.step

    def step(seqs):
        seen.extend(s.request_id for s in seqs)
        original(seqs)

    llm.engine.runner.step = step
    try:
        timer = threading.Timer(0.2, lambda: llm._loop.abort(seen[0]))
        timer.start()
        out = llm.generate(prompt_token_ids=[PROMPT], sampling_params=params)[0]
        timer.join()
    finally:
        del llm.engine.runner.step
    assert out.finish_reason == "abort" and out.num_forward_passes < 256
    assert not llm.engine.has_unfinished


def test_failing_request_fails_alone(monkeypatch):
    llm = LLM(str(PARITY / "llada-tiny"))
    bad_seed = 13
    original = llm.engine.runner._random_for

    def random_for(seq):
        if seq.params.seed == bad_seed:
            raise RuntimeError("injected failure")
        return original(seq)

    monkeypatch.setattr(llm.engine.runner, "_random_for", random_for)
    params = SamplingParams(sampler="llada", max_tokens=8, block_length=8, ignore_eos=True)
    good = llm.generate(prompt_token_ids=[PROMPT], sampling_params=params)[0]
    with pytest.raises(EngineError, match="injected failure"):
        llm.generate(prompt_token_ids=[PROMPT], sampling_params=params.replace(seed=bad_seed))
    again = llm.generate(prompt_token_ids=[PROMPT], sampling_params=params)[0]
    assert again.token_ids == good.token_ids


@pytest.mark.parametrize("cache", ["none", "dual"])
@pytest.mark.parametrize("sampler", ["llada", "threshold"])
def test_response_template_fixes_tokens_and_fills_slots(sampler, cache):
    llm = LLM(str(PARITY / "dream-tiny"))
    template = [5, None, None, 6, 7, None, None, None, 8] + [None] * 8 + [9] * 8 + [None] * 3
    params = SamplingParams(sampler=sampler, max_tokens=32, block_length=8, cache=cache, ignore_eos=True)
    out = llm.generate(prompt_token_ids=[PROMPT], sampling_params=params, response_template=template)[0]
    assert len(out.token_ids) == 32 and 300 not in out.token_ids
    assert all(tok == fixed for tok, fixed in zip(out.token_ids, template) if fixed is not None)
    free = sum(t is None for t in template) + 32 - len(template)
    assert out.num_forward_passes <= free
    if sampler == "llada":
        assert out.num_forward_passes == free          # one token per pass, fixed slots skipped


def test_response_template_validation():
    from dlm_backend.errors import SamplingParamsError
    llm = LLM(str(PARITY / "dream-tiny"))
    with pytest.raises(SamplingParamsError, match="raise max_tokens"):
        llm.generate(prompt_token_ids=[PROMPT], sampling_params=SamplingParams(max_tokens=2),
                     response_template=[1, 2, 3])
    full = llm.generate(prompt_token_ids=[PROMPT], sampling_params=SamplingParams(max_tokens=3, ignore_eos=True),
                        response_template=[1, 2, 3])[0]
    assert full.token_ids == [1, 2, 3] and full.num_forward_passes == 0


def test_a_stop_token_in_a_template_slot_does_not_cut_off_the_skeleton():
    """EOS committed into a JSON value's spare slot used to finish the request there, dropping the
    later slots and the closing braces; after the template a stop token ends it as usual."""
    from dlm_backend.engine.samplers.base import TokenInfo
    from dlm_backend.engine.samplers.llada import LLaDASampler
    from dlm_backend.engine.canvas import CanvasSequence
    from dlm_backend.engine.samplers.base import Commit

    mask, eos, fixed = 9, 2, 5
    params = SamplingParams(sampler="llada", max_tokens=6, block_length=6)
    seq = CanvasSequence([1, 1], params, LLaDASampler(), TokenInfo(mask, (eos,)), response_template=[None, None, fixed])

    def commit(positions, tokens):
        step = seq.plan(0)
        seq.apply(step, Commit([step.candidates.index(p) for p in positions], tokens))
    commit([2, 3], [7, eos])                     # the value and a pad in its slots
    assert not seq.is_finished and seq.prefix_end == 5
    commit([5, 6], [eos, 7])                     # after the template: a stop
    assert seq.is_finished and seq.finish_reason == "stop" and seq.output_end == 5
