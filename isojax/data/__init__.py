"""Data for isojax: STS, GLUE and word-similarity loaders; tokenisation and batching.

Nothing downloads at import. The original releases of STS12–16, SICK and GLUE are read from a data directory
(``data_dir=`` on every loader, ``--data-dir`` on the command line, or ``$ISOJAX_DATA_DIR``; layout in
:mod:`isojax.data.datadir`); without one, STS and GLUE sets come through 🤗 ``datasets`` from the Hub or from
local files in the Hub's layout. Offline assets (STS-B, word-similarity sets) are fetched once by
``python -m isojax.data.assets`` (or :func:`isojax.data.assets.fetch`).

Bad files: a malformed line, text that is not UTF-8, an empty (or whitespace-only) sentence, a gold score outside
the set's range or a label outside the task's classes (``-1``, unlabelled, in GLUE test splits only) is a
``ValueError`` naming the file and line; except that rows with an empty text are left out of GLUE ``train`` and
of sequence-to-sequence tables, and unscored STS pairs (empty gold lines) are left out, each with a logged
count. :func:`tokenize` truncates to ``max_length`` and logs how many rows it cut. A single ``str`` where a
sequence of texts is expected is a ``TypeError``.
"""

from isojax.data.batching import DEFAULT_BUCKETS, batches, bucket_length, least_length, num_batches, tokenize
from isojax.data.datadir import DATA_DIR_ENV
from isojax.data.glue import GLUE_TASKS, GlueData, GlueTask, glue_task, load_glue
from isojax.data.semeval import read_sick, read_sts_release
from isojax.data.sts import STS_SETS, StsData, load_sts, load_stsb, read_stsb_file
from isojax.data.tsv import read_tsv
from isojax.data.wordsim import WORDSIM_SETS, WordSimData, load_wordsim, read_word_pairs

__all__ = [
    "DATA_DIR_ENV",
    "DEFAULT_BUCKETS",
    "GLUE_TASKS",
    "STS_SETS",
    "WORDSIM_SETS",
    "GlueData",
    "GlueTask",
    "StsData",
    "WordSimData",
    "batches",
    "bucket_length",
    "glue_task",
    "least_length",
    "load_glue",
    "load_sts",
    "load_stsb",
    "load_wordsim",
    "num_batches",
    "read_sick",
    "read_sts_release",
    "read_stsb_file",
    "read_tsv",
    "read_word_pairs",
    "tokenize",
]
