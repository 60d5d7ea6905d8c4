"""Where the GPU waits in one call: idle gaps between kernels with the host code running meanwhile,
and the calls that synchronize with the device (``stage_split.py --gaps`` / ``--sync-debug``).

A call whose GPU-busy time is well below its wall time while the host is not the bound either
loses time in gaps: the device drained (a host sync, a blocking copy) and sat idle until the host
queued work again. The gap report names the Python frames of the host op in progress in each large
gap; the sync report names the frames of each synchronizing call, counted.
"""

from __future__ import annotations

import collections
import traceback
import warnings
from collections.abc import Callable
from typing import Any

import torch

OURS = ("hypic_agent", "/fla/", "benchmarks/")


def _frames(stack: list[str] | list[traceback.FrameSummary], depth: int = 4) -> str:
    """The innermost ``depth`` frames of our code (and fla's), innermost first."""
    names = []
    for fr in stack:
        text = fr if isinstance(fr, str) else f"{fr.filename}({fr.lineno}): {fr.name}"
        if any(k in text for k in OURS):
            names.append(text.split("hypic_agent/")[-1].split("site-packages/")[-1])
    return " <- ".join(names[:depth]) if names else "(no frame of ours)"


def gap_report(fn: Callable[[], Any], min_us: float = 20.0, top: int = 12) -> dict[str, Any]:
    """One call under ``torch.profiler`` with Python stacks -> the idle time before the first kernel,
    between kernels (gaps of at least ``min_us``) and after the last, and the largest gaps with the
    host frames running at their middle."""
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=acts, with_stack=True) as prof:
        with torch.profiler.record_function("call"):
            fn()
        torch.cuda.synchronize()
    events = prof.events()
    cuda = torch.autograd.DeviceType.CUDA
    kernels = sorted((e.time_range.start, e.time_range.end) for e in events if e.device_type == cuda)
    copies = ("Memcpy", "Memset")
    compute = [e.time_range.start for e in events if e.device_type == cuda and not e.name.startswith(copies)]
    call = next(e for e in events if e.name == "call")
    cpu_ops = [e for e in events if e.device_type != cuda and e.stack]
    gaps: list[tuple[float, float]] = []
    end = kernels[0][1] if kernels else call.time_range.end
    for s, e in kernels[1:]:
        if s - end >= min_us:
            gaps.append((end, s))
        end = max(end, e)
    rows = []
    for a, b in sorted(gaps, key=lambda g: g[0] - g[1])[:top]:
        mid = (a + b) / 2
        inside = [e for e in cpu_ops if e.time_range.start <= mid <= e.time_range.end]
        op = min(inside, key=lambda e: e.time_range.end - e.time_range.start) if inside else None
        rows.append(
            {
                "gap_us": round(b - a, 1),
                "at_ms": round((a - call.time_range.start) / 1e3, 2),
                "host_op": op.name if op else "",
                "frames": _frames(op.stack) if op else "",
            }
        )
    first = kernels[0][0] if kernels else call.time_range.end
    first_compute = min(compute) if compute else call.time_range.end
    out = {
        "before_first_kernel_ms": round((first - call.time_range.start) / 1e3, 2),
        # host preparation the GPU waits for (table uploads before it are copies, not work)
        "before_first_compute_kernel_ms": round((first_compute - call.time_range.start) / 1e3, 2),
        "gaps_ms": round(sum(b - a for a, b in gaps) / 1e3, 2),
        "gaps": len(gaps),
        "after_last_kernel_ms": round((call.time_range.end - end) / 1e3, 2) if kernels else 0.0,
        "largest": rows,
    }
    print(
        f"idle: {out['before_first_kernel_ms']} ms before the first kernel "
        f"({out['before_first_compute_kernel_ms']} ms before the first compute kernel), {out['gaps_ms']} ms in "
        f"{out['gaps']} gaps >= {min_us:.0f} us"
    )
    for r in rows:
        print(f"  {r['gap_us']:>8.1f} us at {r['at_ms']:>7.2f} ms  {r['host_op'][:40]:<40} {r['frames']}")
    return out


def sync_report(fn: Callable[[], Any]) -> dict[str, int]:
    """One call with ``torch.cuda.set_sync_debug_mode("warn")`` -> how often each Python call site
    synchronized with the device."""
    sites: collections.Counter[str] = collections.Counter()
    torch.cuda.synchronize()
    before = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        shown = warnings.showwarning

        def record(message: Any, category: Any, *args: Any, **kwargs: Any) -> None:
            if "synchroniz" in str(message):
                sites[_frames(traceback.extract_stack()[::-1], depth=3)] += 1

        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(before)
            warnings.showwarning = shown
    print(f"syncs: {sum(sites.values())} at {len(sites)} call sites")
    for site, n in sites.most_common(20):
        print(f"  {n:>4} x {site}")
    return dict(sites)
