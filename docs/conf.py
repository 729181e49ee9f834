"""Sphinx configuration of the skassoc documentation.

Build (from the repository root; on this project's machines a local CPU
wheel of PyTorch 2.13.0 serves the pin, elsewhere install PyTorch first as
docs/installation.rst says and leave the pin out)::

    python -m pip install torch==2.13.0 ".[docs]"
    python -m sphinx -W -b html docs docs/_build/html -j1

The build needs no network: MathJax is served from ``_static/mathjax`` and
the inventories of the projects the docs link to (Python, NumPy,
scikit-learn, PyTorch, matplotlib, ...) are read from ``_inventories``,
written by ``make_inventories.py``.

``SKASSOC_DOCS_PLOT=0`` renders the example gallery without running the
examples (a quick build); by default the examples run and their figures are
shown. The MNIST example runs only when the MNIST files are on the machine
(``SKASSOC_MNIST_DIR``, or ``../shared/data/mnist`` beside the repository);
no example downloads anything.
"""

import os
import re
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
# Document the source tree next to this folder, installed or not.
sys.path.insert(0, str(ROOT))
# This build's own directives (the benchmark pages' tables).
sys.path.insert(0, str(DOCS / "_ext"))

import torch  # noqa: E402

import skassoc  # noqa: E402

# The examples train small networks on the CPU, for which one thread is as
# fast as several, and much faster on a machine shared with other jobs.
torch.set_num_threads(1)

# -- Project -----------------------------------------------------------------

project = "skassoc"
author = "skassoc developers"
copyright = "2026, skassoc developers"
version = skassoc.__version__
release = skassoc.__version__

# -- General -----------------------------------------------------------------

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.intersphinx",
    "sphinx.ext.mathjax",
    "numpydoc",
    "sphinx_gallery.gen_gallery",
    "benchmark_tables",
]

templates_path = ["_templates"]
exclude_patterns = [
    "_build",
    "Thumbs.db",
    ".DS_Store",
    "**.ipynb_checkpoints",
    # The draft of the next README.rst: reviewed as a file, not a page.
]
default_role = "literal"
pygments_style = "sphinx"

# Every cross-reference must resolve: a reference to an object no inventory
# knows fails the build (with -W) instead of rendering as dead text. When
# one fails, add the object to make_inventories.py (foreign objects) or fix
# the reference (skassoc's own).
nitpicky = True
nitpick_ignore = [
    # The estimator's Attributes section is rendered as a parameter list
    # (numpydoc_attributes_as_param_list), which makes no target for
    # :attr:`classes_` in the method docstrings.
    ("py:attr", "classes_"),
]

# -- Offline math ------------------------------------------------------------

# MathJax 3 (the tex-chtml bundle and its woff fonts) is vendored under
# _static/mathjax, so that equations render without a CDN.
mathjax_path = "mathjax/tex-chtml.js"

# -- intersphinx, offline ----------------------------------------------------

# Each project's inventory is a small objects.inv written by
# make_inventories.py for exactly the objects these docs refer to; the links
# point to the projects' real online pages. Nothing is downloaded.
INVENTORIES = DOCS / "_inventories"
intersphinx_mapping = {
    name: (url, str(INVENTORIES / f"{name}.inv"))
    for name, url in {
        "python": "https://docs.python.org/3/",
        "numpy": "https://numpy.org/doc/stable/",
        "sklearn": "https://scikit-learn.org/stable/",
        "torch": "https://docs.pytorch.org/docs/stable/",
        "matplotlib": "https://matplotlib.org/stable/",
        "pandas": "https://pandas.pydata.org/docs/",
        "joblib": "https://joblib.readthedocs.io/en/stable/",
        "distributed": "https://distributed.dask.org/en/stable/",
    }.items()
}
intersphinx_timeout = 1
# Only explicit roles (:class:`sklearn...`) go to the inventories, never a
# plain :ref: or :doc: of this project's.
intersphinx_disabled_reftypes = ["std:doc"]

# -- autodoc / autosummary / numpydoc ---------------------------------------

autosummary_generate = True
autosummary_imported_members = False
autodoc_default_options = {"member-order": "groupwise"}
autodoc_typehints = "none"
# Classes list their methods through the autosummary class template, not
# through numpydoc's member table (which would duplicate them).
numpydoc_show_class_members = False
numpydoc_show_inherited_class_members = False
numpydoc_class_members_toctree = False
numpydoc_attributes_as_param_list = True
numpydoc_xref_param_type = False

# -- sphinx-gallery ----------------------------------------------------------


def _plot_gallery():
    """Run the examples unless SKASSOC_DOCS_PLOT is 0/false/no/off."""
    value = os.environ.get("SKASSOC_DOCS_PLOT", "1").strip().lower()
    return value not in {"0", "false", "no", "off", ""}


def _mnist_dir():
    """The folder of the MNIST files on this machine, or None."""
    for path in (
        os.environ.get("SKASSOC_MNIST_DIR"),
        ROOT.parent / "shared/data/mnist",
    ):
        if path and (Path(path) / "train-images-idx3-ubyte.gz").is_file():
            return Path(path)
    return None


MNIST_DIR = _mnist_dir()
if MNIST_DIR is not None:
    # Read by skassoc.datasets.load_mnist in the examples.
    os.environ["SKASSOC_MNIST_DIR"] = str(MNIST_DIR)

EXAMPLES = ROOT / "examples"
sphinx_gallery_conf = {
    "examples_dirs": "../examples",
    "gallery_dirs": "auto_examples",
    # Only plot_*.py files are executed (the MNIST one only where the files
    # are: examples never download, so its thumbnail is a static image, its
    # confusion matrix saved from a run, _static/plot_mnist_cpu_thumbnail.png)
    # ...
    "filename_pattern": r"/plot_" if MNIST_DIR else r"/plot_(?!mnist)",
    # ... and only they are shown: other scripts in examples/ (such as
    # digits_main.py, a command-line job) are not gallery examples.
    "ignore_pattern": r"^(?!plot_)|__init__\.py",
    "plot_gallery": _plot_gallery(),
    "download_all_examples": False,
    "within_subsection_order": "FileNameSortKey",
    "remove_config_comments": True,
    "abort_on_example_error": False,
    "only_warn_on_example_error": False,
    "show_memory": False,
    # The execution-time pages load a table script from a CDN; the docs
    # stay offline without them.
    "write_computation_times": False,
    "image_scrapers": ("matplotlib",),
    "matplotlib_animations": False,
    # Show what the examples print, never the repr of a cell's last value
    # (<matplotlib.legend.Legend ...>, Text(...)).
    "capture_repr": (),
    # "Examples using this class" on the API pages (the autosummary templates
    # include a minigallery of these files).
    "backreferences_dir": "generated/backreferences",
    "doc_module": ("skassoc",),
    # Link names in the examples' code to skassoc's API pages (and, through
    # the intersphinx inventories above, to the other projects').
    "reference_url": {"skassoc": None},
}
# sphinx-gallery needs a header file in the examples folder, also while the
# folder holds no example yet.
if not any(
    (EXAMPLES / name).is_file()
    for name in ("README.txt", "README.rst", "GALLERY_HEADER.rst")
):
    raise RuntimeError(
        f"{EXAMPLES} needs a README.txt (the gallery's title and introduction)."
    )

# -- HTML --------------------------------------------------------------------

html_theme = "alabaster"
html_title = f"skassoc {release}"
html_static_path = ["_static"]
html_css_files = ["skassoc.css"]
html_theme_options = {
    "description": "Learning by association for scikit-learn",
    "fixed_sidebar": True,
    # Wide enough for the benchmark tables at 1,280 px; narrower windows get
    # alabaster's one-column layout (it switches at this width).
    "page_width": "1240px",
    "body_max_width": "none",
    "sidebar_width": "230px",
    "show_relbars": True,
}
html_sidebars = {
    "**": ["about.html", "navigation.html", "relations.html", "searchbox.html"]
}
html_show_sourcelink = False


# -- Docstring fix-ups -------------------------------------------------------

# Methods inherited from scikit-learn (score, get_params, set_output, ...)
# refer to labels and glossary terms of scikit-learn's own documentation,
# which this build cannot resolve without intersphinx (and network access).
# Keep the text of those references and drop the link.
_TITLED_REF = re.compile(r":(?:ref|term|doc):`([^`<]+?)\s*<[^`>]+>`")
_BARE_REF = re.compile(r":(?:ref|term|doc):`([^`<>]+)`")


def _unlink_foreign_references(app, what, name, obj, options, lines):
    module = getattr(obj, "__module__", None) or ""
    if module == "skassoc" or module.startswith("skassoc."):
        return
    for i, line in enumerate(lines):
        line = _TITLED_REF.sub(r"\1", line)
        lines[i] = _BARE_REF.sub(r"\1", line)


def setup(app):
    # Priorities below numpydoc's (500): fix the text before numpydoc parses it.
    app.connect("autodoc-process-docstring", _unlink_foreign_references, priority=400)
