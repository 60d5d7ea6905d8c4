"""``RadixCache``: the ``prefix_cache`` mode's cache, a radix tree over segment keys whose nodes hold
state-pool pages (shared by reference, never copied) and linear-state snapshots.

A path root -> n1 -> ... -> nd is a prompt prefix: node ni is the i-th segment (keyed by its content
key, ``Engine.entry_key(seg, tenant, 0)``) behind exactly the segments above it, covering token
positions ``[start, end)``. Each node references the pool pages that hold the attention KV of its
positions (``pages``: the pages of page indices ``start // page_size`` .. ``(end - 1) // page_size``,
one reference each, ``StatePool.share``); a page straddling two segments is in both nodes, and a
child's copy of it wins (its rows before the child's start are the parent's tokens, equal there).
A node can also hold a snapshot (``StatePool.save_snapshot``): every linear layer's recurrent and
conv state after its ``end``. As in SGLang's MambaRadixCache, linear states exist only where a
prefill stopped or was split (a prefill row's linear mixers run in two parts at a prefix boundary
and write the state between them into a reserved row: ``reserve_snapshot``, ``plan.RowSnapshot``),
so a request resumes only at a node with a snapshot (the deepest on its path).

* ``match(keys)``: the deepest node with a snapshot; the hit's pages begin the request's block
  table (``StatePool.alloc(tokens, shared=hit.shared)``), ``restore`` copies the snapshot into its
  slot and the partial last page (a boundary that is not page-aligned) into its own page
  (copy-on-write: the request writes its next positions there, never into a shared page).
* ``insert(keys, seg_lens, seq, snapshot=None)``: at a request's boundary: new nodes reference
  ``seq``'s pages (no copy; ``seq`` writes only later positions, which a node never covers: rows
  past a node's end in its last page are never read from the tree), the end node gets a snapshot
  of ``seq``'s slot (its state ends right after its segments) or the row ``snapshot`` that the
  forward passing the boundary filled (``seq`` may be longer then).
* Locks: a request holds its hit (and, once it inserted, its end node) until it is retired; a
  lock counts on every node up to the root. ``evict(pages)`` removes the least recently used
  unlocked leaves until that many pages went back to the free list; a snapshot row is taken from
  the least recently used unlocked node when none is free. A locked node is never evicted.

Engine thread only (the scheduler's step); the pool's own lock guards its counts.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from hypic_agent.runtime.runner.pool import PoolSeq, StatePool


@dataclass(eq=False)
class RadixNode:
    key: str
    parent: RadixNode | None
    start: int  # first token position of this segment
    end: int  # one past its last
    pages: list[int] = field(default_factory=list)  # pages of page indices start // ps .. (end - 1) // ps
    snapshot: int | None = None  # pool snapshot row: linear state after ``end``
    children: dict[str, RadixNode] = field(default_factory=dict)
    locks: int = 0  # holds at this node or below it
    last_used: int = 0

    def path(self) -> list[RadixNode]:
        """The nodes from the root's child down to this one."""
        out: list[RadixNode] = []
        n: RadixNode | None = self
        while n is not None and n.parent is not None:
            out.append(n)
            n = n.parent
        return out[::-1]


@dataclass(frozen=True)
class RadixHit:
    """A matched prefix: its first ``depth`` segments (``tokens`` positions), ``node`` (locked for
    the request), ``pages`` covering positions ``0..tokens-1`` and the ``snapshot`` after them."""

    node: RadixNode
    depth: int
    tokens: int
    pages: tuple[int, ...]
    snapshot: int
    page_size: int

    @property
    def shared(self) -> tuple[int, ...]:
        """The full pages, shared with the request as they are."""
        return self.pages[: self.tokens // self.page_size]

    @property
    def partial(self) -> int | None:
        """The last page when the prefix ends inside it (copied into the request's own page)."""
        return self.pages[-1] if self.tokens % self.page_size else None


@dataclass(frozen=True)
class RadixStats:
    nodes: int
    pages: int  # distinct pool pages the tree references
    snapshots: int
    hits: int
    hit_tokens: int
    inserts: int
    evicted_nodes: int


class RadixCache:
    def __init__(self, pool: StatePool) -> None:
        self.pool = pool
        self.root = RadixNode("", None, 0, 0)
        self._clock = itertools.count(1)
        self._n_nodes = 0
        self._snap_nodes: dict[int, RadixNode] = {}  # snapshot row -> node
        self._page_refs: dict[int, int] = {}  # page -> nodes referencing it
        self.hits = self.hit_tokens = self.inserts = self.evicted_nodes = 0

    # ------------------------------------------------------------------ lookup
    def match(self, keys: Sequence[str]) -> RadixHit | None:
        """The longest prefix of ``keys`` that ends at a node with a snapshot (None: none), locked
        (``unlock(hit.node)`` when the request is done with it)."""
        node, best = self.root, None
        for k in keys:
            child = node.children.get(k)
            if child is None:
                break
            node = child
            if node.snapshot is not None:
                best = node
        if best is None:
            return None
        path = best.path()
        now = next(self._clock)
        for n in path:
            n.last_used = now
        self.lock(best)
        self.hits += 1
        self.hit_tokens += best.end
        assert best.snapshot is not None
        return RadixHit(best, len(path), best.end, tuple(self._table(path)), best.snapshot, self.pool.page_size)

    def _table(self, path: Sequence[RadixNode]) -> list[int]:
        """Block table of positions ``0..path[-1].end - 1``: each node's pages from its first page
        index on (a straddling page: the deeper node's)."""
        table: list[int] = []
        for n in path:
            if n.pages:
                table[n.start // self.pool.page_size :] = n.pages
        return table

    def restore(self, hit: RadixHit, seq: PoolSeq) -> None:
        """Resume ``seq`` (allocated with ``shared=hit.shared``) at the hit: the snapshot into its slot,
        the partial last page copied into its own page, its length the hit's tokens."""
        n = len(hit.shared)
        if list(seq.pages[:n]) != list(hit.shared):
            raise ValueError("the sequence's block table does not start with the hit's pages")
        self.pool.load_snapshot(hit.snapshot, seq.slot)
        if hit.partial is not None:
            self.pool.copy_page(hit.partial, seq.pages[n])
        seq.length = hit.tokens

    # ------------------------------------------------------------------ insert
    def reserve_snapshot(self) -> int | None:
        """A snapshot row for a forward to fill at a boundary it passes (``insert(..., snapshot=)``),
        taken from the least recently used unlocked node when none is free; None when every row is
        held by a locked node. Give it back with ``release_snapshot`` if it is not inserted."""
        snap = self.pool.take_snapshot()
        if snap is None and self._drop_lru_snapshot():
            snap = self.pool.take_snapshot()
        return snap

    def release_snapshot(self, snap: int) -> None:
        self.pool.drop_snapshot(snap)

    def insert(
        self, keys: Sequence[str], seg_lens: Sequence[int], seq: PoolSeq, snapshot: int | None = None
    ) -> RadixNode | None:
        """Record the segments ``keys`` (of ``seg_lens`` tokens) that ``seq`` holds: new nodes
        reference ``seq``'s pages, the end node gets the linear state after them: ``snapshot`` (a
        reserved row the forward filled; ``seq`` may hold more tokens then, and the row is the
        cache's now, given back if the node has one already) or else a snapshot of ``seq``'s slot
        (its state must end right after the segments). Returns the end node, locked for the
        request; None when no snapshot row could be had (every one held by a locked node): nothing
        is kept then."""
        if len(keys) != len(seg_lens) or not keys:
            raise ValueError("insert needs one length per key, and at least one")
        n_tokens = sum(seg_lens)
        if seq.length != n_tokens and not (snapshot is not None and seq.length > n_tokens):
            raise ValueError(f"the sequence holds {seq.length} tokens, its segments {n_tokens}")
        ps = self.pool.page_size
        now = next(self._clock)
        self.inserts += 1
        node, start = self.root, 0
        for key, n in zip(keys, seg_lens, strict=True):
            child = node.children.get(key)
            if child is None:
                end = start + n
                pages = list(seq.pages[start // ps : -(-end // ps)]) if n else []
                self.pool.share(pages)
                for pg in pages:
                    self._page_refs[pg] = self._page_refs.get(pg, 0) + 1
                child = RadixNode(key, node, start, end, pages)
                node.children[key] = child
                self._n_nodes += 1
            child.last_used = now
            node, start = child, child.end
        self.lock(node)  # before taking a snapshot row: making room never evicts this path
        if node.snapshot is not None:
            if snapshot is not None:
                self.pool.drop_snapshot(snapshot)
            return node
        snap = snapshot
        if snap is None:
            snap = self.pool.save_snapshot(seq.slot)
            if snap is None and self._drop_lru_snapshot():
                snap = self.pool.save_snapshot(seq.slot)
        if snap is None:
            self.unlock(node)
            self._prune(node)
            return None
        node.snapshot = snap
        self._snap_nodes[snap] = node
        return node

    # ------------------------------------------------------------------ locks
    def lock(self, node: RadixNode) -> None:
        n: RadixNode | None = node
        while n is not None:
            n.locks += 1
            n = n.parent

    def unlock(self, node: RadixNode) -> None:
        n: RadixNode | None = node
        while n is not None:
            if n.locks <= 0:
                raise RuntimeError("radix node unlocked more often than locked")
            n.locks -= 1
            n = n.parent

    # ------------------------------------------------------------------ eviction
    def evict(self, pages: int) -> int:
        """Remove least recently used unlocked leaves (and the ancestors that become unlocked leaves)
        until ``pages`` pages went back to the pool's free list or nothing more can go; returns the
        pages freed."""
        freed = 0
        heap = [(n.last_used, id(n), n) for n in self._nodes() if not n.children and n.locks == 0]
        heapq.heapify(heap)
        while freed < pages and heap:
            _, _, n = heapq.heappop(heap)
            parent = n.parent
            assert parent is not None
            freed += self._remove(n)
            freed += self._prune(parent)  # an ancestor left without children or snapshot goes now
            if parent.parent is not None and parent.snapshot is not None and not parent.children and not parent.locks:
                heapq.heappush(heap, (parent.last_used, id(parent), parent))
        return freed

    def clear(self) -> int:
        """Evict every unlocked node; returns the pages freed."""
        return self.evict(self.pool.n_pages + 1)

    def _drop_lru_snapshot(self) -> bool:
        """Free the snapshot row of the least recently used unlocked node (a leaf goes whole, pages
        too); False when every snapshot is held by a locked node."""
        free = [n for n in self._snap_nodes.values() if n.locks == 0]
        if not free:
            return False
        victim = min(free, key=lambda n: n.last_used)
        if victim.children:
            self._drop_snapshot(victim)
        else:
            parent = victim.parent
            self._remove(victim)
            if parent is not None:
                self._prune(parent)
        return True

    def _drop_snapshot(self, n: RadixNode) -> None:
        if n.snapshot is not None:
            del self._snap_nodes[n.snapshot]
            self.pool.drop_snapshot(n.snapshot)
            n.snapshot = None

    def _remove(self, n: RadixNode) -> int:
        """Detach leaf ``n``: its snapshot row and its page references go back; returns pages freed."""
        assert not n.children and n.locks == 0 and n.parent is not None
        self._drop_snapshot(n)
        freed = self.pool.release(n.pages)
        for pg in n.pages:
            left = self._page_refs.pop(pg) - 1
            if left:
                self._page_refs[pg] = left
        del n.parent.children[n.key]
        n.pages = []
        self._n_nodes -= 1
        self.evicted_nodes += 1
        return freed

    def _prune(self, n: RadixNode) -> int:
        """Remove ``n`` and its ancestors while each is an unlocked leaf without a snapshot (no
        request can resume there, and nothing below needs its pages); returns the pages freed."""
        freed = 0
        while n is not self.root and not n.children and n.locks == 0 and n.snapshot is None:
            parent = n.parent
            assert parent is not None
            freed += self._remove(n)
            n = parent
        return freed

    # ------------------------------------------------------------------ introspection
    def _nodes(self) -> Iterator[RadixNode]:
        stack = list(self.root.children.values())
        while stack:
            n = stack.pop()
            yield n
            stack.extend(n.children.values())

    def stats(self) -> RadixStats:
        """Counters only (readable from another thread, e.g. a ``/metrics`` scrape)."""
        return RadixStats(
            self._n_nodes,
            len(self._page_refs),
            len(self._snap_nodes),
            self.hits,
            self.hit_tokens,
            self.inserts,
            self.evicted_nodes,
        )
