"""The timing benchmarks and domain adaptation: tables from JSON, smoke runs.

bench_mnist.py and the shared harness have their own file. Every table the
docs include must come back byte for byte from its committed JSON with
``--render-only``; bench_speed.py runs for a few steps on the real MNIST
files when they are there; bench_concurrency.py needs a GPU, so only its
refusal without one and its skassoc fits (on the CPU) are tested here.
"""

import importlib
import json
import threading
from pathlib import Path

import numpy as np
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
        ("bench_concurrency", [], "concurrency_cuda"),
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


def test_bench_concurrency_needs_a_gpu(bench, monkeypatch, tmp_path):
    script = bench("bench_concurrency")
    monkeypatch.setattr(script.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="needs a GPU"):
        script.main(["--steps", "1", f"--json={tmp_path / 'c.json'}"])
    args = script.parse_args(["--streams", "8", "2", "8", "--precisions", "bf16"])
    assert args.streams == [2, 8] and args.precisions == ["bf16"]
    assert args.json.endswith("concurrency_cuda.json")


def test_bench_concurrency_skassoc_fits_in_threads(
    bench, torch_single_thread, monkeypatch
):
    # Part (d) on the CPU: the same fits, one after another and in threads.
    script = bench("bench_concurrency")
    fits = []
    fit = script.SemiSupervisedAssociationClassifier.fit

    def recording_fit(self, X, y):
        fits.append((threading.get_ident(), self.max_iter, self.random_state))
        return fit(self, X, y)

    monkeypatch.setattr(
        script.SemiSupervisedAssociationClassifier, "fit", recording_fit
    )
    recipe = script.recipe_params
    monkeypatch.setattr(script, "recipe_params", lambda name: recipe(name) | TINY)
    args = script.parse_args(
        ["--streams", "2", "--fit-steps", "2", "--pool-size", "200"]
    )
    X, y = script.synthetic_images(args.pool_size)
    assert X.shape == (200, 28, 28) and X.dtype == np.uint8
    assert np.bincount(y[y != -1]).tolist() == [10] * 10
    serial, threads = script.measure_fits("fp32", args, "cpu")
    assert (serial["fits"], threads["fits"]) == (1, 2)
    assert threads["serial_s"] == pytest.approx(2 * serial["serial_s"])
    assert threads["ms_per_step"] == pytest.approx(threads["threads_s"] / 4 * 1e3)
    # A warm-up fit, two fits one after another, then two in threads.
    main = threading.get_ident()
    assert [(t == main, n, s) for t, n, s in fits[:3]] == [
        (True, 2, 0),
        (True, 2, 0),
        (True, 2, 1),
    ]
    assert sorted(s for _, _, s in fits[3:]) == [0, 1]
    assert len({t for t, _, _ in fits[3:]} - {main}) == 2


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
