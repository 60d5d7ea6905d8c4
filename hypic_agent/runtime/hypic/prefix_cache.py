"""A real prefix cache of hybrid states at segment boundaries: the baseline engines offer today.

A trie keyed by the sequence of segment keys. Every node holds the KV rows of its own segment (at
the positions it had behind that exact prefix). Linear-layer states (recurrent + conv) exist only
where a prefill ended, i.e. at the end of each request's segment list, the way SGLang's
MambaRadixCache and vLLM's hybrid prefix caching keep them: a miss is prefilled in one pass, and
a later request can resume only from a node that holds linear states.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from hypic_agent.runtime.state import AttentionLayerState, LayerState, LinearLayerState, RequestState

Pair = tuple[torch.Tensor, torch.Tensor]


@dataclass
class _Node:
    length: int = 0  # prompt tokens covered up to this node's end
    tokens: list[int] = field(default_factory=list)  # this node's segment tokens
    kv: dict[int, Pair] = field(default_factory=dict)  # attention layer -> (k, v) rows of this segment
    linear: dict[int, Pair] | None = None  # linear layer -> (recurrent, conv) at the node's end
    children: dict[str, _Node] = field(default_factory=dict)
    parent: _Node | None = None
    key: str = ""
    last_used: int = 0

    def nbytes(self) -> int:
        pairs = list(self.kv.values()) + list((self.linear or {}).values())
        return sum(a.nbytes + b.nbytes for a, b in pairs)


class PrefixCache:
    def __init__(self, layer_kinds: Sequence[str], max_bytes: int = 0) -> None:
        self.kinds = list(layer_kinds)
        self.max_bytes = max_bytes
        self.root = _Node()
        self.bytes = 0
        self._clock = 0
        self._lock = threading.Lock()

    def lookup(self, keys: Sequence[str]) -> tuple[int, RequestState | None]:
        """Longest reusable prefix of ``keys`` -> (segments matched, state after them)."""
        with self._lock:
            path: list[_Node] = []
            node = self.root
            for k in keys:
                child = node.children.get(k)
                if child is None:
                    break
                path.append(child)
                node = child
            while path and path[-1].linear is None:  # resume only where linear states were kept
                path.pop()
            if not path:
                return 0, None
            self._clock += 1
            for n in path:
                n.last_used = self._clock
            end = path[-1]
            assert end.linear is not None
            layers: list[LayerState] = []
            for li, kind in enumerate(self.kinds):
                if kind == "linear":
                    rec, conv = end.linear[li]
                    layers.append(LinearLayerState(rec.clone(), conv.clone()))
                else:
                    layers.append(
                        AttentionLayerState(
                            torch.cat([n.kv[li][0] for n in path]), torch.cat([n.kv[li][1] for n in path])
                        )
                    )
            return len(path), RequestState(layers, end.length, None, [t for n in path for t in n.tokens])

    def insert(self, keys: Sequence[str], segments: Sequence[Sequence[int]], state: RequestState) -> None:
        """Record the segments ``keys`` (whose tokens are ``segments``) covered by ``state``, which
        must end exactly after the last one; linear states are kept at that end only."""
        with self._lock:
            self._clock += 1
            start = state.length - sum(len(s) for s in segments)
            node = self.root
            for key, seg in zip(keys, segments, strict=True):
                child = node.children.get(key)
                if child is None:
                    kv = {
                        li: (s.k[start : start + len(seg)].clone(), s.v[start : start + len(seg)].clone())
                        for li, s in enumerate(state.layers)
                        if isinstance(s, AttentionLayerState)
                    }
                    child = _Node(start + len(seg), list(seg), kv, None, {}, node, key)
                    node.children[key] = child
                    self.bytes += child.nbytes()
                child.last_used = self._clock
                start += len(seg)
                node = child
            if node is not self.root and node.linear is None:
                node.linear = {
                    li: (s.recurrent.clone(), s.conv.clone())
                    for li, s in enumerate(state.layers)
                    if isinstance(s, LinearLayerState)
                }
                self.bytes += sum(a.nbytes + b.nbytes for a, b in node.linear.values())
            self._evict()

    def _evict(self) -> None:
        while self.max_bytes and self.bytes > self.max_bytes:
            leaves: list[_Node] = []
            stack = list(self.root.children.values())
            while stack:
                n = stack.pop()
                if n.children:
                    stack.extend(n.children.values())
                else:
                    leaves.append(n)
            if len(leaves) <= 1:
                return
            victim = min(leaves, key=lambda n: n.last_used)
            assert victim.parent is not None
            del victim.parent.children[victim.key]
            self.bytes -= victim.nbytes()
