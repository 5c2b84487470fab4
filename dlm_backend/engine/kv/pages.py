"""Which request owns which KV page, and the prefix cache: plain Python, no tensors.

Pages hold ``page_size`` consecutive positions of one sequence. A request reserves every page its
canvas needs when it is admitted, so a running request never runs out; the engine admits the next
waiting request only when its pages are free (admission by KV pages, not by request count).

For block-causal models a page of prompt tokens holds keys and values that depend on nothing but the
tokens up to its end, so full prompt pages are shared: each is named by a hash chained over the
tokens before it, a request that starts with the same tokens maps those pages instead of computing
them, and pages nobody holds stay cached (least recently released evicted first) until their room
is needed. Agents' system prompts and tool schemas, and RAG instructions, are then computed once.
"""

from __future__ import annotations

from collections import OrderedDict, deque


def page_hashes(tokens: list[int], page_size: int, full_pages: int, seed: int = 0) -> list[int]:
    """The chained hash of each of the first ``full_pages`` pages of ``tokens`` (``seed`` names what
    else the keys depend on, e.g. the block length of a block-causal mask)."""
    out, h = [], hash(("dlm-kv", seed))
    for i in range(full_pages):
        h = hash((h, tuple(tokens[i * page_size:(i + 1) * page_size])))
        out.append(h)
    return out


class PageAllocator:
    """Free pages, reference counts and the hash -> page map of the prefix cache."""

    def __init__(self, num_pages: int, page_size: int):
        self.num_pages, self.page_size = num_pages, page_size
        self._free: deque[int] = deque(range(num_pages))     # pages holding nothing reusable
        self._refs = [0] * num_pages
        self._hash_of: dict[int, int] = {}                   # page -> its prefix hash
        self._page_of: dict[int, int] = {}                   # prefix hash -> page
        self._evictable: OrderedDict[int, None] = OrderedDict()   # hashed pages nobody holds, LRU first
        self.lookups = 0                                     # prompt pages looked up in the prefix cache
        self.hits = 0                                        # ... and found there

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

    def reserve(self, needed: int, hashes: list[int]) -> tuple[list[int], int] | None:
        """Pages for a request that needs ``needed`` pages and whose first full prompt pages are named
        by ``hashes``: the cached ones of the longest run of them are shared, the rest allocated.
        Returns (pages, how many are shared), or None (nothing held) when not enough are free."""
        shared = []
        for h in hashes:
            page = self._page_of.get(h)
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
        return shared + self.allocate(needed - len(shared)), len(shared)

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

    def publish(self, page: int, h: int) -> None:
        """Name a page that now holds a full prompt page's keys and values by its prefix hash."""
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
                    self._free.append(page)

    def _hold(self, page: int) -> None:
        if self._refs[page] == 0:
            self._evictable.pop(page, None)
        self._refs[page] += 1
