"""Engine counters (engine/metrics.py): totals since start, rates over a sliding window, and what one
engine records as it runs."""

import threading

import pytest
from tests.helpers import PARITY

from dlm_backend import LLM, SamplingParams
from dlm_backend.engine.metrics import EngineStats


def test_rates_cover_the_window_only_and_totals_everything():
    stats = EngineStats(window_s=10.0)
    stats.record_step(batch_size=8, tokens=40, now=100.0)       # leaves the window at t=110
    stats.record_step(batch_size=4, tokens=4, now=105.0)
    stats.record_step(batch_size=2, tokens=6, now=112.0)
    rates = stats.rates(now=112.0)
    assert rates["steps_per_second"] == pytest.approx(2 / 10)
    assert rates["forward_passes_per_second"] == pytest.approx(6 / 10)
    assert rates["tokens_per_second"] == pytest.approx(10 / 10)
    assert rates["forward_passes_per_token"] == pytest.approx(14 / 50)  # over all time, not the window
    assert (stats.steps, stats.request_passes, stats.generated_tokens) == (3, 14, 50)


def test_an_idle_window_reads_zero_not_a_stale_rate():
    stats = EngineStats(window_s=5.0)
    assert stats.rates(now=0.0) == {"steps_per_second": 0.0, "forward_passes_per_second": 0.0,
                                    "tokens_per_second": 0.0, "forward_passes_per_token": 0.0}
    stats.record_step(batch_size=1, tokens=3, now=10.0)
    assert stats.rates(now=14.0)["tokens_per_second"] == pytest.approx(3 / 5)
    assert stats.rates(now=16.0)["tokens_per_second"] == 0.0      # the step left the window
    assert stats.rates(now=16.0)["forward_passes_per_token"] == pytest.approx(1 / 3)


def test_finishes_and_rejections_are_counted_from_any_thread():
    stats = EngineStats()

    def work():
        for _ in range(500):
            stats.record_finish("stop")
            stats.record_finish(None)
            stats.record_rejected()
            stats.record_step(2, 1)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert stats.finished == {"stop": 2000, "unknown": 2000} and stats.rejected == 2000
    assert (stats.steps, stats.request_passes, stats.generated_tokens) == (2000, 4000, 2000)


def test_an_engine_records_its_steps_tokens_and_finishes(tmp_path):
    import shutil

    llm = LLM(str(shutil.copytree(PARITY / "llada-tiny", tmp_path / "m")))      # an engine of its own
    params = SamplingParams(sampler="llada", max_tokens=8, block_length=8, ignore_eos=True)
    outs = llm.generate(prompt_token_ids=[[5, 6, 7], [8, 9]], sampling_params=params)
    stats = llm.engine.stats
    assert stats.steps == 8 and stats.request_passes == 16                     # two requests in each pass
    assert stats.generated_tokens == sum(len(o.token_ids) for o in outs) == 16
    assert stats.finished == {"length": 2}
    assert stats.rates()["forward_passes_per_token"] == 1.0
    llm.close()
