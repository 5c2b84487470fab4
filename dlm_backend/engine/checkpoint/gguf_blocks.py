"""GGUF's quantized blocks unpacked into the engine's canonical integer weight (quant/int_weight.py):
``W[n, k] = q[n, k] * scale[n, k // g] + offset[n, k // g]``.

ggml stores a ``[N, K]`` weight row by row, each row as ``K / B`` blocks of ``B`` weights (B = 32 for
the legacy types, 256 for the K-quants, whose super-block holds 8 sub-blocks of 32 or 16 of 16). Each
block carries float16 scale(s) and packed levels; unpacked, a block becomes levels, a scale and an
offset per group of 32 (or 16) columns, which IntWeight runs as it runs GPTQ or on-the-fly int4.

The arithmetic is the one llama.cpp's reference (and the ``gguf`` package's ``gguf.quants``) uses,
in the same float32 order wherever it matters, so ``IntWeight.dequantize()`` equals
``gguf.quants.dequantize`` bit for bit: each ``q * scale`` is exact (an f16 scale has 11 significant
bits, times a 6-bit sub-block scale is at most 18, times a level of at most 6 bits is 24: the float32
significand), and the one rounding is the final add, as in the reference. One difference of sign
only: Q4_0/Q5_0 levels stay unsigned (so the int4 kernel can take Q4_0), and ``q d - 8 d`` is +0
where the reference's ``d (q - 8)`` is -0 for a negative d.

Layouts (bytes per block): Q4_0 18 = d f16, 16 B of nibbles (low nibbles: weights 0..15, high:
16..31), w = d (q - 8); Q4_1 20 = d, m, nibbles, w = d q + m; Q5_0 22 = d, 4 B high bits, nibbles,
w = d (q - 16); Q5_1 24 = d, m, high bits, nibbles; Q8_0 34 = d, 32 int8, w = d q; Q2_K 84, Q3_K 110,
Q4_K 144, Q5_K 176, Q6_K 210: see each decoder.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T

#: (levels [N, K] uint8 or int8, scale [N, G] float32, offset [N, G] float32 or None, bits)
Unpacked = tuple[np.ndarray, np.ndarray, np.ndarray | None, int]


def _f16(b: np.ndarray) -> np.ndarray:
    """Two bytes per entry, little-endian float16 -> float32 (exact: every f16 is a float32)."""
    return np.ascontiguousarray(b).view(np.float16)[..., 0].astype(np.float32)


def _bits(packed: np.ndarray, width: int, count: int) -> np.ndarray:
    """[..., B] bytes -> [..., count, B]: field i of each byte (``width`` bits from bit ``i * width``)."""
    shifts = np.arange(0, width * count, width, dtype=np.uint8).reshape(count, 1)
    return (packed[..., None, :] >> shifts) & ((1 << width) - 1)


def _nibbles(qs: np.ndarray, run: int) -> np.ndarray:
    """[..., run * j] bytes -> [..., 2 * run * j] levels: each run of bytes holds 2 * run weights, the
    first ``run`` in the low nibbles, the next ``run`` in the high (run 16 in Q4_0, 32 in Q4_K)."""
    *lead, n = qs.shape
    return _bits(qs.reshape(*lead, n // run, run), 4, 2).reshape(*lead, n * 2)


def _q4_0(b: np.ndarray) -> Unpacked:                         # b: [N, nb, 18]
    d = _f16(b[..., 0:2])                                       # [N, nb]
    return _nibbles(b[..., 2:], 16), d, -8 * d, 4                   # w = q d - 8 d = d (q - 8): exact


def _q4_1(b: np.ndarray) -> Unpacked:                         # [N, nb, 20]
    return _nibbles(b[..., 4:], 16), _f16(b[..., 0:2]), _f16(b[..., 2:4]), 4


def _high_bit(qh: np.ndarray) -> np.ndarray:
    """4 bytes (a little-endian u32 whose bit j is weight j's fifth bit) -> [..., 32] of 0/1."""
    return _bits(qh, 1, 8).swapaxes(-1, -2).reshape(*qh.shape[:-1], 32)


def _q5_0(b: np.ndarray) -> Unpacked:                         # [N, nb, 22]
    d = _f16(b[..., 0:2])
    return _nibbles(b[..., 6:], 16) | (_high_bit(b[..., 2:6]) << 4), d, -16 * d, 5


def _q5_1(b: np.ndarray) -> Unpacked:                         # [N, nb, 24]
    return _nibbles(b[..., 8:], 16) | (_high_bit(b[..., 4:8]) << 4), _f16(b[..., 0:2]), _f16(b[..., 2:4]), 5


def _q8_0(b: np.ndarray) -> Unpacked:                         # [N, nb, 34]
    return np.ascontiguousarray(b[..., 2:]).view(np.int8), _f16(b[..., 0:2]), None, 8


def _k_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 bytes -> 8 six-bit scales and 8 six-bit mins: bytes 0-3 hold scales 0-3 (low 6
    bits) and the top 2 bits of scales 4-7, bytes 4-7 the same for the mins, bytes 8-11 the low 4 bits
    of scales 4-7 (low nibble) and mins 4-7 (high nibble)."""
    lo_s, lo_m, hi = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = np.concatenate([lo_s & 63, (hi & 15) | ((lo_s >> 2) & 48)], axis=-1)
    mn = np.concatenate([lo_m & 63, (hi >> 4) | ((lo_m >> 2) & 48)], axis=-1)
    return sc.astype(np.float32), mn.astype(np.float32)


def _q4_k(b: np.ndarray) -> Unpacked:                         # [N, nb, 144]: d, dmin, scales 12, qs 128
    d, dmin = _f16(b[..., 0:2])[..., None], _f16(b[..., 2:4])[..., None]
    sc, mn = _k_scales(b[..., 4:16])                            # [N, nb, 8]: one per 32 weights
    q = _nibbles(b[..., 16:], 32)                                   # 4 runs of 32 bytes: 64 weights each
    return q, d * sc, -(dmin * mn), 4                           # w = (d sc) q - dmin m


def _q5_k(b: np.ndarray) -> Unpacked:                         # [N, nb, 176]: d, dmin, scales, qh 32, qs 128
    d, dmin = _f16(b[..., 0:2])[..., None], _f16(b[..., 2:4])[..., None]
    sc, mn = _k_scales(b[..., 4:16])
    high = _bits(b[..., 16:48], 1, 8)                           # [N, nb, 8, 32]: bit i -> sub-block i
    q = _nibbles(b[..., 48:], 32) | (high.reshape(*b.shape[:-1], 256) << 4)
    return q, d * sc, -(dmin * mn), 5


def _q6_k(b: np.ndarray) -> Unpacked:                         # [N, nb, 210]: ql 128, qh 64, scales 16 i8, d
    lead = b.shape[:-1]
    ql = _bits(b[..., 0:128].reshape(*lead, 2, 64), 4, 2)       # [N, nb, 2, 2, 64]: halves of 128 weights
    qh = _bits(b[..., 128:192].reshape(*lead, 2, 32), 2, 4)     # [N, nb, 2, 4, 32]
    q = (ql.reshape(*lead, 256) | (qh.reshape(*lead, 256) << 4)).astype(np.int8) - np.int8(32)
    sc = np.ascontiguousarray(b[..., 192:208]).view(np.int8).astype(np.float32)     # [N, nb, 16]
    return q, _f16(b[..., 208:210])[..., None] * sc, None, 6    # w = (d sc) (q - 32), group 16


def _q2_k(b: np.ndarray) -> Unpacked:                         # [N, nb, 84]: scales 16, qs 64, d, dmin
    lead = b.shape[:-1]
    sc = b[..., 0:16]                                           # low nibble: scale, high: min (16 each)
    q = _bits(b[..., 16:80].reshape(*lead, 2, 32), 2, 4).reshape(*lead, 256)
    d, dmin = _f16(b[..., 80:82])[..., None], _f16(b[..., 82:84])[..., None]
    return q, d * (sc & 15).astype(np.float32), -(dmin * (sc >> 4).astype(np.float32)), 2


def _q3_k(b: np.ndarray) -> Unpacked:                         # [N, nb, 110]: hmask 32, qs 64, scales 12, d
    lead = b.shape[:-1]
    s = b[..., 96:108]
    low = _bits(s[..., 0:8], 4, 2).reshape(*lead, 16)          # scales 0-7: low nibbles, 8-15: high
    high = _bits(s[..., 8:12], 2, 4).reshape(*lead, 16)        # two more bits each, from bytes 8-11
    sc = ((low | (high << 4)).astype(np.int8) - np.int8(32)).astype(np.float32)
    ql = _bits(b[..., 32:96].reshape(*lead, 2, 32), 2, 4).reshape(*lead, 256)
    hm = _bits(b[..., 0:32], 1, 8).reshape(*lead, 256)          # a clear bit subtracts 4
    q = ql.astype(np.int8) - ((1 - hm) << 2).astype(np.int8)    # [-4, 3]
    return q, _f16(b[..., 108:110])[..., None] * sc, None, 3


DECODERS: dict[T, Callable[[np.ndarray], Unpacked]] = {
    T.Q4_0: _q4_0, T.Q4_1: _q4_1, T.Q5_0: _q5_0, T.Q5_1: _q5_1, T.Q8_0: _q8_0,
    T.Q2_K: _q2_k, T.Q3_K: _q3_k, T.Q4_K: _q4_k, T.Q5_K: _q5_k, T.Q6_K: _q6_k,
}


def unpack(raw: np.ndarray, qtype: T, rows: int, cols: int) -> Unpacked:
    """A ``[rows, cols]`` weight's blocks (``raw``: its bytes, ``rows * cols / B * bytes-per-block``)
    as levels ``[rows, cols]``, scale and offset ``[rows, groups]`` and the level width in bits."""
    block, size = GGML_QUANT_SIZES[qtype]
    blocks = np.asarray(raw, dtype=np.uint8).reshape(rows, cols // block, size)
    q, scale, offset, bits = DECODERS[qtype](blocks)
    groups = scale.size // rows
    return (q.reshape(rows, cols), scale.reshape(rows, groups),
            None if offset is None else offset.reshape(rows, groups), bits)
