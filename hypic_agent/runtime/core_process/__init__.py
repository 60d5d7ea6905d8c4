"""The engine core in its own process, the HTTP API in another (``HYPIC_ENGINE_PROCESS``).

As vLLM v1 and SGLang split them: the engine process holds the model, the state pool, the runner,
the scheduler's engine thread and the segment store; the API process holds FastAPI, tokenization,
the response formats and SSE, and the tokenizer only (sent by the engine process once it is ready:
no weights are loaded twice). Their GILs are separate, so HTTP parsing, tokenizing and streaming no
longer wait behind the engine thread's host work, and a crash of the engine process is a 503 with
the reason, never a hang.

* ``protocol.py``: the messages (submit, cancel, calls, shutdown; progress, ready, events, replies);
* ``outbox.py``: each side's one writer of the pipe, one message per batch of items;
* ``core.py``: the engine process (``main``), and where the segment store lives and why;
* ``client.py``: ``EngineClient``, the API process's side (spawn, ready, submit, calls, death);
* ``handle.py``: ``RemoteHandle``, a request in flight as the API holds it;
* ``remote_engine.py`` / ``remote_store.py``: the engine and the store as the API reads them;
* ``facts.py`` / ``snapshot.py``: the engine's facts (``Ready``) and the serving numbers (``/metrics``).
"""

from hypic_agent.runtime.core_process.client import EngineClient, EngineStatus
from hypic_agent.runtime.core_process.facts import EngineFacts
from hypic_agent.runtime.core_process.remote_engine import RemoteEngine
from hypic_agent.runtime.core_process.remote_store import RemoteStore
from hypic_agent.runtime.core_process.snapshot import ServingSnapshot

__all__ = ["EngineClient", "EngineFacts", "EngineStatus", "RemoteEngine", "RemoteStore", "ServingSnapshot"]
