"""`dlm eval`'s held-out set, scorer, intervals and configs."""

import json
from dataclasses import replace

import pytest

from dlm_backend.errors import DLMError
from dlm_tiny import corpus, drills
from dlm_tiny.evaluate import (block_configs, default_configs, evaluate, format_table, groups, held_out, score,
                               select_configs, wilson)
from dlm_tiny.train import train
from test_train import TINY


def test_tool_call_targets_parse_and_score_exact():
    for ex in corpus.generate(40, seed=5, families=["tool_call", "json", "qa", "list", "chat", "tool_result"]):
        s = score(ex, ex.target)
        assert s["exact"] and s.get("valid", True), (ex.family, ex.target)


def test_score_rejects_wrong_answers():
    ex = corpus.generate(1, seed=0, families=["tool_call"])[0]
    if ex.expected.get("no_call"):
        ex = corpus.generate(2, seed=0, families=["tool_call"])[1]
    assert score(ex, '<tool_call>{"name": "nope", "arguments": {}}</tool_call>') == {"valid": True, "exact": False}
    assert score(ex, "<tool_call>{oops</tool_call>") == {"valid": False, "exact": False}
    js = corpus.generate(1, seed=0, families=["json"])[0]
    assert score(js, "{not json") == {"valid": False, "exact": False}
    js, key = next((e, k) for e in corpus.generate(50, seed=0, families=["json"])
                   for k, v in e.expected["schema"]["properties"].items() if v["type"] == "integer")
    as_float = json.dumps({**js.expected["object"], key: float(js.expected["object"][key])})
    assert score(js, as_float) == {"valid": False, "exact": False}        # 15.0 is not the integer 15


def test_wilson_interval_shows_how_little_fifty_prompts_say():
    low, high = wilson(45, 50)                   # 90% of 50
    assert 0.78 < low < 0.79 and 0.95 < high < 0.96
    assert wilson(0, 10)[0] == 0.0 and wilson(10, 10)[1] == 1.0
    assert wilson(180, 200)[1] - wilson(180, 200)[0] < high - low


def test_a_chat_turn_with_tools_on_offer_accepts_every_reply_of_its_group():
    ex = next(e for e in corpus.generate(200, seed=3, families=["tool_call"]) if e.expected.get("no_call"))
    others = next(answers for _, answers in drills.CHAT if ex.target in answers)
    for reply in others:
        assert score(ex, reply) == {"valid": True, "exact": True}
    assert score(ex, "Paris.")["exact"] is False
    assert score(ex, '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>')["valid"] is False


def test_eval_runs_on_a_small_slice(tmp_path):
    model = train(replace(TINY, out_dir=str(tmp_path / "m"), steps=1))
    rows = evaluate(str(model), per_family=1, configs=default_configs(16, 8)[:2])
    assert {r["family"] for r in rows} - {"qa: distractor", "qa: not in context"} == set(corpus.EVAL_FAMILIES) | {"all"}
    assert all(0 <= r["exact"] <= 1 and r["passes_per_token"] > 0 for r in rows)
    assert all(r["exact_ci95"][0] <= r["exact"] <= r["exact_ci95"][1] for r in rows)
    assert format_table(rows).count("\n") == len(rows) + 1
    assert len(held_out(2)) == 2 * len(corpus.EVAL_FAMILIES)


def test_eval_splits_qa_by_distractor_and_refusal_without_counting_them_twice():
    examples = held_out(40)
    results = list(range(len(examples)))              # stand-ins: groups only routes them
    rows = groups(examples, results)
    qa = [i for i, e in enumerate(examples) if e.family == "qa"]
    refuse = [i for i in qa if examples[i].target == corpus.NOT_IN_CONTEXT]
    distractor = [i for i in qa if i not in refuse and examples[i].expected["distractor"]]
    assert refuse and distractor
    assert rows["qa: not in context"] == refuse and rows["qa: distractor"] == distractor
    assert sorted(rows["all"]) == results
    assert sum(len(rows[f]) for f in corpus.EVAL_FAMILIES) == len(examples)


def test_eval_configs_are_selected_by_label_and_unknown_ones_refused():
    configs = default_configs()
    chosen = select_configs(configs, "threshold 0.9, prefix, block 4; llada 1 tok/step, dual")
    assert [c.label for c in chosen] == ["threshold 0.9, prefix, block 4", "llada 1 tok/step, dual"]
    assert (chosen[0].params.block_length, chosen[0].params.cache) == (4, "prefix")
    with pytest.raises(DLMError, match="Unknown eval config 'threshold 0.8, prefix'. Known configs: llada"):
        select_configs(configs, "threshold 0.9, dual;threshold 0.8, prefix")


def test_eval_configs_name_every_knob_the_engine_defaults_could_change():
    """The recorded figures were run with 64-token canvases and the cache each label names; engine
    defaults (256 tokens, dual cache since the engine split) must not move them."""
    for config in default_configs() + block_configs():
        own_blocks = config.params.sampler == "fastdllm2"         # a block checkpoint decodes in its own blocks
        assert config.params.max_tokens == 64 and config.params.block_length in ((None,) if own_blocks else (4, 32))
        assert config.label.split(", ")[1] == config.params.cache, config.label
    assert {c.params.max_tokens for c in default_configs(max_tokens=16, block_length=8)} == {16}


def test_eval_refuses_an_empty_slice():
    for bad in (0, True, 2.5):
        with pytest.raises(DLMError, match="give 1 or more"):
            evaluate(per_family=bad)


def test_eval_on_the_shipped_model_fast_sampler_needs_fewer_passes():
    """`dlm eval` on the embedded model: threshold+dual at least 2x fewer passes per token than llada."""
    configs = select_configs(default_configs(), "llada 1 tok/step, dual; threshold 0.9, dual")
    rows = {(r["config"], r["family"]): r for r in evaluate(per_family=2, configs=configs)}
    slow, fast = rows["llada 1 tok/step, dual", "all"], rows["threshold 0.9, dual", "all"]
    assert fast["passes_per_token"] * 2 < slow["passes_per_token"]
    assert rows["threshold 0.9, dual", "chat"]["exact"] >= 0.5
