"""The KV pool on the device: every layer's keys and values in pages, sized from a memory budget."""

from __future__ import annotations

import torch

#: Positions per page: at least 16 (kernel tiles) and a multiple of the model's block, so a block
#: never straddles two pages and full prompt pages are block-aligned (the prefix cache needs it).
MIN_PAGE = 16


def page_size_for(block_size: int | None) -> int:
    block = block_size or MIN_PAGE
    return block * -(-MIN_PAGE // block)


class KVPool:
    """``k[layer], v[layer]: [num_pages + 1, page_size, Hkv, D]``; a sequence's page table maps its
    logical pages (positions ``i*page_size ..``) to physical ones. The extra page, :attr:`scratch`,
    belongs to nobody: padding rows of a fixed-shape batch write and read it. Made with
    ``torch.empty``: a page is only written when a request uses it.

    ``shapes`` gives each layer's ``(Hkv, D)``. Layers may differ (DiffusionGemma's sliding layers
    keep 8 heads of 256, its full ones 2 of 512), so layers of one shape share one tensor
    ``[layers, num_pages + 1, page_size, Hkv, D]`` and each layer's entry is a view of it: a page costs
    exactly the sum of its layers' sizes, nothing is padded to the widest layer.
    """

    def __init__(self, shapes: list[tuple[int, int]] | tuple, page_size: int, num_pages: int,
                 dtype: torch.dtype, device: torch.device):
        groups: dict[tuple[int, int], list[int]] = {}
        for layer, shape in enumerate(shapes):
            groups.setdefault(tuple(shape), []).append(layer)
        self.k: list[torch.Tensor] = [None] * len(shapes)      # type: ignore[list-item]
        self.v: list[torch.Tensor] = [None] * len(shapes)      # type: ignore[list-item]
        self.groups: list[tuple[torch.Tensor, torch.Tensor]] = []
        for (heads, dim), layers in groups.items():
            size = (len(layers), num_pages + 1, page_size, heads, dim)
            k = torch.empty(size, dtype=dtype, device=device)
            v = torch.empty(size, dtype=dtype, device=device)
            self.groups.append((k, v))
            for i, layer in enumerate(layers):
                self.k[layer], self.v[layer] = k[i], v[i]
        self.page_size, self.num_pages, self.scratch, self.dtype = page_size, num_pages, num_pages, dtype

    @staticmethod
    def page_bytes(shapes, page_size: int, dtype: torch.dtype) -> int:
        """Bytes one page takes over every layer (keys and values)."""
        item = torch.empty((), dtype=dtype).element_size()
        return sum(2 * page_size * heads * dim * item for heads, dim in shapes)

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.groups)
