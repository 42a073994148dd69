"""`simulator report`: regenerate the committed reports/ (Markdown, PNG figures, figure data)."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("report", epilog="\b\nExample:\n  simulator report --out reports")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("reports"), show_default=True,
              help="Folder to write README.md, figures/ and data/ into.")
def report_command(out: Path) -> None:
    """Regenerate the validation and planning report from the code and data in the repository."""
    from simulator.report import generate

    generate(out)
    click.echo(f"report written to {out / 'README.md'}")
