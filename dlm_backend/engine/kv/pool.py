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
    """``k, v [layers, num_pages + 1, page_size, Hkv, D]``; a sequence's page table maps its logical
    pages (positions ``i*page_size ..``) to physical ones. The extra page, :attr:`scratch`, belongs to
    nobody: padding rows of a fixed-shape batch write and read it. Made with ``torch.empty``: a page
    is only written when a request uses it."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, page_size: int, num_pages: int,
                 dtype: torch.dtype, device: torch.device):
        shape = (num_layers, num_pages + 1, page_size, num_kv_heads, head_dim)
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self.page_size, self.num_pages, self.scratch = page_size, num_pages, num_pages

    @staticmethod
    def page_bytes(num_layers: int, num_kv_heads: int, head_dim: int, page_size: int, dtype: torch.dtype) -> int:
        return 2 * num_layers * page_size * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes
