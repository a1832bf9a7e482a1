"""nbgrader configuration of the course.

Paths are relative to this file, so `nbgrader <command> --config autograder/nbgrader_config.py`
works from any folder, and `coursekit grade` loads the same file. The course's working state
(gradebook.db, submitted/, autograded/, feedback/, grades.csv) lives in autograder/course/, which
git ignores; the source and release folders are the repository's solutions/ and lessons/.
"""

import os

c = get_config()  # noqa: F821  (provided by traitlets when nbgrader loads this file)

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

# The answer keys, hints and hidden-case seeds (autograder/keys/NN.json) stay with the instructor: the
# grading process reads them through this variable (coursekit/grading/keys.py); the kernel that runs a
# student's code is sandboxed without it (coursekit.guard.GuardedExecute), and ScoreAnswers scores the
# answers its checks hand over.
os.environ.setdefault("COURSEKIT_KEYS", os.path.join(HERE, "keys"))

c.CourseDirectory.course_id = "qlora-backprop"
# The course folder; $COURSEKIT_COURSE points nbgrader's own commands and the formgrader at another one (coursekit
# formgrader --examples uses it for the example class).
c.CourseDirectory.root = os.environ.get("COURSEKIT_COURSE") or os.path.join(HERE, "course")
# nbgrader's commands open the gradebook in the course folder, and `nbgrader collect` on a fresh clone would stop
# with a raw SQLite error ("unable to open database file") without it.
os.makedirs(c.CourseDirectory.root, exist_ok=True)
# nbgrader's exchange (release_assignment, collect, release_feedback; students' fetch_assignment, submit,
# fetch_feedback): one folder every user's server sees, writable by all. This is nbgrader's own default, written out
# so that it is one line to change; $COURSEKIT_EXCHANGE moves it without editing this file. Students' config:
# autograder/student_nbgrader_config.py.
c.Exchange.root = os.environ.get("COURSEKIT_EXCHANGE", "/usr/local/share/nbgrader/exchange")
# nbgrader's collect, leaving a link in a student's submission out (named in links-not-collected.txt) instead of
# copying what it points to (the grading account can read the keys); every grading route then refuses that
# submission (coursekit/exchange.py).
c.ExchangeFactory.collect = "coursekit.exchange.LinkSafeCollect"
# Absolute step folders: nbgrader joins root with them, and an absolute path wins.
c.CourseDirectory.source_directory = os.path.join(REPO, "solutions")
# The release folder is lessons/; COURSEKIT_RELEASE names another (a copy), so that grading, which generates the
# lessons it grades into the release folder again, leaves the repository's lessons/ as they are (the tests use it).
c.CourseDirectory.release_directory = os.environ.get("COURSEKIT_RELEASE") or os.path.join(REPO, "lessons")
# Only lesson folders are assignments; AUTHORING.md and friends are not.
c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback", "*.md"]

# A cell that is not an answer cell may take up to 40 minutes: the model lessons load and run a real model on
# a 2-core CPU, slower still when the grader shares the machine. nbgrader's default of 30 s would kill them
# (nbgrader #915, #1004). Lesson 19 never trains while grading: its run is read from the capstone store that
# `coursekit grade` fills first (coursekit.capstone).
c.Execute.timeout = 2400

# Hostile or broken notebooks (coursekit/guard.py): the kernel runs in a sandbox (coursekit/sandbox.py), an
# answer cell gets 60 s (an endless loop is stopped and the notebook goes on), a notebook that kills its
# kernel keeps the scores of the cells before, and every check is scored in the grading process.
c.GuardedExecute.answer_timeout = int(os.environ.get("COURSEKIT_ANSWER_TIMEOUT", "60"))
# nbconvert validates the whole notebook after every preprocessor by default: once at the end of each run is enough
# (a step may leave it briefly incomplete: nbgrader's OverwriteCells restores deleted cells without an id, which
# IdRestoredCells gives them), and it spares the grader a schema check of every output after each step.
c.Exporter.optimistic_validation = True
c.Autograde.sanitize_preprocessors = [
    # a folder with a link, a device or an oversized file is not graded on any route (coursekit/submissions.py)
    "coursekit.submissions.RefuseUnsafe",
    "nbgrader.preprocessors.ClearOutput",
    "nbgrader.preprocessors.DeduplicateIds",
    "coursekit.guard.DropEmptyMetadata",  # a duplicated cell would otherwise crash OverwriteCells (KeyError)
    "nbgrader.preprocessors.OverwriteKernelspec",
    "nbgrader.preprocessors.OverwriteCells",
    "coursekit.guard.IdRestoredCells",  # a deleted check cell comes back without an id (nbformat warns for each)
    "nbgrader.preprocessors.CheckCellMetadata",
]
c.Autograde.autograde_preprocessors = [
    "coursekit.guard.GuardedExecute",
    "nbgrader.preprocessors.IgnorePattern",
    "coursekit.guard.ScoreAnswers",  # every check is scored here, from the answer the sandboxed kernel handed over
    # what the instructor's pages show of a student's notebook is inert: outputs as text and images, the student's
    # markdown rendered and cleaned by an allow-list sanitizer (coursekit/inert.py)
    "coursekit.inert.InertOutputs",
    "nbconvert.preprocessors.ClearMetadataPreprocessor",
    "nbgrader.preprocessors.LimitOutput",
    "nbgrader.preprocessors.SaveAutoGrades",
    "nbgrader.preprocessors.AssignLatePenalties",
    "nbgrader.preprocessors.CheckCellMetadata",
    # files handed in besides the lesson's notebook are set aside: removed from the autograded copy (nbgrader's
    # feedback step would copy them on, and release_feedback hand out any .html), named in its first cell; the copy
    # keeps nbgrader's timestamp.txt and submission_secret.txt, so that its feedback can always be released
    "coursekit.submissions.TidyAutograded",
]
c.TidyAutograded.release_directory = c.CourseDirectory.release_directory
c.InertOutputs.release_directory = c.CourseDirectory.release_directory
c.RefuseUnsafe.release_directory = c.CourseDirectory.release_directory
# The same limits whichever way grading starts (coursekit grade, a plain `nbgrader autograde`, the formgrader's
# autograde button): GuardedExecute reads the lesson's release notebook from here, so that a code cell the student
# added or edited gets the answer cells' time limit and the sandboxed kernel sees the lesson's files of the
# submission folder, nothing else the student handed in.
c.GuardedExecute.release_directory = c.CourseDirectory.release_directory
# What the grader measured of this run (seconds spent executing and scoring: coursekit.grading.budget) stays in the
# autograded notebook; everything else of the notebook's metadata is cleared as nbgrader does.
c.ClearMetadataPreprocessor.preserve_nb_metadata_mask = {("language_info", "name"), "coursekit_budget"}
# Each check cell's outcome (status and named mistakes, coursekit.guard.OUTCOME_KEY) stays too: the class report
# (coursekit report) reads it from the autograded notebooks.
c.ClearMetadataPreprocessor.preserve_cell_metadata_mask = {"nbgrader", "coursekit_outcome"}
c.ExecutePreprocessor.kernel_name = "python3"
# The grading kernel's own log (e.g. ipykernel's note about TCP transport) is noise in the grader's output.
c.Execute.extra_arguments = ["--IPKernelApp.log_level=ERROR"]

# A test cell that writes to stderr scores 0 (nbgrader utils.determine_grade). coursekit's checkers
# print to stdout only; this strips stderr outputs made up solely of library warning lines
# (torch, bitsandbytes, transformers) so that a harmless warning never zeroes a right answer.
c.IgnorePattern.enabled = True
c.IgnorePattern.pattern = (
    # every line is a warning line, or the indented source line Python prints under a warning
    r"\A(?:(?:[^\n]*(?:Warning:|warnings\.warn\(|NNPACK|bitsandbytes|kernels-community|UserWarning|FutureWarning)[^\n]*|[ \t][^\n]*)(?:\n|\Z))+\Z"
)

# A student who deletes a test cell gets it back from the gradebook instead of an ungradable notebook.
c.OverwriteCells.add_missing_cells = True

c.LimitOutput.max_lines = 400
# The blank an answer cell starts from. It raises nothing, so Run All on a fresh lesson reaches the end: a value cell
# keeps its `answer_xx = None` line, a function only its docstring, and the check says "not answered yet".
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE"}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"

# The release drops the solution-only cells tagged "assert-numbers" (coursekit/checkcells.py): the checks that pin
# every number a lesson quotes run in CI on solutions/, and students read the computation without them.
from nbgrader.converters import GenerateAssignment  # noqa: E402

c.GenerateAssignment.preprocessors = ["coursekit.checkcells.DropNumberChecks",
                                      *GenerateAssignment.class_traits()["preprocessors"].default()]
