"""Files in and out, with one clear error for every way it can fail.

Reading: a file must be a regular file of at most ``MAX_INPUT_FILE_BYTES`` holding UTF-8 text;
YAML is read with the safe loader and without aliases (no tags, no "billion laughs"); JSON must be
strict (no NaN or Infinity); nesting too deep for the parser and integers too long to convert are
refused like any other syntax error.

Writing (``write_output``): a regular file is replaced atomically through a temporary file with a
unique name in the same folder, so a reader (or a second writer) never sees half a file; a
character device or a FIFO (``/dev/null``, ``/dev/stdout``, a named pipe) is written through and
never replaced; a symlink is followed and the file it points to is replaced; a missing folder is
created; everything else (a folder, a block device, a socket, a path the OS refuses) ends in one
``OutputError`` sentence.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import sys
import tempfile
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from simulator.spec.errors import ConfigError, OutputError, SimulatorError
from simulator.spec.limits import MAX_FILE_NAME_BYTES, MAX_INPUT_FILE_BYTES, MAX_PATH_BYTES

T = TypeVar("T", bound=BaseModel)


def short_repr(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters (a 5,000-digit number or a long list stays one line)."""
    try:
        text = repr(value)
    except ValueError:  # an int too long for repr
        return f"<an integer of more than {sys.get_int_max_str_digits()} digits>"
    if len(text) > limit:
        text = f"{text[:limit - 20]}...({len(text):,} characters)"
    return text


# --- names ---------------------------------------------------------------------------------------


def check_name(path: str | os.PathLike, what: str, error: type[SimulatorError] = ConfigError) -> Path:
    """Refuse a path the OS cannot hold (a component over 255 bytes, the whole over 4,096)."""
    text = os.fsencode(path)
    if not text:
        raise error(f"the {what} path is empty; name a file")
    if b"\0" in text:
        raise error(f"the {what} path {short_repr(os.fsdecode(path), 40)} holds a NUL character, which no file name "
                    "may; fix the path")
    if len(text) > MAX_PATH_BYTES:
        raise error(f"the {what} path is {len(text):,} bytes long, more than the {MAX_PATH_BYTES:,} a path may have; "
                    "use a shorter path")
    longest = max(text.split(b"/"), key=len)
    if len(longest) > MAX_FILE_NAME_BYTES:
        raise error(f"the {what} path has a name of {len(longest):,} bytes ({short_repr(os.fsdecode(longest), 40)}), "
                    f"more than the {MAX_FILE_NAME_BYTES} a file name may have; use a shorter name")
    return Path(path)


def exists(path: str | os.PathLike, what: str) -> bool:
    """Whether ``path`` names something on disk; a name the OS cannot hold is a ConfigError, not False."""
    path = check_name(path, f"{what} file")
    try:
        path.stat()
    except OSError:
        return False
    return True


# --- reading -------------------------------------------------------------------------------------


def read_text(path: str | os.PathLike, what: str, error: type[SimulatorError] = ConfigError,
              fix: str = "check the path") -> str:
    """The UTF-8 text of a regular file of at most MAX_INPUT_FILE_BYTES; every failure is one ``error``."""
    path = check_name(path, f"{what} file", error)
    where = repr(str(path))
    try:
        st = path.stat()
    except OSError as exc:
        raise error(f"cannot read {what} file {where}: {exc.strerror}; {fix}") from None
    if stat.S_ISDIR(st.st_mode):
        raise error(f"{what} file {where} is a folder; name a file")
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{what} file {where} is not a regular file (a device, pipe or socket); name a regular file")
    if st.st_size > MAX_INPUT_FILE_BYTES:
        raise error(f"{what} file {where} is {st.st_size:,} bytes, more than the {MAX_INPUT_FILE_BYTES:,} a "
                    f"{what} file may have; check that it is the right file")
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_INPUT_FILE_BYTES + 1)
    except OSError as exc:
        raise error(f"cannot read {what} file {where}: {exc.strerror}; {fix}") from None
    if len(data) > MAX_INPUT_FILE_BYTES:
        raise error(f"{what} file {where} grew past {MAX_INPUT_FILE_BYTES:,} bytes while it was read; "
                    "check that it is the right file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{what} file {where} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
                    "save it as UTF-8") from None


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows")


def parse_json(text: str, where: str, error: type[SimulatorError] = ConfigError, fix: str = "fix its syntax") -> Any:
    """Strict JSON: NaN and Infinity are refused, as are nesting too deep and integers too long to convert."""
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise error(f"{where} is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}); {fix}") from None
    except RecursionError:
        raise error(f"{where} nests its JSON too deep to read; {fix}") from None
    except ValueError as exc:  # parse_constant, or an integer of more than sys.get_int_max_str_digits() digits
        raise error(f"{where} is not valid JSON ({' '.join(str(exc).split())}); {fix}") from None


class _SafeLoader(yaml.SafeLoader):
    """PyYAML's safe loader (plain data, no tags that build Python objects), without aliases."""

    def compose_node(self, parent, index):  # noqa: ANN001 - PyYAML's signature
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(None, None, f"an alias (*{event.anchor}) is not accepted; write the "
                                              "value out", event.start_mark)
        return super().compose_node(parent, index)


def parse_yaml(text: str, where: str, error: type[SimulatorError] = ConfigError, fix: str = "fix its syntax") -> Any:
    try:
        return yaml.load(text, Loader=_SafeLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise error(f"{where} is not valid YAML ({first}); {fix}") from None
    except RecursionError:
        raise error(f"{where} nests its YAML too deep to read; {fix}") from None
    except ValueError as exc:  # an integer of more than sys.get_int_max_str_digits() digits
        raise error(f"{where} is not valid YAML ({' '.join(str(exc).split())}); {fix}") from None


def read_mapping(path: Path, what: str) -> dict[str, Any]:
    """Parse a YAML or JSON file that must hold a mapping."""
    path = Path(path)
    text = read_text(path, what)
    where = f"{what} file {str(path)!r}"
    data = parse_json(text, where) if path.suffix == ".json" else parse_yaml(text, where)
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must hold a mapping of fields, not {type(data).__name__}")
    return data


# --- validation ----------------------------------------------------------------------------------

_BOUNDS = {
    "less_than_equal": ("le", "at most"),
    "less_than": ("lt", "less than"),
    "greater_than": ("gt", "more than"),
    "greater_than_equal": ("ge", "at least"),
}


def _number(x: Any) -> str:
    return f"{x:,}" if isinstance(x, int) else f"{x:g}" if isinstance(x, float) else str(x)


def validation_message(exc: ValidationError, what: str) -> str:
    """One sentence from pydantic's first error, naming the field, the value and the fix."""
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"]) or what
    msg = err["msg"]
    value = short_repr(err.get("input"))
    if msg.startswith("Value error, "):
        # a nested model's rule does not know the file or the field it was read from: name them
        return f"{what} field {loc!r}: {msg[len('Value error, '):]}" if err["loc"] else msg[len("Value error, "):]
    if err["type"] == "extra_forbidden":
        return f"{what} has an unknown field {loc!r}; remove it or check its spelling"
    if err["type"] == "missing":
        return f"{what} is missing the field {loc!r}; add it"
    if err["type"] in _BOUNDS and err.get("ctx"):
        key, words = _BOUNDS[err["type"]]
        return f"{what} field {loc!r} is {value}, out of range; use {words} {_number(err['ctx'][key])}"
    if err["type"] == "too_short" and err.get("ctx"):
        return f"{what} field {loc!r} has {err['ctx']['actual_length']} entries; give at least {err['ctx']['min_length']}"
    if err["type"] == "string_too_short" and err.get("input") == "":
        return f"{what} field {loc!r} is empty; write it out"
    if err["type"] == "finite_number":
        return f"{what} field {loc!r} is {value}, not a finite number; give a finite value"
    if err["type"] in _TYPES:
        kind = _TYPES[err["type"]]
        return (f"{what} field {loc!r} is {value}, not {kind}; write {kind}"
                + (" without quotes" if isinstance(err.get("input"), str)
                   and err["type"] in ("int_type", "float_type", "bool_type") else ""))
    return f"{what} field {loc!r}: {msg} (got {value})"


_TYPES = {"int_type": "a whole number", "float_type": "a number", "bool_type": "true or false",
          "string_type": "text", "model_type": "a mapping of fields", "dict_type": "a mapping",
          "tuple_type": "a list", "list_type": "a list", "float_parsing": "a number"}


def validate_file_data(model: type[T], data: Any) -> T:
    """Validate what a file held into ``model`` strictly, as JSON: a number is a number and a flag is true or
    false, never text or a flag standing for one (``true`` is not 1, ``"12"`` is not 12; a whole number
    may stand where a number is expected). Values JSON has no type for (a YAML date) are read as text."""
    return model.model_validate_json(json.dumps(data, default=str), strict=True)


def build(model: type[T], data: dict[str, Any], what: str, strict: bool = False) -> T:
    """Validate ``data`` into ``model``; a failure is one ConfigError sentence. ``strict``: ``data`` was read
    from a file (``validate_file_data``); Python values (the command line's, already converted) are not."""
    try:
        return validate_file_data(model, data) if strict else model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(validation_message(exc, what)) from None


# --- writing -------------------------------------------------------------------------------------

_FIXES = {
    errno.ENOSPC: "free some space or write elsewhere",
    errno.EDQUOT: "free some space or write elsewhere",
    errno.EACCES: "choose a folder you may write to",
    errno.EPERM: "choose a folder you may write to",
    errno.EROFS: "choose a folder on a writable file system",
    errno.ENAMETOOLONG: "use a shorter name",
    errno.ENOTDIR: "a part of the path is a file, not a folder; fix the path",
}


def _os_error(exc: OSError, what: str, path: Path) -> OutputError:
    fix = _FIXES.get(exc.errno, "check the path")
    reason = exc.strerror or type(exc).__name__
    return OutputError(f"cannot write {what} {str(path)!r}: {reason}; {fix}")


def check_output(path: str | os.PathLike, what: str) -> Path:
    """Refuse an output path that can never be written (before any work is done): a name the OS
    cannot hold, a folder, a block device or a socket. The rest is checked as it is written."""
    path = check_name(path, what, OutputError)
    try:
        st = path.stat()
    except FileNotFoundError:
        return path
    except OSError as exc:
        raise _os_error(exc, what, path) from None
    if stat.S_ISDIR(st.st_mode):
        raise OutputError(f"{what} {str(path)!r} is a folder; name a file in it")
    if stat.S_ISBLK(st.st_mode) or stat.S_ISSOCK(st.st_mode):
        kind = "a block device" if stat.S_ISBLK(st.st_mode) else "a socket"
        raise OutputError(f"{what} {str(path)!r} is {kind}, which is never written; name a regular file")
    return path


def _write_through(path: Path, data: bytes, what: str, st: os.stat_result) -> None:
    """Write into a character device or a FIFO as it is (never replace it)."""
    flags = os.O_WRONLY | (os.O_NONBLOCK if stat.S_ISFIFO(st.st_mode) else 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            raise OutputError(f"{what} {str(path)!r} is a FIFO that no process is reading; start the reader first "
                              "or name a regular file") from None
        raise _os_error(exc, what, path) from None
    try:
        os.set_blocking(fd, True)
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
    except OSError as exc:
        raise _os_error(exc, what, path) from None
    finally:
        os.close(fd)


def _new_file_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def make_folder(folder: str | os.PathLike, what: str) -> Path:
    """Create ``folder`` (and its parents) for ``what``; a path that cannot be a folder is one OutputError."""
    folder = check_name(folder, what.removeprefix("the "), OutputError)  # it says "the {what} path"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise OutputError(f"cannot write {what}: {str(folder)!r} is a file, not a folder; fix the path") from None
    except OSError as exc:
        raise OutputError(f"cannot create the folder {str(folder)!r} for {what}: {exc.strerror}; "
                          f"{_FIXES.get(exc.errno, 'check the path')}") from None
    return folder


def _replace(target: Path, data: bytes, what: str, shown: Path) -> None:
    """Write ``data`` to a unique temporary file beside ``target`` and rename it over ``target``."""
    folder = make_folder(target.parent, f"{what} {str(shown)!r}")
    try:
        mode = stat.S_IMODE(target.stat().st_mode)
    except OSError:
        mode = _new_file_mode()
    # the name keeps the start of the target's, so a leftover temp file says whose it was
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name[:64]}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise _os_error(exc, what, shown) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise _os_error(exc, what, shown) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_output(path: str | os.PathLike, data: str | bytes, what: str) -> Path:
    """Write ``data`` to ``path`` (see the module docstring); every failure is one ``OutputError``."""
    path = check_output(path, what)
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    try:
        st = path.stat()
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise _os_error(exc, what, path) from None
    if st is not None and (stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode)):
        _write_through(path, raw, what, st)
        return path
    target = Path(os.path.realpath(path)) if path.is_symlink() else path
    _replace(target, raw, what, path)
    return path
