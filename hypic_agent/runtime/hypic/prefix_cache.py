"""A real prefix cache of hybrid states at segment boundaries: the baseline engines offer today.

A trie keyed by the sequence of segment keys. Each node holds the KV rows of its own segment (at
the positions it had behind that exact prefix) and the linear layers' recurrent + conv states at
its end boundary, like SGLang's MambaRadixCache / vLLM's hybrid prefix caching. A lookup reuses
the longest matching prefix of segments; anything after the first differing segment is recomputed.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from hypic_agent.runtime.state import AttentionLayerState, LayerState, LinearLayerState, RequestState


@dataclass
class _Node:
    length: int = 0  # prompt tokens covered up to this node's end
    tokens: list[int] = field(default_factory=list)  # this node's segment tokens
    layers: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)  # per layer (k|rec, v|conv)
    children: dict[str, _Node] = field(default_factory=dict)
    parent: _Node | None = None
    key: str = ""
    last_used: int = 0

    def nbytes(self) -> int:
        return sum(a.nbytes + b.nbytes for a, b in self.layers)


class PrefixCache:
    def __init__(self, layer_kinds: Sequence[str], max_bytes: int = 0) -> None:
        self.kinds = list(layer_kinds)
        self.max_bytes = max_bytes
        self.root = _Node()
        self.bytes = 0
        self._clock = 0
        self._lock = threading.Lock()

    def lookup(self, keys: Sequence[str]) -> tuple[int, RequestState | None]:
        """Longest cached prefix of ``keys`` -> (number of segments matched, state after them)."""
        with self._lock:
            path: list[_Node] = []
            node = self.root
            for k in keys:
                child = node.children.get(k)
                if child is None:
                    break
                path.append(child)
                node = child
            if not path:
                return 0, None
            self._clock += 1
            for n in path:
                n.last_used = self._clock
            layers: list[LayerState] = []
            for li, kind in enumerate(self.kinds):
                if kind == "linear":
                    rec, conv = path[-1].layers[li]
                    layers.append(LinearLayerState(rec.clone(), conv.clone()))
                else:
                    keys_t = torch.cat([n.layers[li][0] for n in path])
                    vals_t = torch.cat([n.layers[li][1] for n in path])
                    layers.append(AttentionLayerState(keys_t, vals_t))
            tokens = [t for n in path for t in n.tokens]
            return len(path), RequestState(layers, path[-1].length, None, tokens)

    def insert(self, keys: Sequence[str], state: RequestState, segment_tokens: Sequence[int]) -> None:
        """Record the boundary after ``keys[-1]``; ``state`` covers exactly that prefix and the
        parent node (``keys[:-1]``) must exist (or be the root)."""
        with self._lock:
            node = self.root
            for k in keys[:-1]:
                node = node.children[k]
            if keys[-1] in node.children:
                return
            start = state.length - len(segment_tokens)
            layers: list[tuple[torch.Tensor, torch.Tensor]] = []
            for s in state.layers:
                if isinstance(s, LinearLayerState):
                    layers.append((s.recurrent.clone(), s.conv.clone()))
                else:
                    layers.append((s.k[start:].clone(), s.v[start:].clone()))
            self._clock += 1
            child = _Node(state.length, list(segment_tokens), layers, {}, node, keys[-1], self._clock)
            node.children[keys[-1]] = child
            self.bytes += child.nbytes()
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
