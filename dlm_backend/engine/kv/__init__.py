"""The paged KV cache: the pool of pages on the device (runner side) and who owns which page
(engine side: admission is by free pages, and full prompt pages are shared by hash)."""

from dlm_backend.engine.kv.pages import PageAllocator, page_hashes
from dlm_backend.engine.kv.pool import KVPool

__all__ = ["KVPool", "PageAllocator", "page_hashes"]
