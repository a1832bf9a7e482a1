"""The repository conftest's scheduler for pytest-xdist (conftest.py, ``LongestFirst``): the longest scope first,
lesson 19's readers held back while the background capstone run fills the store, shared scopes on one worker."""

from __future__ import annotations

import importlib.util
import textwrap

import pytest

from conftest import ROOT  # tests/conftest.py

pytest_plugins = ["pytester"]


def _root_conftest():
    spec = importlib.util.spec_from_file_location("root_conftest", ROOT / "conftest.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_tests_that_share_lesson_02s_graded_class_share_one_scope():
    c = _root_conftest()
    shared = {c.scope_of("tests/test_key_leaks.py::test_feedback_shows_hidden_outcomes_not_their_generator"),
              c.scope_of("tests/test_browser.py::test_feedback_renders_with_scores_and_diagnostics"),
              c.scope_of("tests/test_grading_roundtrip.py::TestRoundTrip02::test_blank_scores_zero_on_every_test_cell")}
    assert len(shared) == 1
    assert c.scope_of("tests/test_grading_roundtrip.py::TestRoundTrip03::test_blank_scores_zero_on_every_test_cell") \
        == "tests/test_grading_roundtrip.py::TestRoundTrip03"
    assert c.scope_of("tests/test_lora.py::test_seed_forward") == "tests/test_lora.py"
    assert c.scope_of("tests/test_key_leaks_extra.py::test_x") == "tests/test_key_leaks_extra.py"  # a prefix, not a match
    for nodeid in ("solutions/19-capstone-a-real-qlora-run/19-capstone-a-real-qlora-run.ipynb::Cell 3",
                   "tests/test_grading_roundtrip.py::TestRoundTrip19::test_blank_scores_zero_on_every_test_cell",
                   "tests/test_capstone_run.py::test_memory_as_lesson_19_reads_it"):
        assert c._reads_the_capstone(nodeid), nodeid
    assert not c._reads_the_capstone("tests/test_capstone.py::test_store_computes_once_and_then_reads")


@pytest.mark.notebooks
def test_longest_scope_first_and_readers_after_the_background_run(pytester):
    """Two workers; the background run is a stand-in that sleeps, then leaves a file. A reader (tests/test_capstone_run.py)
    asserts the file is there, so it passes only if it was held back; the declared longest scope starts first,
    although xdist's own order (most tests first) would start it last. Once only readers are left they are handed
    out, filling or not, so the other work (about 6 s a worker) outlasts the stand-in (2 s) by a margin that holds
    on a loaded machine: with 3 s against 3.3 s a CI run once handed the readers out early."""
    log, done = pytester.path / "order.log", pytester.path / "precomputed"
    overrides = f'''
PRECOMPUTE_CODE = "import pathlib, time; time.sleep(2); pathlib.Path(r'{done}').touch()"
SCOPE_SECONDS = {{"test_slow.py": 1000, "tests/test_capstone_run.py": 2000}}
'''
    pytester.makeconftest((ROOT / "conftest.py").read_text() + overrides)
    body = '''
import pathlib, time
import pytest

def _log(what):
    with open(r"{log}", "a") as f:
        f.write(what + "\\n")
'''.format(log=log)
    pytester.makepyfile(test_slow=body + textwrap.dedent('''
        @pytest.mark.parametrize("i", range(2))
        def test_slow(i):
            _log("slow")
            time.sleep(0.3)
    '''))
    for k in range(6):
        pytester.makepyfile(**{f"test_many{k}": body + textwrap.dedent('''
            @pytest.mark.parametrize("i", range(5))
            def test_many(i):
                _log("many")
                time.sleep(0.4)
        ''')})
    (pytester.path / "tests").mkdir()
    (pytester.path / "tests" / "test_capstone_run.py").write_text(body + textwrap.dedent(f'''
        @pytest.mark.parametrize("i", range(2))
        def test_reads_the_run(i):
            _log("reader")
            assert pathlib.Path(r"{done}").exists(), "a reader ran while the background run was filling the store"
    '''))
    result = pytester.runpytest_subprocess("-n", "2", "--dist", "loadscope", "-p", "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(passed=2 + 30 + 2)
    order = log.read_text().split()
    assert "slow" in order[:2], order[:4]
    assert order.index("reader") > order.index("many"), order
