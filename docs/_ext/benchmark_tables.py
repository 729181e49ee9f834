"""Directives that put the benchmark results on the benchmark pages.

``.. results-excerpt:: path``
    A part of a table file that a script in ``benchmarks/`` wrote: from the
    text ``:from:`` (kept) or ``:after:`` (left out) up to ``:until:`` (left
    out), so that a page shows one table under a heading of its own. The
    build fails when a text is not found: the generator changed, and the page
    must follow. ``:drop-columns:`` (names separated by commas) leaves out
    the columns of those headers where a table has them: provenance such as
    the machine or the revision belongs in the appendix's table, not in
    every row.
``.. results-provenance::``
    A table of where every results file's runs came from (machines, torch,
    revisions, dates), read from ``benchmarks/results/*.json``, so that the
    table headers need none of it.
"""

import collections
import json
import re
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import directives
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective

#: Device names that say only the kind, not the machine.
_DEVICE_KINDS = {"cpu", "cuda", "mps", None}
#: A short cell of figures ("0.88-0.94", "94.0 (91.9) 8.5s", "23/30", "n/a"):
#: the stylesheet aligns it right and keeps it on one line, while cells of
#: words wrap, so that a wide table fits the page.
_FIGURES = re.compile(r"(?:n/a|[-+0-9.,%()/:;x* ]|(?<=\d)s)+")
_FIGURES_MAX_CHARS = 20


def _drop_columns(node, names):
    """Remove the columns whose header text is in ``names`` from every table."""
    for tgroup in node.findall(nodes.tgroup):
        head = next(iter(tgroup.findall(nodes.thead)), None)
        if head is None:
            continue
        headers = [entry.astext().strip() for entry in head.children[0].children]
        drop = {i for i, header in enumerate(headers) if header in names}
        if not drop:
            continue
        colspecs = [c for c in tgroup.children if isinstance(c, nodes.colspec)]
        for i in sorted(drop, reverse=True):
            tgroup.remove(colspecs[i])
        for row in tgroup.findall(nodes.row):
            for i in sorted(drop, reverse=True):
                row.remove(row.children[i])
        tgroup["cols"] = len(headers) - len(drop)


def _mark_figures(node):
    for entry in node.findall(nodes.entry):
        text = entry.astext().strip()
        if len(text) <= _FIGURES_MAX_CHARS and _FIGURES.fullmatch(text):
            entry["classes"].append("figures")


def _find(text, needle, start, directive, option):
    index = text.find(needle, start)
    if index < 0:
        raise directive.error(f"{option} text {needle!r} not found")
    return index


class ResultsExcerpt(SphinxDirective):
    """Part of a generated results file, parsed as if written in the page."""

    required_arguments = 1
    option_spec = {
        "from": directives.unchanged_required,
        "after": directives.unchanged_required,
        "until": directives.unchanged_required,
        "drop-columns": lambda text: {n.strip() for n in text.split(",") if n.strip()},
    }

    def run(self):
        relative, path = self.env.relfn2path(self.arguments[0])
        self.env.note_dependency(relative)
        text = Path(path).read_text(encoding="utf-8")
        if ("from" in self.options) == ("after" in self.options):
            raise self.error("give exactly one of :from: and :after:")
        if "from" in self.options:
            start = _find(text, self.options["from"], 0, self, ":from:")
        else:
            after = self.options["after"]
            start = _find(text, after, 0, self, ":after:") + len(after)
        end = len(text)
        if "until" in self.options:
            end = _find(text, self.options["until"], start, self, ":until:")
        lines = StringList(text[start:end].splitlines(), source=path)
        container = nodes.container()
        self.state.nested_parse(lines, 0, container)
        _drop_columns(container, self.options.get("drop-columns", set()))
        _mark_figures(container)
        return container.children


def _values(data, key):
    """Every scalar under ``key`` anywhere in ``data``, in order."""
    if isinstance(data, dict):
        for name, value in data.items():
            if name == key and not isinstance(value, (dict, list)):
                yield value
            else:
                yield from _values(value, key)
    elif isinstance(data, list):
        for value in data:
            yield from _values(value, key)


def _machines(data):
    """The machines the runs trained on, most runs first, with run counts."""
    runs = data.get("runs")
    records = runs.values() if isinstance(runs, dict) else runs or []
    descriptions = data.get("machines") or {}
    counts = collections.Counter()
    for record in records:
        machine = record.get("machine") or record.get("device")
        if machine not in _DEVICE_KINDS:
            counts[machine] += 1
    if counts:
        return [
            f"{descriptions.get(name, name)}: {n} runs"
            for name, n in counts.most_common()
        ]
    found = collections.Counter(
        value
        for value in _values(data, "device")
        if value not in _DEVICE_KINDS
        and not str(value).startswith(("runs on", "processes on"))
    )
    return [name for name, _ in found.most_common()]


def _revision(value):
    commit, dirty, _ = str(value).partition("-dirty")
    return commit[:7] + ("-dirty" if dirty else "")


def provenance_rows(results):
    """``[file, machines, torch, revisions, dates]`` of every results JSON."""
    rows = []
    for path in sorted(Path(results).glob("*.json")):
        if ".shard" in path.name:
            continue
        data = json.loads(path.read_text(encoding="utf-8"))
        revisions = dict.fromkeys(
            _revision(v) for v in _values(data, "git_revision") if v not in (None, "?")
        )
        days = sorted({str(v)[:10] for v in _values(data, "date") if v})
        dates = f"{days[0]} to {days[-1]}" if len(days) > 1 else "".join(days)
        rows.append(
            [
                f"``{path.name}``",
                "; ".join(_machines(data)) or "not recorded",
                ", ".join(dict.fromkeys(map(str, _values(data, "torch"))))
                or "not recorded",
                ", ".join(revisions) or "not recorded",
                dates or "not recorded",
            ]
        )
    return rows


class ResultsProvenance(SphinxDirective):
    """A list-table of :func:`provenance_rows`."""

    required_arguments = 1

    def run(self):
        _, folder = self.env.relfn2path(self.arguments[0])
        header = ["Results file", "Machines", "torch", "Revisions", "Dates"]
        lines = [
            ".. list-table::",
            "   :header-rows: 1",
            "   :widths: 20 36 12 18 14",
            "   :class: wrap",
            "",
        ]
        for path in Path(folder).glob("*.json"):
            self.env.note_dependency(str(path))
        for row in [header, *provenance_rows(folder)]:
            lines.append(f"   * - {row[0]}")
            lines += [f"     - {cell}" for cell in row[1:]]
        container = nodes.container()
        self.state.nested_parse(StringList(lines), 0, container)
        return container.children


def setup(app):
    app.add_directive("results-excerpt", ResultsExcerpt)
    app.add_directive("results-provenance", ResultsProvenance)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
