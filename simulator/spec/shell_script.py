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

import ast
import operator
import re
from dataclasses import dataclass, field

from simulator.spec.errors import ConfigError

_OPERATORS = ("&&", "||", ";;", ";", "|", "&", "(", ")")
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_ASSIGN = re.compile(rf"^({_NAME})(\+?)=")
_DECLARERS = {"export", "local", "declare", "typeset", "readonly"}
_NOT_LAUNCHES = {"echo", "printf", "cat", "ls", "test", "[", "[[", "mkdir", "cp", "mv", "rm", "touch", "tee"}
_MAX_WORDS = 200_000  # a bound, so that a script cannot grow its arrays until memory runs out


@dataclass(frozen=True)
class Part:
    """A piece of a shell word: its text and how it was quoted ('' unquoted, "'" single, '"' double)."""

    text: str
    quote: str


Word = tuple[Part, ...]


def _scan_nested(text: str, i: int, opening: str, closing: str) -> int:
    """Index just past the ``closing`` that matches the ``opening`` before ``i``, skipping quoted text."""
    depth, n = 1, len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c in "'\"":
            end = text.find(c, i + 1)
            if end < 0:
                break
            i = end + 1
            continue
        if c == opening:
            depth += 1
        elif c == closing:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise ConfigError(f"cannot read the Megatron command line (an unclosed {opening!r}); check its quotes and "
                      "brackets")


def _dollar(text: str, i: int) -> int:
    """Index past a ``$`` expansion starting at ``i`` (``$NAME``, ``${...}``, ``$(...)``, ``$((...))``)."""
    nxt = text[i + 1:i + 2]
    if nxt == "{":
        return _scan_nested(text, i + 2, "{", "}")
    if nxt == "(":
        return _scan_nested(text, i + 2, "(", ")")
    m = re.match(rf"{_NAME}|[0-9@*#?$!-]", text[i + 1:])
    return i + 1 + (len(m.group()) if m else 0)


def tokenize(text: str) -> list[Word | str]:
    """Shell words (as parts) and operators ('\\n', ';', '&&', '||', '|', '(', ')'), comments dropped."""
    text = re.sub(r"\\\r?\n", "", text)
    out: list[Word | str] = []
    parts: list[Part] = []
    i, n = 0, len(text)

    def flush() -> None:
        if parts:
            out.append(tuple(parts))
            parts.clear()

    while i < n:
        c = text[i]
        if c in " \t\r":
            flush()
            i += 1
        elif c == "\n":
            flush()
            out.append("\n")
            i += 1
        elif c == "#" and not parts:
            while i < n and text[i] != "\n":
                i += 1
        elif c == "'":
            end = text.find("'", i + 1)
            if end < 0:
                raise ConfigError("cannot read the Megatron command line (an unclosed quote); check its quotes")
            parts.append(Part(text[i + 1:end], "'"))
            i = end + 1
        elif c == '"':
            j, buf = i + 1, []
            while True:
                if j >= n:
                    raise ConfigError("cannot read the Megatron command line (an unclosed quote); check its quotes")
                if text[j] == '"':
                    break
                if text[j] == "\\" and j + 1 < n and text[j + 1] in '$`"\\':
                    buf.append(text[j + 1])
                    j += 2
                elif text[j] == "$":
                    end = _dollar(text, j)
                    buf.append(text[j:end])
                    j = end
                else:
                    buf.append(text[j])
                    j += 1
            parts.append(Part("".join(buf), '"'))
            i = j + 1
        elif c == "\\":
            parts.append(Part(text[i + 1:i + 2], "'"))
            i += 2
        elif c == "$":
            end = _dollar(text, i)
            parts.append(Part(text[i:end], ""))
            i = end
        elif c in "<>" or (c.isdigit() and not parts and re.match(r"\d+>", text[i:])):
            # a redirection and its target: not part of the command's words
            m = re.match(r"\d*(>>|>&|<&|>|<)\s*", text[i:])
            i += m.end() if m else 1
            while i < n and text[i] not in " \t\r\n;|&":
                i += 1
        elif c == "&" and text.startswith("&>", i):
            i += 2
            while i < n and text[i] in " \t":
                i += 1
            while i < n and text[i] not in " \t\r\n;|&":
                i += 1
        elif c in "&|;()":
            flush()
            op = next(o for o in _OPERATORS if text.startswith(o, i))
            out.append(op)
            i += len(op)
        else:
            j = i
            while j < n and text[j] not in " \t\r\n'\"\\$&|;()<>":
                j += 1
            parts.append(Part(text[i:j], ""))
            i = j
    flush()
    return out


@dataclass
class _Shell:
    """The variables a script has set so far, and what it noted."""

    scalars: dict[str, str] = field(default_factory=dict)
    arrays: dict[str, list[str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    commands: list[list[str]] = field(default_factory=list)

    # --- expansion ---------------------------------------------------------------------------------

    def value(self, name: str) -> str | None:
        if name in self.arrays:
            return self.arrays[name][0] if self.arrays[name] else ""
        return self.scalars.get(name)

    def expand_parameter(self, body: str) -> list[str] | None:
        """The fields of ``${body}`` (several for ``ARR[@]``), or None when it cannot be known."""
        m = re.fullmatch(rf"({_NAME})\[([@*])\]", body)
        if m:
            if m.group(1) not in self.arrays:
                return None if m.group(1) not in self.scalars else [self.scalars[m.group(1)]]
            items = self.arrays[m.group(1)]
            return items if m.group(2) == "@" else [" ".join(items)]
        m = re.fullmatch(rf"({_NAME})\[(\d+)\]", body)
        if m:
            items = self.arrays.get(m.group(1))
            if items is None:
                return None
            k = int(m.group(2))
            return [items[k] if k < len(items) else ""]
        m = re.fullmatch(rf"({_NAME}|\d+)(:?[-=])(.*)", body, re.S)
        if m:
            name, how, default = m.groups()
            current = self.value(name)
            unset = current is None or (how.startswith(":") and current == "")
            if not unset:
                return [current]
            words = [t for t in tokenize(default) if isinstance(t, tuple)]
            filled = " ".join("".join(self.expand_word(w, split=False)) for w in words)
            if how.endswith("=") and not name.isdigit():
                self.scalars[name] = filled
            return [filled]
        if re.fullmatch(rf"{_NAME}", body):
            v = self.value(body)
            return None if v is None else [v]
        return None

    def arithmetic(self, expr: str) -> str | None:
        def name(m: re.Match) -> str:
            v = self.value(m.group(1) or m.group(2) or m.group(3))
            return v if v is not None and re.fullmatch(r"-?\d+", v.strip()) else "x"

        text = re.sub(rf"\$\{{({_NAME})\}}|\$({_NAME})|\b({_NAME})\b", name, expr)
        try:
            return str(_integer(ast.parse(text.strip(), mode="eval").body))
        except (SyntaxError, ValueError, ZeroDivisionError, RecursionError):
            return None

    def expand_part(self, part: Part) -> list[tuple[str, bool]]:
        """(text, splittable) pieces of an unquoted or double-quoted part; a new field starts after each
        piece that is a separate field of ``"${ARR[@]}"``, marked by None text."""
        if part.quote == "'":
            return [(part.text, False)]
        pieces: list[tuple[str, bool]] = []
        text, i = part.text, 0
        split = part.quote == ""
        while i < len(text):
            j = text.find("$", i)
            if j < 0:
                pieces.append((text[i:], False))
                break
            if j > i:
                pieces.append((text[i:j], False))
            end = _dollar(text, j)
            token = text[j:end]
            fields: list[str] | None
            if token.startswith("$((") and token.endswith("))"):
                result = self.arithmetic(token[3:-2])
                fields = None if result is None else [result]
            elif token.startswith("$("):
                fields = None  # a command substitution: never run
            elif token.startswith("${"):
                fields = self.expand_parameter(token[2:-1])
            elif len(token) > 1:
                v = self.value(token[1:])
                fields = None if v is None else [v]
            else:
                fields = ["$"]
            if fields is None:
                pieces.append((token, False))  # kept as written, so a flag that needs it says so
            else:
                for k, f in enumerate(fields):
                    if k:
                        pieces.append(("\0", False))  # a field boundary of "${ARR[@]}"
                    pieces.append((f, split))
            i = end
        return pieces

    def expand_word(self, word: Word, split: bool = True) -> list[str]:
        """A word's fields: unquoted expansions split at blanks (``split``), empty unquoted words dropped."""
        whole = re.fullmatch(rf"\$\{{({_NAME})\[@\]\}}", word[0].text) if len(word) == 1 else None
        if whole and self.arrays.get(whole.group(1)) == []:
            return []  # "${ARR[@]}" of an empty array is no word at all
        fields: list[str] = []
        current: list[str] = []
        started = False
        for part in word:
            if part.quote:
                started = True
            for text, splittable in self.expand_part(part):
                if text == "\0":
                    fields.append("".join(current))
                    current, started = [], True
                    continue
                if not (splittable and split):
                    current.append(text)
                    started = started or bool(text)
                    continue
                pieces = re.split(r"[ \t\n]+", text)
                for k, piece in enumerate(pieces):
                    if k:
                        if current or started:
                            fields.append("".join(current))
                        current, started = [], False
                    if piece:
                        current.append(piece)
                        started = True
        if current or started:
            fields.append("".join(current))
        if len(fields) > _MAX_WORDS:
            raise ConfigError(f"the Megatron launch script expands to more than {_MAX_WORDS:,} words; give the "
                              "pretrain_gpt.py command itself")
        return fields

    def expand_words(self, words: list[Word]) -> list[str]:
        return [f for w in words for f in self.expand_word(w)]


def _integer(node: ast.AST) -> int:
    ops = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
           ast.Div: operator.floordiv, ast.Mod: operator.mod}
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _integer(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and type(node.op) in ops:
        left, right = _integer(node.left), _integer(node.right)
        if abs(left) > 2**62 or abs(right) > 2**62:
            raise ValueError
        return ops[type(node.op)](left, right)
    raise ValueError


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
