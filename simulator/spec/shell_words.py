"""The words of a shell text: tokens with their quoting, ``$NAME`` and ``${...}`` forms kept as written, and
bash's operators. With ``simulator.spec.shell_expand`` (what bash expands the words to) this is the part of the
launch-script reader (``simulator.spec.shell_script``) that knows bash's quoting rules and nothing of statements
or control flow.

Every word keeps the script lines it was written on, so that a refusal can name the line a user has to fix. The
tokenizer reads each character a bounded number of times (positions, never slices of the rest of the text).
"""

from __future__ import annotations

import re
from typing import NamedTuple

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
