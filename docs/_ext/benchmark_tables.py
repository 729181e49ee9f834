"""Directives that put the benchmark results on the benchmark pages.

``.. results-excerpt:: path``
    A table file that a script in ``benchmarks/`` wrote, whole or a part of
    it: from the text ``:from:`` (kept) or ``:after:`` (left out), else from
    the start, up to ``:until:`` (left out), else to the end, so that a page
    shows one table under a heading of its own. The build fails when the
    file or a text is not found, or the part holds no table: the generator
    changed, and the page must follow.
``.. results-provenance::``
    A table of where every results file's runs came from (machines, torch,
    revisions, dates), read from ``benchmarks/results/*.json``: the
    generators keep all of it out of the table files.
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
    }

    def run(self):
        relative, path = self.env.relfn2path(self.arguments[0])
        self.env.note_dependency(relative)
        if not Path(path).is_file():
            raise self.error(f"{self.arguments[0]} not found")
        text = Path(path).read_text(encoding="utf-8")
        if "from" in self.options and "after" in self.options:
            raise self.error("give one of :from: and :after:, not both")
        start = 0
        if "from" in self.options:
            start = _find(text, self.options["from"], 0, self, ":from:")
        elif "after" in self.options:
            after = self.options["after"]
            start = _find(text, after, 0, self, ":after:") + len(after)
        end = len(text)
        if "until" in self.options:
            end = _find(text, self.options["until"], start, self, ":until:")
        lines = StringList(text[start:end].splitlines(), source=path)
        container = nodes.container()
        self.state.nested_parse(lines, 0, container)
        if not any(container.findall(nodes.table)):
            raise self.error(f"no table in the part of {self.arguments[0]} shown")
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


def _trainings(runs):
    """One record per training: a run that a file shows under several keys
    (a row of two tables) carries one signature and counts once."""
    records = runs.values() if isinstance(runs, dict) else runs or []
    unique = {}
    for index, record in enumerate(records):
        if record.get("status", "ok") == "ok":
            unique.setdefault(record.get("signature") or index, record)
    return unique.values()


def _count(n, one, many):
    return f"{n} {one if n == 1 else many}"


def _machines(data):
    """The machines the runs trained on, most runs first, with run counts
    (or process counts, for a file joined from processes of its own)."""
    descriptions = data.get("machines") or {}
    counts = collections.Counter()
    for record in _trainings(data.get("runs")):
        machine = record.get("machine") or record.get("device")
        if machine not in _DEVICE_KINDS:
            counts[machine] += 1
    if counts:
        return [
            f"{descriptions.get(name, name)}: {_count(n, 'run', 'runs')}"
            for name, n in counts.most_common()
        ]
    shards = (data.get("meta") or {}).get("shards") or []
    processes = collections.Counter(s.get("device") for s in shards)
    if processes and None not in processes:
        return [
            f"{name}: {_count(n, 'process', 'processes')}"
            for name, n in processes.most_common()
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
