"""Quality of every quantized format and level against full precision: the table in docs/quantization.md.

Each checkpoint is written in its published layout from a float one (the writers the tests use:
tests/engine/quant/layouts.py for GPTQ/AWQ, fp8_layouts.py for compressed-tensors and block FP8,
tests/engine/checkpoint/gguf_writer.py for GGUF in llama.cpp's converter layout), loaded by the
engine as a user's would be, and compared with the float checkpoint on the same token rows: the
logits' largest error over their standard deviation, and the share of positions whose greedy token
is the float model's. bf16 (the float weights, rounded) is the noise floor each model shows.

    python benchmarks/quant_quality.py                 # parity fixtures llada-tiny and dream-tiny
    python benchmarks/quant_quality.py --medium        # + a d_model 512, 4-layer random LLaDA (slower)
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import gguf  # noqa: E402
from gguf import GGMLQuantizationType as T  # noqa: E402
from tests.engine.checkpoint.gguf_writer import quantize_q4_k, write_gguf  # noqa: E402
from tests.engine.quant import fp8_layouts  # noqa: E402
from tests.engine.quant.layouts import awq_tensors, gptq_tensors, quantize_checkpoint  # noqa: E402
from tests.helpers import make_chat_checkpoint  # noqa: E402

from dlm_backend.engine.checkpoint.load import open_checkpoint  # noqa: E402
from dlm_backend.engine.engine_config import EngineConfig  # noqa: E402
from dlm_backend.engine.quant.methods import METHODS, is_head, quantizable  # noqa: E402
from dlm_backend.parity.forward import packed_logits  # noqa: E402



def load(path: Path, dtype: str = "float32", quantization: str | None = None):
    return open_checkpoint(EngineConfig(str(path), device="cpu", dtype=dtype, quantization=quantization)).model


def body_linears(folder: Path) -> list[str]:
    """The checkpoint's linear weights a quantizer replaces (not the head: GPTQ/AWQ/FP8 releases keep it)."""
    model = load(folder)
    return [n for n, (m, _) in quantizable(model).items() if not is_head(m) and getattr(m, _).dim() == 2]


def variants(src: Path, work: Path):
    """(name, path, dtype, quantization) of every format and level, written from ``src``."""
    yield "bf16 (rounded float weights)", src, "bfloat16", None
    for method in METHODS:
        yield f"on the fly: {method}", src, "float32", method
    names = body_linears(src)
    K = min(load(src).get_parameter(n).shape[1] for n in names)
    group = 128 if K % 128 == 0 else 32
    for label, config, pack in [
            (f"GPTQ 4-bit g{group}", {"bits": 4, "group_size": group}, lambda n, w: gptq_tensors(w, 4, group)),
            ("GPTQ 8-bit per channel", {"bits": 8, "group_size": -1}, lambda n, w: gptq_tensors(w, 8, -1)),
            (f"AWQ 4-bit g{group} (GEMM)", None, lambda n, w: awq_tensors(w, group))]:
        dest = work / label.split()[0].lower() / label.replace(" ", "_")
        shutil.copytree(src, dest)
        quant = ({"quant_method": "gptq", "desc_act": False, "sym": False, **config} if config else
                 {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True, "version": "gemm"})
        quantize_checkpoint(dest, quant, pack, names)
        yield label, dest, "float32", None
    dest = work / "ct"
    fp8_layouts.compressed_tensors(src, dest, weights="channel", activations="token")
    yield "compressed-tensors FP8-dynamic", dest, "float32", None
    block = 128 if K % 128 == 0 else 16
    dest = work / "fp8"
    fp8_layouts.block_fp8(src, dest, block=(block, block))
    yield f"block FP8 {block}x{block}", dest, "float32", None
    # K-quants come in super-blocks of 256 columns (the fixtures' rows are 64 long)
    for kind in (T.F32, T.Q8_0, T.Q5_0, T.Q4_0) + ((T.Q4_K,) if K % 256 == 0 else ()):
        path = work / f"{kind.name}.gguf"
        quantize = (lambda x, k: quantize_q4_k(x)) if kind == T.Q4_K else (lambda x, k: gguf.quants.quantize(x, k))
        write_gguf(src, path, types=lambda n, d, kind=kind: kind if d.ndim == 2 else T.F32, quantize=quantize)
        yield f"GGUF {kind.name}", path, "float32", None


@torch.inference_mode()
def measure(model, reference, rows) -> tuple[float, float]:
    got = packed_logits(model, rows, model.args.block_size).float()
    return float((got - reference).abs().max() / reference.std()), float((got.argmax(-1) == reference.argmax(-1)).float().mean())


def medium_checkpoint(work: Path) -> Path:
    """A d_model 512, 4-layer random LLaDA (MLP 1536) with llada-tiny's tokenizer, saved as a checkpoint."""
    import json

    from gpu_e2e import build_random_llada, llada_config
    from safetensors.torch import save_file

    dest = make_chat_checkpoint(work / "medium", "llada")
    base = json.loads((dest / "config.json").read_text())
    config = {**base, **{k: v for k, v in llada_config(512, 4, 8, 1536, base["vocab_size"], 2048).items()
                         if k not in ("mask_token_id", "eos_token_id", "architectures")}}
    (dest / "config.json").write_text(json.dumps(config, indent=1))
    model = build_random_llada(config, "cpu", torch.float32)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(dest / "model.safetensors"))
    return dest


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--medium", action="store_true")
    a = ap.parse_args(argv)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        # The parity fixtures' weights, with a tokenizer (a GGUF file carries one)
        models = [(f"{f}-tiny", make_chat_checkpoint(Path(tmp) / f"{f}-src", f)) for f in ("llada", "dream")]
        if a.medium:
            models.append(("LLaDA d512 x4 (random)", medium_checkpoint(Path(tmp))))
        print("| model | format | max logit error / std | greedy agreement |\n|---|---|---|---|")
        for name, src in models:
            reference_model = load(src)
            V = reference_model.args.vocab_size
            rows = torch.randint(3, V - 3, (4, 64), generator=torch.Generator().manual_seed(0))
            reference = packed_logits(reference_model, rows, reference_model.args.block_size).float()
            work = Path(tmp) / name.split()[0]
            for label, path, dtype, quantization in variants(src, work):
                err, agree = measure(load(path, dtype, quantization), reference, rows)
                print(f"| {name} | {label} | {err:.3f} | {agree:.3f} |", flush=True)


if __name__ == "__main__":
    main()
