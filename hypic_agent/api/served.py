"""The model this server serves: its names, its card, and the check of a request's ``model``.

A request may leave ``model`` out (or null); otherwise it must be the engine's name or one of
``Settings.model_aliases``, else 404 ``model_not_found`` with the served names in the message.
"""

from __future__ import annotations

from typing import Any

from hypic_agent.api.state import ServerState
from hypic_agent.errors import ModelNotFoundError

MODES = ["full_recompute", "prefix_cache", "addition", "transition", "transition_rope", "hypic"]


def served_names(st: ServerState) -> list[str]:
    return [st.engine.name, *(a for a in st.settings.model_aliases if a != st.engine.name)]


def check_model(st: ServerState, name: str | None) -> None:
    if name is None or name in served_names(st):
        return
    served = ", ".join(repr(n) for n in served_names(st))
    raise ModelNotFoundError(
        f"model {name!r} is not served here; this server serves {served} (GET /v1/models). "
        "Leave `model` out to use it, or add the name to HYPIC_MODEL_ALIASES.",
        param="model",
    )


def model_card(st: ServerState, name: str | None = None) -> dict[str, Any]:
    e = st.engine
    return {
        "id": name or e.name,
        "object": "model",
        "created": int(st.started_at),
        "owned_by": "hypic-agent",
        "fingerprint": e.fingerprint,
        "max_context": e.max_context,
        "modes": list(MODES),
    }
