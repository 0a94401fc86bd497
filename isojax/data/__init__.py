"""Data for isojax: STS, GLUE and word-similarity loaders; tokenisation and batching.

Nothing downloads at import. Offline assets (STS-B, word-similarity sets) are fetched once by
``python -m isojax.data.assets`` (or :func:`isojax.data.assets.fetch`); GLUE, STS12–16 and SICK-R come through 🤗 ``datasets`` from the Hub
or from local files in the Hub's layout.
"""
from isojax.data.batching import DEFAULT_BUCKETS, batches, bucket_length, num_batches, tokenize
from isojax.data.glue import GLUE_TASKS, GlueData, GlueTask, glue_task, load_glue
from isojax.data.sts import STS_SETS, StsData, load_sts, load_stsb, read_stsb_file
from isojax.data.wordsim import WORDSIM_SETS, WordSimData, load_wordsim, read_word_pairs

__all__ = [
    "DEFAULT_BUCKETS", "GLUE_TASKS", "STS_SETS", "WORDSIM_SETS",
    "GlueData", "GlueTask", "StsData", "WordSimData",
    "batches", "bucket_length", "glue_task", "load_glue", "load_sts", "load_stsb",
    "load_wordsim", "num_batches", "read_stsb_file", "read_word_pairs", "tokenize",
]
