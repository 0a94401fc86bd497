"""Sequence-to-sequence tasks (translation, summarisation) as columns of source and target texts.

Tasks (:data:`SEQ2SEQ_TASKS`; the papers' runs are isotropy-calibration-evaluation Tables 2, 3 and 5):

    wmt16_en_ro     WMT16 English -> Romanian   Hub ``wmt/wmt16`` config ``ro-en``, column ``translation`` {en, ro}
    wmt16_de_en     WMT16 German -> English     Hub ``wmt/wmt16`` config ``de-en``, column ``translation`` {de, en}
    cnn_dailymail   CNN / Daily Mail 3.0.0      Hub ``abisee/cnn_dailymail`` config ``3.0.0``, ``article`` -> ``highlights``
    seq2seq         any local table             columns ``source`` -> ``target`` (no Hub copy: give ``source=``)

(``wmt/wmt16`` and ``abisee/cnn_dailymail`` are the Hub's current names of the ``wmt16`` and ``cnn_dailymail``
data sets.) Every source goes through :func:`isojax.data.tables.load_table`, as GLUE does: the Hub id, or a local
file or directory in the Hub's layout (``ro-en/train-00000-of-00001.parquet``, ``train.jsonl``, ``validation.tsv``,
...). A column is named ``name`` or, inside a column of dictionaries (WMT's ``translation``), ``name.key``. A missing
column, a value that is not text, or text that is not UTF-8 is a ``ValueError`` naming the file and line. A pair
whose source or target is empty (or whitespace only) is left out, in every split, and how many were left out (and
where the first ones were) is logged as a warning: there is nothing to translate or summarise, or nothing to
compare an output with.
"""

from __future__ import annotations

from dataclasses import dataclass

from isojax._validate import check_texts
from isojax.data.tables import Table, load_table

__all__ = ["SEQ2SEQ_TASKS", "Seq2SeqData", "Seq2SeqTask", "load_seq2seq", "seq2seq_task"]


@dataclass(frozen=True)
class Seq2SeqTask:
    """A sequence-to-sequence task: where its data live and which columns hold the source and target texts.

    Attributes:
      name: its key in :data:`SEQ2SEQ_TASKS`.
      hub_id: the Hub copy (None: local files only).
      hub_config: the Hub copy's configuration, or None.
      source: the source column (``"translation.en"``: key ``en`` of the dictionaries in column ``translation``).
      target: the target column, likewise.
      metrics: what its tables report (``bleu``; ``rouge1 rouge2 rougeL``).
      source_lang: mBART's language code of the source, for tokenizers that take one (``src_lang``), or None.
      target_lang: likewise of the target (``tgt_lang``).
      splits: its split names.
    """

    name: str
    hub_id: str | None
    hub_config: str | None
    source: str
    target: str
    metrics: tuple[str, ...]
    source_lang: str | None = None
    target_lang: str | None = None
    splits: tuple[str, ...] = ("train", "validation", "test")


_ROUGE = ("rouge1", "rouge2", "rougeL")
SEQ2SEQ_TASKS: dict[str, Seq2SeqTask] = {
    t.name: t
    for t in (
        Seq2SeqTask(
            "wmt16_en_ro", "wmt/wmt16", "ro-en", "translation.en", "translation.ro", ("bleu",), "en_XX", "ro_RO"
        ),
        Seq2SeqTask(
            "wmt16_de_en", "wmt/wmt16", "de-en", "translation.de", "translation.en", ("bleu",), "de_DE", "en_XX"
        ),
        Seq2SeqTask("cnn_dailymail", "abisee/cnn_dailymail", "3.0.0", "article", "highlights", _ROUGE),
        Seq2SeqTask("seq2seq", None, None, "source", "target", ("bleu", *_ROUGE)),
    )
}


@dataclass(frozen=True)
class Seq2SeqData:
    """One split of a task: ``sources[i]`` is to be turned into ``targets[i]``.

    Attributes:
      sources: the ``n`` source texts.
      targets: the ``n`` target texts.
      task: the :class:`Seq2SeqTask`.
      split: the split's name.
    """

    sources: list[str]
    targets: list[str]
    task: Seq2SeqTask
    split: str

    def __post_init__(self):
        check_texts(self.sources, "sources")
        check_texts(self.targets, "targets")
        if len(self.sources) != len(self.targets):
            raise ValueError(
                f"sources ({len(self.sources)}) and targets ({len(self.targets)}) must have the same length"
            )

    def __len__(self) -> int:
        return len(self.sources)


def seq2seq_task(task: str) -> Seq2SeqTask:
    """Look a task up by name, ignoring case and ``-`` vs ``_``; unknown -> ``ValueError`` listing the tasks.

    Args:
      task: the task's name.

    Returns:
      Its :class:`Seq2SeqTask`.

    Examples:
      >>> spec = seq2seq_task("WMT16-en-ro")
      >>> spec.name, spec.source, spec.target, spec.metrics
      ('wmt16_en_ro', 'translation.en', 'translation.ro', ('bleu',))
    """
    key = str(task).lower().replace("-", "_")
    if key not in SEQ2SEQ_TASKS:
        raise ValueError(f"task: unknown sequence-to-sequence task {task!r}; expected one of {sorted(SEQ2SEQ_TASKS)}")
    return SEQ2SEQ_TASKS[key]


def _texts(table: Table, column: str) -> list[str]:
    """Column ``name`` or ``name.key`` (see the module docstring) as text, checked row by row."""
    name, _, key = column.partition(".")
    if not key:
        return table.text(name)
    table.require([name])
    out = []
    for i, value in enumerate(table.columns[name]):
        text = value.get(key) if isinstance(value, dict) else None
        if not isinstance(text, str):
            raise ValueError(
                f"{table.where(i)}: column {name!r} must hold dictionaries with a text under {key!r}, got {value!r}"
            )
        out.append(text)
    return out


def load_seq2seq(task: str, split: str = "train", *, source="auto") -> Seq2SeqData:
    r"""Load ``split`` of a sequence-to-sequence ``task``.

    Rows with an empty source or target are left out, with a logged count.

    Args:
      task: the task's name (see :func:`seq2seq_task`).
      split: one of the task's splits; ``"dev"`` means ``"validation"``.
      source: ``"auto"`` / ``"hub"`` (the task's Hub copy), or a local file or directory in the Hub's layout
        (a directory is searched in its ``hub_config`` sub-directory when it has one).

    Returns:
      A :class:`Seq2SeqData`.

    Examples:
      Task ``seq2seq`` reads local files with columns ``source`` and ``target``:

      >>> import json, tempfile, pathlib
      >>> root = pathlib.Path(tempfile.mkdtemp())
      >>> rows = [{"source": "hello", "target": "salut"}, {"source": "", "target": "gol"}]
      >>> _ = (root / "validation.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
      >>> data = load_seq2seq("seq2seq", "dev", source=root)
      >>> data.sources, data.targets, data.split
      (['hello'], ['salut'], 'validation')
    """
    spec = seq2seq_task(task)
    split = "validation" if split == "dev" else split
    if split not in spec.splits:
        raise ValueError(f"split: {spec.name} has splits {list(spec.splits)}, got {split!r}")
    if source in ("auto", "hub", None):
        if spec.hub_id is None:
            raise ValueError(
                f"task {spec.name} has no Hub copy: pass source=<local file or directory with columns "
                f"{spec.source!r} and {spec.target!r}> (command line: --data-source)"
            )
        source = spec.hub_id
    table = load_table(source, split, config=spec.hub_config)
    pairs = Table({"source": _texts(table, spec.source), "target": _texts(table, spec.target)}, table.parts)
    pairs = pairs.without_blank(["source", "target"])
    return Seq2SeqData(pairs.columns["source"], pairs.columns["target"], spec, split)
