"""Which request owns which KV page, and the prefix cache: plain Python, no tensors.

Pages hold ``page_size`` consecutive positions of one sequence. A request reserves every page its
canvas needs when it is admitted, so a running request never runs out; the engine admits the next
waiting request only when its pages are free (admission by KV pages, not by request count).

For block-causal models a page of prompt tokens holds keys and values that depend on nothing but the
tokens up to its end, so full prompt pages are shared: each is named by a SHA-256 chained over the
tokens before it (and the request's cache salt), a request that starts with the same tokens maps
those pages instead of computing them, and pages nobody holds stay cached (least recently released
evicted first) until their room is needed. Agents' system prompts and tool schemas, and RAG instructions, are then computed once.

A page is shared from the moment a request reserves it, before its keys are written (*pending*):
requests admitted together with the same system prompt then compute it once, the others waiting
for it (``Scheduler``). Should the request writing a pending page end first, a request sharing it
writes it itself (the same keys: the same tokens at the same positions).
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict, deque


def page_hashes(tokens: list[int], page_size: int, full_pages: int, seed: int = 0, salt: str = "") -> list[bytes]:
    """The name of each of the first ``full_pages`` pages of ``tokens``: SHA-256 chained over the
    pages before it. ``seed`` names what else the keys depend on (the block length of a block-causal
    mask); ``salt`` keeps requests that do not share it apart (a tenant's ``cache_salt``).

    A name is all a lookup compares, so it must not collide: Python's ``hash()`` of a tuple of ints is
    unsalted and 64 bits wide, and two 16-token pages with the same one were found by brute force
    (~3e9 tries), which let one prompt read another's cached keys (vLLM's CVE-2025-25183 is the same
    bug). SHA-256 puts a collision out of reach.
    """
    out, h = [], hashlib.sha256(f"dlm-kv\0{seed}\0{salt}".encode()).digest()
    for i in range(full_pages):
        page = array("q", tokens[i * page_size:(i + 1) * page_size]).tobytes()    # 8 bytes a token: no ambiguity
        h = hashlib.sha256(h + page).digest()
        out.append(h)
    return out


class PageAllocator:
    """Free pages, reference counts and the hash -> page maps of the prefix cache."""

    def __init__(self, num_pages: int, page_size: int):
        self.num_pages, self.page_size = num_pages, page_size
        self._free: deque[int] = deque(range(num_pages))     # pages holding nothing reusable
        self._refs = [0] * num_pages
        self._hash_of: dict[int, bytes] = {}                 # page -> its prefix hash, once written
        self._page_of: dict[bytes, int] = {}                 # prefix hash -> page, once written
        self._pending: dict[bytes, tuple[int, int]] = {}     # prefix hash -> (page, writer) not written yet
        self._pending_name: dict[int, bytes] = {}            # page -> its pending prefix hash
        self._evictable: OrderedDict[int, None] = OrderedDict()   # hashed pages nobody holds, LRU first
        self.lookups = 0                                     # prompt pages looked up in the prefix cache
        self.hits = 0                                        # ... and found there (written or being written)

    @property
    def num_free(self) -> int:
        """Pages a new request can take (evicting cached prefixes nobody holds if need be)."""
        return len(self._free) + len(self._evictable)

    @property
    def num_used(self) -> int:
        return self.num_pages - self.num_free

    @property
    def hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0

    def pages_for(self, positions: int) -> int:
        return -(-positions // self.page_size)

    def reserve(self, needed: int, hashes: list[bytes], writer: int = -1) -> tuple[list[int], int] | None:
        """Pages for request ``writer`` that needs ``needed`` pages and whose first full prompt pages
        are named by ``hashes``: the longest run of them already written or being written is shared,
        the rest allocated (its own prompt pages become pending under ``writer``). Returns (pages,
        how many are shared), or None (nothing held) when not enough are free."""
        shared = []
        for h in hashes:
            page = self._page_of.get(h)
            if page is None and h in self._pending:
                page = self._pending[h][0]
            if page is None:
                break
            shared.append(page)
        idle = sum(self._refs[p] == 0 for p in shared)      # cached pages nobody holds count as free
        if needed - len(shared) > self.num_free - idle:
            return None
        for page in shared:
            self._hold(page)
        self.lookups += len(hashes)
        self.hits += len(shared)
        own = self.allocate(needed - len(shared))
        for h, page in zip(hashes[len(shared):], own):
            self._pending[h] = (page, writer)
            self._pending_name[page] = h
        return shared + own, len(shared)

    def written(self, h: bytes) -> bool:
        """Whether the page named ``h`` holds its keys and values already."""
        return h in self._page_of

    def writer(self, h: bytes) -> int | None:
        """The request writing the pending page named ``h`` (None: not pending)."""
        entry = self._pending.get(h)
        return entry[1] if entry else None

    def allocate(self, n: int) -> list[int]:
        """``n`` pages for one request; the caller checked :attr:`num_free` first."""
        if n > self.num_free:
            raise RuntimeError(f"{n} KV pages asked for, {self.num_free} free")
        pages = []
        for _ in range(n):
            if self._free:
                page = self._free.popleft()
            else:                                             # reuse the least recently released prefix
                page, _ = self._evictable.popitem(last=False)
                del self._page_of[self._hash_of.pop(page)]
            self._refs[page] = 1
            pages.append(page)
        return pages

    def publish(self, page: int, h: bytes) -> None:
        """Name a page that now holds a full prompt page's keys and values by its prefix hash."""
        if self._pending.get(h, (None,))[0] == page:
            del self._pending[h], self._pending_name[page]
        if h not in self._page_of and page not in self._hash_of:
            self._page_of[h] = page
            self._hash_of[page] = h

    def release(self, pages: list[int]) -> None:
        for page in pages:
            self._refs[page] -= 1
            if self._refs[page] == 0:
                if page in self._hash_of:
                    self._evictable[page] = None
                else:
                    # A pending page nobody holds any more was never written: forget its name.
                    h = self._pending_name.pop(page, None)
                    if h is not None:
                        del self._pending[h]
                    self._free.append(page)

    def _hold(self, page: int) -> None:
        if self._refs[page] == 0:
            self._evictable.pop(page, None)
        self._refs[page] += 1
