"""The timing benchmarks and domain adaptation: tables from JSON, smoke runs.

bench_mnist.py and the shared harness have their own file. Every table the
docs include must come back byte for byte from its committed JSON with
``--render-only``; bench_speed.py runs for a few steps on the real MNIST
files when they are there.
"""

import importlib
import json
from pathlib import Path

import pytest

from skassoc import SemiSupervisedAssociationClassifier

#: A tiny network for the smoke runs: what is tested is the scripts' flow.
TINY = {"network": "mlp", "hidden_layer_sizes": (8,), "embedding_dim": 4}

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
MNIST_DIR = ROOT.parent / "shared" / "data" / "mnist"


@pytest.fixture
def bench(monkeypatch):
    """Import a benchmark module by name."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    return importlib.import_module


@pytest.mark.parametrize(
    "script, args, table",
    [
        ("bench_speed", ["--device=cuda"], "speed_cuda"),
        ("bench_speed", ["--device=cpu"], "speed_cpu"),
        ("bench_scale", ["--device=cuda"], "scale_cuda"),
        ("bench_domain_adaptation", ["--device=cuda"], "domain_adaptation_cuda"),
    ],
)
def test_render_only_reproduces_the_committed_table(
    bench, tmp_path, capsys, script, args, table
):
    out = tmp_path / "table.rst"
    json_before = {p: p.read_bytes() for p in RESULTS.glob("*.json")}
    bench(script).main([*args, "--render-only", f"--table={out}"])
    assert out.read_bytes() == (RESULTS / f"{table}.rst").read_bytes()
    assert {p: p.read_bytes() for p in RESULTS.glob("*.json")} == json_before
    capsys.readouterr()


def test_domain_adaptation_cases_would_resume_the_committed_runs(bench):
    da, harness = bench("bench_domain_adaptation"), bench("_harness")
    args = harness.parse(harness.make_parser("x", "domain_adaptation"), [])
    rows, jobs = harness.plan(da.CASES, args, "cuda", {"source_size": 60_000})
    committed = json.loads((RESULTS / "domain_adaptation_cuda.json").read_text())
    assert rows == committed["rows"]
    runs = committed["runs"]
    assert {k for job in jobs.values() for k in job["keys"]} == set(runs)
    for signature, job in jobs.items():
        assert all(runs[key]["signature"] == signature for key in job["keys"])
    known = set(SemiSupervisedAssociationClassifier().get_params())
    assert all(set(case.params) <= known for case in da.CASES)


def test_bench_scale_refuses_too_few_batch_steps(bench, capsys):
    with pytest.raises(SystemExit):
        bench("bench_scale").main(["--batch-steps", "3", "--render-only"])
    assert "--batch-steps must be more than 3" in capsys.readouterr().err


def test_bench_speed_smoke(bench, tmp_path, capsys, torch_single_thread, monkeypatch):
    if not (MNIST_DIR / "train-images-idx3-ubyte.gz").is_file():
        pytest.skip(f"real MNIST files not found in {MNIST_DIR}")
    out = tmp_path / "speed_cpu.json"
    script = bench("bench_speed")
    requested = []
    recipe = script.recipe_params

    def tiny_recipe(name):
        requested.append(name)
        return recipe(name) | TINY

    monkeypatch.setattr(script, "recipe_params", tiny_recipe)
    script.main(
        [
            "--device=cpu",
            f"--data-home={MNIST_DIR}",
            "--steps=3",
            "--warmup-steps=2",
            "--predict-rows=200",
            "--eval-rows=100",
            "--accuracy-steps=3",
            "--accuracy-recipe=improved",
            f"--json={out}",
        ]
    )
    # (b) fits the paper's recipe, (c) the recipe asked for.
    assert set(requested[:-1]) == {"paper"} and requested[-1] == "improved"
    results = json.loads(out.read_text())
    assert results["training"]["skassoc"]["steps_per_s"] > 0
    assert sorted(results["predict"]["runs"]) == ["test_100", "tiled_200"]
    assert results["meta"]["steps"] == 3 and results["meta"]["source_digest"]
    assert results["time_to_accuracy"]["recipe"] == "improved"
    assert [fit["max_iter"] for fit in results["time_to_accuracy"]["fits"]] == [3]
    # The table beside the JSON: one row per speed_cpu*.json file there.
    table = (tmp_path / "speed_cpu.rst").read_text()
    assert "speed_cpu.json" in table and '"improved" 3:' in table
    capsys.readouterr()


def test_source_digest_follows_the_files(bench, tmp_path):
    harness = bench("_harness")
    for folder in ("skassoc", "benchmarks"):
        (tmp_path / folder).mkdir()
    (tmp_path / "skassoc" / "a.py").write_text("x = 1\n")
    (tmp_path / "benchmarks" / "b.py").write_text("y = 2\n")
    first = harness.source_digest(tmp_path)
    (tmp_path / "skassoc" / "a.py").write_text("x = 2\n")
    assert harness.source_digest(tmp_path) != first
    # Only Python sources count: result files may change freely.
    (tmp_path / "skassoc" / "a.py").write_text("x = 1\n")
    (tmp_path / "benchmarks" / "results.json").write_text("{}")
    assert harness.source_digest(tmp_path) == first
    assert harness.resolve_device("cpu").type == "cpu"
    with pytest.raises(SystemExit, match="is not a device"):
        harness.resolve_device("tpu-ish")


def test_the_readme_table_is_the_rendered_one(monkeypatch):
    """README.rst's results table is generated, never typed by hand."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import readme_table

    block = readme_table.readme_block((ROOT / "README.rst").read_text())
    assert block is not None, "README.rst lost its results-table markers"
    assert block.strip() == readme_table.render().strip()
