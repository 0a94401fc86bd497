"""Argparse ``type`` functions shared by the command lines (:mod:`isojax.cli`, :mod:`isojax.train.cli`)."""

from __future__ import annotations

import argparse


def int_at_least(low: int):
    """An argparse ``type`` for integers ``>= low``: ``--flow-steps 0`` is refused by name, as a usage error."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}")
        return value

    return parse
