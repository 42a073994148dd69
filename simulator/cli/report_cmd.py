"""`simulator report`: regenerate the committed reports/ (Markdown, PNG figures, figure data)."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("report", epilog="\b\nExample:\n  simulator report --out reports")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("reports"), show_default=True,
              help="Folder to write README.md, figures/ and data/ into.")
@click.option("--json", "as_json", is_flag=True, default=False, help="Also print the report's numbers as JSON.")
def report_command(out: Path, as_json: bool) -> None:
    """Regenerate the validation and planning report from the code and data in the repository."""
    import json

    from simulator._io import make_folder
    from simulator.report import generate

    make_folder(out, "the report")  # before the two minutes the report takes, not after
    data = generate(out)
    if as_json:
        click.echo(json.dumps(data, indent=2, sort_keys=True, allow_nan=False))
    else:
        click.echo(f"report written to {out / 'README.md'}")
