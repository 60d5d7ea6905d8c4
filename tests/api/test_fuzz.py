"""Schemathesis against the app on the tiny model: no 5xx, and every response as the spec says.

Every operation of the OpenAPI spec gets valid and invalid requests generated from it (bounded
examples, derandomized, well under a minute on two cores); each response must not be a server
error, must carry a status the route declares, the declared content type and a body matching
the declared schema (the error envelope for every error), and invalid requests must be refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from hypic_agent.api import create_app
from hypic_agent.config import Settings
from tests.api.conftest import TINY

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.python.asgi import shutdown_lifespans  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
]
EXAMPLES = {GenerationMode.POSITIVE: 40, GenerationMode.NEGATIVE: 25}


@pytest.fixture
def api_schema(engine: Any, tmp_path: Any) -> Iterator[Any]:
    # small completions and a small context keep each generated request quick on the CPU
    settings_ = Settings(home=tmp_path, device="cpu", model=TINY, max_tokens_limit=64, max_context=160)
    app = create_app(settings_, engine=engine)
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)  # runs the app's lifespan
    yield schema
    shutdown_lifespans()  # closes the app's store


def test_fuzz_no_5xx_and_conforms_to_spec(api_schema: Any) -> None:
    seen: dict[str, int] = {}
    operations = 0
    for result in api_schema.get_all_operations():
        op = result.ok()
        operations += 1
        for mode, n in EXAMPLES.items():

            @given(case=op.as_strategy(generation_mode=mode))
            @settings(
                max_examples=n,
                deadline=None,
                derandomize=True,
                database=None,
                phases=[Phase.explicit, Phase.generate, Phase.shrink],
                suppress_health_check=list(HealthCheck),
            )
            def run(case: Any) -> None:
                case.call_and_validate(checks=CHECKS)
                seen[op.label] = seen.get(op.label, 0) + 1

            try:
                run()
            except Unsatisfiable:
                # a route with no parameters and no body (GET /health) has no invalid request
                assert mode == GenerationMode.NEGATIVE, op.label
    assert operations >= 12 and len(seen) == operations, seen  # every route was exercised
