"""The client stays light: httpx + pydantic only, no torch, adapters imported only when used.

The fresh-virtualenv check installs from PyPI, so it is opt-in:
``HYPIC_SDK_VENV_TEST=1 python -m pytest sdk/python/tests/test_sdk_packaging.py -q``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

SDK = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "numpy", "transformers", "langchain_core", "llama_index", "hypic_agent")


def run_python(code: str, python: str = sys.executable) -> str:
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, cwd=SDK, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_declared_dependencies_are_httpx_and_pydantic_only():
    project = tomllib.loads((SDK / "pyproject.toml").read_text())["project"]
    assert project["name"] == "hypic-client"
    names = sorted(d.split(">")[0].split("<")[0].split("=")[0].strip() for d in project["dependencies"])
    assert names == ["httpx", "pydantic"]
    extras = project["optional-dependencies"]
    assert extras["langchain"][0].startswith("langchain-core")
    assert extras["llamaindex"][0].startswith("llama-index-core")


def test_import_pulls_nothing_heavy():
    code = (
        "import sys, json, hypic_client; "
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})))"
    )
    assert json.loads(run_python(code)) == []


def test_imports_without_the_optional_frameworks():
    block = "import sys\nfor m in " + repr(HEAVY) + ": sys.modules[m] = None\n"
    code = block + (
        "import hypic_client\n"
        "try:\n    import hypic_client.langchain\nexcept ImportError as e:\n    print('LC', e)\n"
        "try:\n    import hypic_client.llamaindex\nexcept ImportError as e:\n    print('LI', e)\n"
    )
    out = run_python(code)
    assert "LC hypic_client.langchain needs langchain-core: pip install 'hypic-client[langchain]'" in out
    assert "LI hypic_client.llamaindex needs llama-index-core" in out


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("HYPIC_SDK_VENV_TEST") != "1", reason="set HYPIC_SDK_VENV_TEST=1 (needs PyPI)")
def test_fresh_venv_install_has_no_torch(tmp_path: Path):
    src = tmp_path / "src"
    shutil.copytree(SDK, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "tests"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = str(venv / "bin" / "python")
    subprocess.run([py, "-m", "pip", "install", "-q", str(src)], check=True, timeout=600)
    listed = subprocess.run([py, "-m", "pip", "list", "--format=json"], capture_output=True, text=True, check=True)
    installed = {p["name"].lower().replace("_", "-") for p in json.loads(listed.stdout)}
    assert {"hypic-client", "httpx", "pydantic"} <= installed
    assert not installed & {"torch", "numpy", "transformers", "triton", "langchain-core", "llama-index-core"}
    assert run_python("import hypic_client; print(hypic_client.__version__)", python=py).strip()
