"""WeDLM's schedule and sampler against a plain loop: on a random tiny WeDLM (the Qwen2.5 form: q/k/v
biases, no QK-norm, tied head), the engine's paged, reordered passes give the tokens and pass counts of
a loop that rebuilds and recomputes the whole reordered sequence every pass, as generate_wedlm does."""

import json

import pytest
import torch
from safetensors.torch import save_file

from dlm_backend.engine.engine import LLMEngine
from dlm_backend.engine.engine_config import EngineConfig
from dlm_backend.engine.layers import ForwardContext, PackedAttention, Segment, forward_context
from dlm_backend.engine.models.wedlm import WeDLMForCausalLM
from dlm_backend.engine.params import SamplingParams
from dlm_backend.errors import SamplingParamsError

MASK, EOS = 90, 91
CONFIG = {"architectures": ["WeDLMForCausalLM"], "model_type": "wedlm", "vocab_size": 96, "hidden_size": 32,
          "intermediate_size": 40, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "max_position_embeddings": 256, "rope_theta": 10000.0, "tie_word_embeddings": True,
          "attention_bias": True, "qk_norm": False, "mask_token_id": MASK, "eos_token_id": EOS}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("wedlm-random")
    g = torch.Generator().manual_seed(3)
    model = WeDLMForCausalLM.from_config(CONFIG)
    tensors = {}
    for name, p in model.state_dict().items():
        if name.endswith("norm.weight"):
            tensors[name] = 1 + 0.1 * torch.randn(p.shape, generator=g)
        else:       # wide values so a mask's row depends on what it attends to, not on its own embedding
            wide = 2.0 if "v_proj" in name or "o_proj" in name else 1.0
            tensors[name] = wide * torch.randn(p.shape, generator=g) / (p.shape[-1] ** 0.5 if p.dim() > 1 else 4)
    tensors["model.embed_tokens.weight"][MASK] *= 0.1
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(CONFIG))
    return folder


def plain_loop(model, prompt, max_new, block, threshold, temperature):
    """generate_wedlm's loop, written plainly: (generated tokens, forwards). Each pass rebuilds the
    sequence as its committed tokens then its masks, each at its own position, and runs it whole."""
    ids, steps = list(prompt), 0
    for start in range(len(prompt), len(prompt) + max_new, block):
        ids += [MASK] * min(block, len(prompt) + max_new - start)
        while MASK in ids:
            order = [i for i, t in enumerate(ids) if t != MASK] + [i for i, t in enumerate(ids) if t == MASK]
            T, n = len(order), sum(t != MASK for t in ids)
            with torch.no_grad(), forward_context(ForwardContext(PackedAttention([Segment(slice(0, T), 0, 1)]))):
                logits = model.compute_logits(model(torch.tensor([ids[i] for i in order]), torch.tensor(order)))
            probs = torch.softmax(logits[n:].float() / (temperature or 1.0), dim=-1)
            probs[:, MASK] = -1                                     # the engine never commits the mask token
            conf, tok = probs.max(-1)
            picked = (conf >= threshold).nonzero()[:, 0].tolist() if threshold else []
            for j in picked or [int(conf.argmax())]:
                ids[order[n + j]] = int(tok[j])
            steps += 1
    return ids[len(prompt):], steps


def _engine(folder, prefix_caching=True):
    return LLMEngine(EngineConfig(str(folder), device="cpu", dtype="float32", prefix_caching=prefix_caching))


def _outputs(engine, prompts, params):
    seqs = [engine.admit(p, params) for p in prompts]
    for seq in seqs:
        engine.enqueue(seq)
    done = {}
    while engine.has_unfinished:
        for chunk in engine.step():
            if chunk.finished:
                done[chunk.request_id] = chunk.output
    return [done[s.request_id] for s in seqs]


PROMPTS = [[(5 * i + k) % 89 for i in range(n)] for k, n in ((0, 3), (7, 12), (20, 21), (41, 1))]


@pytest.mark.parametrize("cache", ["prefix", "none"])
@pytest.mark.parametrize("block,max_new,threshold,temperature", [
    (4, 10, 0.0, 0.0), (8, 13, 0.15, 0.0), (5, 17, 0.1, 0.7), (16, 16, 0.0, 1.5)])
def test_the_engine_equals_the_plain_loop(checkpoint, cache, block, max_new, threshold, temperature):
    engine = _engine(checkpoint)
    try:
        params = SamplingParams(sampler="wedlm", max_tokens=max_new, block_length=block, threshold=threshold or 1.0,
                                remasking="low_confidence_dynamic" if threshold else "low_confidence",
                                temperature=temperature, cache=cache, ignore_eos=True)
        outs = _outputs(engine, PROMPTS, params)             # four requests sharing every forward
        want = [plain_loop(engine.model, p, max_new, block, threshold, temperature) for p in PROMPTS]
    finally:
        engine.close()
    assert [(o.token_ids, o.num_forward_passes) for o in outs] == want
    assert any(steps < max_new for _, steps in want) or not threshold   # some pass commits several slots


def test_the_family_defaults_decode_one_slot_a_pass_in_blocks_of_16(checkpoint):
    engine = _engine(checkpoint)
    try:
        out = _outputs(engine, PROMPTS[:1], SamplingParams(max_tokens=20, ignore_eos=True, **{
            k: v for k, v in engine.sampling_defaults.items()}))[0]
        assert (out.token_ids, out.num_forward_passes) == plain_loop(engine.model, PROMPTS[0], 20, 16, 0.0, 0.0)
    finally:
        engine.close()


def test_a_stop_token_ends_the_output_once_it_is_final(checkpoint):
    engine = _engine(checkpoint)
    try:
        want, _ = plain_loop(engine.model, PROMPTS[1], 12, 4, 0.0, 0.0)
        stop = want[5]
        params = SamplingParams(sampler="wedlm", max_tokens=12, block_length=4, remasking="low_confidence",
                                stop_token_ids=[stop], ignore_eos=True)
        out = _outputs(engine, PROMPTS[1:2], params)[0]
    finally:
        engine.close()
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert out.token_ids == want[:want.index(stop)]


@pytest.mark.parametrize("knobs,match", [
    ({"sampler": "wedlm", "remasking": "random"}, "remasking"),
    ({"sampler": "wedlm", "top_k": 5}, "top_k"),
    ({"sampler": "wedlm", "top_p": 0.9}, "top_p"),
    ({"sampler": "fastdllm2"}, "wedlm"),
    ({"sampler": "llada2_edit"}, "wedlm"),
])
def test_what_the_schedule_cannot_decode_is_refused(checkpoint, knobs, match):
    engine = _engine(checkpoint)
    try:
        with pytest.raises(SamplingParamsError, match=match):
            engine.admit(PROMPTS[0], SamplingParams(max_tokens=8, **knobs))
    finally:
        engine.close()


def test_the_threshold_rule_also_decodes_wedlm(checkpoint):
    """Another mask sampler runs on the reordered passes too (Fast-dLLM's threshold rule here)."""
    engine = _engine(checkpoint)
    try:
        out = _outputs(engine, PROMPTS[:2], SamplingParams(sampler="threshold", threshold=0.2, max_tokens=9,
                                                            block_length=4, ignore_eos=True))
    finally:
        engine.close()
    assert [len(o.token_ids) for o in out] == [9, 9] and all(MASK not in o.token_ids for o in out)
