"""Package attributes imported on first use (PEP 562), so that importing a light module of a package (the
training configuration) does not import JAX through the package's ``__init__``."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_attributes(package: str, names: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: ``names`` maps an attribute to the module that defines it (a
    submodule's own name maps to itself)."""

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(names[name])
        return module if module.__name__ == f"{package}.{name}" else getattr(module, name)

    return __getattr__
