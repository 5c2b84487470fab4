"""DiffusionGemma: both config forms load the same model, the vision tower is left out, variants that
are not implemented are refused, and the encoder keeps its own layer scalars. The forward tensors
themselves (encoder, routers, KV cache, decoder) are checked by ``dlm parity`` (tests/parity)."""

import json
import shutil

import pytest
import torch
from tests.helpers import FIXTURES
from safetensors.torch import load_file, save_file

from dlm_backend.engine.checkpoint.folder import read_config
from dlm_backend.engine.models.diffusion_gemma import inverse_frequencies
from dlm_backend.engine.checkpoint.weights import load_model
from dlm_backend.errors import CheckpointError
from dlm_backend.parity.forward import PagedRun

FIXTURE = FIXTURES / "parity-block" / "diffusiongemma-tiny"
CASES = json.loads((FIXTURE / "cases.json").read_text())
EXPECTED = load_file(str(FIXTURE / "expected_logits.safetensors"))
CPU, FP32 = torch.device("cpu"), torch.float32


def _copy(tmp_path, edit=None, tensors=None):
    folder = shutil.copytree(FIXTURE, tmp_path / "dg")
    config = json.loads((folder / "config.json").read_text())
    if edit:
        edit(config)
    (folder / "config.json").write_text(json.dumps(config))
    if tensors is not None:
        save_file(tensors(load_file(str(folder / "model.safetensors"))), str(folder / "model.safetensors"))
    return folder


def _encoder_logits(model, ids):
    run = PagedRun(model, len(ids), block=1)
    return model.compute_logits(run.hidden(ids, 0, len(ids)))


def test_the_save_pretrained_form_of_the_config_loads_the_same_model(tmp_path):
    def normalised(c):
        text = c["text_config"]
        for key in ("global_head_dim", "num_global_key_value_heads", "attention_k_eq_v", "final_logit_softcapping"):
            text.pop(key)
        text["per_layer_config"] = CASES["per_layer_config_as_saved_by_transformers"]
    folder = _copy(tmp_path, normalised)
    model = load_model(folder, read_config(folder), CPU, FP32)
    assert model.args.kv_shapes == ((2, 16), (2, 16), (1, 32)) and model.gemma.softcap == 30.0
    ids = EXPECTED["enc0.input_ids"][0]
    torch.testing.assert_close(_encoder_logits(model, ids)[None], EXPECTED["enc0.logits"], atol=1e-4, rtol=1e-4)


def test_the_vision_tower_is_not_loaded_but_any_other_stray_tensor_is_an_error(tmp_path):
    model = load_model(FIXTURE, read_config(FIXTURE), CPU, FP32)
    assert not any("vision" in name for name in model.state_dict())

    def stray(t):
        return {**t, "model.decoder.layers.0.self_attn.v_proj.bias": torch.zeros(32)}
    folder = _copy(tmp_path, tensors=stray)
    with pytest.raises(CheckpointError, match="v_proj.bias"):
        load_model(folder, read_config(folder), CPU, FP32)


@pytest.mark.parametrize("edit, match", [
    (lambda c: c.update(tie_word_embeddings=False), "tie_word_embeddings"),
    (lambda c: c["text_config"].update(use_bidirectional_attention="all"), "bidirectional"),
    (lambda c: c["text_config"]["rope_parameters"]["full_attention"].update(rope_type="yarn"), "proportional"),
    (lambda c: c["text_config"].update(layer_types=["sliding_attention"]), "layer_types"),
    (lambda c: c["text_config"].update(hidden_activation="silu"), "hidden_activation"),
    (lambda c: c["text_config"].update(num_global_key_value_heads=3), "key/value heads"),
])
def test_variants_that_are_not_implemented_are_refused(tmp_path, edit, match):
    folder = _copy(tmp_path, edit)
    with pytest.raises(CheckpointError, match=match):
        load_model(folder, read_config(folder), CPU, FP32)


def test_proportional_rope_turns_the_first_quarter_of_frequencies_over_the_whole_head():
    freq = inverse_frequencies(32, 1e6, 0.25)              # 16 frequencies, int(0.25 * 32 // 2) = 4 turn
    assert freq.shape == (16,) and (freq[4:] == 0).all()
    torch.testing.assert_close(freq[:4], 1e6 ** (-torch.arange(0, 8, 2).float() / 32))


def test_encoder_rows_use_the_encoders_layer_scalars_and_decoder_rows_the_decoders():
    model = load_model(FIXTURE, read_config(FIXTURE), CPU, FP32)
    ids = EXPECTED["enc0.input_ids"][0]
    canvas = EXPECTED["dec0_first_step.decoder_input_ids"][0]

    def both():
        run = PagedRun(model, len(ids) + len(canvas), block=1)
        enc = model.compute_logits(run.hidden(ids, 0, len(ids)))
        return enc, run.decode(canvas, len(ids))
    enc, dec = both()
    scalar = model.model.decoder.layers[1].layer_scalar
    scalar.mul_(2.0)                                         # the decoder's own, not the encoder's
    try:
        enc2, dec2 = both()
    finally:
        scalar.div_(2.0)
    assert torch.equal(enc, enc2) and not torch.allclose(dec, dec2)


@pytest.mark.parametrize("block", [1, 0], ids=["encoder: causal", "decoder: bidirectional"])
def test_a_sliding_window_hides_the_keys_the_references_sliding_cache_has_dropped(block):
    from dlm_backend.engine.layers.attention import sdpa
    from dlm_backend.engine.layers.paged_attention import paged_attention_ref

    g = torch.Generator().manual_seed(block)
    start, n, window = 21, 16, 8                           # a canvas after 21 cached positions
    k_cache, v_cache = (torch.randn(3, 16, 2, 8, generator=g) for _ in range(2))      # 3 pages of 16
    q = torch.randn(n, 4, 8, generator=g)
    i32 = lambda v: torch.tensor(v, dtype=torch.int32)   # noqa: E731
    got = paged_attention_ref(q, k_cache, v_cache, i32([0, n]), i32([start]), i32([start + n]), i32([[0, 1, 2]]),
                              i32([block]), scale=1.0, window=window)
    qpos, kpos = torch.arange(start, start + n)[:, None], torch.arange(start + n)[None, :]
    # encoder: causal, keys > q - W; decoder: every canvas key, and the last W - 1 cached ones
    mask = (kpos <= qpos) & (kpos > qpos - window) if block else kpos > start - window
    keys, values = (c.reshape(-1, 2, 8)[:start + n].transpose(0, 1)[None] for c in (k_cache, v_cache))
    want = sdpa(q.transpose(0, 1)[None], keys, values, mask, 1.0)[0].transpose(0, 1)
    torch.testing.assert_close(got, want)
