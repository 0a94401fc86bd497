"""Tab-separated files of the original data releases, read as a :class:`isojax.data.tables.Table`.

SemEval STS inputs, SICK, the STS-B distribution and the files of GLUE's download script are all one record
per line, fields separated by tabs. They are read here as they were written: no quoting (the sentences hold
unbalanced double quotes, which a CSV reader would take as the start of a quoted field spanning lines), a
UTF-8 byte-order mark dropped (GLUE's MRPC files start with one), ``\\n`` or ``\\r\\n`` line ends, a last line
without a final newline kept. Every row must have exactly the expected number of fields; anything else is a
``ValueError`` that names the file and the line, and so is text that is not UTF-8. Field values are kept verbatim
(no stripping).
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

from isojax.data.tables import Table
from isojax.data.utf8 import not_utf8

__all__ = ["read_tsv"]


def read_tsv(path, names: Sequence[str] | None = None, *, extra: Sequence[str] = ()) -> Table:
    """Read a tab-separated file into columns of strings.

    Args:
      path: the file (UTF-8).
      names: the field names of a file without a header row; ``None``: the first line is the header.
      extra: names of optional trailing fields (a row has ``len(names)`` or ``len(names) + len(extra)``
        fields; a row without them holds ``None`` there), e.g. the two source columns of STS16's inputs.

    Returns:
      a :class:`Table` whose rows remember their line numbers, so that a bad value found later is reported
      as ``path: line N``. A missing file is a ``FileNotFoundError``; an empty file, a row with the wrong
      number of fields or text that is not UTF-8 is a ``ValueError`` naming the file and line.

    Examples:
      A double quote is text, not the start of a quoted field; a row without the optional field holds ``None``:

      >>> import tempfile, pathlib
      >>> path = pathlib.Path(tempfile.mkdtemp()) / "pairs.tsv"
      >>> _ = path.write_text('a "b\\tc\\tx\\nd\\te\\n')
      >>> read_tsv(path, ("s1", "s2"), extra=("source",)).columns
      {'s1': ['a "b', 'd'], 's2': ['c', 'e'], 'source': ['x', None]}
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        with path.open(encoding="utf-8-sig", newline="") as fh:
            reader = csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE)
            header = list(names) if names is not None else next(reader, None)
            if header is None:
                raise ValueError(f"{path}: empty file; expected a header row")
            extra = list(extra)
            if len(set(header + extra)) != len(header) + len(extra):
                raise ValueError(f"{path}: field names must be distinct, got {header + extra}")
            widths = (len(header), len(header) + len(extra)) if extra else (len(header),)
            columns: dict[str, list[str | None]] = {name: [] for name in header + extra}
            lines = []
            for row in reader:
                if len(row) not in widths:
                    expected = " or ".join(map(str, widths))
                    raise ValueError(
                        f"{path}: line {reader.line_num}: expected {expected} tab-separated fields "
                        f"({', '.join(header + extra)}), got {len(row)}"
                    )
                padded: list[str | None] = [*row, *[None] * (widths[-1] - len(row))]
                for values, value in zip(columns.values(), padded):
                    values.append(value)
                lines.append(reader.line_num)
    except UnicodeDecodeError:
        raise not_utf8(path) from None
    if not lines:
        raise ValueError(f"{path}: no data rows")
    return Table.from_file(str(path), columns, lines)
