"""Every setting of ``Settings`` as text: ``docs/configuration.md``, ``hypic-agent config`` and the
settings list of ``serve --help``, all read from the ``Settings`` class at run time (a field added
there shows up everywhere; ``tests/test_config_docs.py`` fails while the committed doc lags behind).

``setting_rows()`` walks the fields (a nested model such as ``kernels`` gives one row per field of
its own, ``HYPIC_KERNELS__<FIELD>``), in the class's order, under the section comments of
``config.py`` (``# --- store ---``).
"""

from __future__ import annotations

import inspect
import json
import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from hypic_agent.config import Settings

REGENERATE = "hypic-agent config --markdown > docs/configuration.md"
_SECTION = re.compile(r"^\s*#\s*---+\s*(.+?)\s*-*\s*$")
_FIELD = re.compile(r"^    (\w+)\s*:")
# current values never printed as they are (keys, tokens, a database URL with its password)
_SECRET = re.compile(r"(^|_)(keys?|token|secret|password)$|^database_url$")


@dataclass(frozen=True)
class SettingRow:
    name: str  # dotted for nested fields: kernels.precise_for_half
    env: str  # HYPIC_KERNELS__PRECISE_FOR_HALF
    type: str  # "int >= 1", "auto | cpu | cuda", "JSON object"
    default: str  # as one would write it in the environment; "unset" for None
    description: str
    section: str


def _env_prefix(cls: type[Settings]) -> tuple[str, str]:
    cfg = cls.model_config
    return str(cfg.get("env_prefix") or ""), str(cfg.get("env_nested_delimiter") or "__")


def _sections(cls: type[BaseModel]) -> dict[str, str]:
    """Field name -> the ``# --- title ---`` comment above it in the class's source ("" when none)."""
    try:
        lines = inspect.getsource(cls).splitlines()
    except (OSError, TypeError):
        return {}
    out, current = {}, ""
    for line in lines:
        if m := _SECTION.match(line):
            current = m.group(1).strip()
        elif m := _FIELD.match(line):
            out[m.group(1)] = current
    return out


def _optional(tp: Any) -> tuple[Any, bool]:
    """``X | None`` -> (X, True); anything else -> (itself, False)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        rest = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(rest) == 1 and len(rest) < len(typing.get_args(tp)):
            return rest[0], True
    return tp, False


def _type_name(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin is Literal:
        return " | ".join(str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join("null" if a is type(None) else _type_name(a) for a in args)
    if origin is list or tp is list:
        return f"JSON list of {_type_name(args[0])}" if args else "JSON list"
    if origin is dict or tp is dict:
        return f"JSON object ({_type_name(args[0])} -> {_type_name(args[1])})" if args else "JSON object"
    if tp is Path:
        return "path"
    return getattr(tp, "__name__", str(tp))


def _bounds(info: FieldInfo) -> str:
    parts = []
    for m in info.metadata:
        for attr, fmt in (
            ("ge", ">= {}"),
            ("gt", "> {}"),
            ("le", "<= {}"),
            ("lt", "< {}"),
            ("max_length", "<= {} chars"),
        ):
            v = getattr(m, attr, None)
            if v is not None:
                parts.append(fmt.format(v))
    return ", ".join(parts)


def env_value(value: Any) -> str:
    """A value as the environment spells it: true/false, JSON for lists and objects, ~ for the home."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Path):
        home = Path.home()
        return f"~/{value.relative_to(home)}" if value.is_relative_to(home) else str(value)
    if isinstance(value, list | dict):
        return json.dumps(value)
    if isinstance(value, BaseModel):
        return json.dumps(value.model_dump(mode="json"))
    if isinstance(value, str) and not value:
        return '""'
    return str(value)


def _with_size(name: str, shown: str, value: Any) -> str:
    """``8589934592 (8 GiB)`` for a whole number of KiB / MiB / GiB of a ``*_bytes`` setting."""
    if not name.endswith("bytes") or isinstance(value, bool) or not isinstance(value, int) or value < 1024:
        return shown
    for shift, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if value % (1 << shift) == 0:
            return f"{shown} ({value >> shift} {unit})"
    return shown


def _default(info: FieldInfo) -> Any:
    if info.default_factory is not None:
        return info.default_factory()  # type: ignore[call-arg]
    return info.default


def setting_rows(cls: type[Settings] = Settings) -> list[SettingRow]:
    """Every setting, nested ones flattened, in the class's order."""
    prefix, nested = _env_prefix(cls)
    sections = _sections(cls)
    rows: list[SettingRow] = []
    for name, info in cls.model_fields.items():
        section = sections.get(name, "")
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            for sub, sub_info in ann.model_fields.items():
                rows.append(_row(f"{name}.{sub}", f"{prefix}{name}{nested}{sub}", sub_info, section))
            continue
        rows.append(_row(name, f"{prefix}{name}", info, section))
    return rows


def _row(name: str, env: str, info: FieldInfo, section: str) -> SettingRow:
    tp, optional = _optional(info.annotation)
    kind, bounds = _type_name(tp), _bounds(info)
    kind = f"{kind} {bounds}" if bounds else kind
    default = _default(info)
    return SettingRow(
        name=name,
        env=env.upper(),
        type=f"{kind}, or unset" if optional else kind,
        default=_with_size(name, env_value(default), default),
        description=" ".join((info.description or "").split()),
        section=section,
    )


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(cls: type[Settings] = Settings) -> str:
    """``docs/configuration.md``: every setting, by section, as a table."""
    rows = setting_rows(cls)
    prefix, nested = _env_prefix(cls)
    out = [
        "# Configuration",
        "",
        f"<!-- generated from hypic_agent/config.py (Settings) by `{REGENERATE}`; do not edit by hand: "
        "tests/test_config_docs.py fails when this file is out of date -->",
        "",
        f"Every setting is an environment variable `{prefix}<NAME>` (or a line of a `.env`-style environment). "
        f'Lists and objects are JSON (`{prefix}API_KEYS=\'{{"my-key": "tenant-a"}}\'`); a nested setting is '
        f"`{prefix}<GROUP>{nested}<FIELD>` (`{prefix}KERNELS{nested}PRECISE_FOR_HALF=false`). The flags of "
        "`hypic-agent serve` (`--model`, `--port`, ...) override their variables for one run. "
        "`hypic-agent config` prints every setting with the value in effect; "
        f"`hypic-agent serve --help` lists the variables and their defaults. {len(rows)} settings.",
        "",
    ]
    section = None
    for r in rows:
        if r.section != section:
            if section is not None:
                out.append("")
            section = r.section
            out += [f"## {section or 'other'}", "", "| setting | variable | type | default | what it does |"]
            out += ["|---|---|---|---|---|"]
        cells = [f"`{r.name}`", f"`{r.env}`", _cell(r.type), f"`{_cell(r.default)}`", _cell(r.description)]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def current_rows(settings: Settings) -> list[tuple[SettingRow, str]]:
    """Every setting with the value ``settings`` holds (secrets masked: ``(set)``)."""
    out = []
    for r in setting_rows(type(settings)):
        value: Any = settings
        for part in r.name.split("."):
            value = getattr(value, part)
        shown = _with_size(r.name, env_value(value), value)
        leaf = r.name.rsplit(".", 1)[-1]
        if _SECRET.search(leaf) and shown not in ("unset", "{}", "[]"):
            shown = "(set)"
        out.append((r, shown))
    return out


def help_epilog(cls: type[Settings] = Settings) -> str:
    """The settings list under ``serve --help``: one ``VARIABLE=default`` per line."""
    rows = setting_rows(cls)
    lines = [
        f"Settings ({len(rows)}; environment variable = default). `hypic-agent config` prints each with its "
        "description and the value in effect; docs/configuration.md is the same list.",
        "",
    ]
    lines += [f"{r.env} (unset)" if r.default == "unset" else f"{r.env}={r.default}" for r in rows]
    return "\n".join(lines)
