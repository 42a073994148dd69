"""The words of a shell text and what bash expands them to, given the variables set so far: tokens with
their quoting, ``$NAME``, ``${...}`` parameter forms, arrays and ``$((...))`` arithmetic. This is the
part of the launch-script reader (``simulator.spec.shell_script``) that knows bash's quoting and
expansion rules and nothing of statements or control flow, which the reader asks of it at every
assignment, test and command.
"""

from __future__ import annotations

import ast
import operator
import re
from dataclasses import dataclass, field

from simulator.spec.errors import ConfigError

_OPERATORS = ("&&", "||", ";;", ";", "|", "&", "(", ")")
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
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
