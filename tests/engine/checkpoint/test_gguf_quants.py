"""GGUF's quantized tensors: engine/checkpoint/gguf_blocks.py unpacks each type to exactly what
llama.cpp's gguf package dequantizes, quantized models decode, and split over two ranks. Every file here is written by tests/engine/checkpoint/gguf_writer.py in llama.cpp's converter layout
(LLaDAModel, DreamModel), from the parity fixtures' weights and the test tokenizer of tests/helpers.py."""

import shutil

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from safetensors.numpy import load_file as load_numpy
from safetensors.numpy import save_file as save_numpy

from tests.engine.checkpoint.gguf_writer import (FAMILIES, llama_permute, quantize_q4_k, random_blocks, wide_checkpoint, write_gguf, open_gguf as _open)

from dlm_backend import LLM
from dlm_backend.engine.checkpoint.gguf_blocks import unpack
from dlm_backend.engine.checkpoint.gguf_file import GGUFFile
from dlm_backend.engine.quant.int_weight import IntWeight
from dlm_backend.parity.forward import packed_logits


# --- (b) quantized tensors ------------------------------------------------------------------------

QUANTS = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]


@pytest.mark.parametrize("kind", QUANTS, ids=lambda k: k.name)
def test_each_quantized_type_unpacks_to_exactly_what_gguf_dequantizes(tmp_path, kind):
    """Every 2-D weight stored as ``kind`` (all level bits random, scales random finite f16) reads as an
    IntWeight whose dequantize() is gguf.quants.dequantize of the same bytes: equal in value and bit
    for bit wherever not zero (gguf computes Q4_0's and Q5_0's d * (q - 8); ours, q d - 8 d, gives +0
    where that gives -0 for a negative d)."""
    folder = wide_checkpoint(tmp_path)
    path = write_gguf(folder, tmp_path / "q.gguf", types=lambda n, d: kind if d.ndim == 2 else T.F32,
                      quantize=lambda x, k: random_blocks(x, k, seed=len(x.tobytes())))
    file = GGUFFile(path)
    heads = {"attn_q": 4, "attn_k": 4}
    read = 0
    for entry, tensor in zip(file.source().entries("cpu", lambda n: None), file.reader.tensors):
        if tensor.tensor_type != kind:
            continue
        value = entry.read()
        got = value.dequantize() if isinstance(value, IntWeight) else value
        assert isinstance(value, IntWeight) != entry.name.endswith(("wte.weight", "transformer.ff_out.weight"))
        if isinstance(value, IntWeight):
            assert value.shape == entry.shape and value.bits <= 8
        part = tensor.name.split(".")[2] if tensor.name.startswith("blk.") else ""
        got = got.numpy() if part not in heads else llama_permute(got.numpy(), heads[part])
        want = gguf.quants.dequantize(tensor.data, kind)
        assert np.array_equal(got, want)
        nonzero = want != 0
        assert np.array_equal(got[nonzero].view(np.uint32), want[nonzero].view(np.uint32))
        read += 1
    assert read == 2 + 2 * 7


def test_legacy_types_quantized_by_gguf_unpack_exactly(tmp_path):
    x = np.random.default_rng(1).standard_normal((32, 256)).astype(np.float32)
    for kind in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0):
        raw = gguf.quants.quantize(x, kind)
        q, scale, offset, bits = unpack(raw, kind, 32, 256)
        offset = None if offset is None else torch.from_numpy(offset)
        w = IntWeight(torch.from_numpy(q), torch.from_numpy(scale), offset, bits)
        assert np.array_equal(w.dequantize().numpy(), gguf.quants.dequantize(raw, kind)), kind.name


def _dequantized_twin(folder, dest, family: str, quantize):
    """``folder`` with each 2-D weight replaced by what its quantized blocks stand for
    (``gguf.quants.dequantize``), quantized in the converter's row order (LLaDA's q/k interleaved)."""
    twin = shutil.copytree(folder, dest)
    state = load_numpy(str(folder / "model.safetensors"))
    for name, w in state.items():
        if w.ndim == 2 and family == "llada" and name.endswith(("q_proj.weight", "k_proj.weight")):
            stored = gguf.quants.dequantize(quantize(llama_permute(w, 4)), _KIND[quantize])
            state[name] = stored.reshape(4, -1, 2, w.shape[1]).swapaxes(1, 2).reshape(w.shape)
        elif w.ndim == 2:
            state[name] = gguf.quants.dequantize(quantize(w), _KIND[quantize])
    save_numpy(state, str(twin / "model.safetensors"))
    return twin


def _q8_0(x):
    return gguf.quants.quantize(x, T.Q8_0)


_KIND = {_q8_0: T.Q8_0, quantize_q4_k: T.Q4_K}


@pytest.mark.parametrize("quantize, tol", [(_q8_0, 0.03), (quantize_q4_k, 0.03)], ids=["Q8_0", "Q4_K"])
@pytest.mark.parametrize("family", FAMILIES)
def test_a_quantized_model_decodes_as_the_float_model_of_its_weights(tmp_path, family, quantize, tol):
    """Greedy logits of a Q8_0 / Q4_K file against a float model holding the weights its blocks stand
    for: Q4_K on the int4 kernel, Q8_0 as two 4-bit halves on it, both with bf16 activations
    (measured: Q4_K 1.2% and 0.7% of the largest logit); the same token wins at most positions."""
    folder, kind = wide_checkpoint(tmp_path, family), _KIND[quantize]
    path = write_gguf(folder, tmp_path / "q.gguf", types=lambda n, d: kind if d.ndim == 2 else T.F32,
                      quantize=lambda x, k: quantize(x))
    want, got = _open(_dequantized_twin(folder, tmp_path / "twin", family, quantize)), _open(path)
    kernels = {m.exec for m in got.model.modules() if isinstance(m, IntWeight)}
    assert kernels == ({"int4pack"} if kind == T.Q4_K else {"int4x2"})
    rows = torch.tensor([[18, 6, 128, 277, 152, 118, 81, 36, 3, 146, 13, 205, 300, 300, 300, 300]])
    a, b = packed_logits(want.model, rows, None), packed_logits(got.model, rows, None)
    assert (a - b).abs().max() <= tol * a.abs().max()
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() >= 0.9



def test_a_quantized_gguf_splits_over_two_ranks(tmp_path):
    """The worker rank reads the file through the same config and source (forward/workers.py): two
    gloo ranks give the one-device tokens of a Q8_0 file, each holding its rows or columns of every
    weight."""
    folder = wide_checkpoint(tmp_path)
    path = write_gguf(folder, tmp_path / "q8.gguf", types=lambda n, d: T.Q8_0 if d.ndim == 2 else T.F32)
    prompts = [[5, 6, 7, 8, 9, 10, 11], [20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30]]
    outputs = []
    for ranks in (1, 2):
        with LLM(str(path), device="cpu", dtype="float32", tensor_parallel_size=ranks) as llm:
            params = llm.sampling_params(temperature=0.0, ignore_eos=True, max_tokens=8)
            outputs.append([o.token_ids for o in llm.generate(prompt_token_ids=prompts, sampling_params=params)])
            q = llm.engine.model.model.transformer.blocks[0].q_proj.weight
            assert isinstance(q, IntWeight) and tuple(q.shape) == (256 // ranks, 256)
    assert outputs[0] == outputs[1]
