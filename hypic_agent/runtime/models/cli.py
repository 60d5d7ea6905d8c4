"""``hypic-agent models``: list the catalog and fetch models (mounted by ``hypic_agent/cli.py``)."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

from hypic_agent.config import get_settings
from hypic_agent.errors import HypicError
from hypic_agent.runtime.models.loading.catalog import fetch_model, list_models

models_app = typer.Typer(help="List and fetch models.", no_args_is_help=True, add_completion=False)


def _human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


@models_app.command("list")
def list_cmd() -> None:
    """Show catalog, built-in tiny, local and HF-cache models."""
    settings = get_settings()
    table = Table(title=f"models (default: {settings.model}; home: {settings.home})")
    for col in ("name", "kind", "source", "present", "size"):
        table.add_column(col, justify="right" if col == "size" else "left")
    for m in list_models(settings):
        present = "[green]yes[/green]" if m.present else "[yellow]no (fetch)[/yellow]"
        name = f"[bold]{m.name}[/bold]" if m.name == settings.model else m.name
        table.add_row(name, m.kind, m.source, present, _human(m.size_bytes))
    Console().print(table)


@models_app.command("fetch")
def fetch_cmd(
    name: str = typer.Argument(..., help="catalog name, e.g. smollm2-135m-instruct"),
    force: bool = typer.Option(False, "--force", help="download again even if present"),
) -> None:
    """Download a catalog model into <home>/models (idempotent)."""
    console = Console()
    try:
        with console.status(f"fetching {name} ..."):
            src = fetch_model(name, get_settings(), force=force)
    except HypicError as e:
        console.print(f"[red]error:[/red] {e.message}")
        raise typer.Exit(1) from e
    console.print(f"{src.name}: {src.kind} at {src.path or 'built-in'}")
