"""The checks that keep a lesson's numbers honest, kept out of the student's way.

A solution notebook's Know-this cell shows the computation and what it prints; the ``assert`` and
``np.testing`` lines that pin each quoted number sit in the cell right after it, tagged ``assert-numbers``.
nbval runs them in every solution notebook (CI), so a number that drifts fails the build; the release drops
them (:class:`DropNumberChecks`, in nbgrader's GenerateAssignment pipeline, autograder/nbgrader_config.py), so
a student reads the lesson, not its tests.
"""

from __future__ import annotations

from nbgrader.preprocessors import NbGraderPreprocessor

#: The cell tag of a solution-only check cell.
TAG = "assert-numbers"


def is_check_cell(cell) -> bool:
    """A code cell tagged :data:`TAG` that nbgrader does not manage (an answer or grade cell is never dropped)."""
    md = cell.get("metadata", {})
    return cell.get("cell_type") == "code" and TAG in md.get("tags", []) and not md.get("nbgrader")


class DropNumberChecks(NbGraderPreprocessor):
    """Release step: remove every check cell (:func:`is_check_cell`) from the student's notebook."""

    def preprocess(self, nb, resources):
        nb.cells = [c for c in nb.cells if not is_check_cell(c)]
        return nb, resources


__all__ = ["TAG", "DropNumberChecks", "is_check_cell"]
