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

# Modules whose every public function carries Args/Returns and an example, and every public class its constructor
# arguments (Args or Attributes). Public names: the module's ``__all__`` (a package's re-exports included); for a
# module without one, the functions and classes it defines whose names do not start with ``_``.
DOCUMENTED = (
    "isojax.calibrate",
    "isojax.data",
    "isojax.data.batching",
    "isojax.data.datadir",
    "isojax.data.glue",
    "isojax.data.semeval",
    "isojax.data.seq2seq",
    "isojax.data.sts",
    "isojax.data.tables",
    "isojax.data.tsv",
    "isojax.data.wordsim",
    "isojax.eval",
    "isojax.eval.generation_metrics",
    "isojax.gradients",
    "isojax.losses",
    "isojax.metrics",
    "isojax.models",
    "isojax.models.hub",
    "isojax.models.registry",
    "isojax.softdecay",
    "isojax.spectral",
    "isojax.topology",
    "isojax.train.checkpoint",
    "isojax.train.config",
    "isojax.train.gradient_stats",
    "isojax.train.hyperparams",
    "isojax.train.optim",
    "isojax.train.state",
)

# Modules whose classes are documented in prose, without an Args/Attributes list yet (to do).
CLASSES_WITHOUT_FIELD_LISTS = ("isojax.calibrate", "isojax.gradients", "isojax.softdecay", "isojax.spectral")

# Public functions of DOCUMENTED modules without an example, and why none is possible.
NO_EXAMPLE: dict[str, str] = {}


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


def _public_objects(module_name):
    module = importlib.import_module(module_name)
    if hasattr(module, "__all__"):
        names = module.__all__
    else:
        names = [
            name
            for name, obj in vars(module).items()
            if not name.startswith("_")
            and (inspect.isfunction(obj) or inspect.isclass(obj))
            and obj.__module__ == module_name
        ]
    for name in names:
        yield f"{module_name}.{name}", getattr(module, name)


def _functions(module_name):
    for name, obj in _public_objects(module_name):
        if callable(obj) and not inspect.isclass(obj):
            yield name, obj


@pytest.mark.parametrize("name, function", [pair for module in DOCUMENTED for pair in _functions(module)])
def test_public_function_documents_args_returns_and_an_example(name, function):
    doc = inspect.getdoc(function) or ""
    takes_arguments = bool(inspect.signature(function).parameters)
    example = name not in NO_EXAMPLE
    missing = [
        section
        for section, needed in (
            ("Args:", takes_arguments),
            ("Returns:", True),
            ("Examples:", example),
            (">>>", example),
        )
        if needed and section not in doc
    ]
    assert not missing, f"{name}'s docstring lacks {missing}"


def test_exemptions_name_documented_functions():
    """An exemption names a function the coverage test checks, so that a stale entry does not linger."""
    functions = {name for module in DOCUMENTED for name, _ in _functions(module)}
    assert set(NO_EXAMPLE) <= functions
    assert all(reason.strip() for reason in NO_EXAMPLE.values())


@pytest.mark.parametrize("module_name", DOCUMENTED)
def test_public_class_documents_its_fields(module_name):
    """Every public class has a docstring that lists its constructor arguments (``Args:`` or ``Attributes:``)."""
    sections = () if module_name in CLASSES_WITHOUT_FIELD_LISTS else ("Args:", "Attributes:")
    undocumented = [
        name
        for name, obj in _public_objects(module_name)
        if inspect.isclass(obj)
        and not (obj.__doc__ and (not sections or any(s in inspect.getdoc(obj) for s in sections)))
    ]
    assert not undocumented
