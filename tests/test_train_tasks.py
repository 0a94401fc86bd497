"""Tasks as recipes: both recipes satisfy :class:`~isojax.train.tasks.base.TaskRecipe` (at run time and for mypy),
the protocol names every recipe member the loop uses, and the loop imports no task module.

References: the loop's source (its imports and the attributes it reads of a recipe, parsed with ``ast``) and mypy
(a recipe that lacks a method is rejected).
"""

import ast
import importlib.util
import inspect
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import isojax.train.loop as loop
from isojax.train import TaskConfig, TrainConfig
from isojax.train.tasks import ClassificationRecipe, Seq2SeqRecipe, TaskRecipe, recipe_for

ROOT = Path(__file__).resolve().parents[1]
LOOP = Path(inspect.getfile(loop))

# Modules that know a kind of task: the loop reaches them only through isojax.train.tasks.recipe_for.
TASK_MODULES = (
    "isojax.train.tasks.classification",
    "isojax.train.tasks.seq2seq",
    "isojax.train.seq2seq",
    "isojax.train.model",
    "isojax.train.evaluation",
    "isojax.train.objective",
    "isojax.data",
    "isojax.models",
    "isojax.eval",
)


NO_EVALUATION = """\
class NoEvaluation:
    metrics: tuple[str, ...] = ("accuracy",)
    curves: tuple[str, ...] = ("isoscore",)
    eval_split = "validation"
    build = ClassificationRecipe.build
    check = ClassificationRecipe.check
    load = ClassificationRecipe.load
    init_variables = ClassificationRecipe.init_variables
    references = ClassificationRecipe.references
    objective = ClassificationRecipe.objective
    predict_step = ClassificationRecipe.predict_step
"""
"""A recipe with every member of the protocol but ``evaluate``."""


def _imports(tree: ast.Module) -> list[str]:
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names += [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
    return names


def _protocol_members() -> set[str]:
    return {n for n in vars(TaskRecipe) if not n.startswith("_")} | set(TaskRecipe.__annotations__)


@pytest.mark.parametrize(
    ("task", "recipe", "eval_split"),
    [
        ("sst2", ClassificationRecipe, "validation"),
        ("mnli", ClassificationRecipe, "validation_matched"),
        ("stsb", ClassificationRecipe, "validation"),
        ("cnn_dailymail", Seq2SeqRecipe, "validation"),
        ("wmt16_en_ro", Seq2SeqRecipe, "validation"),
    ],
)
def test_recipe_for_picks_the_tasks_recipe_and_it_satisfies_the_protocol(task, recipe, eval_split):
    chosen = recipe_for(TrainConfig(task=TaskConfig(name=task)))
    assert type(chosen) is recipe
    assert isinstance(chosen, TaskRecipe)
    assert chosen.eval_split == eval_split
    assert set(chosen.curves) and set(chosen.metrics)


def test_an_object_without_a_protocol_member_is_not_a_recipe():
    namespace = {"ClassificationRecipe": ClassificationRecipe}
    exec(NO_EVALUATION, namespace)
    assert not isinstance(namespace["NoEvaluation"](), TaskRecipe)
    assert not isinstance(object(), TaskRecipe)


def test_the_loop_imports_no_task_module_and_names_no_task_type():
    tree = ast.parse(LOOP.read_text())
    imported = _imports(tree)
    assert "isojax.train.tasks.recipe_for" in imported
    known = [m for m in imported if any(m == t or m.startswith(t + ".") for t in TASK_MODULES)]
    assert known == [], f"loop.py imports task modules: {known}"
    task_imports = [m for m in imported if m.startswith("isojax.train.tasks")]
    allowed = ("isojax.train.tasks", "isojax.train.tasks.recipe_for")
    assert all(m in allowed or m.startswith("isojax.train.tasks.base") for m in task_imports), task_imports
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    task_names = {"is_seq2seq", "seq2seq", "ClassificationRecipe", "Seq2SeqRecipe", "TaskModel", "Seq2SeqModel"}
    assert not names & task_names, f"loop.py uses {names & task_names}"


def test_the_protocol_names_every_recipe_member_the_loop_reads():
    """Every ``<...>.recipe.X`` / ``recipe.X`` the loop reads is a member of TaskRecipe (so a new recipe that
    implements the protocol is all the loop needs)."""
    used = set()
    for node in ast.walk(ast.parse(LOOP.read_text())):
        if isinstance(node, ast.Attribute):
            owner = node.value
            if (isinstance(owner, ast.Name) and owner.id == "recipe") or (
                isinstance(owner, ast.Attribute) and owner.attr == "recipe"
            ):
                used.add(node.attr)
    assert {"build", "check", "load", "eval_split", "init_variables", "references", "evaluate"} <= used
    assert used <= _protocol_members(), used - _protocol_members()


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="needs mypy")
def test_mypy_checks_a_recipe_against_the_protocol(tmp_path):
    """Statically, both recipes are TaskRecipes with their own model and split types (as recipe_for declares
    them), and a recipe without ``evaluate`` is refused."""
    typed = textwrap.dedent(
        """\
        from isojax.train.config import TrainConfig
        from isojax.train.feed import Split
        from isojax.train.model import TaskModel
        from isojax.train.tasks import ClassificationRecipe, Seq2SeqRecipe, TaskRecipe
        from isojax.train.tasks.seq2seq import Seq2SeqModel, Seq2SeqSplit

        config = TrainConfig()
        classification: TaskRecipe[TaskModel, Split] = ClassificationRecipe(config)
        seq2seq: TaskRecipe[Seq2SeqModel, Seq2SeqSplit] = Seq2SeqRecipe(config)
        """
    )
    broken = "broken: TaskRecipe[TaskModel, Split] = NoEvaluation()\n"
    snippet = tmp_path / "recipes.py"
    snippet.write_text(typed + NO_EVALUATION + broken)
    broken_line = len((typed + NO_EVALUATION).splitlines()) + 1
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), str(snippet)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    errors = [line for line in out.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 1 and f"recipes.py:{broken_line}:" in errors[0] and "TaskRecipe" in errors[0], out.stdout
    assert 'missing following "TaskRecipe" protocol member' in out.stdout and "evaluate" in out.stdout, out.stdout
