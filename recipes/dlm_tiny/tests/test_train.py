"""`dlm train`: flags refused before anything is written, precisions and devices that follow the
float32 CPU run, compiled layers, resuming, stages, and a checkpoint the engine loads."""

import json
import re
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

from dlm_backend import LLM, SamplingParams
from dlm_backend.errors import DLMError
from dlm_tiny import corpus
from dlm_tiny.checks import bf16_is_native
from dlm_tiny.train import TrainConfig, train

TINY = TrainConfig(num_examples=300, vocab_size=512, hidden_size=32, num_layers=3, num_heads=2, pointer_layer=2,
                   num_kv_heads=1, intermediate_size=64, rows=4, steps=4, warmup=2, save_every=2)


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
    import dlm_tiny.checks as checks

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
