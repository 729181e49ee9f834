"""bench_halving.py: the committed table from its JSON, and a short run."""

import importlib
import json
import re
from pathlib import Path

import pytest

import skassoc._engine._step

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


@pytest.fixture
def script(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    return importlib.import_module("bench_halving")


def test_render_only_reproduces_the_committed_table(script, tmp_path, capsys):
    out = tmp_path / "table.rst"
    json_before = {p: p.read_bytes() for p in RESULTS.glob("*.json")}
    script.main(["--render-only", f"--table={out}"])
    assert out.read_bytes() == (RESULTS / "halving_cpu.rst").read_bytes()
    assert {p: p.read_bytes() for p in RESULTS.glob("*.json")} == json_before
    capsys.readouterr()


def _expected_steps(record, folds):
    """Steps of a search that retrains each round, and of one that continues."""
    rounds = list(zip(record["n_candidates"], record["n_resources"], strict=True))
    retrained = folds * sum(n * steps for n, steps in rounds)
    previous = [0, *record["n_resources"][:-1]]
    added = [n * (steps - before) for (n, steps), before in zip(rounds, previous)]
    return retrained, folds * sum(added)


def test_a_short_run_counts_the_steps_each_search_trains(
    script, tmp_path, monkeypatch, capsys, torch_single_thread
):
    monkeypatch.setattr(script, "GRID", {"visit_weight": [0.5, 1.0, 2.0]})
    step = skassoc._engine._step.AssociationStep
    original = step.__call__
    path = tmp_path / "halving.json"
    argv = ["--device=cpu", "--min-steps=2", "--max-steps=6", "--factor=3"]
    script.main([*argv, "--decay-steps=4", f"--json={path}"])
    assert step.__call__ is original
    result = json.loads(path.read_text())
    retrained, continued = (result["searches"][k] for k in ("retrained", "continued"))
    assert retrained["n_resources"] == continued["n_resources"] == [2, 6]
    assert retrained["n_candidates"] == [3, 1]
    assert (retrained["steps"], continued["steps"]) == _expected_steps(retrained, 2)
    assert continued["best_params"] == retrained["best_params"]
    assert continued["cv_results"] == retrained["cv_results"]
    assert result["params"]["lr_decay_steps"] == 4
    assert result["environment"]["torch_threads"] == 1
    table = path.with_suffix(".rst").read_text()
    assert "rounds of 2, 6 steps" in table and '``lr_decay_steps="auto"``' in table
    assert re.search(rf"\ncontinued \(RunStore\) +{continued['steps']} ", table)
    capsys.readouterr()


def test_the_step_counter_is_removed_when_the_search_fails(script):
    step = skassoc._engine._step.AssociationStep
    original = step.__call__
    with pytest.raises(RuntimeError), script.counted_steps() as taken:
        assert step.__call__ is not original
        raise RuntimeError
    assert step.__call__ is original and taken == []


@pytest.mark.parametrize(
    "argv",
    [
        ["--min-steps", "0"],
        ["--max-steps", "-1"],
        ["--factor", "1"],
        ["--folds", "1"],
        ["--decay-steps", "0"],
        ["--labeled-per-class", "175"],
        ["--seed", str(2**32)],
    ],
)
def test_numeric_options_out_of_range_are_usage_errors(script, capsys, argv):
    with pytest.raises(SystemExit):
        script.parse_args(["--device=cpu", *argv])
    assert f"argument {argv[0]}: takes an integer" in capsys.readouterr().err


def test_the_first_round_may_not_exceed_the_last(script, capsys):
    with pytest.raises(SystemExit):
        script.parse_args(["--min-steps=50", "--max-steps=40"])
    assert "--min-steps must not exceed --max-steps" in capsys.readouterr().err


def test_the_committed_table_is_valid_restructuredtext():
    """A name such as ``n_resources_`` left bare is a reference to nowhere."""
    core = pytest.importorskip("docutils.core")
    text = (RESULTS / "halving_cpu.rst").read_text(encoding="utf-8")
    settings = {"report_level": 2, "halt_level": 2, "warning_stream": False}
    tree = core.publish_doctree(text, settings_overrides=settings)
    assert len(list(tree.findall(lambda node: node.tagname == "table"))) == 1
