"""Keep transformers' import-time notice about a missing PyTorch out of isojax's output.

isojax uses transformers only for tokenizers (its models are Flax modules), which need no PyTorch. Without
PyTorch installed, ``import transformers`` logs "PyTorch was not found. Models won't be available and only
tokenizers, configuration and file/data utilities can be used." on the ``transformers`` logger, which tells an
isojax user nothing. :func:`drop_torch_notice` adds a filter to that logger that drops exactly this record;
every other transformers message still passes.
"""

from __future__ import annotations

import logging

NOTICE = "PyTorch was not found."


class _DropTorchNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(NOTICE)


def drop_torch_notice() -> None:
    """Install the filter on the ``transformers`` logger (once; before transformers is imported)."""
    logger = logging.getLogger("transformers")
    if not any(isinstance(f, _DropTorchNotice) for f in logger.filters):
        logger.addFilter(_DropTorchNotice())
