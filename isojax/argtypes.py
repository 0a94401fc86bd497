"""Argparse ``type`` functions: ``isojax``'s command lines (``isojax.cli``, ``isojax.train.cli``) and the
experiments' refuse a bad count or address by its option, as a usage error."""

from __future__ import annotations

import argparse

__all__ = ["host_port", "int_at_least"]


def int_at_least(low: int):
    """An argparse ``type`` for integers ``>= low``: ``--flow-steps 0`` is refused by name, as a usage error.

    Args:
      low: the least value accepted.

    Returns:
      A function ``str -> int`` that raises ``argparse.ArgumentTypeError`` for text that is not an integer ``>= low``.

    Examples:
      >>> parse = int_at_least(1)
      >>> parse("3")
      3
      >>> parse("0")
      Traceback (most recent call last):
      argparse.ArgumentTypeError: expected an integer >= 1, got '0'
    """

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}")
        return value

    return parse


def host_port(text: str) -> str:
    """An argparse ``type`` for a ``HOST:PORT`` address (``localhost:1234``, ``[::1]:1234``): a missing or
    non-numeric port is refused as a usage error before ``jax.distributed`` is started with it.

    Args:
      text: the option's value.

    Returns:
      ``text`` itself; ``argparse.ArgumentTypeError`` when it is not ``HOST:PORT`` with a port in 1..65535.

    Examples:
      >>> host_port("[::1]:1234")
      '[::1]:1234'
      >>> host_port("localhost")
      Traceback (most recent call last):
      argparse.ArgumentTypeError: expected HOST:PORT with a port in 1..65535, got 'localhost'
    """
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT with a port in 1..65535, got {text!r}")
    return text
