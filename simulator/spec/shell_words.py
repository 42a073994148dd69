"""The words of a shell text and what bash expands them to, given the variables set so far: tokens with
their quoting, ``$NAME``, ``${...}`` parameter forms, arrays and ``$((...))`` arithmetic. This is the
part of the launch-script reader (``simulator.spec.shell_script``) that knows bash's quoting and
expansion rules and nothing of statements or control flow, which the reader asks of it at every
assignment, test and command.

Every word keeps the script lines it was written on, and every expanded field the lines of the word
or the array item it came from, so that a refusal can name the line a user has to fix. The tokenizer
reads each character a bounded number of times (positions, never slices of the rest of the text), and
expansion is bounded by ``limits.MAX_SCRIPT_EXPANSION_BYTES`` and ``limits.MAX_SCRIPT_NESTING``.
"""

from __future__ import annotations

import ast
import operator
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, NamedTuple

from simulator.spec import limits
from simulator.spec.errors import ConfigError

_OPERATORS = ("&&", "||", ";;", ";", "|", "&", "(", ")")
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_MAX_WORDS = 200_000  # a bound, so that a script cannot grow its arrays until memory runs out

Span = tuple[int, int]  # the first and last script line (1-based) a piece of text was written on


class Part(NamedTuple):
    """A piece of a shell word: its text, how it was quoted ('' unquoted, "'" single, '"' double), and the
    script lines it was written on."""

    text: str
    quote: str
    line: int = 0
    last_line: int = 0


Word = tuple[Part, ...]


def span_of(word: Word) -> Span:
    return word[0].line, max(word[-1].last_line, word[0].line)


# --- tokens ----------------------------------------------------------------------------------------

# A run of plain unquoted words on one line, each ending at a blank, a newline or an operator: most of a launch
# script, taken in one match. A run stops before a word with an expansion other than $NAME, ${NAME} or
# ${NAME[@]}; that word, and anything else (quotes, escapes, redirections, comments), is read character by
# character below. Single-character repeats only, so that a failed match backtracks at most one word.
_RUN = re.compile(r"(?:[^\s'\"\\&|;()<>#][^\s'\"\\&|;()<>]*(?=[ \t\r\n;&|()]|\Z)[ \t\r]*)+")
_NOT_SIMPLE_DOLLAR = re.compile(rf"\$(?![A-Za-z_]|\{{{_NAME}(?:\[[@*0-9]+\])?\}})")
_BLANKS = re.compile(r"[ \t\r]+")
_WORD = re.compile(r"[^ \t\r\n'\"\\$&|;()<>]+")
_DOUBLE_QUOTED = re.compile(r'[^"\\$]+')
_DOLLAR_NAME = re.compile(rf"{_NAME}|[0-9@*#?$!-]")
_NESTED_PLAIN = re.compile(r"[^\\'\"{}()]+")
_FD_REDIRECT = re.compile(r"\d+>")
_REDIRECT = re.compile(r"\d*(?:>>|>&|<&|>|<)(?:[ \t]|\\\r?\n)*")
_REDIRECT_TARGET = re.compile(r"[^ \t\r\n;|&]*")
_CONTINUATION = re.compile(r"\\\r?\n")
_BLANK_SPLIT = re.compile(r"[ \t\n]+")


def _joined(text: str) -> str:
    """``text`` without its line continuations (a backslash before a newline)."""
    return _CONTINUATION.sub("", text) if "\\" in text else text


def _scan_nested(text: str, i: int, opening: str, closing: str) -> int:
    """Index just past the ``closing`` that matches the ``opening`` before ``i``, skipping quoted text."""
    depth, n = 1, len(text)
    while i < n:
        plain = _NESTED_PLAIN.match(text, i)
        if plain:
            i = plain.end()
            continue
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
    m = _DOLLAR_NAME.match(text, i + 1)
    return m.end() if m else i + 1


class _Lines:
    """The line of a position of ``text``, for positions asked in increasing order (each newline counted once)."""

    def __init__(self, text: str, first: int) -> None:
        self.text, self.pos, self.line = text, 0, first

    def at(self, pos: int) -> int:
        if pos > self.pos:
            self.line += self.text.count("\n", self.pos, pos)
            self.pos = pos
        return self.line


def tokenize(text: str, first_line: int = 1) -> list[Word | str]:
    """Shell words (as parts) and operators ('\\n', ';', '&&', '||', '|', '(', ')'), comments dropped; the
    parts' lines count from ``first_line``."""
    out: list[Word | str] = []
    parts: list[Part] = []
    lines = _Lines(text, first_line)
    cached: dict[str, Word] = {}
    cached_line = 0
    run_end = -1
    i, n = 0, len(text)

    def flush() -> None:
        if parts:
            out.append(tuple(parts))
            parts.clear()

    def part(body: str, quote: str, start: int, end: int) -> None:
        parts.append(Part(body, quote, lines.at(start), lines.at(end)))

    while i < n:
        if not parts:
            if i >= run_end:  # else still inside the run matched before, which need not be matched again
                run = _RUN.match(text, i)
                run_end = run.end() if run else i
            end = run_end
            bad = _NOT_SIMPLE_DOLLAR.search(text, i, end)
            if bad:  # the run ends before the word that holds it
                end = max(text.rfind(" ", i, bad.start()), text.rfind("\t", i, bad.start()),
                          text.rfind("\r", i, bad.start())) + 1
            if end > i:
                line = lines.at(i)
                if line != cached_line:
                    cached.clear()
                    cached_line = line
                for w in text[i:end].split():
                    word = cached.get(w)
                    if word is None:
                        word = cached[w] = (Part(w, "", line, line),)  # a word seen twice on a line is shared
                    out.append(word)
                i = end
                continue
        c = text[i]
        if c in " \t\r":
            flush()
            i = _BLANKS.match(text, i).end()
        elif c == "\n":
            flush()
            out.append("\n")
            i += 1
        elif c == "#" and not parts:
            end = text.find("\n", i)
            i = n if end < 0 else end
        elif c == "'":
            end = text.find("'", i + 1)
            if end < 0:
                raise ConfigError("cannot read the Megatron command line (an unclosed quote); check its quotes")
            part(text[i + 1:end], "'", i, end)
            i = end + 1
        elif c == '"':
            j, buf = i + 1, []
            while True:
                plain = _DOUBLE_QUOTED.match(text, j)
                if plain:
                    buf.append(plain.group())
                    j = plain.end()
                if j >= n:
                    raise ConfigError("cannot read the Megatron command line (an unclosed quote); check its quotes")
                if text[j] == '"':
                    break
                if text[j] == "$":
                    end = _dollar(text, j)
                    buf.append(_joined(text[j:end]))
                    j = end
                elif text.startswith("\n", j + 1) or text.startswith("\r\n", j + 1):
                    j += 2 if text[j + 1] == "\n" else 3  # a line continuation: nothing
                elif j + 1 < n and text[j + 1] in '$`"\\':
                    buf.append(text[j + 1])
                    j += 2
                else:
                    buf.append("\\")
                    j += 1
            part("".join(buf), '"', i, j)
            i = j + 1
        elif c == "\\":
            if text.startswith("\n", i + 1) or text.startswith("\r\n", i + 1):
                i += 2 if text[i + 1] == "\n" else 3  # a line continuation joins the word to the next line
            else:
                part(text[i + 1:i + 2], "'", i, i)
                i += 2
        elif c == "$":
            end = _dollar(text, i)
            part(_joined(text[i:end]), "", i, end)
            i = end
        elif c in "<>" or (c.isdigit() and not parts and _FD_REDIRECT.match(text, i)):
            # a redirection and its target: not part of the command's words
            m = _REDIRECT.match(text, i)
            i = _REDIRECT_TARGET.match(text, m.end() if m else i + 1).end()
        elif c == "&" and text.startswith("&>", i):
            i = _BLANKS.match(text, i + 2).end() if _BLANKS.match(text, i + 2) else i + 2
            i = _REDIRECT_TARGET.match(text, i).end()
        elif c in "&|;()":
            flush()
            op = next(o for o in _OPERATORS if text.startswith(o, i))
            out.append(op)
            i += len(op)
        else:
            end = _WORD.match(text, i).end()
            part(text[i:end], "", i, end)
            i = end
    flush()
    return out


# --- expansion -------------------------------------------------------------------------------------

_ARRAY_ALL = re.compile(rf"({_NAME})\[([@*])\]")
_ARRAY_ITEM = re.compile(rf"({_NAME})\[(\d+)\]")
_DEFAULT = re.compile(rf"({_NAME}|\d+)(:?[-=])(.*)", re.S)
_BARE_NAME = re.compile(_NAME)
_WHOLE_ARRAY = re.compile(rf"\$\{{({_NAME})\[@\]\}}")
_NOT_BLANK = re.compile(r"[^ \t\n]+")
_BLANK = re.compile(r"[ \t\n]")
_BARE_DOLLAR = re.compile(rf"\$(?:({_NAME})|\{{({_NAME})\}})")
_BOUNDARY = None  # a piece that ends a field: the boundary between two items of "${ARR[@]}"
_MAX_SEGMENTS = 256  # lines kept for one value: past them, its end is said to come from the last one kept

# Where each stretch of an expanded text was written: (offset in the text, lines), offsets rising from 0. A value
# built from a literal and another variable keeps both, so a word split out of it names its own line.
Segments = tuple[tuple[int, Span], ...]


def _slice(segments: Segments, start: int, end: int) -> Segments:
    """The segments of ``text[start:end]``."""
    if len(segments) == 1:
        return segments if segments[0][0] == 0 else ((0, segments[0][1]),)
    out = [(max(off - start, 0), span) for k, (off, span) in enumerate(segments)
           if off < end and (k + 1 == len(segments) or segments[k + 1][0] > start)]
    return tuple(out) or ((0, segments[-1][1]),)


class _Field:
    """A field being built from pieces, with the segments of each."""

    __slots__ = ("texts", "size", "segments", "started")

    def __init__(self, started: bool = False) -> None:
        self.texts: list[str] = []
        self.size = 0
        self.segments: list[tuple[int, Span]] = []
        self.started = started

    def add(self, text: str, segments: Segments) -> None:
        if text:
            for off, span in segments:
                if len(self.segments) < _MAX_SEGMENTS and (not self.segments or self.segments[-1][1] != span):
                    self.segments.append((self.size + off, span))
            self.texts.append(text)
            self.size += len(text)
            self.started = True


@dataclass
class _Shell:
    """The variables a script has set so far (with where their text was written), and what it noted."""

    scalars: dict[str, str] = field(default_factory=dict)
    arrays: dict[str, list[str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    commands: list[list[str]] = field(default_factory=list)
    segments: dict[str, Segments] = field(default_factory=dict)  # a scalar's
    array_segments: dict[str, list[Segments]] = field(default_factory=dict)  # each item's
    command_segments: list[list[Segments]] = field(default_factory=list)  # each command word's
    expanded_bytes: int = 0
    depth: int = 0

    # --- bounds ------------------------------------------------------------------------------------

    @contextmanager
    def nested(self, what: str, line: int) -> Iterator[None]:
        """One level deeper into ``what`` (if-blocks, defaults), refused past ``MAX_SCRIPT_NESTING``."""
        if self.depth >= limits.MAX_SCRIPT_NESTING:
            raise ConfigError(f"line {line} of the Megatron launch script nests {what} more than "
                              f"{limits.MAX_SCRIPT_NESTING} deep; flatten it or give the pretrain_gpt.py command")
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1

    def _spend(self, size: int, line: int) -> None:
        """Count ``size`` characters of expansion against the script's bound before they are built."""
        self.expanded_bytes += size
        if self.expanded_bytes > limits.MAX_SCRIPT_EXPANSION_BYTES:
            raise ConfigError(f"the Megatron launch script's variables expand to more than "
                              f"{limits.MAX_SCRIPT_EXPANSION_BYTES:,} characters by line {line} (a variable that "
                              "grows from itself?); give the pretrain_gpt.py command with its values written out")

    # --- variables ---------------------------------------------------------------------------------

    def value(self, name: str) -> str | None:
        located = self._located(name)
        return None if located is None else located[0]

    def _located(self, name: str) -> tuple[str, Segments] | None:
        if name in self.arrays:
            items = self.arrays[name]
            return (items[0], self.array_segments[name][0]) if items else ("", ((0, (0, 0)),))
        if name in self.scalars:
            return self.scalars[name], self.segments[name]
        return None

    def assign(self, name: str, value: str, segments: Segments, append: bool) -> None:
        """``NAME=value`` or ``NAME+=value`` (on an array: its first item, as bash does)."""
        if name in self.arrays:
            items = self.arrays[name]
            if append and items:
                joined = _Field()
                joined.add(items[0], self.array_segments[name][0])
                joined.add(value, segments)
                items[0], self.array_segments[name][0] = items[0] + value, tuple(joined.segments) or segments
            else:
                self.arrays[name], self.array_segments[name] = [value], [segments]
        elif append and name in self.scalars:
            joined = _Field()
            joined.add(self.scalars[name], self.segments[name])
            joined.add(value, segments)
            self.scalars[name] += value
            self.segments[name] = tuple(joined.segments) or segments
        else:
            self.scalars[name], self.segments[name] = value, segments

    def assign_array(self, name: str, items: list[str], segments: list[Segments], append: bool) -> None:
        """``NAME=( ... )`` or ``NAME+=( ... )``."""
        if append and name in self.arrays:
            items, segments = self.arrays[name] + items, self.array_segments[name] + segments
        self.arrays[name], self.array_segments[name] = items, segments
        self.scalars.pop(name, None)

    def unset(self, name: str) -> None:
        for table in (self.scalars, self.arrays, self.segments, self.array_segments):
            table.pop(name, None)

    # --- expansion ---------------------------------------------------------------------------------

    def expand_parameter(self, body: str, own: Segments) -> list[tuple[str, Segments]] | None:
        """The fields of ``${body}`` (several for ``ARR[@]``) and where each was written, or None when it
        cannot be known."""
        m = _ARRAY_ALL.fullmatch(body)
        if m:
            name = m.group(1)
            if name not in self.arrays:
                return None if name not in self.scalars else [(self.scalars[name], self.segments[name])]
            items, segments = self.arrays[name], self.array_segments[name]
            if m.group(2) == "@":
                return list(zip(items, segments))
            self._spend(sum(map(len, items)) + len(items), own[0][1][0])
            joined = _Field()
            for k, (item, where) in enumerate(zip(items, segments)):
                joined.add(" " if k else "", own)
                joined.add(item, where)
            return [(" ".join(items), tuple(joined.segments) or own)]
        m = _ARRAY_ITEM.fullmatch(body)
        if m:
            items = self.arrays.get(m.group(1))
            if items is None:
                return None
            digits = m.group(2)
            k = int(digits) if len(digits) < 19 else len(items)  # past any array the bound allows
            return [(items[k], self.array_segments[m.group(1)][k]) if k < len(items) else ("", own)]
        m = _DEFAULT.fullmatch(body)
        if m:
            name, how, default = m.groups()
            current = self._located(name)
            if current is not None and not (how.startswith(":") and current[0] == ""):
                return [current]
            with self.nested("${NAME:-...} defaults", own[0][1][0]):
                words = [t for t in tokenize(default, own[0][1][0]) if isinstance(t, tuple)]
                filled = " ".join("".join(self.expand_word(w, split=False)) for w in words)
            if how.endswith("=") and not name.isdigit():
                self.unset(name)
                self.assign(name, filled, own, append=False)
            return [(filled, own)]
        if _BARE_NAME.fullmatch(body):
            located = self._located(body)
            return None if located is None else [located]
        return None

    def arithmetic(self, expr: str) -> str | None:
        def name(m: re.Match) -> str:
            v = self.value(m.group(1) or m.group(2) or m.group(3))
            return v if v is not None and re.fullmatch(r"-?\d+", v.strip()) else "x"

        text = re.sub(rf"\$\{{({_NAME})\}}|\$({_NAME})|\b({_NAME})\b", name, _joined(expr))
        try:
            return str(_integer(ast.parse(text.strip(), mode="eval").body))
        except (SyntaxError, ValueError, ZeroDivisionError, RecursionError, MemoryError):
            return None

    def expand_part(self, part: Part) -> list[tuple[str | None, bool, Segments]]:
        """(text, splittable, where it was written) pieces of a part; a piece of None text ends a field (between
        the items of ``"${ARR[@]}"``)."""
        own: Segments = ((0, (part.line, max(part.line, part.last_line))),)
        if part.quote == "'":
            return [(part.text, False, own)]
        pieces: list[tuple[str | None, bool, Segments]] = []
        text, i = part.text, 0
        split = part.quote == ""
        while i < len(text):
            j = text.find("$", i)
            if j < 0:
                pieces.append((text[i:], False, own))
                break
            if j > i:
                pieces.append((text[i:j], False, own))
            end = _dollar(text, j)
            token = text[j:end]
            fields: list[tuple[str, Segments]] | None
            if token.startswith("$((") and token.endswith("))"):
                result = self.arithmetic(token[3:-2])
                fields = None if result is None else [(result, own)]
            elif token.startswith("$("):
                fields = None  # a command substitution: never run
            elif token.startswith("${"):
                fields = self.expand_parameter(token[2:-1], own)
            elif len(token) > 1:
                located = self._located(token[1:])
                fields = None if located is None else [located]
            else:
                fields = [("$", own)]
            if fields is None:
                pieces.append((token, False, own))  # kept as written, so a flag that needs it says so
            else:
                self._spend(sum(len(f) for f, _ in fields), part.line)
                for k, (f, where) in enumerate(fields):
                    if k:
                        pieces.append((_BOUNDARY, False, own))
                    pieces.append((f, split, where))
            i = end
        return pieces

    def expand_value(self, word: Word) -> tuple[str, Segments]:
        """What ``NAME=word`` assigns (unsplit, its fields joined) and where its text was written."""
        fields, wheres = self.expand_located(word, split=False)
        if len(fields) == 1:
            return fields[0], wheres[0]
        joined = _Field()
        for text, where in zip(fields, wheres):
            joined.add(text, where)
        return "".join(fields), tuple(joined.segments) or ((0, span_of(word)),)

    def expand_word(self, word: Word, split: bool = True) -> list[str]:
        """A word's fields: unquoted expansions split at blanks (``split``), empty unquoted words dropped."""
        return self.expand_located(word, split)[0]

    def expand_located(self, word: Word, split: bool = True) -> tuple[list[str], list[Segments]]:
        """A word's fields (as ``expand_word``) and where the text of each was written."""
        whole = _WHOLE_ARRAY.fullmatch(word[0].text) if len(word) == 1 else None
        if whole and self.arrays.get(whole.group(1)) == []:
            return [], []  # "${ARR[@]}" of an empty array is no word at all
        own: Segments = ((0, span_of(word)),)
        if len(word) == 1 and word[0].quote == "":  # the common words, at once: a literal, or $NAME of one word
            text = word[0].text
            if "$" not in text:
                return ([text], [own]) if text else ([], [])
            bare = _BARE_DOLLAR.fullmatch(text)
            located = self._located(bare.group(1) or bare.group(2)) if bare else None
            if located is not None and located[0] and not _BLANK.search(located[0]):
                self._spend(len(located[0]), word[0].line)
                return [located[0]], [located[1]]
        fields: list[str] = []
        wheres: list[Segments] = []
        current = _Field()

        def end_field() -> None:
            fields.append("".join(current.texts))
            wheres.append(tuple(current.segments) or own)

        for part in word:
            if part.quote:
                current.started = True
            for text, splittable, source in self.expand_part(part):
                if text is _BOUNDARY:
                    end_field()
                    current = _Field(started=True)
                elif not (splittable and split):
                    current.add(text, source)
                else:
                    # an unquoted expansion: its blanks end the field, its words start new ones
                    at = 0
                    for m in _NOT_BLANK.finditer(text):
                        if m.start() > at and (current.texts or current.started):
                            end_field()
                            current = _Field()
                        current.add(m.group(), _slice(source, m.start(), m.end()))
                        at = m.end()
                    if at < len(text) and (current.texts or current.started):
                        end_field()
                        current = _Field()
        if current.texts or current.started:
            end_field()
        if len(fields) > _MAX_WORDS:
            raise ConfigError(f"the Megatron launch script expands to more than {_MAX_WORDS:,} words; give the "
                              "pretrain_gpt.py command itself")
        return fields, wheres

    def expand_words(self, words: list[Word]) -> list[str]:
        return self.expand_words_located(words)[0]

    def expand_words_located(self, words: list[Word]) -> tuple[list[str], list[Segments]]:
        fields: list[str] = []
        wheres: list[Segments] = []
        for w in words:
            f, s = self.expand_located(w)
            fields += f
            wheres += s
        return fields, wheres


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
