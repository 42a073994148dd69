"""`simulator report`: regenerate the committed reports/ (Markdown, PNG figures, figure data)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

EXAMPLES = """
\b
Examples:
  simulator report --out reports
  simulator report --out reports --html      # also reports/report.html, the interactive search page
"""


@click.command("report", epilog=EXAMPLES)
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("reports"), show_default=True,
              help="Folder to write README.md, figures/ and data/ into.")
@click.option("--json", "as_json", is_flag=True, default=False, help="Also print the report's numbers as JSON.")
@click.option("--html", "html", is_flag=True, default=False,
              help="Also write OUT/report.html: the headline search as one interactive offline page (needs plotly).")
@click.option("--cache-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where unchanged sections and figures are kept between runs (default: OUT/.cache).")
@click.option("--no-cache", is_flag=True, default=False, help="Recompute every section and redraw every figure.")
def report_command(out: Path, as_json: bool, html: bool = False, cache_dir: Path | None = None,
                   no_cache: bool = False) -> None:
    """Regenerate the validation and planning report from the code and data in the repository.

    Sections whose inputs (code, data, library versions) did not change are read from the cache, so a
    rerun with nothing changed takes seconds and writes the same bytes. On a terminal, a bar shows
    which section is being computed."""
    import json

    from simulator.outputs.report import generate
    from simulator.outputs.report_cache import ReportCache
    from simulator.spec._io import make_folder

    if html:
        try:
            import plotly  # noqa: F401
        except ImportError:
            raise click.UsageError("--html needs plotly: pip install 'megatron-perf-simulator[html]'") from None
    make_folder(out, "the report")  # before the minutes the report takes, not after
    cache = ReportCache(None if no_cache else (cache_dir if cache_dir is not None else out / ".cache"))
    bar = None
    if sys.stderr.isatty():  # progress for a person watching, never in a stream a program reads
        from tqdm import tqdm

        bar = tqdm(total=None, unit="section", file=sys.stderr, leave=False)

    def progress(step: str, cached: bool, done: int, total: int) -> None:
        if bar is not None:
            bar.total = total
            bar.n = done - 1
            bar.set_description(f"{step}{' (cached)' if cached else ''}")
            bar.refresh()

    try:
        data = generate(out, progress=progress, html=html, cache=cache)
    finally:
        if bar is not None:
            bar.close()
    if as_json:
        click.echo(json.dumps(data, indent=2, sort_keys=True, allow_nan=False))
    else:
        click.echo(f"report written to {out / 'README.md'}" + (f" and {out / 'report.html'}" if html else ""))
