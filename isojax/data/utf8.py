"""Reading UTF-8 data files so that text that is not UTF-8 is an error naming the file and line.

Python's ``UnicodeDecodeError`` gives a byte offset into a buffer, not a line, and names no file. The readers of
:mod:`isojax.data` read text through :func:`utf8_lines`, or turn that error into :func:`not_utf8`'s ``ValueError``
(``path: line N: not UTF-8 text (...)``, lines counted from 1 at ``\\n``) where another library reads the file.
The file is read a second time, in binary, only to find the line once decoding has failed.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from pathlib import Path

__all__ = ["not_utf8", "utf8_lines"]


def not_utf8(path) -> ValueError:
    """The ``ValueError`` for a file (``.gz``: decompressed) that does not decode as UTF-8.

    Args:
      path: the file (``str`` or path-like); a name ending in ``.gz`` is read through ``gzip``.

    Returns:
      a ``ValueError`` (returned, not raised) whose message names the file, the first line (counted from 1 at
      ``\\n``) that does not decode and the offending bytes with their 1-based position in that line; a file
      that does decode (decoding failed elsewhere) gets ``path: not UTF-8 text``.

    Examples:
      ``b"\\xe9"`` (Latin-1 ``é``) is not UTF-8; it is byte 4 of line 2:

      >>> import tempfile, pathlib
      >>> path = pathlib.Path(tempfile.mkdtemp()) / "words.txt"
      >>> _ = path.write_bytes(b"ok\\ncaf\\xe9\\n")
      >>> str(not_utf8(path)).removeprefix(str(path))
      ": line 2: not UTF-8 text (bytes b'\\\\xe9' at byte 4 of the line: invalid continuation byte)"
    """
    path = Path(path)
    with (gzip.open if path.suffix == ".gz" else open)(path, "rb") as fh:
        for number, line in enumerate(fh, start=1):  # a UTF-8 sequence never holds b"\n": decode line by line
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as e:
                return ValueError(
                    f"{path}: line {number}: not UTF-8 text (bytes {line[e.start : e.end]!r} at byte "
                    f"{e.start + 1} of the line: {e.reason})"
                )
    return ValueError(f"{path}: not UTF-8 text")


def utf8_lines(path, *, encoding: str = "utf-8", newline: str | None = None) -> Iterator[str]:
    """The lines of a text file as ``open(path, encoding=encoding, newline=newline)`` yields them.

    Args:
      path: the file (``str`` or path-like).
      encoding: ``"utf-8"``, or ``"utf-8-sig"``, which drops a byte-order mark.
      newline: passed to ``open``: ``None`` translates ``\\r\\n`` to ``\\n``; ``""`` keeps line ends as written.

    Returns:
      an iterator of ``str`` lines, line ends included. Text that is not UTF-8 raises :func:`not_utf8`'s
      ``ValueError`` (naming the file and line) when the iteration reaches it.

    Examples:
      >>> import tempfile, pathlib
      >>> path = pathlib.Path(tempfile.mkdtemp()) / "lines.txt"
      >>> _ = path.write_bytes(b"\\xef\\xbb\\xbfa\\r\\nb")
      >>> list(utf8_lines(path, encoding="utf-8-sig"))
      ['a\\n', 'b']
      >>> list(utf8_lines(path, newline=""))
      ['\\ufeffa\\r\\n', 'b']
    """
    try:
        with open(path, encoding=encoding, newline=newline) as fh:
            yield from fh
    except UnicodeDecodeError:
        raise not_utf8(path) from None
