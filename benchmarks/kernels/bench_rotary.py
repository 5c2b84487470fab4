"""In-place rotary kernel (q and k in one launch) vs eager torch ``apply_rotary``, both conventions."""

from __future__ import annotations

import torch
from _bench import ms, require_cuda, table


def main() -> None:
    require_cuda("bench_rotary")
    from dlm_backend.engine.kernels.rotary import rotary_
    from dlm_backend.engine.layers.rotary import RotaryTable, apply_rotary

    def rotary_ref(q, k, cos, sin, full):          # the layer's torch path
        c, s = cos[:, None], sin[:, None]
        return apply_rotary(q, c, s, full), apply_rotary(k, c, s, full)

    table_ = RotaryTable(128, 500000.0, 4096, "cuda")
    rows = []
    for T in (32, 1024, 8192, 32768):
        pos = torch.arange(T, device="cuda") % 4096
        cos, sin = table_.cos[pos], table_.sin[pos]
        q = torch.randn(T, 32, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(T, 32, 128, device="cuda", dtype=torch.bfloat16)
        nbytes = 2 * (q.nbytes + k.nbytes) + 2 * cos.nbytes
        for full in (True, False):
            t_tri = ms(lambda: rotary_(q, k, cos, sin, full))
            t_ref = ms(lambda: rotary_ref(q, k, cos, sin, full))
            rows.append([T, "llada" if full else "dream", t_tri, nbytes / t_tri / 1e6, t_ref,
                         nbytes / t_ref / 1e6, t_ref / t_tri])
    table("rotary q+k (bf16, H=32, D=128)", ["tokens", "style", "triton ms", "GB/s", "torch ms", "GB/s",
                                             "speedup"], rows)


if __name__ == "__main__":
    main()
