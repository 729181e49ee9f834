"""The Python code of the narrative docs runs as written.

Pages: getting started, the user guide and the FAQ.

Every ``.. code-block:: python`` (or ``.. code:: python``) block of the pages
in ``PAGES`` is extracted and run, page by page, in order and in one
namespace per page, as a reader pasting the blocks into one session would.
A block fails the test with its page and line number.

Markers, written as an RST comment (invisible in the rendered page) on the
line right before the block's directive:

``.. test-docs: skip <reason>``
    Never run the block (it needs a cluster, a GPU, files of the reader's).
``.. test-docs: needs-mnist``
    Run the block only when MNIST is on this machine (``SKASSOC_MNIST_DIR``
    or ``../shared/data/mnist`` beside the repository), else skip it and
    every later block of the page, which may use its variables.

Keep blocks fast: a few hundred steps at most, ``device="cpu"``.
"""

import os
import re
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
# README.rst, from the docs folder: its example runs as written too.
PAGES = ["../README.rst", "getting_started.rst", "user_guide.rst", "faq.rst"]

# Sections (by their label) whose blocks are not run, with the reason. Keep
# this empty where a marker on the block can say the same.
SKIP_SECTIONS = {}

_DIRECTIVE = re.compile(r"^(\s*)\.\.\s+(code-block|code|sourcecode)::\s*(\S*)\s*$")
_MARKER = re.compile(r"^\s*\.\.\s+test-docs:\s*(\S+)\s*(.*)$")
_LABEL = re.compile(r"^\.\.\s+_([\w-]+):\s*$")
_LITERAL = re.compile(r"(?<!:)::\s*$")


def _mnist_dir():
    """The folder of the MNIST files on this machine, or None."""
    for path in (
        os.environ.get("SKASSOC_MNIST_DIR"),
        ROOT.parent / "shared" / "data" / "mnist",
    ):
        if path and (Path(path) / "train-images-idx3-ubyte.gz").is_file():
            return Path(path)
    return None


def extract_blocks(text):
    """``[(line, language, code, marker, section)]`` of the code blocks of ``text``.

    ``marker`` is ``(name, argument)`` or None; ``section`` the label of the
    latest ``.. _label:`` above the block.
    """
    lines = text.splitlines()
    blocks = []
    section = None
    i = 0
    while i < len(lines):
        label = _LABEL.match(lines[i])
        if label:
            section = label.group(1)
        match = _DIRECTIVE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, language = len(match.group(1)), match.group(3)
        marker = None
        j = i - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        if j >= 0 and _MARKER.match(lines[j]):
            m = _MARKER.match(lines[j])
            marker = (m.group(1), m.group(2))
        # Skip the directive's options, then take the indented body.
        i += 1
        while i < len(lines) and re.match(r"^\s+:\w[\w-]*:", lines[i]):
            i += 1
        start = i
        body = []
        while i < len(lines):
            line = lines[i]
            if line.strip() and len(line) - len(line.lstrip()) <= indent:
                break
            body.append(line)
            i += 1
        while body and not body[-1].strip():
            body.pop()
        while body and not body[0].strip():
            body.pop(0)
        # Dedent by the body's indentation.
        widths = [len(x) - len(x.lstrip()) for x in body if x.strip()]
        width = min(widths) if widths else 0
        code = "\n".join(x[width:] for x in body)
        blocks.append((start + 1, language, code, marker, section))
    return blocks


def untagged_literal_blocks(text):
    """Line numbers of ``::`` literal blocks (their language is implicit)."""
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if stripped.startswith(".."):
            continue
        if _LITERAL.search(line):
            found.append(number)
    return found


@pytest.mark.parametrize("page", PAGES)
def test_code_blocks_name_their_language(page):
    """No code hides in a ``::`` literal block, where this test would miss it."""
    text = (DOCS / page).read_text(encoding="utf-8")
    assert untagged_literal_blocks(text) == [], (
        f"{page}: write code as `.. code-block:: python` (or another language), "
        "not as a `::` literal block"
    )


@pytest.mark.parametrize("page", PAGES)
def test_code_blocks_run(page, tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import torch

    monkeypatch.chdir(tmp_path)  # blocks may write files (clf.save(...))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny fits; faster than threads on a busy machine
    text = (DOCS / page).read_text(encoding="utf-8")
    blocks = [b for b in extract_blocks(text) if b[1] in ("python", "python3", "py")]
    assert blocks, f"{page} has no Python code block"
    namespace = {"__name__": "__docs__"}
    skipped = []
    mnist = _mnist_dir()
    try:
        for line, _, code, marker, section in blocks:
            where = f"{page}, line {line}"
            if section in SKIP_SECTIONS:
                skipped.append(f"{where}: {SKIP_SECTIONS[section]}")
                continue
            if marker and marker[0] == "skip":
                skipped.append(f"{where}: {marker[1] or 'marked skip'}")
                continue
            if marker and marker[0] == "needs-mnist":
                if mnist is None:
                    skipped.append(f"{where} and later: MNIST is not on this machine")
                    break
                monkeypatch.setenv("SKASSOC_MNIST_DIR", str(mnist))
            if marker and marker[0] not in ("skip", "needs-mnist"):
                pytest.fail(f"{where}: unknown marker `.. test-docs: {marker[0]}`")
            started = time.perf_counter()
            try:
                exec(compile(code, where, "exec"), namespace)
            except Exception as exc:
                raise AssertionError(
                    f"the code block at {where} failed:\n{code}"
                ) from exc
            elapsed = time.perf_counter() - started
            print(f"{where}: {elapsed:.1f} s")
    finally:
        import matplotlib.pyplot as plt

        plt.close("all")
        torch.set_num_threads(threads)
    for reason in skipped:
        print("skipped", reason)


def test_parameters_page_names_every_parameter():
    """docs/parameters.rst lists every constructor parameter, no stale one."""
    import inspect

    from skassoc import SemiSupervisedAssociationClassifier

    text = (DOCS / "parameters.rst").read_text(encoding="utf-8")
    rows = re.findall(r"^   \* - ((?:``\w+``(?:, )?)+)\s*$", text, flags=re.M)
    listed = {name for row in rows for name in re.findall(r"``(\w+)``", row)}
    expected = set(inspect.signature(SemiSupervisedAssociationClassifier).parameters)
    assert sorted(expected - listed) == [], "parameters missing from the table"
    assert sorted(listed - expected) == [], "the table names unknown parameters"


def test_extract_blocks_reads_markers_and_sections():
    text = """\
.. _first:

Title
-----

.. code-block:: python

    a = 1

.. test-docs: skip needs a GPU

.. code-block:: python
   :caption: x

    if a:
        b = 2

.. _second:

.. code-block:: bash

    echo hi
"""
    blocks = extract_blocks(text)
    assert [(b[1], b[2], b[3], b[4]) for b in blocks] == [
        ("python", "a = 1", None, "first"),
        ("python", "if a:\n    b = 2", ("skip", "needs a GPU"), "first"),
        ("bash", "echo hi", None, "second"),
    ]
    assert untagged_literal_blocks("Text::\n\n    x\n.. math::\n") == [1]
