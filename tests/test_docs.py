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

import json
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


def test_user_guide_describes_every_fit_report_score():
    """The user guide's table of ``fit_report_.scores`` says what
    ``REPORT_SCORES`` says, score for score."""
    from skassoc import REPORT_SCORES

    text = (DOCS / "user_guide.rst").read_text(encoding="utf-8")
    body = _section(text, "Is my model any good? What should I label next?")
    rows = re.findall(
        r"^   \* - ``(\w+)``\n     - (.+?)(?=^   \* - |\n\n)", body, flags=re.M | re.S
    )
    table = {name: " ".join(words.split()) for name, words in rows}
    scores = {name: " ".join(words.split()) for name, words in REPORT_SCORES.items()}
    assert table == scores


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


# --------------------------------------------------------------------------
# Install instructions


def _section(text, title):
    """The body of the section ``title`` of an RST page (up to the next one)."""
    match = re.search(
        rf"^{re.escape(title)}\n[-=~^]+\n(.*?)(?=^\S[^\n]*\n[-=~^]+\n|\Z)",
        text,
        flags=re.M | re.S,
    )
    assert match, f"no section {title!r}"
    return match.group(1)


CPU_INSTALL = "pip install torch --index-url https://download.pytorch.org/whl/cpu"
CUDA_INSTALL = re.compile(
    r"pip install torch --index-url https://download\.pytorch\.org/whl/cu\d+"
)


@pytest.mark.parametrize(
    "page, section", [("../README.rst", "Install"), ("installation.rst", None)]
)
def test_install_gives_the_cpu_and_the_cuda_build(page, section):
    """Commands right on any machine: the CPU build from PyTorch's index (PyPI's
    Linux wheel is the CUDA build), the CUDA build, each labelled, and the
    local-wheel pin said to hold on this project's machines only."""
    text = (DOCS / page).read_text(encoding="utf-8")
    body = _section(text, section) if section else text
    bash = "\n".join(
        code for _, lang, code, _, _ in extract_blocks(body) if lang == "bash"
    )
    assert CPU_INSTALL in bash and CUDA_INSTALL.search(bash)
    assert "CPU" in body and ("GPU" in body or "CUDA" in body)
    assert "pip install torch==2.13.0 ." in body
    assert "this project's own machines" in body


@pytest.mark.parametrize("page", ["../README.rst", "installation.rst"])
def test_docs_install_pins_torch_as_the_other_commands(page):
    text = (DOCS / page).read_text(encoding="utf-8")
    assert re.search(r'pip install torch==2\.13\.0 "\.\[docs\]"', text)
    assert not re.search(
        r'(?<!torch==2\.13\.0 )(?<!then )``pip install "\.\[docs\]" &&', text
    )


# --------------------------------------------------------------------------
# The benchmark pages

BENCHMARK_PAGES = [
    "benchmarks.rst",
    *sorted(
        p.relative_to(DOCS).as_posix() for p in (DOCS / "benchmarks").glob("*.rst")
    ),
]
_DIRECTIVE_WITH_PATH = re.compile(r"^\.\. (include|results-excerpt):: (\S+)\s*$")
_OPTION = re.compile(r"^   :([\w-]+):\s*(.*)$")


def _excerpt(text, options, where):
    """What an include or results-excerpt directive with ``options`` shows."""
    lines = text.splitlines(keepends=True)
    text = "".join(
        lines[
            int(options.get("start-line", 0)) : int(options.get("end-line", len(lines)))
        ]
    )
    start = 0
    for name, keep in (("start-after", False), ("after", False), ("from", True)):
        if name in options:
            start = text.find(options[name])
            assert start >= 0, f"{where}: {name} text {options[name]!r} not found"
            start += 0 if keep else len(options[name])
    end = len(text)
    for name in ("end-before", "until"):
        if name in options:
            end = text.find(options[name], start)
            assert end >= 0, f"{where}: {name} text {options[name]!r} not found"
    return text[start:end]


def expanded_page(page):
    """The page's text with its included and excerpted files put in place."""
    path = DOCS / page
    lines = path.read_text(encoding="utf-8").splitlines()
    out, i = [], 0
    while i < len(lines):
        match = _DIRECTIVE_WITH_PATH.match(lines[i])
        i += 1
        if not match:
            out.append(lines[i - 1])
            continue
        options = {}
        while i < len(lines) and _OPTION.match(lines[i]):
            name, value = _OPTION.match(lines[i]).groups()
            options[name] = value
            i += 1
        source = (path.parent / match.group(2)).resolve()
        out += _excerpt(
            source.read_text(encoding="utf-8"), options, f"{page}"
        ).splitlines()
    return "\n".join(out)


def headings(text):
    """Section titles and rubrics of an RST text."""
    lines = text.splitlines()
    titles = [
        lines[i].strip()
        for i in range(len(lines) - 1)
        if lines[i].strip()
        and re.fullmatch(r"([=\-~^\"'`#*+])\1{2,}", lines[i + 1])
        and len(lines[i + 1]) >= len(lines[i].strip())
        and not re.fullmatch(r"[=\- ]+", lines[i])
    ]
    return titles + re.findall(r"^\.\. rubric:: (.+)$", text, flags=re.M)


def test_benchmark_pages_have_unique_headings():
    seen = {}
    for page in BENCHMARK_PAGES:
        for title in headings(expanded_page(page)):
            assert title not in seen, f"{title!r} on {page} and on {seen[title]}"
            seen[title] = page


def test_benchmark_provenance_and_runs_only_in_the_appendix():
    """Revisions, machine lines and per-run rows stay out of the pages' tables
    and headers; the appendix has them."""
    provenance = re.compile(r"\| torch \S+ \||-dirty\b|Runs per machine")
    per_run = re.compile(r"^\S+/\S+/(100|1000|all)/\d+\s", flags=re.M)
    for page in BENCHMARK_PAGES:
        text = expanded_page(page)
        if page.endswith("appendix.rst"):
            assert per_run.search(text) and "results-provenance::" in text
            continue
        assert not provenance.search(text), page
        assert not per_run.search(text), page


def test_benchmark_summary_is_the_first_page_and_short():
    """The few tables a user decides on; the rest on the pages below it."""
    text = expanded_page("benchmarks.rst")
    borders = re.findall(r"^=+(?: +=+)+$", text, flags=re.M)
    assert 0 < len(borders) // 3 <= 3
    toctree = text.split(".. toctree::")[1]
    for page in BENCHMARK_PAGES[1:]:
        assert page.removesuffix(".rst") in toctree


def test_benchmark_appendix_counts_each_training_once(tmp_path, monkeypatch):
    """A run shown in two tables is one training on one machine; a file
    joined from processes says how many ran on each machine."""
    pytest.importorskip("sphinx")
    monkeypatch.syspath_prepend(str(DOCS / "_ext"))
    from benchmark_tables import provenance_rows

    run = {"status": "ok", "device": "GPU A", "git_revision": "0123456789abc-dirty"}
    runs = {
        "t/x/100/0": {**run, "signature": "s0"},
        "u/x/100/0": {**run, "signature": "s0"},  # the same training
        "t/x/100/1": {**run, "signature": "s1", "device": "GPU B"},
        "t/x/100/2": {**run, "signature": "s2", "status": "error"},
    }
    (tmp_path / "a.json").write_text(json.dumps({"meta": {}, "runs": runs}))
    shards = [{"device": "GPU A"}, {"device": "GPU B"}, {"device": "GPU B"}]
    meta = {"device": "processes on GPU B (2), GPU A (1)", "shards": shards}
    (tmp_path / "b.json").write_text(json.dumps({"meta": meta, "runs": {}}))
    rows = provenance_rows(tmp_path)
    assert [row[:2] for row in rows] == [
        ["``a.json``", "GPU A: 1 run; GPU B: 1 run"],
        ["``b.json``", "GPU B: 2 processes; GPU A: 1 process"],
    ]
    assert rows[0][3] == "0123456-dirty"


# --------------------------------------------------------------------------
# The example gallery

EXAMPLES = sorted((ROOT / "examples").glob("plot_*.py"))


def _estimator_calls(path):
    import ast

    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", None) == "SemiSupervisedAssociationClassifier"
    ]


def _prose(path):
    """The docstring and comments of an example: what a reader is told."""
    text = path.read_text(encoding="utf-8")
    docstring = text.split('"""')[1]
    comments = [
        line.strip() for line in text.splitlines() if line.strip().startswith("#")
    ]
    return docstring + "\n".join(comments)


def test_label_count_example_uses_the_defaults():
    calls = _estimator_calls(ROOT / "examples" / "plot_digits_label_count.py")
    assert calls
    for call in calls:
        assert not call.args
        assert [k.arg for k in call.keywords] == ["random_state"]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_says_which_parameters_it_sets(path):
    prose = _prose(path)
    for call in _estimator_calls(path):
        assert not call.args, f"{path.name}: name the parameters it sets"
        for keyword in call.keywords:
            if keyword.arg not in (None, "random_state"):
                assert keyword.arg in prose, f"{path.name} sets {keyword.arg} silently"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_has_a_thumbnail(path):
    """A figure of its own, or a static image where the build may not run it
    (the MNIST example runs only where the MNIST files are)."""
    text = path.read_text(encoding="utf-8")
    static = re.search(
        r"^# sphinx_gallery_thumbnail_path = \"(.+)\"$", text, flags=re.M
    )
    if "mnist" in path.name:
        assert static, f"{path.name} needs a static thumbnail"
    if static:
        assert (DOCS / static.group(1)).is_file()
    assert re.search(r"plt\.subplots|plt\.figure|plot_\w+\(", text)
    number = re.search(r"^# sphinx_gallery_thumbnail_number = (\d+)$", text, flags=re.M)
    if number:
        figures = len(re.findall(r"plt\.subplots|plt\.figure|fig = plot_", text))
        assert int(number.group(1)) <= figures
