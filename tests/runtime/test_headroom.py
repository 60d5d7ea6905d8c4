"""The allocator headroom: a no-op off CUDA; on CUDA the next allocations up to its size are cut from
the reserve it keeps (no new cudaMalloc on the request path)."""

import pytest
import torch

from hypic_agent.runtime.headroom import AllocatorHeadroom


def test_headroom_is_a_noop_on_cpu_and_rejects_negative_sizes():
    h = AllocatorHeadroom(torch.device("cpu"), 1 << 30)
    h.top_up()
    assert h.nbytes == 0 and h.top_ups == 0
    with pytest.raises(ValueError, match=">= 0"):
        AllocatorHeadroom(torch.device("cpu"), -1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_headroom_serves_the_next_allocations_without_growing_the_reserve():
    dev = torch.device("cuda")
    torch.cuda.empty_cache()  # no free cached blocks left by earlier tests: the top-up has to grow the reserve
    h = AllocatorHeadroom(dev, 512 << 20)
    h.top_up()
    assert h.top_ups == 1
    reserved = torch.cuda.memory_reserved(dev)
    kept = [torch.empty(100 << 20, dtype=torch.uint8, device=dev) for _ in range(4)]  # 400 MB of new "entries"
    assert torch.cuda.memory_reserved(dev) == reserved
    h.top_up()  # 112 MB left of the block: grows the reserve once more, here rather than on the next request
    assert torch.cuda.memory_reserved(dev) >= reserved + (512 << 20) and h.top_ups == 2
    del kept
