"""Sphinx configuration of vcrawl's manual: MyST Markdown pages and an API reference from docstrings.

Built by ``make docs`` with warnings as errors. Nothing here reaches the network (no intersphinx).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the packages sit at the repository root (also installed editable)

import vcrawl  # noqa: E402  (needs the path above)

project = "vcrawl"
author = "the vcrawl authors"
copyright = "the vcrawl authors, Apache-2.0"
release = vcrawl.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

# Headings get anchors, so pages can link to a section: [Proxy pool health](jobs.md#proxy-pool-health).
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence"]

# Google-style docstrings (STYLE.md section 9).
napoleon_google_docstring = True
napoleon_numpy_docstring = False
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_typehints = "signature"

html_theme = "alabaster"
html_title = f"vcrawl {release}"
html_theme_options = {"description": "A distributed vertical web crawler built as a Celery task graph"}
