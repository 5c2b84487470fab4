"""The corpus, tokenizer, objective and training loop behind the embedded model."""

import json
import re
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

from dlm_backend import LLM, SamplingParams
from dlm_backend.errors import DLMError
from dlm_backend.training import corpus
from dlm_backend.training.entities import Entities
from dlm_backend.training.evaluate import (default_configs, evaluate, format_table, groups, held_out, score,
                                          select_configs, wilson)
from dlm_backend.engine.tokenizer import Tokenizer as ChatTokenizer
from dlm_backend.training.objective import PackedBatches
from dlm_backend.training.checkpoint import build_tokenizer, model_config, write_checkpoint_files
from dlm_backend.training.checks import bf16_is_native
from dlm_backend.training.train import TrainConfig, encode_examples, parse_weights, train

TINY = TrainConfig(num_examples=300, vocab_size=512, hidden_size=32, num_layers=3, num_heads=2, pointer_layer=2,
                   num_kv_heads=1, intermediate_size=64, rows=4, steps=4, warmup=2, save_every=2)


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
    others = next(answers for _, answers in corpus.CHAT if ex.target in answers)
    for reply in others:
        assert score(ex, reply) == {"valid": True, "exact": True}
    assert score(ex, "Paris.")["exact"] is False
    assert score(ex, '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>')["valid"] is False


def _qa_shares(examples) -> tuple[float, float]:
    """(share of QA examples, share of those that are unanswerable)."""
    qa = [e for e in examples if e.family == "qa"]
    return len(qa) / len(examples), sum(e.target == corpus.NOT_IN_CONTEXT for e in qa) / len(qa)


def test_a_training_mix_over_samples_a_family_and_unanswerable_questions():
    base_qa, base_absent = _qa_shares(corpus.generate(2000, seed=4))
    mixed_qa, mixed_absent = _qa_shares(corpus.generate(2000, seed=4, weights={"qa": 0.5}, unanswerable=0.5))
    assert mixed_qa > base_qa + 0.15
    assert mixed_absent > 0.4 and base_absent < 0.25


@pytest.mark.parametrize("spec, needle", [("qa=lots", "cannot read"), ("qa", "cannot read"),
                                          ("qa=-1", "negative weight"), ("poems=0.2", "unknown families")])
def test_a_bad_family_mix_names_the_problem(spec, needle):
    with pytest.raises(DLMError, match=needle):
        parse_weights(spec)


def test_hard_qa_puts_a_same_attribute_distractor_in_the_context():
    plain = corpus.generate(300, seed=6, families=["qa"])
    hard = corpus.generate(300, seed=6, families=["qa"], qa_hard=1.0)
    def distracted(examples):
        return sum(e.expected["distractor"] for e in examples)
    assert 250 < distracted(hard) < 300 and distracted(plain) < 150
    # every hard context has a second person with the asked attribute; it is a distractor only when
    # that value differs from the answer (a shared "red" is answered by the attribute alone)
    for e in hard:
        if not e.expected["distractor"]:
            assert json.dumps(e.messages).count(e.target) >= 2
    assert [e.target for e in corpus.generate(50, seed=6)] == [e.target for e in corpus.generate(50, seed=6, qa_hard=0)]


def test_rag_templates_write_qa_as_the_frameworks_send_it():
    examples = corpus.generate(200, seed=6, families=["qa"], rag_templates=1.0)
    seen = set()
    for e in examples:
        text = "\n".join(m["content"] for m in e.messages)
        needle = {"LlamaIndex query engine": "\nQuery: ", "LlamaIndex chat engine": "assist the user",
                  "LangChain rlm/rag-prompt": "\nContext: ", "LangChain retrieval chain": "question-answering"}
        assert needle[e.expected["template"]] in text       # the label names the prompt it wrote
        seen.add(e.expected["template"])
        if e.target != corpus.NOT_IN_CONTEXT:
            assert e.target in text
        assert e.messages[-1]["role"] == "user"
    assert len(seen) == 4
    # retrieved documents carry metadata headers, and some prompts hold several documents
    assert sum("file: " in json.dumps(e.messages) for e in examples) > 20
    assert any(json.dumps(e.messages).count("source: ") >= 2 for e in examples)
    # 0 draws nothing extra: stages trained before the flag keep their exact corpus
    assert [e.to_json() for e in corpus.generate(80, seed=6)] == \
        [e.to_json() for e in corpus.generate(80, seed=6, rag_templates=0.0)]


@pytest.mark.parametrize("field", ["unanswerable", "qa_hard", "rag_templates"])
def test_bad_qa_share_is_refused_before_anything_is_written(tmp_path, field):
    with pytest.raises(DLMError, match="share of QA questions"):
        train(replace(TINY, out_dir=str(tmp_path / "x"), **{field: 1.5}))
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("flags, needle", [
    ({"pad_dist": "gauss"}, "--pad-dist: got 'gauss'; give 'uniform' or 'log'"),
    ({"save_every": 0}, "--save-every must be at least 1"),
    ({"max_extra_pad": 0}, "--max-extra-pad must be at least 1"),
    ({"rows": 0}, "--rows must be at least 1"),
    ({"num_heads": 3}, "must divide --hidden-size 32"),
    ({"num_heads": 4}, "heads of at least 16 dims"),
    ({"family_weights": "qa=nan"}, "not finite"),
    ({"family_weights": ",".join(f"{f}=0" for f in corpus.FAMILIES)}, "every family weighs 0"),
    ({"init_from": "."}, "no config.json there"),
    ({"copy_circuit": False}, "pass --pointer-layer 0 with it"),
    ({"max_len": 4096}, "--max-len 4096 is longer than the model's 2048 positions"),
    ({"precision": "fp16"}, "--precision: got 'fp16'; give 'float32' or 'bf16'"),
    ({"device": "gpu0"}, "--device: cannot read 'gpu0'; give cpu, cuda or cuda:N"),
    ({"device": "meta"}, "--device meta: training runs on cpu or cuda"),
] + ([] if torch.cuda.is_available() else [({"device": "cuda"}, "--device cuda: torch sees no CUDA device here")]))
def test_flags_that_cannot_make_a_run_are_refused_before_anything_is_written(tmp_path, flags, needle):
    with pytest.raises(DLMError, match=re.escape(needle)):
        train(replace(TINY, out_dir=str(tmp_path / "x"), **flags))
    assert not (tmp_path / "x").exists()


def test_bf16_is_refused_where_the_cpu_would_emulate_it(tmp_path, monkeypatch):
    import dlm_backend.training.checks as checks

    monkeypatch.setattr(checks, "bf16_is_native", lambda: False)
    with pytest.raises(DLMError, match="--precision bf16 needs a CPU with native bfloat16"):
        train(replace(TINY, out_dir=str(tmp_path / "x"), precision="bf16"))
    assert not (tmp_path / "x").exists()


@pytest.mark.skipif(not bf16_is_native(), reason="--precision bf16 needs AVX512-BF16 or AMX, which this CPU lacks (float32 training is tested)")
def test_a_bf16_run_follows_the_float32_run(tmp_path):
    runs = {p: train(replace(TINY, out_dir=str(tmp_path / p), precision=p, steps=6)) for p in ("float32", "bf16")}
    losses = {p: [float(line.split(",")[1]) for line in (m.parent / "loss.csv").read_text().splitlines()]
              for p, m in runs.items()}
    assert losses["bf16"] != losses["float32"]                               # the products did run in bf16
    assert losses["bf16"] == pytest.approx(losses["float32"], rel=0.02)      # and the loss follows float32's
    weights = load_file(str(runs["bf16"] / "model.safetensors"))
    assert all(w.dtype == torch.float32 for w in weights.values())           # master weights stay float32


def _losses(model_dir) -> list[float]:
    return [float(line.split(",")[1]) for line in (model_dir.parent / "loss.csv").read_text().splitlines()]


def test_a_compiled_run_follows_the_eager_run_and_may_resume_it(tmp_path):
    """``--compile`` changes how each layer runs, not what the run trains: losses and weights follow
    the eager run's, the frozen copy circuit stays frozen, and an eager run may go on compiled."""
    eager = train(replace(TINY, out_dir=str(tmp_path / "eager"), steps=6))
    compiled = train(replace(TINY, out_dir=str(tmp_path / "compiled"), steps=6, compile=True))
    assert _losses(compiled) == pytest.approx(_losses(eager), rel=1e-3)
    a, b = (load_file(str(m / "model.safetensors")) for m in (eager, compiled))
    assert a.keys() == b.keys()
    apart = [k for k in a if not torch.allclose(a[k], b[k], atol=1e-4)]
    assert not apart, apart
    train(replace(TINY, out_dir=str(tmp_path / "split"), steps=6), stop_at=3)
    split = train(replace(TINY, out_dir=str(tmp_path / "split"), steps=6, compile=True))
    assert _losses(split) == pytest.approx(_losses(eager), rel=1e-3)


@pytest.mark.gpu
def test_a_cuda_run_follows_the_cpu_run(tmp_path):
    """Same seed, same batches and masks (drawn on the CPU): the GPU run's losses follow the CPU's
    (cuBLAS sums in another order; bf16 rounds more, and must differ, or autocast did not run)."""
    runs = {(d, p): train(replace(TINY, out_dir=str(tmp_path / f"{d}-{p}"), device=d, precision=p, steps=6))
            for d, p in (("cpu", "float32"), ("cuda", "float32"), ("cuda", "bf16"))}
    losses = {key: _losses(m) for key, m in runs.items()}
    assert losses["cuda", "float32"] == pytest.approx(losses["cpu", "float32"], rel=0.002)
    assert losses["cuda", "bf16"] == pytest.approx(losses["cpu", "float32"], rel=0.03)
    assert losses["cuda", "bf16"] != losses["cuda", "float32"]
    weights = load_file(str(runs["cuda", "bf16"] / "model.safetensors"))
    assert all(w.device.type == "cpu" and w.dtype == torch.float32 for w in weights.values())


@pytest.mark.gpu
def test_a_cpu_run_resumes_on_cuda(tmp_path):
    whole = train(replace(TINY, out_dir=str(tmp_path / "whole"), steps=6))
    train(replace(TINY, out_dir=str(tmp_path / "split"), steps=6), stop_at=3)
    split = train(replace(TINY, out_dir=str(tmp_path / "split"), steps=6, device="cuda"))
    assert _losses(split) == pytest.approx(_losses(whole), rel=0.002)


def test_too_few_examples_for_one_step_is_an_error_not_a_hang():
    with pytest.raises(DLMError, match="do not fill one step of 4 rows"):
        PackedBatches([([1] * 50, [2] * 5)] * 3, 0, 512, 4, 40, 0)(0)


def test_a_resume_with_other_flags_and_a_stage_with_other_circuits_are_refused(tmp_path):
    run = tmp_path / "a"
    train(replace(TINY, out_dir=str(run)), stop_at=2)
    with pytest.raises(DLMError, match=r"other flags \(--pad-dist 'uniform' -> 'log', --seed 0 -> 7\)"):
        train(replace(TINY, out_dir=str(run), seed=7, pad_dist="log"))
    first = train(replace(TINY, out_dir=str(run), steps=5))          # more steps: the same run, resumed
    assert json.loads((first / "config.json").read_text())["dlm_training"]["pointer_layer"] == 2
    for flags, needle in [({"pointer_layer": 0}, "--pointer-layer 0 (checkpoint: 2)"),
                          ({"hidden_size": 64}, "--hidden-size 64 (checkpoint: 32)")]:
        with pytest.raises(DLMError, match=re.escape(needle)):
            train(replace(TINY, out_dir=str(tmp_path / "b"), init_from=str(first), steps=0, **flags))


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


def test_training_is_deterministic_resumable_and_loads_in_the_engine(tmp_path):
    straight = train(replace(TINY, out_dir=str(tmp_path / "a")))
    half = train(replace(TINY, out_dir=str(tmp_path / "b")), stop_at=2)     # interrupted
    first, second = (tmp_path / "b" / "loss.csv").read_text().splitlines()
    step2_loss = second.split(",")[1]
    # step 2 as if the run had been going 1000 s at an EMA of 5, then a step logged after the last
    # save and a line cut short by the kill
    (tmp_path / "b" / "loss.csv").write_text(f"{first}\n2,{step2_loss},5.0,1000.0\n3,9.0,9.0,1.0\n4")
    resumed = train(replace(TINY, out_dir=str(tmp_path / "b")))
    assert half == resumed
    log = [[float(x) for x in line.split(",")] for line in (tmp_path / "b" / "loss.csv").read_text().splitlines()]
    assert [int(row[0]) for row in log] == [1, 2, 3, 4]
    assert log[2][2] == pytest.approx(0.98 * 5.0 + 0.02 * log[2][1], abs=1e-4)     # the EMA goes on
    assert log[2][3] >= 1000.0                                                     # and so does the clock
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


def _packed_pairs(folder, n=120, seed=3, **model):
    """A corpus slice encoded with its own small tokenizer, and the model config for it."""
    examples = corpus.generate(n, seed=seed)
    tok = build_tokenizer([e.target + json.dumps(e.messages) for e in examples], 512)
    config = model_config(replace(TINY, **model), tok)
    write_checkpoint_files(folder, config, tok)
    return encode_examples(examples, ChatTokenizer(folder), 512), config


def test_packed_rows_compute_each_example_as_if_alone(tmp_path):
    from dlm_backend.engine.layers import AttentionContext, attention_context
    from dlm_backend.engine.models.dream import DreamModel
    from dlm_backend.training.train import init_weights

    pairs, config = _packed_pairs(tmp_path, hidden_size=64, num_layers=2)
    batches = PackedBatches(pairs, seed=0, max_len=512, rows=3, max_extra_pad=8, eos=config["eos_token_id"])
    batch = batches(1)
    assert torch.equal(batches(1).ids, batch.ids)                            # a pure function of the step
    assert batch.ids.shape == (3, 512)
    assert (batch.ex >= 0).float().mean() > 0.7                              # little of a row unused
    model = DreamModel.from_config(config)
    init_weights(model, 0)
    model.setup("cpu")
    with torch.no_grad(), attention_context(AttentionContext(rows=(3, 512), attend=batch.attend)):
        packed = model(batch.ids.reshape(-1), batch.pos.reshape(-1)).view(3, 512, -1)
    for e in range(int(batch.ex.max()) + 1):
        r, cols = (batch.ex == e).nonzero(as_tuple=True)
        ids = batch.ids[r, cols]
        assert batch.pos[r, cols].tolist() == list(range(len(ids)))          # positions restart
        assert ids[:batch.prompt_len[e]].tolist() == pairs[[p for p, _ in pairs].index(
            ids[:batch.prompt_len[e]].tolist())][0]
        with torch.no_grad(), attention_context(AttentionContext(rows=(1, len(ids)))):
            alone = model(ids, torch.arange(len(ids)))
        torch.testing.assert_close(packed[r, cols], alone, atol=1e-4, rtol=1e-4)


def test_mask_covers_replies_or_whole_examples_at_ratio_t(tmp_path):
    from dlm_backend.training.objective import sample_mask

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


def test_eval_runs_on_a_small_slice(tmp_path):
    model = train(replace(TINY, out_dir=str(tmp_path / "m"), steps=1))
    rows = evaluate(str(model), per_family=1, configs=default_configs(16, 8)[:2])
    assert {r["family"] for r in rows} - {"qa: distractor", "qa: not in context"} == set(corpus.EVAL_FAMILIES) | {"all"}
    assert all(0 <= r["exact"] <= 1 and r["passes_per_token"] > 0 for r in rows)
    assert all(r["exact_ci95"][0] <= r["exact"] <= r["exact_ci95"][1] for r in rows)
    assert format_table(rows).count("\n") == len(rows) + 1
    assert len(held_out(2)) == 2 * len(corpus.EVAL_FAMILIES)


def test_length_buckets_give_the_row_masks_loss_and_gradients(tmp_path):
    from dlm_backend.engine.models.dream import DreamModel
    from dlm_backend.training.objective import diffusion_loss
    from dlm_backend.training.train import init_weights

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
    import torch.nn.functional as F

    from dlm_backend.engine.layers import AttentionContext, attention_context
    from dlm_backend.engine.models.dream import DreamModel
    from dlm_backend.training.objective import diffusion_loss
    from dlm_backend.training.train import ar_share, init_weights

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
            with attention_context(AttentionContext(rows=(1, len(ids)), attend=causal)):
                hidden = model(ids, torch.arange(len(ids)))
            ce = F.cross_entropy(model.compute_logits(hidden[:-1]), ids[1:], reduction="none")
            weight = torch.where(torch.arange(1, len(ids)) < n, 1.0, 0.05)
            expected.append((ce * weight).sum() / (n - 1))
    torch.testing.assert_close(loss, torch.stack(expected).mean(), atol=1e-4, rtol=1e-4)
    cfg = replace(TINY, steps=100, ar_until=0.5)
    assert [ar_share(s, cfg) for s in (0, 25, 50, 99)] == [1.0, 0.5, 0.0, 0.0]


def test_a_word_tokenizes_the_same_wherever_it_stands():
    examples = corpus.generate(200, seed=0)
    tok = build_tokenizer([json.dumps(e.messages) + " " + e.target for e in examples], 512)
    pieces = lambda text: tok.encode(text).tokens                                  # noqa: E731
    word = pieces("Krexrou")
    assert pieces(" Krexrou.") == ["Ġ", *word, "."]           # after a space: the space is its own token
    assert pieces('"Krexrou"') == ['"', *word, '"']           # after a quote: the same pieces
    assert pieces("21098") == list("21098")                   # digits one by one
    assert tok.decode(tok.encode('in Krexrou, "Oslo" 42').ids) == 'in Krexrou, "Oslo" 42'


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
