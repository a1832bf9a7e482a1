"""coursekit.recipe is lesson 19's model answer, and the capstone store keys results by the code that computed them.

Three promises: the model answers in solutions/ have exactly the fingerprints of coursekit's reference recipe (so a
class's solution notebook and `coursekit capstone` share one run); a student's changed function gets keys of its
own for the results it decides and shares the rest; a fresh lesson's blanks run the reference; and inside
``nbgrader autograde`` (a store that may not compute) every recipe reads the reference's results."""

from __future__ import annotations

import json
import linecache
from pathlib import Path

import pytest

from coursekit import capstone
from coursekit.fingerprint import code_fingerprint

ROOT = Path(__file__).resolve().parent.parent
LESSON = "19-capstone-a-real-qlora-run"
RECIPE_CELLS = {f"p{i}_answer" for i in (1, 2, 3, 4, 5, 6, 8)}  # the cells that define the recipe's functions
FIELDS = ("load_for_lora", "adapter_optimizer", "train_steps", "answer_logprobs", "first_word", "merge_onto_w16")


def _answers(folder: str, replace: dict[str, str] | None = None) -> dict:
    """Run the setup cell and every answer cell of lesson 19's notebook in ``folder`` as a kernel would (each cell's
    source readable through linecache, as IPython keeps it), with ``replace`` applied to the sources."""
    nb = json.loads((ROOT / folder / LESSON / f"{LESSON}.ipynb").read_text())
    ns: dict = {"__name__": "__main__"}
    for i, cell in enumerate(nb["cells"]):
        src = "".join(cell["source"])
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id", "")
        if cell["cell_type"] != "code" or not (i == 1 or grade_id in RECIPE_CELLS):
            continue
        for old, new in (replace or {}).items():
            src = src.replace(old, new)
        name = f"<{folder} cell {i}>"
        linecache.cache[name] = (len(src), None, src.splitlines(True), name)
        exec(compile(src, name, "exec"), ns)
    return ns


def _recipe(ns: dict) -> capstone.Recipe:
    return capstone.Recipe("a student's", ns["load_for_lora"], ns["preflight"], ns["adapter_optimizer"],
                           ns["train_steps"], ns["answer_logprobs"], ns["first_word"], ns["merge_onto_w16"])


@pytest.fixture(scope="module")
def solution() -> dict:
    return _answers("solutions")


@pytest.mark.parametrize("field", FIELDS)
def test_the_model_answer_is_the_reference_recipe(solution, field):
    """If this fails, coursekit/recipe.py and the solution notebook's answer have drifted apart: the solution
    notebook would train a run of its own beside `coursekit capstone`'s (minutes more in `make test`)."""
    assert code_fingerprint(solution[field]) == code_fingerprint(getattr(capstone.REFERENCE, field)), field


def test_a_changed_function_gets_its_own_results_and_shares_the_rest(solution, tmp_path):
    mine = _recipe(_answers("solutions", {"losses.append(total / n)": "losses.append(total / len(window))"}))
    store = capstone.Store(root=tmp_path, compute=True)
    ref = capstone.REFERENCE
    assert capstone.recipe_key(mine, store, "runs") != capstone.recipe_key(ref, store, "runs")
    for kind in ("labels", "generate", "merges", "prompts"):  # functions not changed: the reference's results
        assert capstone.recipe_key(mine, store, kind) == capstone.recipe_key(ref, store, kind), kind
    # a comment or a docstring is not a change
    commented = _recipe(_answers("solutions", {"    losses = []\n": "    losses = []  # one per window\n"}))
    assert capstone.recipe_key(commented, store, "runs") == capstone.recipe_key(ref, store, "runs")


def test_the_grader_reads_the_reference_results_whatever_the_recipe(tmp_path):
    """nbgrader autograde never trains: a store that may not compute keys every recipe as the reference."""
    mine = _recipe(_answers("solutions", {"lora_dropout=0.0": "lora_dropout=0.1"}))
    grader, own = capstone.Store(root=tmp_path, compute=False), capstone.Store(root=tmp_path, compute=True)
    assert capstone.recipe_key(mine, grader, "runs") == capstone.recipe_key(capstone.REFERENCE, own, "runs")
    assert capstone.recipe_key(mine, own, "runs") != capstone.recipe_key(capstone.REFERENCE, own, "runs")


def test_a_fresh_lessons_blanks_run_the_reference(tmp_path):
    blank = _recipe(_answers("lessons"))
    assert set(blank.missing()) == {"load_for_lora", "preflight", "adapter_optimizer", "train_steps",
                                    "answer_logprobs", "first_word", "merge_onto_w16"}
    store = capstone.Store(root=tmp_path, compute=True)
    for kind in capstone.DEPENDS_ON:
        assert capstone.recipe_key(blank.or_reference(), store, kind) == capstone.recipe_key(capstone.REFERENCE, store, kind)
