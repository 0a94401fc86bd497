"""The docstring examples of every public name run as doctests, and the numeric modules document every function.

Collection: every ``isojax`` module that defines ``__all__`` (so docstrings added later run too); for each, its own
docstring and every object its ``__all__`` names (methods included), each object once under the module that
defines it. One pytest case per docstring with examples, run in a copy of its defining module's globals (as
``python -m doctest`` and ``pytest --doctest-modules`` do).
"""

from __future__ import annotations

import doctest
import importlib
import inspect
import pkgutil

import pytest

import isojax

OPTIONS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE

# Modules whose every function must carry Args/Returns and an example (the lead extends the list).
DOCUMENTED = (
    "isojax.calibrate",
    "isojax.gradients",
    "isojax.losses",
    "isojax.metrics",
    "isojax.softdecay",
    "isojax.spectral",
    "isojax.topology",
)


def _public_modules():
    names = [isojax.__name__] + [m.name for m in pkgutil.walk_packages(isojax.__path__, isojax.__name__ + ".")]
    modules = [importlib.import_module(name) for name in names]
    return [module for module in modules if hasattr(module, "__all__")]


def _doctests():
    finder = doctest.DocTestFinder(exclude_empty=True)
    found = {}
    for module in _public_modules():
        objects = [(module.__name__, module, module)]
        for name in module.__all__:
            obj = getattr(module, name)
            owner = inspect.getmodule(obj) or module
            objects.append((f"{owner.__name__}.{getattr(obj, '__qualname__', name)}", obj, owner))
        for qualified, obj, owner in objects:
            if inspect.ismodule(obj) and obj is not module:
                continue  # a submodule re-exported by name: collected as a module of its own
            for test in finder.find(obj, qualified, module=owner):  # globals: a copy of the defining module's
                if test.examples:
                    found.setdefault(test.name, test)
    return [found[name] for name in sorted(found)]


DOCTESTS = _doctests()


@pytest.mark.parametrize("test", DOCTESTS, ids=[test.name for test in DOCTESTS])
def test_docstring_examples_run(test):
    lines = []
    runner = doctest.DocTestRunner(optionflags=OPTIONS)
    runner.run(test, out=lines.append)
    assert runner.failures == 0, "".join(lines)


def test_doctests_are_collected():
    """The collector finds the examples of a re-exported function (defined in a submodule without ``__all__``)."""
    names = {test.name for test in DOCTESTS}
    assert "isojax.calibrate.whitening.fit_whitening" in names
    assert "isojax.metrics.isoscore" in names


def _functions(module_name):
    module = importlib.import_module(module_name)
    for name in module.__all__:
        obj = getattr(module, name)
        if callable(obj) and not inspect.isclass(obj):
            yield f"{module_name}.{name}", obj


@pytest.mark.parametrize("name, function", [pair for module in DOCUMENTED for pair in _functions(module)])
def test_public_function_documents_args_returns_and_an_example(name, function):
    doc = inspect.getdoc(function) or ""
    takes_arguments = bool(inspect.signature(function).parameters)
    missing = [
        section
        for section, needed in (("Args:", takes_arguments), ("Returns:", True), ("Examples:", True), (">>>", True))
        if needed and section not in doc
    ]
    assert not missing, f"{name}'s docstring lacks {missing}"


@pytest.mark.parametrize("module_name", DOCUMENTED)
def test_public_class_has_a_docstring(module_name):
    module = importlib.import_module(module_name)
    undocumented = [
        name for name in module.__all__ if inspect.isclass(getattr(module, name)) and not getattr(module, name).__doc__
    ]
    assert not undocumented
