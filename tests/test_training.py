"""The corpus, tokenizer, objective and training loop behind the embedded model."""

import json
from dataclasses import replace

import torch
from safetensors.torch import load_file

from dlm_backend import LLM, SamplingParams
from dlm_backend.training import corpus
from dlm_backend.training.entities import Entities
from dlm_backend.training.evaluate import default_configs, evaluate, held_out, score
from dlm_backend.training.train import TrainConfig, train

TINY = TrainConfig(num_examples=300, vocab_size=512, hidden_size=32, num_layers=1, num_heads=2,
                   num_kv_heads=1, intermediate_size=64, batch_tokens=2048, steps=4, warmup=2, save_every=2,
                   late_from_step=3)


def test_corpus_is_deterministic_and_covers_every_family():
    a = [e.to_json() for e in corpus.generate(200, seed=3)]
    b = [e.to_json() for e in corpus.generate(200, seed=3)]
    assert a == b
    assert {e["family"] for e in a} == set(corpus.GENERATORS)
    assert a != [e.to_json() for e in corpus.generate(200, seed=4)]


def test_train_and_eval_entities_are_disjoint():
    import random
    train_names = {Entities(random.Random(0), "train").name() for _ in range(3000)}
    eval_ent = Entities(random.Random(1), "eval")
    eval_names = {eval_ent.name() for _ in range(500)} | {eval_ent.city() for _ in range(500)}
    assert not train_names & eval_names


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


def test_training_is_deterministic_resumable_and_loads_in_the_engine(tmp_path):
    straight = train(replace(TINY, out_dir=str(tmp_path / "a")))
    half = train(replace(TINY, out_dir=str(tmp_path / "b")), stop_at=2)     # interrupted
    with (tmp_path / "b" / "loss.csv").open("a") as f:
        f.write("3,9.0,9.0,1.0\n")        # a step logged after the last save, then killed
    resumed = train(replace(TINY, out_dir=str(tmp_path / "b")))
    assert half == resumed
    assert [line.split(",")[0] for line in (tmp_path / "b" / "loss.csv").read_text().splitlines()] == list("1234")
    wa, wb = load_file(str(straight / "model.safetensors")), load_file(str(resumed / "model.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert len((tmp_path / "a" / "loss.csv").read_text().splitlines()) == 4
    assert (tmp_path / "a" / "loss.png").is_file()
    config = json.loads((straight / "config.json").read_text())
    assert config["architectures"] == ["DreamModel"] and config["tie_word_embeddings"]
    llm = LLM(str(straight))
    out = llm.chat([{"role": "user", "content": "Hi!"}], SamplingParams(max_tokens=8, block_length=8))
    assert out.num_forward_passes >= 1 and isinstance(out.text, str)
    assert llm.engine.tokens.eot_ids == (llm.tokenizer.token_id("<|im_end|>"),)


def test_second_stage_starts_from_the_first(tmp_path):
    first = train(replace(TINY, out_dir=str(tmp_path / "a")))
    second = train(replace(TINY, out_dir=str(tmp_path / "b"), init_from=str(first), steps=0, seed=1))
    assert (second / "tokenizer.json").read_text() == (first / "tokenizer.json").read_text()
    wa, wb = load_file(str(first / "model.safetensors")), load_file(str(second / "model.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)                  # zero steps: the same weights


def test_mask_ratio_floor_and_weights():
    from dlm_backend.training.train import response_mask

    gen = torch.Generator().manual_seed(0)
    prompt_len = torch.tensor([3, 10, 1, 7] * 64)
    masked, t = response_mask(prompt_len, 40, gen, "bernoulli", t_min=0.3)
    assert t.min() >= 0.3 and t.max() <= 1
    assert not masked[torch.arange(40)[None, :] < prompt_len[:, None]].any()     # prompts stay clean
    ratio = masked.sum(1) / (40 - prompt_len)
    assert abs(float((ratio - t[:, 0]).mean())) < 0.05                          # masked at ratio t
    masked, t = response_mask(prompt_len, 40, gen, "count")
    assert torch.equal(masked.sum(1), (t[:, 0] * (40 - prompt_len)).round().long())


def test_eval_runs_on_a_small_slice(tmp_path):
    model = train(replace(TINY, out_dir=str(tmp_path / "m"), steps=1))
    rows = evaluate(str(model), per_family=1, configs=default_configs(16, 8)[:2])
    assert {r["family"] for r in rows} == set(corpus.GENERATORS) | {"all"}
    assert all(0 <= r["exact"] <= 1 and r["passes_per_token"] > 0 for r in rows)
    assert len(held_out(2)) == 2 * len(corpus.GENERATORS)
