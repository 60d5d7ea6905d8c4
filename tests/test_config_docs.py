"""``docs/configuration.md``, ``hypic-agent config`` and ``serve --help`` list every setting of
``Settings`` (read from the class at run time, so a new field shows up in all three)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from hypic_agent.cli import app
from hypic_agent.config import Settings
from hypic_agent.config_docs import REGENERATE, markdown, setting_rows

DOC = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def _every_variable() -> list[str]:
    """HYPIC_<FIELD> of every field, HYPIC_<FIELD>__<SUB> of every field of a nested model."""
    out = []
    for name, info in Settings.model_fields.items():
        sub = getattr(info.annotation, "model_fields", None)
        out += [f"HYPIC_{name}__{s}".upper() for s in sub] if sub else [f"HYPIC_{name}".upper()]
    return out


def test_docs_configuration_md_is_up_to_date() -> None:
    assert DOC.is_file(), f"docs/configuration.md is missing; create it: {REGENERATE}"
    assert DOC.read_text() == markdown(), (
        f"docs/configuration.md is out of date with Settings (hypic_agent/config.py); regenerate it: {REGENERATE}"
    )


def test_every_setting_is_a_row_with_its_variable_and_default() -> None:
    rows = {r.env: r for r in setting_rows()}
    assert sorted(rows) == sorted(_every_variable())
    assert rows["HYPIC_PORT"].default == "8000" and rows["HYPIC_PORT"].type == "int"
    assert rows["HYPIC_MODEL"].default == Settings.model_fields["model"].default
    assert rows["HYPIC_HOME"].default == "~/.cache/hypic-agent"  # not this machine's home folder
    assert rows["HYPIC_MAX_RUNNING"].type == "int >= 1"
    assert rows["HYPIC_DEFAULT_MODE"].type.startswith("full_recompute | prefix_cache")
    assert rows["HYPIC_GPU_BUDGET_BYTES"].default == f"{8 << 30} (8 GiB)"
    assert rows["HYPIC_API_KEYS"].default == "{}" and rows["HYPIC_DATABASE_URL"].default == "unset"
    assert rows["HYPIC_KERNELS__PRECISE_FOR_HALF"].section == "model / runtime"
    undocumented = [r.name for r in setting_rows() if not r.description]
    assert not undocumented, f"give these Settings fields a description= in hypic_agent/config.py: {undocumented}"


def test_serve_help_lists_every_variable() -> None:
    res = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    missing = [v for v in _every_variable() if v not in res.output]
    assert not missing, f"serve --help does not list {missing}"
    assert "HYPIC_PORT=8000" in res.output and "docs/configuration.md" in res.output
    assert "default smollm2-135m-hybrid" in " ".join(res.output.split())  # --model names the real default


def test_config_command_shows_values_in_effect_and_hides_secrets() -> None:
    env = {"HYPIC_PORT": "9001", "HYPIC_API_KEYS": '{"sk-secret": "team"}', "HYPIC_METRICS_TOKEN": "tok-secret"}
    res = CliRunner().invoke(app, ["config"], env=env)
    assert res.exit_code == 0, res.output
    assert "HYPIC_PORT=9001   (default 8000)" in res.output
    assert "HYPIC_API_KEYS=(set)" in res.output and "HYPIC_METRICS_TOKEN=(set)" in res.output
    assert "sk-secret" not in res.output and "tok-secret" not in res.output
    assert all(v in res.output for v in _every_variable())
    md = CliRunner().invoke(app, ["config", "--markdown"])
    assert md.exit_code == 0 and md.output == markdown()
