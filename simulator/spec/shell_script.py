"""The words of the launch command in a shell script, as bash would pass them, without running anything.

A Megatron launch script builds its command from variables and arrays (Megatron-LM's own examples:
``GPT_MODEL_ARGS=( --num-layers 96 ... )`` then ``torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py
${GPT_MODEL_ARGS[@]} ...``). This reader follows that much of bash:

- words, quotes ('...', "..."), backslash escapes and line continuations, comments;
- ``NAME=value``, ``NAME+=value``, ``export``/``local``/``declare``/``readonly`` and ``unset``;
  arrays ``NAME=( ... )`` and ``NAME+=( ... )``;
- ``$NAME``, ``${NAME}``, ``${NAME:-default}`` (and ``-``, ``:=``, ``=``), ``${ARR[@]}``, ``${ARR[*]}``,
  ``${ARR[i]}``, ``$(( arithmetic ))`` on integers; an unquoted expansion is split into words as bash splits it;
- ``if``/``elif``/``else``/``fi`` whose conditions are ``[ ]`` or ``[[ ]]`` string and integer tests joined by
  ``&&``, ``||`` and ``!``: the branch bash would take is read. A condition it cannot decide (a file test, a
  command) skips the whole block, with a note; so are loops and ``case``.

Nothing is executed: a command substitution ``$(...)`` and a variable the script never sets stay as written,
so a modelled flag that depends on one is refused in one sentence naming it. The launch is the last command
that runs a ``.py`` file (``torchrun ... pretrain_gpt.py``, ``python pretrain_gpt.py``); a text without one
(a bare list of flags) is read whole, and one that instead runs another script (a Slurm job whose container
runs ``train.sh``) names that script and its line. If-blocks and defaults nest at most
``limits.MAX_SCRIPT_NESTING`` deep; an if without its fi is refused at the line of its if.
"""

from __future__ import annotations

import re

from dataclasses import dataclass, field

from simulator.spec.errors import ConfigError
from simulator.spec.shell_expand import _Shell
from simulator.spec.shell_words import _NAME, Part, Span, Word, span_of, tokenize

_ASSIGN = re.compile(rf"^({_NAME})(\+?)=")
_DECLARERS = {"export", "local", "declare", "typeset", "readonly"}
_NOT_LAUNCHES = {"echo", "printf", "cat", "ls", "test", "[", "[[", "mkdir", "cp", "mv", "rm", "touch", "tee"}
_HANDOVER = re.compile(r"[^\s'\"=;|&()<>]+\.(?:sh|bash|slurm|sbatch)\b")  # another script that holds the launch


# --- statements -----------------------------------------------------------------------------------


def _statements(tokens: list[Word | str]) -> list[list[Word | str]]:
    """Tokens grouped into statements at newlines and ';' (array parentheses keep their newlines inside)."""
    out, current, depth = [], [], 0
    for t in tokens:
        if t == "(":
            depth += 1
        elif t == ")":
            depth = max(0, depth - 1)
        if t in ("\n", ";", ";;", "&") and depth == 0:
            if current:
                out.append(current)
            current = []
        elif t != "\n" or depth == 0:
            current.append(t)
    if current:
        out.append(current)
    return out


def _plain(word: Word | str) -> str | None:
    """A word's text when it is a single unquoted literal (a keyword such as ``if``), else None."""
    if isinstance(word, tuple) and len(word) == 1 and word[0].quote == "" and "$" not in word[0].text:
        return word[0].text
    return None


def _test(shell: _Shell, words: list[str]) -> bool | None:
    """A ``[ ]`` / ``[[ ]]`` test's truth, or None when it is not a string or integer comparison."""
    negate = False
    while words and words[0] == "!":
        negate, words = not negate, words[1:]
    result: bool | None = None
    if len(words) == 2 and words[0] in ("-z", "-n"):
        result = (words[1] == "") == (words[0] == "-z")
    elif len(words) == 1:
        result = words[0] != ""
    elif len(words) == 3 and words[1] in ("=", "==", "!="):
        result = (words[0] == words[2]) == (words[1] != "!=")
    elif len(words) == 3 and words[1] in ("-eq", "-ne", "-lt", "-le", "-gt", "-ge"):
        try:
            a, b = int(words[0]), int(words[2])
        except ValueError:
            return None
        result = {"-eq": a == b, "-ne": a != b, "-lt": a < b, "-le": a <= b, "-gt": a > b, "-ge": a >= b}[words[1]]
    if result is None or any("$" in w for w in words):
        return None  # a variable the script never set could hold anything
    return result != negate


def _condition(shell: _Shell, tokens: list[Word | str]) -> bool | None:
    """Tests joined by && and || (left to right, as bash does), each possibly negated by '!'."""
    value: bool | None = None
    pending = None
    i = 0
    while i < len(tokens):
        negate = False
        while i < len(tokens) and _plain(tokens[i]) == "!":
            negate, i = not negate, i + 1
        if i == len(tokens):
            raise ConfigError("an if of the launch script negates nothing ('if ! ;'): '!' needs a test after it, "
                              "such as [ -n \"$X\" ]; fix the condition or drop the if")
        opener = _plain(tokens[i])
        closer = {"[": "]", "[[": "]]"}.get(opener or "")
        if closer is None:
            return None
        j = next((k for k in range(i + 1, len(tokens)) if _plain(tokens[k]) == closer), None)
        if j is None:
            return None
        inner = [t for t in tokens[i + 1:j] if isinstance(t, tuple)]
        if len(inner) != j - i - 1:
            return None
        words = [" ".join(shell.expand_word(w, split=False)) for w in inner]
        truth = _test(shell, words)
        truth = None if truth is None else truth != negate
        if pending is None:
            value = truth
        elif pending == "&&":
            value = False if value is False or truth is False else (None if None in (value, truth) else True)
        else:
            value = True if value is True or truth is True else (None if None in (value, truth) else False)
        i = j + 1
        if i < len(tokens):
            if tokens[i] not in ("&&", "||"):
                return None
            pending, i = tokens[i], i + 1
    return value


def _line(statement: list[Word | str]) -> int:
    """The script line a statement starts on."""
    return next((t[0].line for t in statement if isinstance(t, tuple)), 0)


def _run(shell: _Shell, statements: list[list[Word | str]], i: int, stop: set[str]) -> int:
    """Read statements from ``i`` until one that starts with a keyword of ``stop``; returns its index."""
    while i < len(statements):
        st = statements[i]
        head = _plain(st[0])
        if head in stop:
            return i
        if head == "if":
            with shell.nested("if-blocks", _line(st)):  # each level is a call of _run into itself
                i = _if_block(shell, statements, i)
            continue
        if head in ("for", "while", "until", "case", "select", "function") or (
                len(st) > 2 and st[1] == "(" and st[2] == ")" and not (head or "=").endswith("=")):
            i = _skip_block(shell, statements, i)
            continue
        if head in ("{", "}", "then", "do", "done", "fi", "esac"):
            i += 1
            continue
        _simple(shell, st)
        i += 1
    return i


def _unclosed_if(line: int) -> ConfigError:
    return ConfigError(f"the if on line {line} of the Megatron launch script has no fi; close it or give the "
                       "pretrain_gpt.py command")


def _if_block(shell: _Shell, statements: list[list[Word | str]], i: int) -> int:
    taken = False
    decided = True
    opened = _line(statements[i])
    while True:
        if i >= len(statements):
            raise _unclosed_if(opened)
        st = statements[i]
        head = _plain(st[0])
        if head in ("if", "elif"):
            cond_tokens = st[1:]
            body_start = i + 1
            if cond_tokens and _plain(cond_tokens[-1]) == "then":
                cond_tokens = cond_tokens[:-1]
            elif body_start < len(statements) and _plain(statements[body_start][0]) == "then":
                rest = statements[body_start][1:]
                statements[body_start:body_start + 1] = [rest] if rest else []
            truth = None if taken else _condition(shell, cond_tokens)
            if truth is None and not taken:
                decided = False
            run_it = truth is True and not taken and decided
            i = _branch(shell, statements, body_start, run_it, opened)
            taken = taken or run_it
        elif head == "else":
            rest = st[1:]
            if rest:
                statements[i] = rest
                i = _branch(shell, statements, i, not taken and decided, opened)
            else:
                i = _branch(shell, statements, i + 1, not taken and decided, opened)
        elif head == "fi":
            if not decided:
                shell.notes.append("skipped an if-block whose condition cannot be decided without running the "
                                   "script (a file test or a command); put the flags it adds in the launch itself")
            return i + 1
        else:
            raise _unclosed_if(opened)


def _branch(shell: _Shell, statements: list[list[Word | str]], i: int, run_it: bool, opened: int) -> int:
    if run_it:
        return _run(shell, statements, i, {"elif", "else", "fi"})
    depth = 0
    while i < len(statements):
        head = _plain(statements[i][0])
        if head == "if":
            depth += 1
        elif head == "fi":
            if depth == 0:
                return i
            depth -= 1
        elif head in ("elif", "else") and depth == 0:
            return i
        i += 1
    raise _unclosed_if(opened)


def _skip_block(shell: _Shell, statements: list[list[Word | str]], i: int) -> int:
    """Past a loop (to its ``done``), a ``case`` (to its ``esac``) or a function (to its closing brace)."""
    head = _plain(statements[i][0])
    if head in ("for", "while", "until", "select"):
        opens, closer, what = {"for", "while", "until", "select"}, "done", f"{head} loop"
    elif head == "case":
        opens, closer, what = {"case"}, "esac", "case block"
    else:
        opens, closer, what = {"{"}, "}", "function"
    shell.notes.append(f"skipped a {what} (the reader follows assignments, arrays and if-blocks, not loops, cases "
                       "or functions); put the flags it adds in the launch itself")
    depth = 0
    for k in range(i, len(statements)):
        words = [_plain(t) for t in statements[k]]
        depth += sum(w in opens for w in words)
        depth -= sum(w == closer for w in words)
        if depth <= 0 and k >= i and (closer in words):
            return k + 1
    return len(statements)


def _simple(shell: _Shell, st: list[Word | str]) -> None:
    """An assignment, a declaration, or a command (recorded with its words expanded)."""
    for piece in _split_on(st, ("&&", "||", "|")):
        if not piece:
            continue
        head = _plain(piece[0])
        if head in _DECLARERS:
            args = [w for w in piece[1:] if not (_plain(w) or "").startswith("-")]
            _assignments(shell, args, declare=True)
            continue
        if head == "unset":
            for w in piece[1:]:
                shell.unset(_plain(w) or "")
            continue
        rest = _assignments(shell, piece, declare=False)
        if rest:
            words, wheres = shell.expand_words_located([w for w in rest if isinstance(w, tuple)])
            shell.commands.append(words)
            shell.command_segments.append(wheres)


def _split_on(tokens: list[Word | str], ops: tuple[str, ...]) -> list[list[Word | str]]:
    out, current = [], []
    for t in tokens:
        if t in ops:
            out.append(current)
            current = []
        else:
            current.append(t)
    out.append(current)
    return out


def _assignments(shell: _Shell, tokens: list[Word | str], declare: bool) -> list[Word | str]:
    """Apply the leading ``NAME=...`` words (every word for a declaration); return the command after them."""
    i = 0
    while i < len(tokens):
        word = tokens[i]
        if not isinstance(word, tuple) or word[0].quote != "":
            break
        m = _ASSIGN.match(word[0].text)
        if not m:
            if declare:
                i += 1
                continue
            break
        name, append = m.group(1), bool(m.group(2))
        first = word[0]._replace(text=word[0].text[m.end():])
        value_word = ((first,) if first.text else ()) + word[1:]
        if not value_word and i + 1 < len(tokens) and tokens[i + 1] == "(":
            end = next((k for k in range(i + 2, len(tokens)) if tokens[k] == ")"), None)
            if end is None:
                raise ConfigError(f"the array {name}=( on line {word[0].line} of the Megatron launch script is not "
                                  "closed; close it with )")
            items, wheres = shell.expand_words_located([t for t in tokens[i + 2:end] if isinstance(t, tuple)])
            shell.assign_array(name, items, wheres, append)
            i = end + 1
            continue
        value, where = shell.expand_value(value_word) if value_word else ("", ((0, span_of(word)),))
        shell.assign(name, value, where, append)
        i += 1
    return tokens[i:]


def _is_launch(words: list[str]) -> bool:
    if not words or words[0] in _NOT_LAUNCHES:
        return False
    return any(w.endswith(".py") and not re.search(r"\s", w) for w in words)


@dataclass
class ScriptLaunch:
    """What a launch script runs: the launch command's words and the script lines of each, the variables the
    script set (as bash would have them when the launch runs), what the reader noted, and, when no command
    runs a .py file, the last command that hands the launch to another script (its name and line)."""

    words: list[str]
    spans: list[Span]
    notes: list[str]
    variables: dict[str, str] = field(default_factory=dict)
    variable_spans: dict[str, Span] = field(default_factory=dict)
    found_launch: bool = False
    handover: tuple[str, int] | None = None


def read_launch(text: str) -> ScriptLaunch:
    """The last command that runs a .py file, with the script's variables and arrays expanded; a text without
    one is read whole (a list of flags)."""
    shell = _Shell()
    _run(shell, _statements(tokenize(text)), 0, set())
    launches = [k for k, c in enumerate(shell.commands) if _is_launch(c)]
    out = ScriptLaunch(words=[], spans=[], notes=shell.notes, variables=shell.scalars,
                       variable_spans={name: where[0][1] for name, where in shell.segments.items()})
    commands = list(zip(shell.commands, ([where[0][1] for where in c] for c in shell.command_segments)))
    if launches:
        (out.words, out.spans), out.found_launch = commands[launches[-1]], True
        return out
    for words, spans in commands:
        out.words += words
        out.spans += spans
        if words and words[0] not in _NOT_LAUNCHES and words[0] not in ("source", "."):
            found = next((m.group() for w in words for m in [_HANDOVER.search(w)] if m), None)
            if found is not None:
                out.handover = (found, spans[0][0])
    return out


def launch_words(text: str) -> tuple[list[str], list[str]]:
    """(words of the launch command, notes): see ``read_launch``."""
    launch = read_launch(text)
    return launch.words, launch.notes


def launch_variable(text: str, name: str) -> str | None:
    """The value the script (or an assignment before the launch command) gives variable ``name``, if any."""
    return read_launch(text).variables.get(name)


__all__ = [
    "Part",
    "ScriptLaunch",
    "Word",
    "launch_variable",
    "launch_words",
    "read_launch",
    "tokenize",
]
