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
(a bare list of flags) is read whole.
"""

from __future__ import annotations

import re

from simulator.spec.errors import ConfigError
from simulator.spec.shell_words import _NAME, Part, Word, _Shell, tokenize

_ASSIGN = re.compile(rf"^({_NAME})(\+?)=")
_DECLARERS = {"export", "local", "declare", "typeset", "readonly"}
_NOT_LAUNCHES = {"echo", "printf", "cat", "ls", "test", "[", "[[", "mkdir", "cp", "mv", "rm", "touch", "tee"}


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
        while _plain(tokens[i]) == "!":
            negate, i = not negate, i + 1
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


def _run(shell: _Shell, statements: list[list[Word | str]], i: int, stop: set[str]) -> int:
    """Read statements from ``i`` until one that starts with a keyword of ``stop``; returns its index."""
    while i < len(statements):
        st = statements[i]
        head = _plain(st[0])
        if head in stop:
            return i
        if head == "if":
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


def _if_block(shell: _Shell, statements: list[list[Word | str]], i: int) -> int:
    taken = False
    decided = True
    while True:
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
            i = _branch(shell, statements, body_start, run_it)
            taken = taken or run_it
        elif head == "else":
            rest = st[1:]
            if rest:
                statements[i] = rest
                i = _branch(shell, statements, i, not taken and decided)
            else:
                i = _branch(shell, statements, i + 1, not taken and decided)
        elif head == "fi":
            if not decided:
                shell.notes.append("skipped an if-block whose condition cannot be decided without running the "
                                   "script (a file test or a command); put the flags it adds in the launch itself")
            return i + 1
        else:
            raise ConfigError("the Megatron launch script has an if without its fi; check the script")


def _branch(shell: _Shell, statements: list[list[Word | str]], i: int, run_it: bool) -> int:
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
    raise ConfigError("the Megatron launch script has an if without its fi; check the script")


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
                name = _plain(w)
                shell.scalars.pop(name or "", None)
                shell.arrays.pop(name or "", None)
            continue
        rest = _assignments(shell, piece, declare=False)
        if rest:
            shell.commands.append(shell.expand_words([w for w in rest if isinstance(w, tuple)]))


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
        first = Part(word[0].text[m.end():], "")
        value_word = ((first,) if first.text else ()) + word[1:]
        if not value_word and i + 1 < len(tokens) and tokens[i + 1] == "(":
            end = next((k for k in range(i + 2, len(tokens)) if tokens[k] == ")"), None)
            if end is None:
                raise ConfigError(f"the array {name}=( in the Megatron launch script is not closed; check the script")
            items = shell.expand_words([t for t in tokens[i + 2:end] if isinstance(t, tuple)])
            shell.arrays[name] = (shell.arrays.get(name, []) if append else []) + items
            shell.scalars.pop(name, None)
            i = end + 1
            continue
        value = "".join(shell.expand_word(value_word, split=False)) if value_word else ""
        if name in shell.arrays and not append:
            shell.arrays[name] = [value]
        elif name in shell.arrays:
            shell.arrays[name][0] = shell.arrays[name][0] + value if shell.arrays[name] else value
        else:
            shell.scalars[name] = (shell.scalars.get(name, "") if append else "") + value
        i += 1
    return tokens[i:]


def _is_launch(words: list[str]) -> bool:
    if not words or words[0] in _NOT_LAUNCHES:
        return False
    return any(w.endswith(".py") and not re.search(r"\s", w) for w in words)


def launch_words(text: str) -> tuple[list[str], list[str]]:
    """(words of the launch command, notes): the last command that runs a .py file, with the script's variables
    and arrays expanded; a text without one is read whole (a list of flags)."""
    shell = _Shell()
    statements = _statements(tokenize(text))
    _run(shell, statements, 0, set())
    launches = [c for c in shell.commands if _is_launch(c)]
    if launches:
        return launches[-1], shell.notes
    return [w for c in shell.commands for w in c], shell.notes


def launch_variable(text: str, name: str) -> str | None:
    """The value the script (or an assignment before the launch command) gives variable ``name``, if any."""
    shell = _Shell()
    _run(shell, _statements(tokenize(text)), 0, set())
    return shell.scalars.get(name)


__all__ = [
    "Part",
    "Word",
    "launch_variable",
    "launch_words",
    "tokenize",
]
