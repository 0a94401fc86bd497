"""Sphinx configuration of isojax's documentation.

Why Sphinx + myst-nb: it is what the JAX libraries researchers already read use (jax, flax, optax, chex, orbax),
so the API pages look and link like theirs; myst-nb renders the notebooks from their stored outputs and lets the
guides be Markdown; autosummary + napoleon turn the Google-style docstrings (Args/Returns, ``:math:``) into one
page per public name.

Generated at build time (under ``docs/_generated/``, never committed):
- the API reference: one page per public module listing exactly its ``__all__`` (read at build time, never
  hand-listed); autosummary then writes one page per name;
- the results pages: one per ``experiments/results/*.md``, included as they are;
- the notebooks: ``notebooks/*.ipynb`` copied in, rendered from their stored outputs (never executed).

Math: MathJax 3 from a local copy (``mathjax_path``), so pages render offline. ``make docs`` fetches the
``mathjax`` npm package into ``docs/_build/mathjax`` once; without it (the strict build of ``tests/test_docs.py``)
the pages still point at the local path and never at a CDN.

Intersphinx is not used: inventories cannot be fetched offline. Cross-references stay strict (``nitpicky``;
``-n -W`` turns a broken one into an error); ``nitpick_ignore`` lists only external types, each with its reason.
"""

import importlib
import inspect
import pkgutil
import shutil
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
GEN = DOCS / "_generated"
sys.path.insert(0, str(ROOT))

import isojax  # noqa: E402

project = "isojax"
author = "isojax contributors"
release = version = isojax.__version__
copyright = "isojax contributors"

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "myst_nb",
]
templates_path = ["_templates"]
exclude_patterns = ["_build", "README.md", "**.ipynb_checkpoints", "_generated/api/objects.rst"]
html_theme = "furo"
html_title = f"isojax {release}"

# MyST: $...$ and $$...$$ math in the guides, ``{include}`` for the results pages.
myst_enable_extensions = ["dollarmath", "colon_fence"]
myst_heading_anchors = 3
nb_execution_mode = "off"  # rendered from the outputs stored in the .ipynb files; the test suite executes them
suppress_warnings = ["myst.header"]  # the results files start at level 2 under their own titles

# autodoc / autosummary / napoleon
autosummary_generate = ["_generated/api/objects.rst"]  # the page list of every public name (generate_api)
autosummary_ignore_module_all = False
autodoc_typehints = "description"
autodoc_member_order = "bysource"
autodoc_default_options = {"show-inheritance": False}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_use_ivar = True  # "Attributes:" as fields: NamedTuple fields are documented once, by :members:

# Offline MathJax: `make docs` unpacks the npm package `mathjax` (version pinned in the Makefile) into
# docs/_build/mathjax, copied into _static/; a relative mathjax_path is relative to _static.
MATHJAX_DIR = DOCS / "_build" / "mathjax"  # tex-svg.js and input/tex/extensions/ (autoloaded) of es5/
mathjax_path = "tex-svg.js"  # never a CDN: SVG output needs no web fonts
html_static_path = [str(MATHJAX_DIR)] if MATHJAX_DIR.is_dir() else []

# Cross-references stay strict. External names (no intersphinx offline) that docstrings and signatures mention:
nitpicky = True
nitpick_ignore_regex = [
    # jax, flax, optax, numpy and the standard library are documented on their own sites; without intersphinx
    # their types cannot resolve, and a hand-written inventory would go stale.
    ("py:.*", r"(jax|jaxlib|flax|optax|chex|orbax|numpy|np|jnp|nn|ml_dtypes|transformers|datasets)(\..*)?"),
    ("py:.*", r"(Array|ArrayLike|PRNGKey|PyTree|DTypeLike|Mesh|NamedSharding|PartitionSpec)"),
    # standard library / builtins that Sphinx cannot resolve without python's inventory
    ("py:.*", r"(collections\.abc|typing|os|pathlib|dataclasses|enum|logging)\..*"),
    ("py:.*", r"(Path|Callable|Sequence|Mapping|Iterable|Iterator|Any|Literal|NamedTuple|Enum|Self|TypeIs)"),
    ("py:class", r"(int|float|str|bool|bytes|dict|list|tuple|object|None|type|complex)"),
    # the configuration's fields are Annotated[type, tyro.conf.arg(aliases=...)]: autodoc prints the metadata's parts
    ("py:class", r"(tyro|types)\..*|\w+=.*|'--[\w-]+'|.*\.Annotated"),
]


# ---------------------------------------------------------------------------------------------------------------
# API pages: isojax, every module named in its __all__ and its public subpackages, each with its whole __all__; then
# every other public module (no leading underscore in its dotted name) that defines __all__, with the names no
# earlier page shows (so each public object has one page and a cross-reference one target).
def _packages():
    mods = [isojax]
    mods += [v for k in isojax.__all__ if inspect.ismodule(v := getattr(isojax, k))]
    for info in pkgutil.iter_modules(isojax.__path__, "isojax."):
        if info.ispkg and not info.name.rsplit(".", 1)[1].startswith("_"):
            mods.append(importlib.import_module(info.name))
    return list({m.__name__: m for m in mods}.values())


def api_pages():
    """``[(module, [member names])]`` in page order (comment above); modules themselves are not members."""
    pages, shown = [], set()
    for mod in _packages():
        members = [k for k in mod.__all__ if not inspect.ismodule(getattr(mod, k))]
        pages.append((mod, members))
        shown |= {id(getattr(mod, k)) for k in members}
    for info in pkgutil.walk_packages(isojax.__path__, "isojax."):
        if any(part.startswith("_") for part in info.name.split(".")):
            continue
        mod = importlib.import_module(info.name)
        if mod.__name__ in {m.__name__ for m, _ in pages} or not hasattr(mod, "__all__"):
            continue
        members = [k for k in mod.__all__ if not inspect.ismodule(v := getattr(mod, k)) and id(v) not in shown]
        if members:
            pages.append((mod, members))
            shown |= {id(getattr(mod, k)) for k in members}
    return pages


def _write(path: Path, text: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:  # unchanged files keep Sphinx's incremental build
        path.write_text(text)


def generate_api():
    pages = api_pages()
    for mod, members in pages:
        name = mod.__name__
        body = [f"``{name}``", "=" * (len(name) + 4), "", f".. automodule:: {name}", "   :no-members:", ""]
        if members:
            body += [f".. currentmodule:: {name}", "", ".. autosummary::", ""]
            body += [f"   {k}" for k in members] + [""]
        _write(GEN / "api" / f"{name}.rst", "\n".join(body))
    # The names' own pages are generated from a list that is not itself a page, and are orphans (the templates in
    # _templates/autosummary): reached from their module's table and by cross-references, not from the sidebar.
    # A toctree of ~300 pages would put them all in furo's navigation, which is rendered into every page
    # (the build took 2 minutes, most of it in that tree).
    objects = [".. autosummary::", "   :toctree: .", ""]
    objects += [f"   {mod.__name__}.{k}" for mod, members in pages for k in members]
    _write(GEN / "api" / "objects.rst", "\n".join(objects) + "\n")
    index = [
        "API reference",
        "=============",
        "",
        "Every name in the ``__all__`` of isojax, of the modules it exports and of its public subpackages; then the",
        "names of deeper public modules that those pages do not show. One page each, generated at build time from",
        "the docstrings.",
        "",
        ".. toctree::",
        "   :maxdepth: 1",
        "",
    ] + [f"   {mod.__name__}" for mod, _ in pages]
    _write(GEN / "api" / "index.rst", "\n".join(index) + "\n")
    # pages of names no longer public (left by an earlier build: a renamed class) would break the strict build
    keep = (
        {"index", "objects"}
        | {mod.__name__ for mod, _ in pages}
        | {f"{mod.__name__}.{k}" for mod, ks in pages for k in ks}
    )
    for stale in (GEN / "api").glob("*.rst"):
        if stale.stem not in keep:
            stale.unlink()


def generate_results():
    files = sorted((ROOT / "experiments" / "results").rglob("*.md"))
    toc = []
    for f in files:
        rel = f.relative_to(ROOT / "experiments" / "results").with_suffix("")
        stem = str(rel).replace("/", "-")
        src = Path("..", "..", "..", "experiments", "results", rel.with_suffix(".md")).as_posix()
        _write(GEN / "results" / f"{stem}.md", f"```{{include}} {src}\n:relative-images:\n```\n")
        toc.append(stem)
    text = (
        "# Result files\n\nEach committed table of `experiments/results/`, as written by the command that made it "
        "(its command, commit and machine are in the file; under its title, the git tag `results/<name>` that "
        "reproduces it, made by `python -m experiments.tooling.tag_results`).\n\n```{toctree}\n:maxdepth: 1\n\n"
        + "\n".join(toc)
        + "\n```\n"
    )
    _write(GEN / "results" / "index.md", text)


def copy_notebooks():
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        dest = GEN / "notebooks" / nb.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        if not dest.exists() or dest.read_bytes() != nb.read_bytes():
            shutil.copyfile(nb, dest)


generate_api()
generate_results()
copy_notebooks()


# ---------------------------------------------------------------------------------------------------------------
# References in docstrings, resolved as Python would resolve the name:
# - a relative name (``spectral_map``) is looked up in the module that defines the documented object, so a function
#   re-exported by another module (``isojax.gradients.spectral_derivative``) still finds its neighbours;
# - a name by its defining module (``isojax.models.hub.from_pretrained``) goes to the page of the public name that
#   is the same Python object (``isojax.models.from_pretrained``);
# - an existing object that no ``__all__`` exports (an internal helper class, a private module) is shown as code
#   without a link;
# - a name that does not exist (a typo, a renamed or removed object) stays a broken reference: an error under -W.
def _public_names():
    names = {}
    for mod, members in api_pages():
        for k in members:
            names.setdefault(id(getattr(mod, k)), f"{mod.__name__}.{k}")
    return names


_MISSING = object()


def _lookup(target: str):
    """The object a dotted name means, as attribute access would find it (a function shadows its module)."""
    parts = target.split(".")
    try:
        obj = importlib.import_module(parts[0])
    except ImportError:
        return _MISSING
    for i, p in enumerate(parts[1:], start=2):
        if hasattr(obj, p):
            obj = getattr(obj, p)
            continue
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            return _MISSING
    return obj


def _documented_object(docname: str):
    """The object a generated API page documents (``_generated/api/isojax.x.name``), else None."""
    if not docname.startswith("_generated/api/"):
        return None
    obj = _lookup(docname.rsplit("/", 1)[1])
    return None if obj is _MISSING else obj


def _candidates(node):
    target = node["reftarget"].lstrip("~.")
    if target.startswith("isojax."):
        return [target]
    out = []
    obj = _documented_object(node["refdoc"])
    if inspect.ismodule(obj):  # a module's summary table: the homes of the names it lists
        homes = [getattr(inspect.unwrap(getattr(obj, k)), "__module__", None) for k in getattr(obj, "__all__", ())]
    else:
        homes = [getattr(inspect.unwrap(obj), "__module__", None) if obj is not None else None]
    for ctx in dict.fromkeys([*homes, node.get("py:module")]):
        if ctx and ctx.startswith("isojax"):
            out.append(f"{ctx}.{target}")
            if node.get("py:class"):
                out.append(f"{ctx}.{node['py:class']}.{target}")
    return out


def _resolve_by_identity(app, env, node, contnode):
    if node.get("refdomain") != "py":
        return None
    domain = env.get_domain("py")
    for target in _candidates(node):
        obj = _lookup(target)
        if obj is _MISSING:
            continue
        public = _PUBLIC.get(id(obj))
        if public is not None:
            found = domain.resolve_xref(env, node["refdoc"], app.builder, node["reftype"], public, node, contnode)
            if found is not None:
                return found
        if public is None:
            return contnode  # exists, but no __all__ exports it: code without a link
    return None


_PUBLIC = _public_names()


def _drop_type_docstring(app, what, name, obj, options, lines):
    """A constant (``GLUE_TASKS = {...}``) has no docstring of its own: autodoc would show ``dict``'s."""
    if what in ("data", "attribute") and lines and inspect.getdoc(type(obj)) == "\n".join(lines).strip():
        lines.clear()


def _skip_flax_hooks(app, what, name, obj, skip, options):
    """``setup`` is Flax's construction hook, not an API: its inherited docstring is flax's own."""
    if name == "setup" and what == "class":
        return True
    return None


_FIELD_HELP: dict[str, list[str]] = {}


def _keep_field_help(app, what, name, obj, options, lines):
    """Napoleon reads an attribute docstring's first line as ``type: text``; the help under a configuration field is
    prose (``"GLUE source: auto (...)"``): its text is kept before napoleon runs and put back after."""
    if what == "attribute" and name.split(".")[-2].endswith("Config"):
        if name in _FIELD_HELP:
            lines[:] = _FIELD_HELP.pop(name)
        else:
            _FIELD_HELP[name] = list(lines)


def setup(app):
    app.connect("autodoc-process-docstring", _keep_field_help, priority=100)  # before napoleon's (500)
    app.connect("autodoc-process-docstring", _keep_field_help, priority=900)  # and after it
    app.connect("missing-reference", _resolve_by_identity)
    app.connect("autodoc-process-docstring", _drop_type_docstring)
    app.connect("autodoc-skip-member", _skip_flax_hooks)
