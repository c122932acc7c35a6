#!/usr/bin/env python3
"""Fill ``${var}`` placeholders of a Triton ``config.pbtxt`` template.

Usage::

    fill_template.py [-i] FILE "key1:value1,key2:value2"

Without ``-i`` the filled text goes to stdout; with ``-i`` the file is rewritten in place
(atomically: a temporary file in the same directory, then a rename).

Substitution syntax: items are separated by ``,`` and each item is split into key and value on
its first ``:``. Write ``\\,`` and ``\\:`` for a literal comma or colon. A backslash before any
other character is kept as it is. Empty items (``a:1,,b:2`` or a trailing comma) are ignored.

A key that is not a placeholder of the file is an error (a typo would otherwise leave a setting
silently at its default); placeholders that are not given stay in the text as they are, so a
template can be filled in several passes.

Any error is reported as one line ``fill_template: error: ...`` on stderr with exit status 2,
and the file is left untouched.

This file is self-contained: it runs as a plain script and imports nothing else of the repo.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import NoReturn

__all__ = [
    "TemplateError",
    "fill_file",
    "fill_text",
    "main",
    "parse_substitutions",
    "placeholders",
]

PROG = "fill_template"

# ``${name}``; the name follows Python's string.Template identifier rules.
_PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class TemplateError(ValueError):
    """A bad substitution spec, an unknown key, or a template that cannot be filled."""


def placeholders(text: str) -> set[str]:
    """Return the names of all ``${name}`` placeholders in ``text``."""
    return set(_PLACEHOLDER.findall(text))


def _split_unescaped(text: str, sep: str, maxsplit: int = -1) -> list[str]:
    """Split on ``sep`` where it is not preceded by a backslash; escapes are kept verbatim."""
    parts: list[str] = []
    current: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text) and text[i + 1] in ",:":
            current.append(text[i : i + 2])
            i += 2
            continue
        if ch == sep and (maxsplit < 0 or len(parts) < maxsplit):
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
        i += 1
    parts.append("".join(current))
    return parts


def _unescape(text: str) -> str:
    return text.replace("\\,", ",").replace("\\:", ":")


def parse_substitutions(spec: str) -> dict[str, str]:
    """Parse ``"k1:v1,k2:v2"`` into a dict.

    ``\\,`` and ``\\:`` are a literal comma and colon. Keys are stripped of surrounding
    whitespace, values are kept verbatim (an empty value is allowed). Raises TemplateError for
    an item without ``:``, an empty key, or a key given twice with different values.
    """
    values: dict[str, str] = {}
    for item in _split_unescaped(spec, ","):
        if not item.strip():
            continue
        key_value = _split_unescaped(item, ":", maxsplit=1)
        if len(key_value) != 2:
            raise TemplateError(f"bad substitution {item!r}: expected 'key:value'")
        key, value = _unescape(key_value[0]).strip(), _unescape(key_value[1])
        if not key:
            raise TemplateError(f"bad substitution {item!r}: empty key")
        if key in values and values[key] != value:
            raise TemplateError(f"key {key!r} given twice with different values ({values[key]!r}, {value!r})")
        values[key] = value
    return values


def fill_text(text: str, values: Mapping[str, str], *, source: str = "<template>") -> str:
    """Replace ``${k}`` by ``values[k]`` for every given key.

    Every key must be a placeholder of ``text``, otherwise TemplateError lists the unknown keys
    and the known placeholders. Placeholders without a value stay as they are. Values are
    inserted literally (a value containing ``${x}`` is not expanded again).
    """
    known = placeholders(text)
    unknown = sorted(set(values) - known)
    if unknown:
        names = ", ".join(repr(k) for k in unknown)
        plural = "s" if len(unknown) > 1 else ""
        known_list = ", ".join(sorted(known)) or "none"
        raise TemplateError(f"{source}: unknown key{plural} {names} (known: {known_list})")

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        return str(values[name]) if name in values else match.group(0)

    return _PLACEHOLDER.sub(replace, text)


def _write_atomic(path: Path, text: str) -> None:
    target = Path(os.path.realpath(path))  # replace the file a symlink points to, not the link
    mode = target.stat().st_mode & 0o7777
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp_name, mode)
        os.replace(tmp_name, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise


def fill_file(path: str | os.PathLike[str], values: Mapping[str, str], *, in_place: bool) -> str:
    """Fill the template at ``path`` and return the filled text.

    With ``in_place`` the file is replaced atomically; on any error it is left untouched.
    OSError (e.g. a missing file) propagates unchanged.
    """
    path = Path(path)
    with open(path, encoding="utf-8", newline="") as f:
        text = f.read()
    filled = fill_text(text, values, source=str(path))
    if in_place and filled != text:
        _write_atomic(path, filled)
    return filled


class _OneLineErrorParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise TemplateError(message)


def _build_parser() -> argparse.ArgumentParser:
    parser = _OneLineErrorParser(
        prog=PROG,
        description="Fill ${var} placeholders of a Triton config.pbtxt template.",
    )
    parser.add_argument(
        "-i",
        "--in_place",
        "--in-place",
        dest="in_place",
        action="store_true",
        help="rewrite FILE in place (atomically) instead of printing to stdout",
    )
    parser.add_argument("file_path", metavar="FILE", help="template file (config.pbtxt)")
    parser.add_argument(
        "substitutions",
        metavar="SUBSTITUTIONS",
        help=r'"key1:value1,key2:value2"; write \, and \: for a literal comma or colon',
    )
    return parser


def _one_line(message: object) -> str:
    return " ".join(str(message).split())


def main(argv: list[str] | None = None) -> int:
    try:
        args = _build_parser().parse_args(argv)
        values = parse_substitutions(args.substitutions)
        filled = fill_file(args.file_path, values, in_place=args.in_place)
    except TemplateError as exc:
        print(f"{PROG}: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except OSError as exc:
        reason = exc.strerror or exc.__class__.__name__
        where = exc.filename if exc.filename is not None else ""
        print(f"{PROG}: error: {_one_line(f'{where}: {reason}' if where else reason)}", file=sys.stderr)
        return 2
    except UnicodeDecodeError as exc:
        print(f"{PROG}: error: {args.file_path}: not UTF-8 text ({_one_line(exc)})", file=sys.stderr)
        return 2
    if not args.in_place:
        sys.stdout.write(filled)
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
