"""The repository conftest widens nbval's hard-coded 5 s output wait (see conftest.py)."""

from __future__ import annotations

import nbformat
import pytest

from conftest import ROOT  # tests/conftest.py

pytest_plugins = ["pytester"]


@pytest.mark.notebooks
def test_nbval_cells_get_the_wider_output_timeout(pytester):
    hooks = (ROOT / "conftest.py").read_text()
    probe = '''

def pytest_runtest_setup(item):
    print(f"OUTPUT_TIMEOUT={getattr(item, 'output_timeout', None)}")
'''
    pytester.makeconftest(hooks + probe)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("x = 1 + 1")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, pytester.path / "tiny.ipynb")
    result = pytester.runpytest_subprocess("--nbval-lax", "--nbval-current-env", "-s", "-p", "no:xdist",
                                           "-p", "no:cacheprovider", "tiny.ipynb")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*OUTPUT_TIMEOUT=120*"])


@pytest.mark.notebooks
def test_a_solution_cell_writing_to_stderr_fails(pytester):
    pytester.makeconftest((ROOT / "conftest.py").read_text())
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("print('fine')"),
                nbformat.v4.new_code_cell("import sys\nprint('a library note', file=sys.stderr)")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, pytester.path / "noisy.ipynb")
    result = pytester.runpytest_subprocess("--nbval-lax", "--nbval-current-env", "-p", "no:xdist",
                                           "-p", "no:cacheprovider", "noisy.ipynb")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*wrote to stderr*", "*a library note*"])
