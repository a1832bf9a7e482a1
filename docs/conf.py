"""Sphinx configuration of the course's web book (`make book`: docs/ and lessons/ as one site, offline).

The source folder is the repository's root, so that the links the lessons and the guides already hold
(``../glossary.md`` from a lesson, ``../lessons/...`` from a guide) work the same in JupyterLab, on a code host and
here; ``include_patterns`` keeps the site to docs/ and lessons/: solutions/, the answer keys and the example class
are never read. The release notebooks are rendered as committed (no outputs: running a lesson needs the model and
minutes of CPU, and a blank lesson's outputs would only say "Not answered yet"), never executed.
"""

from __future__ import annotations

project = "Gradients through a frozen, quantized base"
author = "the course's authors"
copyright = "the course's authors, Apache-2.0"

root_doc = "docs/index"
include_patterns = ["docs/**", "lessons/*.md", "lessons/*/*.ipynb"]
exclude_patterns = ["**/.ipynb_checkpoints/**", "docs/_root/**",
                    # the raw results the capstone command writes; docs/capstone.md holds the same text in its blocks
                    "docs/capstone-results-*.md"]

extensions = [
    "myst_nb",                    # .md (MyST) and .ipynb pages
    "sphinx-mathjax-offline",     # MathJax 3 copied into _static/mathjax: no CDN, math renders offline
]

# The notebooks as committed: never run (see the module docstring), and the site says so on its index page.
nb_execution_mode = "off"
myst_enable_extensions = ["dollarmath", "amsmath"]
myst_heading_anchors = 3                   # "guide.md#a-heading" links resolve to the heading's anchor

html_theme = "furo"
html_title = "QLoRA backprop course"
html_extra_path = ["_root"]                       # index.html at the site's root, which sends the browser to docs/index.html
html_show_sourcelink = False               # the page's source, for a notebook its .ipynb, stays off the site
html_copy_source = False
html_last_updated_fmt = None

# What fails the build (make book runs sphinx-build -W --keep-going): a broken cross-reference, a link to a page
# or heading that does not exist, a document missing from every table of contents. Warnings that are noise here:
suppress_warnings = [
    # A notebook's markdown cells often go from a lesson's "#" title straight to a "###" sub-part inside a cell; a
    # heading level that jumps is how the lessons read in JupyterLab, not a defect of the site.
    "myst.header",
]
