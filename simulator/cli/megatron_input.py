"""Megatron flags into ``simulator plan``: from a file (``--megatron-args FILE``, ``-`` for stdin) or
typed on the command line itself (``simulator plan --cluster dgx-h100 --num-layers 80 ...``).

Megatron's flags override the ``--model`` (default gpt3-175b, whose architecture is Megatron's GPT
defaults); the simulator's own options (``--cluster``, ``--gpus``, ``--tokens``, ``--json`` ...) keep
their meaning. A line that mixes Megatron flags with the simulator's plan flags reads both as one
launch, so ``--tp 8`` and ``--tensor-model-parallel-size 8`` are the same flag there.
"""

from __future__ import annotations

import shlex
import sys
from typing import Any

import click

from simulator.cli.options import PLAN_OPTION_NAMES, job_from_options
from simulator.spec import limits
from simulator.spec.errors import ConfigError
from simulator.spec.megatron_args import FLAGS, parse_launch, read_text, resolve

INLINE = "megatron_inline"  # the hidden option that carries Megatron flags typed on the plan command line
# Plan options that are the simulator's own, not part of a launch: allowed beside --megatron-args.
_OWN = frozenset({"model", "cluster", "gpus", "as_json", "allow_tp_across_nodes", "moe_load_imbalance"})


def _option_arity(command: click.Command) -> dict[str, bool | str]:
    """Every option name of the command -> whether it takes a value (or 'optional')."""
    out = {}
    for param in command.params:
        if isinstance(param, click.Option):
            for name in (*param.opts, *param.secondary_opts):
                # an option whose value may be left out (--launch [bridge]) takes one only if one follows
                out[name] = "optional" if getattr(param, "_flag_needs_value", False) else not (
                    param.is_flag or param.count)
    return out


class MegatronAwareCommand(click.Command):
    """A click command that also reads Megatron's flag names: when a token is a Megatron flag this
    command has no option for (``--num-layers``, ``--bf16`` ...), every plan flag of the line goes to the
    Megatron reader and only the command's own options (``--model``, ``--cluster``, ``--gpus`` ...) stay."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        arity = _option_arity(self)
        names = [a.partition("=")[0] for a in args]
        if not any(n in FLAGS and n not in arity for n in names):
            return super().parse_args(ctx, args)
        own, megatron = [], []
        i = 0
        while i < len(args):
            word, name = args[i], names[i]
            takes_value = arity.get(name)
            if takes_value is not None and name not in FLAGS:
                own.append(word)
                if (takes_value and "=" not in word and i + 1 < len(args)
                        and not (takes_value == "optional" and args[i + 1].startswith("-"))):
                    own.append(args[i + 1])
                    i += 1
            else:
                megatron.append(word)
            i += 1
        return super().parse_args(ctx, own + [f"--{INLINE.replace('_', '-')}", shlex.join(megatron)])


def megatron_options(func):
    """``--megatron-args FILE`` and the hidden option that carries flags typed inline."""
    func = click.option(f"--{INLINE.replace('_', '-')}", INLINE, hidden=True, default=None)(func)
    return click.option(
        "--megatron-args", "megatron_args_path", default=None, metavar="FILE|-",
        help="Predict the job an existing Megatron-LM pretrain_gpt.py command line runs (a shell script, or - for "
             "standard input; torchrun's --nnodes and --nproc-per-node give the GPUs). Its flags override --model; "
             "Megatron's flags may also be typed on this command line directly.")(func)


def _standard_input() -> bytes | str:
    """Standard input, up to one byte past the largest launch (so that more is refused unread)."""
    return getattr(sys.stdin, "buffer", sys.stdin).read(limits.MAX_INPUT_FILE_BYTES + 1)


def job_from_megatron(ctx: click.Context, kwargs: dict[str, Any]):
    """(Job, notes, the launch's own checkpoint settings: ``GoodputSettings`` fields) of ``--megatron-args`` or
    of inline Megatron flags; None if neither was given."""
    path, inline = kwargs.get("megatron_args_path"), kwargs.get(INLINE)
    if path is None and inline is None:
        return None
    if path is not None and inline is not None:
        raise ConfigError("give Megatron's flags either in --megatron-args or on the command line, not both")
    if path is not None:
        given = [p.opts[0] for p in ctx.command.params
                 if isinstance(p, click.Option) and p.name in PLAN_OPTION_NAMES and p.name not in _OWN
                 and ctx.get_parameter_source(p.name) is click.core.ParameterSource.COMMANDLINE]
        if given:
            raise ConfigError(f"give the plan either in --megatron-args or as flags, not both ({', '.join(given)} "
                              "given too); put them in the file")
    from simulator.spec.catalog import load_model
    from simulator.spec.hardware import load_cluster

    cluster = load_cluster(kwargs.get("cluster", "dgx-a100-80gb"))
    text = inline if inline is not None else read_text(path, _standard_input)
    launch = parse_launch(text, cluster.gpus_per_node)
    base = load_model(kwargs.get("model", "gpt3-175b"))
    model, options, notes = resolve(launch, base, kwargs.get("gpus"), kwargs.get("nnodes"))
    if ctx.get_parameter_source("model") is not click.core.ParameterSource.COMMANDLINE and model:
        model["name"] = "megatron-flags" if path in (None, "-") else _stem(path)
    split = options.pop("pipeline_layer_split", None)
    job = job_from_options(
        model_overrides=model, plan_overrides={"pipeline_layer_split": split} if split else None,
        **{**options, "model": kwargs.get("model", "gpt3-175b"), "cluster": kwargs.get("cluster", "dgx-a100-80gb"),
           "allow_tp_across_nodes": kwargs.get("allow_tp_across_nodes", False),
           "moe_load_imbalance": kwargs.get("moe_load_imbalance")})
    return job, notes, launch.checkpointing()


def _stem(path: str) -> str:
    from pathlib import Path

    return Path(path).stem or "megatron-flags"
