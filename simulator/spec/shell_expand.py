"""What bash expands a word to, given the variables a script has set so far: ``$NAME``, ``${...}`` parameter
forms, arrays and ``$((...))`` arithmetic, over the words ``simulator.spec.shell_words`` reads. The launch-script
reader (``simulator.spec.shell_script``) asks it at every assignment, test and command.

Every expanded field keeps the lines of the word or the array item it came from, so that a refusal can name the
line a user has to fix; expansion is bounded by ``limits.MAX_SCRIPT_EXPANSION_BYTES`` and
``limits.MAX_SCRIPT_NESTING``.
"""

from __future__ import annotations

import ast
import operator
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

from simulator.spec import limits
from simulator.spec.errors import ConfigError
from simulator.spec.shell_words import _MAX_WORDS, _NAME, Part, Span, Word, _dollar, _joined, span_of, tokenize


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
