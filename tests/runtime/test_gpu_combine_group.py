"""GPU: several warm composed requests in one step run their linear layers as one group
(``hypic.combine_group``: one conv, one factor and one chain launch per layer for all of them); every
request gets the logits and pool state it gets from its own standalone combine (fp32, 1e-4), next to
a decode row and a request that cannot join the group (one of its segments is built in the step):
``combine_group_case``, in three modes."""

from __future__ import annotations

import pytest
import torch

from hypic_agent.runtime.hypic.modes import mode_spec

from .combine_group_case import check_grouped_combines
from .conftest import make_model

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
CUDA = torch.device("cuda")


@pytest.mark.parametrize("mode", ["hypic", "transition", "addition"])
def test_grouped_combines_give_each_request_its_standalone_result(mode):
    model, _, _ = make_model("qwen3_5_text")
    check_grouped_combines(model.to(CUDA, torch.float32), mode_spec(mode), CUDA)
