"""The ``simulator`` command line: a thin click group over the library.

Each command lives in its own module ``simulator/cli/<name>_cmd.py`` and is registered with one
line in ``COMMANDS``; modules are imported only when their command runs (or ``--help`` lists it),
so heavy imports (matplotlib, torch) stay inside the command that needs them.

Bad input of any kind (a ``SimulatorError`` or a click usage error) ends with one sentence on
stderr and exit code 2 (3 for a plan that ``--require-fit`` refuses), never a traceback; anything
else is a bug and keeps its traceback. SIGTERM and SIGHUP stop a command the way Ctrl-C does, so
that child processes and temporary files are cleaned up on the way out.

May import: every layer of ``simulator``; nothing imports it but ``simulator.__main__``.
"""

from __future__ import annotations

import importlib
import signal
import sys
from importlib import metadata
from typing import Any

import click

from simulator.spec.errors import SimulatorError

# name -> "module:attribute"; one line per command.
COMMANDS: dict[str, str] = {
    "memory": "simulator.cli.memory_cmd:memory",
    "plan": "simulator.cli.plan_cmd:plan_command",
    "search": "simulator.cli.search_cmd:search_command",
    "report": "simulator.cli.report_cmd:report_command",
    "plot": "simulator.cli.plot_cmd:plot_command",
    "reference": "simulator.cli.reference_cmd:reference",
    "validate": "simulator.cli.validate_cmd:validate_cmd",
    "calibrate": "simulator.cli.calibrate_cmd:calibrate_command",
    "models": "simulator.cli.models_cmd:models_command",
    "clusters": "simulator.cli.clusters_cmd:clusters_command",
    "sweep": "simulator.cli.sweep_cmd:sweep_command",
    "capacity": "simulator.cli.capacity_cmd:capacity_command",
}

USAGE_EXIT_CODE = 2
INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT, what a shell reports for Ctrl-C
DISTRIBUTION = "megatron-perf-simulator"


def _version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:  # running from a checkout that was never installed
        return "0+checkout"


def _one_sentence(message: str) -> str:
    return " ".join(message.split()).rstrip(".")


class SimulatorGroup(click.Group):
    """A group that loads its commands lazily and turns user errors into one line and exit code 2."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(COMMANDS))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in COMMANDS:
            module, attr = COMMANDS[cmd_name].split(":")
            return getattr(importlib.import_module(module), attr)
        return super().get_command(ctx, cmd_name)

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except (click.exceptions.Abort, KeyboardInterrupt):
            click.echo("error: interrupted; nothing more was written", err=True)
            sys.exit(INTERRUPTED_EXIT_CODE)
        except click.UsageError as exc:
            hint = f"; see '{exc.ctx.command_path} --help'" if exc.ctx is not None else ""
            click.echo(f"error: {_one_sentence(exc.format_message())}{hint}", err=True)
            sys.exit(USAGE_EXIT_CODE)
        except click.ClickException as exc:
            click.echo(f"error: {_one_sentence(exc.format_message())}", err=True)
            sys.exit(USAGE_EXIT_CODE)
        except SimulatorError as exc:
            click.echo(f"error: {_one_sentence(str(exc))}", err=True)
            sys.exit(exc.exit_code)
        # non-standalone click returns the exit code of --help / ctx.exit(); commands return None
        sys.exit(code if isinstance(code, int) else 0)


@click.group(cls=SimulatorGroup, name="simulator", context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(version=_version(), prog_name="simulator")
def cli() -> None:
    """Performance simulator and capacity planner for Megatron-style GPT training."""


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main() -> None:
    """Console-script entry point."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    try:
        cli(prog_name="simulator")
    except BrokenPipeError:
        # the reader of stdout went away (`simulator models | head -1`): nothing left to say
        sys.stderr.close()
        sys.exit(1)


__all__ = ["COMMANDS", "cli", "main"]
