"""The docstring examples of every public name run as doctests, and every public name is documented.

Collection: every ``isojax`` module that defines ``__all__`` (so docstrings added later run too); for each, its own
docstring and every object its ``__all__`` names (methods included), each object once under the module that
defines it. One pytest case per docstring with examples, run in a copy of its defining module's globals (as
``python -m doctest`` and ``pytest --doctest-modules`` do).

Coverage: in every public module (no ``_`` in its dotted name) that defines ``__all__``, each function named there
gives Args (when it takes arguments), Returns and an example (or a ``NO_EXAMPLE`` entry with the reason), and each
class a field list (``Args:`` or ``Attributes:``).
"""

from __future__ import annotations

import ast
import dataclasses
import doctest
import importlib
import inspect
import pathlib
import pkgutil
import re
import textwrap
import tomllib
import types
import typing

import pytest

import isojax

# pyproject.toml's doctest_optionflags, so that `pytest --doctest-modules isojax` runs the examples as these tests do
_PYPROJECT = pathlib.Path(__file__).resolve().parents[1] / "pyproject.toml"
OPTIONS = 0
for _flag in tomllib.loads(_PYPROJECT.read_text())["tool"]["pytest"]["ini_options"]["doctest_optionflags"]:
    OPTIONS |= doctest.OPTIONFLAGS_BY_NAME[_flag]

# Public functions without an example, and why none is possible. Every other public function (a name in the
# ``__all__`` of a public module) carries Args/Returns and an example, and every public class a field list.
NO_EXAMPLE: dict[str, str] = {
    "isojax.export.export_run": "needs a fine-tuning run's checkpoint (a run of tens of seconds on CPU); "
    "tests/test_export.py exports runs and checks them against transformers",
    "isojax.export.load_task_model": "needs an exported run; tests/test_export.py loads them",
    "isojax.host.reuse_freed_memory": "changes glibc's malloc for the whole process that runs the doctests; "
    "tests/test_host.py calls it in a subprocess and counts the page faults",
    "isojax.export.read_run": "needs a fine-tuning run's checkpoint; tests/test_export.py reads runs",
    "isojax.data.assets.pip_download": "runs pip in a subprocess (seconds even for a local wheel) and normally "
    "downloads from PyPI; fetch's example shows the cached path, tests/test_data_sts.py the download with pip faked",
    "isojax.train.fit": "a whole fine-tuning run: a saved pretrained model with its tokenizer, a GLUE data "
    "directory, compiled train, predict and evaluation steps (tens of seconds on CPU); tests/test_train_loop.py "
    "runs it",
    "isojax.train.tasks.classification.build_task_model": "loads a pretrained model and tokenizer with "
    "isojax.from_pretrained (about 10 s for the default model on CPU); tests/test_train_loop.py builds one",
    "isojax.train.tasks.classification.representation_covariance": "runs a task model over a tokenised split, "
    "which needs a pretrained tokenizer; tests/test_train_loop.py checks it against numpy's covariance",
}


def _public_modules():
    """Every isojax module that defines ``__all__`` (the public ones, and any private module that has one)."""
    names = [isojax.__name__] + [m.name for m in pkgutil.walk_packages(isojax.__path__, isojax.__name__ + ".")]
    modules = [importlib.import_module(name) for name in names]
    return [module for module in modules if hasattr(module, "__all__")]


# The modules whose public names the coverage tests check: every module of ``_public_modules`` whose dotted name has
# no component starting with ``_``. Computed, never hand-listed, so a new public module is covered when it appears.
DOCUMENTED = tuple(
    module.__name__
    for module in _public_modules()
    if not any(part.startswith("_") for part in module.__name__.split("."))
)


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
    """``(qualified name, object)`` of each name in the module's ``__all__`` (a package's re-exports included)."""
    module = importlib.import_module(module_name)
    for name in module.__all__:
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


def _args_entries(doc):
    """The parameter names of the entries of a Google-style ``Args:`` section: the lines at the indentation of the
    section's first entry that read ``name: text`` or ``name (type): text`` (``*args``/``**kwargs`` spelt with
    their stars). Continuation lines sit deeper and a line at the header's indentation or shallower ends it."""
    lines = doc.splitlines()
    header = next((i for i, line in enumerate(lines) if line.strip() == "Args:"), None)
    if header is None:
        return []
    header_indent = len(lines[header]) - len(lines[header].lstrip())
    names, entry_indent = [], None
    for line in lines[header + 1 :]:
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if indent <= header_indent:
            break
        if entry_indent is None:
            entry_indent = indent
        if indent == entry_indent:
            match = re.match(r"(\*{0,2}\w+)(?: \([^)]*\))?:(?:\s|$)", line.strip())
            names.append(match.group(1) if match else line.strip())
    return names


@pytest.mark.parametrize("name, function", [pair for module in DOCUMENTED for pair in _functions(module)])
def test_public_function_documents_each_parameter(name, function):
    """Every parameter (bar ``self``/``cls``, ``*args`` and ``**kwargs``) has its own ``Args`` entry, as napoleon
    renders one parameter per entry: ``x: ...; c0: ...`` on one line or ``module, params: ...`` shows one name."""
    parameters = [
        parameter.name
        for parameter in inspect.signature(function).parameters.values()
        if parameter.name not in ("self", "cls")
        and parameter.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]
    entries = _args_entries(inspect.getdoc(function) or "")
    undocumented = [parameter for parameter in parameters if parameter not in entries]
    assert not undocumented, f"{name}'s Args section has no entry of its own for {undocumented}"


def test_exemptions_name_documented_functions():
    """An exemption names a function the coverage test checks, so that a stale entry does not linger."""
    functions = {name for module in DOCUMENTED for name, _ in _functions(module)}
    assert set(NO_EXAMPLE) <= functions
    assert all(reason.strip() for reason in NO_EXAMPLE.values())


def test_every_public_module_is_covered():
    """The coverage tests reach the public modules, deep ones and packages included, and no private one (a
    spot check of the walk that computes ``DOCUMENTED``: a module that fails to be found is a failure here)."""
    for name in (
        "isojax",
        "isojax.data.assets",
        "isojax.data.utf8",
        "isojax.eval.analysis",
        "isojax.models.generate",
        "isojax.train",
        "isojax.train.parallel",
        "isojax.train.tasks",
        "isojax.train.tasks.seq2seq",
    ):
        assert name in DOCUMENTED
    assert not any(part.startswith("_") for name in DOCUMENTED for part in name.split("."))


def test_all_lists_name_no_typing_constructs():
    """``__all__`` names functions, classes, modules and constants, not type aliases (``Callable[...]``, unions)."""
    aliases = [
        name
        for module in DOCUMENTED
        for name, obj in _public_objects(module)
        if isinstance(obj, (types.GenericAlias, types.UnionType, typing._GenericAlias))  # type: ignore[attr-defined]
    ]
    assert not aliases


def _fields_documented(cls) -> bool:
    """Whether ``cls`` is a dataclass whose every field has a docstring on the lines after it."""
    if not dataclasses.is_dataclass(cls):
        return False
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    documented = {
        node.target.id
        for node, after in zip(body, body[1:])
        if isinstance(node, ast.AnnAssign)
        and isinstance(node.target, ast.Name)
        and isinstance(after, ast.Expr)
        and isinstance(after.value, ast.Constant)
        and isinstance(after.value.value, str)
    }
    return {f.name for f in dataclasses.fields(cls)} <= documented


@pytest.mark.parametrize("module_name", DOCUMENTED)
def test_public_class_documents_its_fields(module_name):
    """Every public class has a docstring that lists its constructor arguments (``Args:`` or ``Attributes:``), or
    is a dataclass with a docstring under each field (what tyro and Sphinx read)."""
    undocumented = [
        name
        for name, obj in _public_objects(module_name)
        if inspect.isclass(obj)
        and not any(s in (inspect.getdoc(obj) or "") for s in ("Args:", "Attributes:"))
        and not _fields_documented(obj)
    ]
    assert not undocumented
