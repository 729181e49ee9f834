"""The timing benchmarks and domain adaptation: tables from JSON, smoke runs.

bench_mnist.py and the shared harness have their own file. Every table the
docs include must come back byte for byte from its committed JSON with
``--render-only``; bench_speed.py runs for a few steps on the real MNIST
files when they are there.
"""

import argparse
import importlib
import json
import re
import shlex
import tempfile
import warnings
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.exceptions import ConvergenceWarning
from sklearn.pipeline import make_pipeline
from sklearn.semi_supervised import LabelSpreading

from skassoc import FitReport, SemiSupervisedAssociationClassifier

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
        ("bench_defaults", ["--device=cpu"], "defaults_cpu"),
        ("bench_defaults", ["--device=cuda"], "defaults_cuda"),
        ("bench_search", ["--device=cuda"], "search_cuda"),
        ("bench_halving", ["--device=cpu"], "halving_cpu"),
        ("bench_multi_gpu", ["--device=cuda"], "multi_gpu_cuda"),
        ("bench_multi_gpu_search", ["--device=cuda"], "multi_gpu_search_cuda"),
        *[
            (script, ["--device=cuda", f"--json={RESULTS / table}.json"], table)
            for script, table in [
                ("bench_multi_gpu", "multi_gpu_cuda_x2"),
                ("bench_multi_gpu", "multi_gpu_cuda_x2_plain_ops"),
                ("bench_multi_gpu_search", "multi_gpu_search_cuda_x2"),
                ("bench_multi_gpu_search", "multi_gpu_search_cuda_fit_reports"),
                ("bench_multi_gpu_search", "multi_gpu_search_cuda_one_group"),
            ]
        ],
        ("bench_sparse_memory", [], "sparse_memory_cpu"),
        ("bench_verdict_noise", [], "verdict_noise_cpu"),
        ("bench_label_suggestions", [], "label_suggestions_cpu"),
        (
            "bench_label_suggestions",
            [f"--json={RESULTS / 'label_suggestions_20_draws_cpu.json'}"],
            "label_suggestions_20_draws_cpu",
        ),
        (
            "bench_label_suggestions",
            [f"--json={RESULTS / 'label_suggestions_warm_20_draws_cpu.json'}"],
            "label_suggestions_warm_20_draws_cpu",
        ),
        (
            "bench_label_suggestions",
            [f"--json={RESULTS / 'label_suggestions_warm_cpu.json'}"],
            "label_suggestions_warm_cpu",
        ),
        (
            "bench_label_suggestions",
            [f"--json={RESULTS / 'label_suggestions_warm_8_cpu.json'}"],
            "label_suggestions_warm_8_cpu",
        ),
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


#: Keys of the results files whose values say where and when runs were made.
PROVENANCE_KEYS = {"git_revision", "device", "machine", "torch", "date", "started"}


def _provenance(data):
    """Every machine, revision, torch build and date that ``data`` records."""
    if isinstance(data, list):
        return set().union(*map(_provenance, data))
    if not isinstance(data, dict):
        return set()
    found = set(data.get("machines") or {}) | set((data.get("machines") or {}).values())
    for key, value in data.items():
        if key in PROVENANCE_KEYS and isinstance(value, str):
            found |= {value, value[:7]} if key == "git_revision" else {value}
        else:
            found |= _provenance(value)
    # "cpu" and "cuda" name a kind of device, which a table may name too.
    return found - {"cpu", "cuda", "?", ""}


@pytest.mark.parametrize("table", sorted(RESULTS.glob("*.rst")), ids=lambda p: p.stem)
def test_committed_tables_carry_no_provenance(table):
    """Machines, revisions, torch builds and dates live in the JSON files
    (and the docs' appendix table), never in the tables the pages show."""
    text = table.read_text(encoding="utf-8")
    sources = sorted(RESULTS.glob(f"{table.stem}*.json"))
    assert sources, f"no results file for {table.name}"
    recorded = set().union(*(_provenance(json.loads(p.read_text())) for p in sources))
    assert any(len(value) >= 7 for value in recorded)  # the files do record it
    for value in recorded:
        assert not re.search(rf"(?<![\w-]){re.escape(value)}(?![\w-])", text), value
    for marker in ("-dirty", "| torch", "Runs per machine", "Device:", "Revision"):
        assert marker not in text


def test_render_only_prints_paths_in_the_repository_relative(bench, tmp_path, capsys):
    out = tmp_path / "search.rst"
    bench("bench_search").main(["--device=cuda", "--render-only", f"--table={out}"])
    printed = capsys.readouterr().out
    assert printed.endswith(
        f"results benchmarks/results/search_cuda.json, table {out}\n"
    )
    assert str(ROOT) not in printed
    with pytest.raises(SystemExit, match=r"results benchmarks/results/x_cuda\.json$"):
        bench("bench_search").main(
            ["--render-only", f"--json={RESULTS / 'x_cuda.json'}", f"--table={out}"]
        )


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


def test_bench_defaults_runs_resume_and_merge(bench, tmp_path, capsys):
    """Runs split over processes (one --json each) join into one table."""
    script = bench("bench_defaults")
    common = ["--device=cpu", "--only", "wine", "--labels", "5"]
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    script.main([*common, "--methods", "mlp-labeled", "--draws=2", f"--json={first}"])
    script.main(
        [*common, "--methods", "label-spreading", "--draws=1", "--machine=other"]
        + [f"--json={second}"]
    )
    runs = json.loads(first.read_text())["runs"]
    assert [(r["method"], r["draw"]) for r in runs] == [
        ("mlp-labeled", d) for d in (0, 1)
    ]
    # Resuming runs only the draws the file lacks.
    script.main([*common, "--methods", "mlp-labeled", "--draws=3", f"--json={first}"])
    resumed = json.loads(first.read_text())["runs"]
    assert resumed[:2] == runs and [r["draw"] for r in resumed] == [0, 1, 2]

    merged = tmp_path / "merged.json"
    script.main(
        ["--device=cpu", "--merge", str(first), str(second), str(first)]
        + [f"--json={merged}"]
    )
    results = json.loads(merged.read_text())
    assert len(results["runs"]) == 4
    assert results["machines"].keys() == {resumed[0]["machine"], "other"}
    machines = [r["machine"] for r in results["runs"]]
    assert machines.count("other") == 1 and machines.count(resumed[0]["machine"]) == 3
    # Which machine ran what is the JSON's (and the docs' appendix's).
    table = (tmp_path / "merged.rst").read_text()
    assert "label-spreading" in table and "machine" not in table

    changed = json.loads(second.read_text())
    changed["runs"][0].update(method="mlp-labeled", accuracy=-1.0)
    second.write_text(json.dumps(changed))
    with pytest.raises(ValueError, match="disagree on run"):
        script.main(
            ["--device=cpu", "--merge", str(first), str(second)] + [f"--json={merged}"]
        )
    gpu = tmp_path / "gpu.json"
    gpu.write_text(json.dumps({"device": "cuda", "runs": []}))
    with pytest.raises(ValueError, match="holds runs on cuda, not cpu"):
        script.main(
            ["--device=cpu", "--merge", str(first), str(gpu), f"--json={merged}"]
        )
    capsys.readouterr()
    refused = [
        ["--merge", str(first), f"--json={merged}"],  # no device
        ["--device=cpu", "--merge", str(first)],  # would replace the committed file
        ["--device=cpu", "--merge", str(first), f"--json={merged}", "--render-only"],
    ]
    for argv, message in zip(refused, ["needs --device", "name --json", "leave out"]):
        with pytest.raises(SystemExit):
            script.main(argv)
        assert message in capsys.readouterr().err
    assert len(json.loads(merged.read_text())["runs"]) == 4


def test_bench_defaults_variants_set_their_parameter(bench, monkeypatch):
    script = bench("bench_defaults")
    fitted = []
    monkeypatch.setattr(
        script.SemiSupervisedAssociationClassifier,
        "fit",
        lambda model, X, y: fitted.append(model.get_params()) or model,
    )
    X, y = np.zeros((4, 2)), np.array([0, 0, 0, 1])
    y_semi = np.array([0, -1, -1, 1])
    for method in ("skassoc", *script.VARIANTS):
        script.fit_method(method, X, y_semi, "cpu", 3, None, y)
    default, given_prior, no_visit = fitted
    assert default["visit_weight"] == 1 and default["class_prior"] == "auto"
    np.testing.assert_allclose(given_prior["class_prior"], [0.75, 0.25])
    assert no_visit["visit_weight"] == 0 and no_visit["class_prior"] == "auto"
    assert {p["random_state"] for p in fitted} == {3}


def test_bench_defaults_table_names_the_rows_skassoc_loses(bench):
    script = bench("bench_defaults")

    def runs(dataset, method, accuracies):
        return [
            dict(dataset=dataset, labels=5, method=method, draw=draw, accuracy=a)
            | dict(fit_seconds=1.0, machine="m")
            for draw, a in enumerate(accuracies)
        ]

    results = [
        *runs("wine", "skassoc", [0.90, 0.80, 0.70]),
        *runs("wine", "label-spreading", [0.95, 0.85, 0.70]),  # ahead: 0/1/2
        *runs("pendigits", "skassoc", [0.9, 0.7, 0.8]),
        *runs("pendigits", "self-training-lr", [0.8, 0.95, 0.85]),  # by draw: 1/0/2
        *runs("digits", "skassoc", [0.9, 0.9, 0.9]),
        *runs("digits", "label-spreading", [0.90001, 0.8, 1.0]),  # a tie as shown
        *runs("breast-cancer", "skassoc", [0.9, 0.9]),
        *runs("breast-cancer", "mlp-labeled", [0.8, 0.8]),
    ]
    table = script.render(results, "cpu")
    behind = table.split("level and behind:")[1]
    assert "\ndigits " not in behind and "breast" not in behind
    assert re.search(r"\nwine +5 +label-spreading +85.0 +80.0 +0 / 1 / 2\n", behind)
    assert re.search(
        r"\npendigits +5 +self-training-lr +85.0 +80.0 +1 / 0 / 2\n", behind
    )
    assert "over 3 label draws" in table
    assert (
        "other counts of draws: mlp-labeled, breast-cancer, 5 labels/class: 2" in table
    )
    # The best median of a row is bold, and equal medians as shown are both bold.
    lines = {line.split()[0]: line for line in table.splitlines() if "(" in line}
    assert lines["digits"].count("**90.0 (") == 2
    assert "**85.0 (70.0)" in lines["wine"] and "**80.0" not in lines["wine"]
    assert script.render([], "cpu")  # an empty file renders, no crash


@pytest.mark.parametrize(
    "script, argv",
    [
        ("bench_mnist", ["--train-subset", "-5"]),
        ("bench_mnist", ["--train-subset", "60001"]),
        ("bench_mnist", ["--eval-subset", "-10"]),
        ("bench_mnist", ["--eval-subset", "10001"]),
        ("bench_mnist", ["--draws", "30000000"]),
        ("bench_mnist", ["--draws", "3e7"]),
        ("bench_mnist", ["--max-iter", "0"]),
        ("bench_domain_adaptation", ["--source-size", "0"]),
        ("bench_domain_adaptation", ["--draws", "1001"]),
        ("bench_defaults", ["--labels", "5", "0"]),
        # Draws 1000 and up are those LabelSpreading is tuned on.
        ("bench_defaults", ["--draws", "1001"]),
        ("bench_scale", ["--seed", "-1"]),
        ("bench_scale", ["--search-steps", "0"]),
        ("bench_scale", ["--unlabeled-sizes", "100", "-1"]),
        # The step time is the difference to a 3-step fit.
        ("bench_scale", ["--batch-steps", "3"]),
        ("bench_scale", ["--pool-size", "0"]),
        ("bench_scale", ["--memmap-steps", "0"]),
        ("bench_search", ["--steps", "0"]),
        ("bench_search", ["--seed", str(2**32)]),
        ("bench_search", ["--train-subset", "-5"]),
        ("bench_speed", ["--steps", "0"]),
        ("bench_speed", ["--warmup-steps", "0"]),
        ("bench_speed", ["--seed", "-1"]),
        ("bench_speed", ["--accuracy-steps", "100,-1"]),
        ("bench_speed", ["--predict-rows", "0"]),
        ("bench_speed", ["--eval-rows", "-10"]),
    ],
)
def test_numeric_options_out_of_range_are_usage_errors(bench, capsys, script, argv):
    with pytest.raises(SystemExit):
        bench(script).parse_args(["--device=cpu", *argv])
    err = capsys.readouterr().err
    assert f"argument {argv[0]}: takes an integer" in err
    bad = argv[-1].split(",")[-1]
    assert f"not {bad}\n" in err or f"not {bad!r}\n" in err


def test_bench_defaults_keeps_one_device_a_file(bench, tmp_path, capsys):
    script = bench("bench_defaults")
    path = tmp_path / "defaults_cuda.json"
    run = dict(dataset="wine", labels=5, method="mlp-labeled", draw=0)
    run.update(accuracy=0.9, fit_seconds=1.0, machine="gpu-host")
    path.write_text(json.dumps({"device": "cuda", "runs": [run], "machines": {}}))
    before = path.read_bytes()
    # Resuming on a CPU would relabel the GPU runs as CPU ones.
    resume = ["--only", "wine", "--labels", "5", "--methods", "mlp-labeled"]
    for argv in ([*resume, "--draws=1"], ["--render-only"]):
        with pytest.raises(SystemExit, match="holds runs on cuda, not cpu"):
            script.main(["--device=cpu", *argv, f"--json={path}"])
    assert path.read_bytes() == before
    assert not (tmp_path / "defaults_cuda.rst").exists()
    # Rendered without --device: the file's device titles the table.
    script.main(["--render-only", f"--json={path}"])
    table = (tmp_path / "defaults_cuda.rst").read_text()
    assert "Default parameters on one GPU" in table
    assert "--device cuda" in table
    capsys.readouterr()


@pytest.mark.parametrize(
    "content, problem",
    [
        (None, "it does not exist"),
        ("{not json", "cannot be read as JSON"),
        ("[]", "not a JSON object"),
        ('{"runs": {}}', '"runs" is not a list of runs'),
        ('{"runs": [{"dataset": "wine"}]}', '"runs" is not a list of runs'),
        ('{"runs": [], "device": 3}', '"device" is not a string'),
    ],
)
def test_bench_defaults_merge_names_a_malformed_file(
    bench, tmp_path, capsys, content, problem
):
    bad = tmp_path / "bad.json"
    if content is not None:
        bad.write_text(content)
    out = tmp_path / "merged.json"
    argv = ["--device=cpu", "--merge", str(bad), f"--json={out}"]
    with pytest.raises(SystemExit, match=problem) as raised:
        bench("bench_defaults").main(argv)
    assert str(bad) in str(raised.value)
    assert not out.exists()


@pytest.fixture
def tiny_skassoc(bench, monkeypatch):
    """bench_defaults with a tiny skassoc network, fitted for a few steps."""
    script = bench("bench_defaults")
    tiny = partial(script.SemiSupervisedAssociationClassifier, max_iter=5, **TINY)
    monkeypatch.setattr(script, "SemiSupervisedAssociationClassifier", tiny)
    return script


def test_bench_defaults_prints_only_its_table_and_keeps_no_files(
    tiny_skassoc, tmp_path, monkeypatch, capsys, torch_single_thread
):
    """README's first command: one plain table on stdout, nothing on stderr,
    no warning, and no file left in the working folder or the repository."""
    script = tiny_skassoc
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    repository = {p.name for p in ROOT.iterdir()}
    results_before = {p.name for p in RESULTS.iterdir()}
    methods = ["skassoc-labeled", "label-spreading", "mlp-labeled"]
    argv = ["--device=cpu", "--only", "digits", "--labels", "3", "--draws", "2"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = script.main([*argv, "--methods", *methods, "--no-save"])
    out, err = capsys.readouterr()
    assert [str(w.message) for w in caught] == [] and err == ""
    assert out == script.summary(results["runs"], methods) + "\n"
    lines = out.splitlines()
    assert lines[0].split("  ")[0] == "data set" and set(lines[1]) == {"-", " "}
    assert [line.split()[:3] for line in lines[2:]] == [
        ["digits", "3", method] for method in methods
    ]
    assert len({len(line) for line in lines}) == 1  # aligned columns
    for markup in ("**", "``", ".. ", "{", "Runs per machine"):
        assert markup not in out
    assert not any(work.iterdir()) and not any(scratch.glob("skassoc-bench-*"))
    assert {p.name for p in ROOT.iterdir()} == repository
    assert {p.name for p in RESULTS.iterdir()} == results_before


def test_bench_defaults_verbose_and_resumed_runs(
    bench, tmp_path, capsys, torch_single_thread
):
    """-v reports each run on stderr; the table shows the runs asked for,
    not every run of the file."""
    script = bench("bench_defaults")
    path = tmp_path / "runs" / "wine.json"
    argv = ["--device=cpu", "--only", "wine", "--labels", "3"]
    argv += ["--methods", "mlp-labeled", f"--json={path}"]
    results = script.main([*argv, "--draws=2", "-v"])
    out, err = capsys.readouterr()
    assert err.splitlines() == [
        script.progress_line(run) for run in results["runs"]
    ] + [f"results {path}, table {path.with_suffix('.rst')}"]
    assert out == script.summary(results["runs"]) + "\n"
    assert path.with_suffix(".rst").is_file()
    script.main([*argv, "--draws=1"])  # resumed: nothing to fit
    out, err = capsys.readouterr()
    assert err == "" and out == script.summary(results["runs"][:1]) + "\n"
    median, worst = out.splitlines()[2].split()[3:5]
    assert median == worst == f"{100 * results['runs'][0]['accuracy']:.1f}"


@pytest.mark.parametrize(
    "argv", [["--json=r.json"], ["--table=r.rst"], ["--render-only"]]
)
def test_bench_defaults_no_save_refuses_file_options(bench, capsys, argv):
    with pytest.raises(SystemExit):
        bench("bench_defaults").parse_args(["--device=cpu", "--no-save", *argv])
    assert "--no-save runs in a temporary folder" in capsys.readouterr().err


def test_bench_defaults_only_refuses_unknown_data_sets(bench, capsys):
    with pytest.raises(SystemExit):
        bench("bench_defaults").parse_args(["--device=cpu", "--only", "digit"])
    assert "invalid choice: 'digit'" in capsys.readouterr().err


@pytest.mark.parametrize("page", ["README.rst", "docs/getting_started.rst"])
def test_the_first_command_of_the_docs_writes_no_file_in_the_checkout(bench, page):
    line = next(
        line
        for line in (ROOT / page).read_text().splitlines()
        if "benchmarks/bench_defaults.py" in line
    )
    argv = shlex.split(line.split("benchmarks/bench_defaults.py", 1)[1])
    args = bench("bench_defaults").parse_args(argv)
    assert args.no_save or not Path(args.json).resolve().is_relative_to(ROOT)


def test_label_spreading_baseline_is_quiet_where_no_label_reaches(bench):
    """A test sample among unlabeled neighbours only: LabelSpreading's NaN
    probabilities and first class, without the warning of 0/0."""
    script = bench("bench_defaults")
    X = np.array([[0.0], [0.1], [1.0], [1.1], [50.0], [50.1], [50.2]])
    y = np.array([0, 0, 1, 1, -1, -1, -1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = script.QuietLabelSpreading(kernel="knn", n_neighbors=2).fit(X, y)
        proba = model.predict_proba([[50.05], [0.05]])
        predicted = model.predict([[50.05]])
    assert np.isnan(proba[0]).all() and np.isfinite(proba[1]).all()
    assert predicted.tolist() == [model.classes_[0]]


def test_label_spreading_baseline_fits_and_scores_without_warnings(bench):
    """The grid point that neither converges in max_iter nor reaches every
    test sample, on digits: the same accuracy as LabelSpreading's, quietly."""
    script = bench("bench_defaults")
    X, X_test, y, y_test = script.load("digits", "cpu")
    y_semi = script.draw_labels(y, 5, 0)
    grid_point = {"n_neighbors": 5, "alpha": 0.8}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = script.fit_method("label-spreading", X, y_semi, "cpu", 0, grid_point, y)
        accuracy = model.score(X_test, y_test)
    spreading = model[-1]
    assert spreading.n_iter_ == spreading.max_iter  # did not converge
    assert np.isnan(model.predict_proba(X_test)).any()  # unreached samples
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = make_pipeline(*model[:-1], LabelSpreading(**spreading.get_params()))
        assert plain.fit(X, y_semi).score(X_test, y_test) == accuracy


def test_bench_defaults_hides_only_the_labeled_baselines_warning(bench, monkeypatch):
    """skassoc-labeled fits without unlabeled samples on purpose; any other
    warning of a fit still shows."""
    script = bench("bench_defaults")

    def fit(model, X, y):
        message = "y holds no unlabeled samples (no label is -1)"
        warnings.warn(message, UserWarning, stacklevel=2)
        warnings.warn("something else went wrong", UserWarning, stacklevel=2)
        return model

    monkeypatch.setattr(script.SemiSupervisedAssociationClassifier, "fit", fit)
    X, y_semi = np.zeros((4, 2)), np.array([0, -1, -1, 1])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        script.fit_method("skassoc-labeled", X, y_semi, "cpu", 0, None, y_semi)
    assert [str(w.message) for w in caught] == ["something else went wrong"]


def test_bench_verdict_noise_counts_each_rows_flagged_fits(
    bench, tmp_path, monkeypatch, capsys
):
    script = bench("bench_verdict_noise")
    # The small rows only; one with random labels.
    monkeypatch.setattr(script, "CASES", ((10, 100, None), (10, 500, 50)))
    out = tmp_path / "noise.json"
    script.main(["--trials", "40", f"--json={out}"])
    results = json.loads(out.read_text())
    assert [(r["classes"], r["labels"]) for r in results["rows"]] == [
        (10, None),
        (10, 50),
    ]
    keys = ("verdict", "normal", "failed_verdict", "failed_normal")
    assert all(0 <= r[key] <= 40 for r in results["rows"] for key in keys)
    # The random labels' under-counted classes trip the normal score often.
    assert results["rows"][1]["normal"] > results["rows"][1]["verdict"]
    table = out.with_suffix(".rst").read_text()
    assert "50 random labels" in table and "--trials 40" in table
    capsys.readouterr()


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


def test_bench_multi_gpu_search_smoke(
    bench, tmp_path, capsys, torch_single_thread, monkeypatch
):
    """The four searches of one run, the Dask ones on two CPU worker
    processes, train the same fits: the same scores and best candidate."""
    pytest.importorskip("distributed")
    from sklearn.datasets import load_digits

    script = bench("bench_multi_gpu_search")
    digits = load_digits()
    images = (digits.images * 15).astype(np.uint8)
    monkeypatch.setattr(script, "load_train", lambda home: (images, digits.target))
    recipe, fast = script.recipe_params, {**TINY, "learning_rate": 0.03}
    monkeypatch.setattr(script, "recipe_params", lambda name: recipe(name) | fast)
    out = tmp_path / "search.json"
    script.main(
        ["--device=cpu", "--workers=2", "--steps=6", "--train-subset=300"]
        + [f"--json={out}"]
    )
    runs = json.loads(out.read_text())["runs"]
    assert list(runs) == [key for key, _, _ in script.SEARCHES]
    assert json.loads(out.read_text())["worker_devices"] == [["", 0], ["", 0]]
    first = runs["grid, one"]
    assert first["speedup"] == 1.0
    assert len(set(first["mean_test_scores"])) > 1  # the candidates differ
    for run in runs.values():
        assert run["seconds"] > 0 and run["best_params"] == first["best_params"]
        # CPU fits of one random_state: the same scores wherever they ran.
        np.testing.assert_allclose(run["mean_test_scores"], first["mean_test_scores"])
    assert runs["stacked, dask"]["workers_used"] in (1, 2)
    assert (tmp_path / "search.rst").read_text().count("Dask, 2 CPU workers") == 2
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


def test_trust_table_keeps_the_held_out_draws_apart(bench):
    """Draws the verdict was not set on get a row of their own."""
    trust = bench("bench_trust")

    def run(draw, error, ratio):
        scores = dict.fromkeys(trust.SCORES, ratio)
        scores.update(class_share_ratio=ratio, class_share_z=10.0)
        shares = [0.1, ratio / 10, 0.1]
        report = {"scores": scores, "predicted_shares": shares}
        report["expected_shares"] = [0.1] * 3
        record = {"recipe": "consistency", "draw": draw, "test_error_percent": error}
        return {**record, "fit_report": report}

    held_out = trust.HELD_OUT_FROM["consistency"]
    runs = [run(0, 0.5, 1.05), run(1, 2.0, 1.15)]
    runs += [run(held_out + 5, 0.5, 1.12), run(held_out + 6, 2.0, 1.16)]
    rows = trust.diagnosis_rows(runs, failing_above=1.5)
    label = f"consistency, held out (draws {held_out + 5}-{held_out + 6})"
    assert [row[:4] for row in rows] == [
        ["consistency", "2", "1 / 1", "0 / 1"],
        [label, "2", "1 / 1", "1 / 1"],
    ]
    # Flagged runs blame class 1, whose share is above the others'.
    assert [row[:3] for row in trust.score_rows(runs, failing_above=1.5)] == [
        ["consistency", "1: 1", "none"],
        [label, "1: 1", "1: 1"],
    ]
    # An excess class the inputs side with clears the verdict, not the
    # "shares alone" columns; the walks' score no longer clears anything.
    scores = runs[1]["fit_report"]["scores"]
    scores["excess_class_low_visit"] = -0.02
    assert trust.diagnosis_rows(runs, failing_above=1.5)[0][2:4] == ["1 / 1", "0 / 1"]
    scores["excess_class_input_disagreement"] = -0.1
    rows = trust.diagnosis_rows(runs, failing_above=1.5)
    assert [row[2:6] for row in rows] == [
        ["0 / 1", "0 / 1", "1 / 1", "0 / 1"],
        ["1 / 1", "1 / 1", "1 / 1", "1 / 1"],
    ]
    # A file's own held-out line moves the draws between the rows.
    rows = trust.diagnosis_rows(runs, 1.5, {"consistency": held_out + 6})
    assert [row[:2] for row in rows] == [
        ["consistency", "3"],
        [f"consistency, held out (draws {held_out + 6})", "1"],
    ]
    # Reports made before the inputs' score keep the verdict of their time:
    # the walks' score below -0.01 cleared an excess.
    for r in runs:
        del r["fit_report"]["scores"]["excess_class_input_disagreement"]
    assert trust.diagnosis_rows(runs, failing_above=1.5)[0][2:4] == ["0 / 1", "0 / 1"]
    # Without either score (older reports still), those columns are left out.
    for r in runs:
        del r["fit_report"]["scores"]["excess_class_low_visit"]
    assert len(trust.diagnosis_rows(runs, failing_above=1.5)[0]) == len(rows[0]) - 2
    assert len(trust.score_rows(runs, failing_above=1.5)[0]) == 3 + 4  # AUCs


def test_trust_table_spans_runs_of_draws_as_the_command_line_reads_them(bench):
    trust = bench("bench_trust")
    draws = [30, 33, 36, *range(40, 60), 7, 7]
    assert trust.draw_spans(draws) == "7, 30, 33, 36, 40-59"
    assert trust.parse_draws(trust.draw_spans(draws).replace(" ", "")) == sorted(
        set(draws)
    )


@pytest.mark.parametrize(
    "name",
    [
        "trust_cuda",
        "trust_verdict_cuda",
        "trust_refits_cuda",
        "trust_inputs_cuda",
        "trust_warm_cuda",
        "trust_warm_held_out_cuda",
        "trust_warm_verdicts_cuda",
        "trust_warm_new_draws_cuda",
    ],
)
def test_trust_tables_are_rendered_from_their_files(bench, name):
    trust = bench("bench_trust")
    committed = json.loads((RESULTS / f"{name}.json").read_text())
    table = trust.render(committed, trust.FAILING_ABOVE)
    assert table == (RESULTS / f"{name}.rst").read_text()


def test_trust_refits_new_and_warm_each_start_where_they_should(bench, monkeypatch):
    """A new refit builds a new estimator; a warm one continues the draw's
    own fit (each strategy's from the same one), recorded under its own
    name, and the table lists it after the new refits."""
    trust = bench("bench_trust")
    starts, fitted = [], []

    def fit_one(params, X, y_semi, X_test, y_test, start_from=None):
        starts.append((int((y_semi != -1).sum()), start_from))
        report = argparse.Namespace(
            to_dict=lambda: {"verdict": "suspect"}, verdict="suspect"
        )
        fitted.append(argparse.Namespace(fit_report_=report))
        if start_from is not None:
            warnings.warn("collapsed", ConvergenceWarning, stacklevel=2)
        return fitted[-1], 0.0, 2.0 if len(fitted) == 1 else 0.5

    monkeypatch.setattr(trust, "fit_one", fit_one)

    def pick(strategy, clf, X, y_semi, seed):
        unlabeled = np.flatnonzero(y_semi == -1)
        return unlabeled[:1] if strategy == "association" else unlabeled[1:2]

    monkeypatch.setattr(trust, "pick", pick)
    y = np.repeat(np.arange(10), 11)
    data = (np.zeros((110, 4)), y), (np.zeros((5, 4)), y[:5])
    args = argparse.Namespace(
        strategies=["association", "random"],
        refits=["new", "warm"],
        failing_above=1.5,
        suggest_all=False,
        max_iter=None,
    )
    run = trust.run_draw(("fast", 0), data, "cpu", args)
    # 100 labels, then 101: a new refit and a warm one from the first fit,
    # for each strategy.
    the_fit = fitted[0]
    assert starts == [(100, None)] + [(101, None), (101, the_fit)] * 2
    assert list(run["refits"]) == [
        "association",
        "association, warm start",
        "random",
        "random, warm start",
    ]
    # Each refit's verdict and the warnings fit gave it are kept.
    assert [r["warnings"] for r in run["refits"].values()] == [
        [],
        ["ConvergenceWarning"],
    ] * 2
    assert {r["verdict"] for r in run["refits"].values()} == {"suspect"}
    rows = trust.suggestion_rows([run])
    assert [row[1] for row in rows] == [
        "none (the fit)",
        "association",
        "random",
        "association, warm start",
        "random, warm start",
        "association, warm start; a new fit if suspect (1 new)",
        "random, warm start; a new fit if suspect (1 new)",
    ]
    # The warm starts were suspect: the loop's rows hold the new fits' errors.
    assert [row[3] for row in rows[-2:]] == ["0.50"] * 2


def test_the_recommended_refit_is_the_warm_start_unless_it_is_suspect(bench):
    trust = bench("bench_trust")

    def refits(verdict):
        warm = {"test_error_percent": 90.0, "verdict": verdict}
        return {
            "association": {"test_error_percent": 0.9},
            "association, warm start": warm,
        }

    assert (
        trust.recommended_refit(refits("ok"), "association")["test_error_percent"]
        == 90.0
    )
    assert (
        trust.recommended_refit(refits("suspect"), "association")["test_error_percent"]
        == 0.9
    )
    # Runs made before verdicts were recorded, or without both refits: none.
    older = refits("ok")
    del older["association, warm start"]["verdict"]
    assert trust.recommended_refit(older, "association") is None
    assert trust.recommended_refit(refits("ok"), "random") is None


def test_the_pooled_warm_start_table_is_rendered_from_its_files(bench, tmp_path):
    trust = bench("bench_trust")
    committed = json.loads((RESULTS / "trust_warm_pooled.json").read_text())
    sources = [str(ROOT / path) for path in committed["meta"]["sources"]]
    out = tmp_path / "pooled.json"
    trust.pool(sources, out)
    assert json.loads(out.read_text())["rows"] == committed["rows"]
    # The same table, but for the file it is written to.
    pooled = out.with_suffix(".rst").read_text()
    committed_table = (RESULTS / "trust_warm_pooled.rst").read_text()
    assert pooled == committed_table.replace(
        "benchmarks/results/trust_warm_pooled.json", str(out)
    )


def test_pooling_refuses_what_it_cannot_pool_or_would_overwrite(
    bench, tmp_path, capsys
):
    trust = bench("bench_trust")
    warm = str(RESULTS / "trust_warm_cuda.json")

    def refused(*argv):
        with pytest.raises(SystemExit):
            trust.main(list(argv))
        return capsys.readouterr().err

    assert "needs --json" in refused("--pool", warm)
    assert "one of the pooled files" in refused("--pool", warm, "--json", warm)
    runs = str(RESULTS / "trust_cuda.json")
    assert "holds runs" in refused("--pool", warm, "--json", runs)
    # Another script's results, a file without refitted draws.
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"runs": {"wine/0": {"dataset": "wine"}}}))
    with pytest.raises(SystemExit, match="no runs of bench_trust"):
        trust.pool([str(other)], tmp_path / "out.json")
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"runs": {}}))
    with pytest.raises(SystemExit, match="no file of"):
        trust.pool([str(empty)], tmp_path / "none.json")
    # A pooled table holds no runs to render: it is made again with --pool.
    pooled = str(RESULTS / "trust_warm_pooled.json")
    assert "pooled table" in refused("--render-only", "--json", pooled)


def _tiny_two_class_fit():
    """A 3-step fit of 60 random rows, 6 of them labeled: the fit, its
    parameters, X, the true labels and the training labels."""
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(60, 5)).astype(np.float32), np.repeat([0, 1], 30)
    y_semi = np.where(np.arange(60) % 10 == 0, y, -1)
    params = {**TINY, "max_iter": 3, "device": "cpu", "random_state": 0}
    fit = SemiSupervisedAssociationClassifier(**params).fit(X, y_semi)
    return fit, params, X, y, y_semi


def test_trust_warm_refit_leaves_the_fit_it_starts_from_as_it_was(bench):
    trust = bench("bench_trust")
    fit, params, X, y, y_semi = _tiny_two_class_fit()
    before = [p.detach().clone() for p in fit.model_.parameters()]
    y_more = y_semi.copy()
    y_more[1] = y[1]
    refit, _, error = trust.fit_one(params, X, y_more, X, y, start_from=fit)
    assert refit is not fit and refit.warm_start and not fit.warm_start
    assert refit.n_iter_ == 3 and 0 <= error <= 100
    assert all(
        torch.equal(a, b.detach())
        for a, b in zip(before, fit.model_.parameters(), strict=True)
    )
    # The refit started from the fit's weights, not new ones.
    new, _, _ = trust.fit_one(params, X, y_more, X, y)
    assert not torch.equal(
        next(refit.model_.parameters()), next(new.model_.parameters())
    )


def test_trust_inputs_replay_scores_a_handed_over_region_as_fit_would(bench):
    script = bench("bench_trust_inputs")
    committed = json.loads((RESULTS / "trust_inputs_replay.json").read_text())
    assert script.render(committed) == (RESULTS / "trust_inputs_replay.rst").read_text()
    # Three groups of inputs; the fit hands 40 samples of group 1 to class 0.
    rng = np.random.default_rng(0)
    y = np.repeat([0, 1, 2], 100)
    X = (5 * np.eye(3)[y] + 0.3 * rng.standard_normal((300, 3))).astype(np.float32)
    predicted = y.copy()
    predicted[100:140] = 0
    shares = (np.bincount(predicted) / 300).tolist()
    report = {
        "verdict": "suspect",
        "predicted_shares": shares,
        "expected_shares": [1 / 3] * 3,
        "scores": {"class_share_ratio": 1.4, "class_share_z": 10.0},
    }
    run = script._replayed("fast", 0, {"err": 2.0, "report": report}, predicted, X, y)
    assert run["shares_alone"] and run["verdict"] and run["verdict_at_fit"]
    # 40 of class 0's 140 predictions lie among group 1's labels.
    assert run["score"] == pytest.approx(40 / 140, abs=0.05)


def test_trust_seeds_table_counts_the_failed_fits_of_each_draw(bench):
    script = bench("bench_trust_seeds")
    committed = json.loads((RESULTS / "trust_seeds_cuda.json").read_text())
    assert script.render(committed) == (RESULTS / "trust_seeds_cuda.rst").read_text()

    def fit(draw, seed, error, verdict):
        record = {"draw": draw, "seed": seed, "test_error_percent": error}
        return record | {"verdict": verdict, "class_share_ratio": 1.1}

    fits = [fit(10, 2010, 0.9, "ok"), fit(10, 1010, 0.8, "ok")]
    fits += [fit(2, 1002, 2.1, "suspect"), fit(2, 2002, 0.7, "ok")]
    results = {
        "meta": {"commands": ["cmd"], "device": "a GPU"},
        "runs": {f"{f['draw']}/{f['seed']}": f for f in fits},
    }
    rows = [line for line in script.render(results).splitlines() if line[:1].isdigit()]
    assert [row.split()[0] for row in rows] == ["2", "10"]  # by draw, as numbers
    assert "1 / 2" in rows[0] and "0 / 2" in rows[1]
    assert "0.80, 0.90" in rows[1]  # by seed


def test_trust_seeds_fits_each_draw_with_its_seeds(bench, monkeypatch):
    script = bench("bench_trust_seeds")
    seen = []

    def fit_one(params, X, y_semi, X_test, y_test):
        seen.append((params["random_state"], int((y_semi != -1).sum())))
        scores = {"class_share_ratio": 1.2}
        clf = type("Fit", (), {"fit_report_": FitReport("suspect", scores=scores)})
        return clf, 0.1, 2.0

    monkeypatch.setattr(script, "fit_one", fit_one)
    y = np.repeat(np.arange(3), 12)
    data = (np.zeros((36, 4)), y), (None, None)
    fits = script.run_draw(5, 2, data, "cpu")
    assert seen == [(1005, 30), (2005, 30)]  # 10 labels a class, seeds 1000 k + d
    assert [f["seed"] for f in fits] == [1005, 2005]
    assert {f["draw"] for f in fits} == {5} and fits[0]["verdict"] == "suspect"


def test_trust_seeds_resumes_by_seed_and_keeps_the_note(bench, monkeypatch, tmp_path):
    script = bench("bench_trust_seeds")
    monkeypatch.setattr(script.h, "RESULTS_DIR", tmp_path)
    monkeypatch.setattr(script.h, "load_mnist_sets", lambda home: None)
    first = {"draw": 2, "seed": 1002, "test_error_percent": 2.0, "verdict": "ok"}
    first["class_share_ratio"] = 1.1
    meta = {"commands": ["first"], "runs_note": "made by hand", "device": "x"}
    path = tmp_path / "trust_seeds_cpu.json"
    path.write_text(json.dumps({"runs": {"2/1002": first}, "meta": meta}))
    asked = []

    def run_draw(draw, seeds, data, device):
        asked.append((draw, list(seeds)))
        return [{**first, "seed": 1000 * k + draw, "draw": draw} for k in seeds]

    monkeypatch.setattr(script, "run_draw", run_draw)
    script.main(["--device=cpu", "--draws=2,5", "--seeds=2"])
    assert asked == [(2, [2]), (5, [1, 2])]
    results = json.loads(path.read_text())
    assert sorted(results["runs"]) == ["2/1002", "2/2002", "5/1005", "5/2005"]
    assert results["meta"]["runs_note"] == "made by hand"
    assert results["meta"]["commands"] == [
        "first",
        "python benchmarks/bench_trust_seeds.py --device=cpu --draws=2,5 --seeds=2",
    ]
    with pytest.raises(SystemExit):
        script.main(["--device=cuda", "--render-only"])  # no file for cuda here


def test_multi_gpu_accuracy_table_names_the_draws_that_warned(bench):
    script = bench("bench_multi_gpu")

    def fits(warnings):
        return [
            {"draw": d, "test_error_percent": 1.0, "fit_seconds": 2.0} | w
            for d, w in enumerate(warnings)
        ]

    section = {
        "environment": {"device_type": "cuda"},
        "recipe": "fast",
        "params": {"max_iter": 10, "labeled_per_class": 10},
        "draws": 2,
        "labels_per_class": 10,
        "test_images": 100,
        "runs": {
            "1": {
                "fits": fits(
                    [{"warnings": [], "step_ms": 1.5}, {"warnings": [], "step_ms": 2.5}]
                )
            },
            "2": {
                "fits": fits([{"warnings": []}, {"warnings": ["ConvergenceWarning"]}])
            },
            "4": {"fits": fits([{}, {}])},  # recorded before warnings were
        },
    }
    section["params"]["unlabeled_batch_size"] = 100
    lines = script.accuracy_table({"accuracy": section}).splitlines()
    rows = {line.split()[0]: line for line in lines if line[:1].isdigit()}
    assert rows["1"].endswith("none")
    assert rows["2"].endswith("1 (ConvergenceWarning)")
    assert rows["4"].endswith("not recorded")
    # The steps' median time, where the fits recorded it.
    assert rows["1"].split()[-2] == "2.00" and rows["4"].split()[-3] == "n/a"


def test_multi_gpu_accuracy_rerun_keeps_the_earlier_runs_marked(
    bench, tmp_path, monkeypatch
):
    script = bench("bench_multi_gpu")

    def section(errors, max_iter=10):
        fits = [
            {"draw": d, "test_error_percent": e, "fit_seconds": 1.0, "warnings": []}
            for d, e in enumerate(errors)
        ]
        return {
            "environment": {"device_type": "cpu"},
            "recipe": "fast",
            "params": {
                "max_iter": max_iter,
                "labeled_per_class": 10,
                "unlabeled_batch_size": 100,
            },
            "draws": len(errors),
            "labels_per_class": 10,
            "test_images": 100,
            "runs": {"1": {"fits": fits}, "2": {"fits": fits}},
        }

    path = tmp_path / "multi_gpu_cpu.json"
    path.write_text(json.dumps({"accuracy": section([1.0, 89.68])}))
    fresh = iter([section([1.0, 2.0, 3.0]), section([4.0], max_iter=20)])
    monkeypatch.setattr(
        script, "measure_accuracy", lambda args, counts, save: save(next(fresh))
    )
    argv = ["--device=cpu", "--only=accuracy", "--gpus=1,2", f"--json={path}"]
    results = script.measure(script.parse_args(argv))
    assert [r["draws"] for r in results["earlier_accuracy"]] == [2]
    assert results["accuracy"]["draws"] == 3
    table = script.accuracy_table(results)
    assert "1.00, 89.68" in table and "2, earlier run 1" in table
    assert "with the same settings" in table
    path.write_text(json.dumps(results))
    results = script.measure(script.parse_args(argv))
    assert [r["draws"] for r in results["earlier_accuracy"]] == [2, 3]
    table = script.accuracy_table(results)
    assert "with other settings" in table and "1, earlier run 2" in table
    # Settings outside the parameters count too (--eval-subset's test images).
    results["earlier_accuracy"] = [section([1.0])]
    results["accuracy"] = section([4.0])
    assert "with the same settings" in script.accuracy_table(results)
    results["accuracy"]["test_images"] = 50
    assert "with other settings" in script.accuracy_table(results)


def test_multi_gpu_accuracy_stopped_midway_keeps_what_it_measured(
    bench, tmp_path, monkeypatch
):
    script = bench("bench_multi_gpu")
    fits = {"fits": [{"draw": 0, "test_error_percent": 1.0, "fit_seconds": 1.0}]}
    path = tmp_path / "multi_gpu_cpu.json"
    path.write_text(json.dumps({"accuracy": {"draws": 7, "runs": {"4": fits}}}))

    def spawn(worker, world, *args):
        if world > 1:
            raise KeyboardInterrupt  # as a run stopped at its time limit
        return fits

    monkeypatch.setattr(script, "_spawn", spawn)
    monkeypatch.setattr(script, "load_sets", lambda args: [np.zeros((3, 1))] * 4)
    argv = ["--device=cpu", "--only=accuracy", "--gpus=1,2", f"--json={path}"]
    with pytest.raises(KeyboardInterrupt):
        script.measure(script.parse_args(argv))
    saved = json.loads(path.read_text())
    assert saved["accuracy"]["runs"] == {"1": fits}
    assert [run["draws"] for run in saved["earlier_accuracy"]] == [7]


def test_multi_gpu_throughput_hands_over_every_case_as_it_ends(bench, monkeypatch):
    script = bench("bench_multi_gpu")
    # No GPU needed: the cases' runs are faked, the section's frame kept.
    monkeypatch.setattr(script.h, "resolve_device", lambda name: "cpu")
    monkeypatch.setattr(script.h, "environment", lambda device: {})
    monkeypatch.setattr(script.h, "resolved_precision", lambda *a, **k: "bf16")
    first_case, second_case = list(script.CASES)[:2]

    def run_case(args, case, world):
        if case == second_case and world > 1:
            raise KeyboardInterrupt  # as a run stopped at its time limit
        return {"steps": 10, "seconds": 1.0, "samples_per_s": 100.0 * world}

    monkeypatch.setattr(script, "run_case", run_case)
    saved = []
    args = script.parse_args(["--gpus=1,2"])
    with pytest.raises(KeyboardInterrupt):
        script.measure_throughput(args, [1, 2], lambda s: saved.append(json.dumps(s)))
    # The first case, whole, was handed over before the second stopped.
    [section] = [json.loads(s) for s in saved]
    assert list(section["cases"]) == [first_case]
    assert section["cases"][first_case]["2"]["speedup"] == 2.0


@pytest.mark.parametrize("verdict", ["ok", "suspect"])
def test_label_suggestions_warm_refit_continues_the_fit_unless_suspect(
    bench, monkeypatch, verdict
):
    """The user guide's loop: a copy of the fit continued with the new
    labels (the fit itself untouched), a new fit where that copy's report
    is suspect."""
    script = bench("bench_label_suggestions")
    fit, params, X, y, y_semi = _tiny_two_class_fit()
    new_fits = []
    monkeypatch.setattr(
        script, "fit_default", lambda X, y_more, draw: new_fits.append(draw) or "new"
    )
    report = argparse.Namespace(verdict=verdict)
    monkeypatch.setattr(
        SemiSupervisedAssociationClassifier,
        "fit_report_",
        property(lambda self: report),
        raising=False,
    )
    y_more = y_semi.copy()
    y_more[1] = y[1]
    refit, anew = script.refit_default(fit, X, y_more, 7, warm=True)
    if verdict == "ok":
        assert not anew and refit is not fit and refit.warm_start
        assert refit.n_iter_ == 3 and not fit.warm_start
        assert not new_fits
    else:
        assert anew and refit == "new" and new_fits == [7]
    # Without warm, always a new fit.
    assert script.refit_default(fit, X, y_more, 7, warm=False) == ("new", True)


class InProcessPool:
    """bench_label_suggestions' process pool, without processes: the fakes a
    test monkeypatches into the module stay in effect."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def map(self, work, jobs):
        return map(work, jobs)


def test_label_suggestions_warm_start_runs_record_their_refit(
    bench, tmp_path, monkeypatch
):
    script = bench("bench_label_suggestions")

    fitted = argparse.Namespace(
        score=lambda X, y: 0.9, fit_report_=argparse.Namespace(verdict="ok")
    )
    asked = []

    def refit_default(clf, X, y_more, draw, warm):
        asked.append(warm)
        return fitted, draw == 1

    y = np.array([0, 1, 0, 1])
    monkeypatch.setattr(script, "_pool", lambda jobs: InProcessPool())
    monkeypatch.setattr(script, "_first_level", lambda name: 5)
    monkeypatch.setattr(
        script,
        "_draw_data",
        lambda n, d: (None, None, y, y, np.array([0, 1, -1, -1]), 5),
    )
    monkeypatch.setattr(script, "fit_default", lambda X, y_semi, draw: fitted)
    monkeypatch.setattr(script, "pick", lambda s, clf, X, y_semi, n, draw: [2, 3])
    monkeypatch.setattr(script, "refit_default", refit_default)
    path = tmp_path / "ls.json"
    script.main(["--warm-start", "--draws=2", "--only", "wine", f"--json={path}"])
    results = json.loads(path.read_text())
    assert asked == [True] * 4
    assert results["meta"]["refit"] == script.h.LOOP_REFIT
    assert [r["refits"]["random"]["new_fit"] for r in results["runs"].values()] == [
        False,
        True,
    ]
    assert "2 of 4 refits did" in path.with_suffix(".rst").read_text()


@pytest.mark.parametrize(
    "held, argv", [(None, ["--warm-start"]), ("warm start; a new fit if suspect", [])]
)
def test_label_suggestions_refuses_to_mix_refits_in_one_file(
    bench, tmp_path, capsys, held, argv
):
    """A file without a refit kind holds new fits (made before the kinds)."""
    script = bench("bench_label_suggestions")
    path = tmp_path / "ls.json"
    run = {"dataset": "wine", "labels": 5, "draw": 0, "accuracy": 0.9, "refits": {}}
    meta = {"commands": []} if held is None else {"commands": [], "refit": held}
    path.write_text(json.dumps({"runs": {"wine/0": run}, "meta": meta}))
    with pytest.raises(SystemExit):
        script.main([*argv, "--only", "wine", f"--json={path}"])
    assert "holds refits of another kind" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        script.main(["--warm-start", "--seed-noise", f"--json={path}"])
    assert "takes no --warm-start" in capsys.readouterr().err


def test_label_suggestions_seed_noise_keeps_its_own_machine_and_table(
    bench, tmp_path, monkeypatch
):
    script = bench("bench_label_suggestions")

    fits = []

    class Fitted:
        def __init__(self, seed):
            self.seed = seed

        def score(self, X, y):
            return 0.9 + 0.01 * (self.seed // 1000) * (self.seed % 1000 + 1)

    def fit_default(X, y_semi, seed):
        fits.append((y_semi.tolist(), seed))
        return Fitted(seed)

    def draw_data(name, draw):
        y_semi = np.array([draw, -1, -1])
        return None, None, None, None, y_semi, 5

    run = {"dataset": "wine", "labels": 5, "draw": 0, "accuracy": 0.9}
    run["refits"] = {
        s: {"accuracy": 0.9 + g, "picked_classes": 2}
        for s, g in [("association", 0.03), ("random", 0.01)]
    }
    meta = {"device": "the strategies' machine", "commands": ["first", "first"]}
    path = tmp_path / "label_suggestions_cpu.json"
    path.write_text(json.dumps({"runs": {"wine/0": run}, "meta": meta}))
    monkeypatch.setattr(script, "_pool", lambda jobs: InProcessPool())
    monkeypatch.setattr(script, "fit_default", fit_default)
    monkeypatch.setattr(script, "_draw_data", draw_data)
    monkeypatch.setattr(script, "_first_level", lambda name: 5)
    argv = ["--seed-noise", "--draws=3", "--only", "wine", "breast-cancer"]
    script.main([*argv, f"--json={path}"])
    # Each draw: its own labels, fitted with seeds d and d + 1000.
    assert fits[:2] == [([0, -1, -1], 0), ([0, -1, -1], 1000)]
    assert fits[4:6] == [([2, -1, -1], 2), ([2, -1, -1], 1002)]
    results = json.loads(path.read_text())
    assert results["meta"] == meta  # the strategies' runs keep their machine
    section = results["seed_noise"]
    assert len(section["runs"]) == 6
    assert section["meta"]["device_type"] == "cpu"
    command = " ".join(["python", script.SCRIPT, *argv, f"--json={path}"])
    assert section["meta"]["commands"] == [command]  # the argv given
    rows = {row[0]: row for row in script.seed_noise_rows(results)}
    # Changes of 1, 2 and 3 points: median 2, largest 3; the strategies'
    # difference (3 - 1 points) where the first table has the set, and the
    # seed-0 fit's accuracy is the first table's first fit's.
    assert rows["wine"] == ["wine", "3", "2.0", "3.0", "2.0", "1 / 1"]
    assert rows["breast-cancer"][-2:] == ["none", "0 / 0"]
    table = path.with_suffix(".rst").read_text()
    assert "the same labels, another seed" in table
    assert "``first`` on a CPU" in table  # a repeated command, once
    script.main([*argv, f"--json={path}"])  # nothing left to run
    assert json.loads(path.read_text()) == results

    # A file of seed-noise fits alone renders their table alone.
    del results["runs"], results["meta"]
    path.write_text(json.dumps(results | {"runs": {}}))
    script.main(["--render-only", f"--json={path}"])
    table = path.with_suffix(".rst").read_text()
    assert table.lstrip().startswith(".. rubric:: Defaults suite: the same labels")


def test_extended_meta_keeps_notes_and_title_and_renews_the_rest(bench):
    import torch

    harness = bench("_harness")
    old = {"date": "then", "commands": ["a"], "x_note": "n", "title": "T", "seed": 3}
    meta = harness.extended_meta(old, torch.device("cpu"), "b")
    assert meta["commands"] == ["a", "b"]
    assert meta["x_note"] == "n" and meta["title"] == "T"
    assert "seed" not in meta and meta["date"] != "then"


def test_trust_render_only_without_its_file_says_so(bench, tmp_path, capsys):
    trust = bench("bench_trust")
    missing = tmp_path / "trust_cuda.json"
    with pytest.raises(SystemExit):
        trust.main(["--render-only", f"--json={missing}"])
    assert "--render-only needs" in capsys.readouterr().err
    assert not missing.with_suffix(".rst").exists()


@pytest.mark.parametrize(
    "script, results, option, key",
    [
        ("bench_trust", "trust_warm_cuda", "--refit-title", "refit_title"),
        (
            "bench_label_suggestions",
            "label_suggestions_20_draws_cpu",
            "--title",
            "title",
        ),
    ],
)
def test_a_title_given_to_a_render_is_kept_in_the_file(
    bench, tmp_path, capsys, script, results, option, key
):
    """Two files on one page need headings of their own: the title goes to
    the file's meta, and later renders (without it) keep it."""
    path = tmp_path / f"{results}.json"
    path.write_bytes((RESULTS / f"{results}.json").read_bytes())
    module = bench(script)
    original = json.loads(path.read_text())
    module.main(["--render-only", f"--json={path}", option, "A title of its own"])
    original["meta"][key] = "A title of its own"
    assert json.loads(path.read_text()) == original  # the title, nothing else
    before = path.read_bytes()
    module.main(["--render-only", f"--json={path}"])
    assert path.read_bytes() == before
    assert ".. rubric:: A title of its own\n" in path.with_suffix(".rst").read_text()
    capsys.readouterr()


def test_titles_are_written_at_once_whatever_runs_after(bench, tmp_path):
    """A run that finds nothing left to run still keeps the title it was
    given; a title left out changes nothing."""
    harness = bench("_harness")
    path = tmp_path / "results.json"
    results = {"runs": {"a/0": {}}, "meta": {"commands": ["c"]}}
    harness.keep_titles(path, results, {"title": None})
    assert not path.exists()
    harness.keep_titles(path, results, {"title": "T", "refit_title": None})
    assert json.loads(path.read_text()) == {
        "runs": {"a/0": {}},
        "meta": {"commands": ["c"], "title": "T"},
    }


def test_trust_prior_table_reproduces_the_committed_one(bench):
    script = bench("bench_trust_prior")
    committed = json.loads((RESULTS / "trust_prior_cuda.json").read_text())
    assert script.render(committed) == (RESULTS / "trust_prior_cuda.rst").read_text()


def test_trust_prior_cut_moves_the_blamed_class_surplus_to_the_others(bench):
    script = bench("bench_trust_prior")
    report = FitReport(
        "suspect",
        predicted_shares={0: 0.5, 1: 0.3, 2: 0.2},
        expected_shares={0: 0.4, 1: 0.3, 2: 0.3},
    )
    prior = script.cut_prior(report)
    # Class 0 exceeds its share by 0.1: cut to 0.4, the 0.1 shared 3 : 2.
    np.testing.assert_allclose(prior, [0.4, 0.36, 0.24])


def _prior_run(draw, error, verdict, refits=None):
    return {
        "draw": draw,
        "test_error_percent": error,
        "verdict": verdict,
        "refits": refits or {},
    }


def test_trust_prior_recipe_rows_take_the_refit_of_each_suspect_draw(bench):
    script = bench("bench_trust_prior")
    plan = "labels x2, new"
    mended = {plan: {"test_error_percent": 0.9, "verdict": "ok"}}
    runs = {f"{d}/{plan}": _prior_run(d, 0.8, "ok") for d in range(180, 200)}
    runs[f"185/{plan}"] = _prior_run(185, 2.1, "suspect", mended)
    # A second block, refitted with --refit-all: its "ok" fit stays.
    runs[f"200/{plan}"] = _prior_run(200, 1.3, "ok", {plan: mended[plan]})
    # A rerun of suspect draws alone is no row of the recipe, nor are
    # draws with a gap.
    for draw in (181, 187):
        runs[f"{draw}/labels x4, new"] = _prior_run(draw, 2.0, "suspect", {})
    runs["184/labels x4, new"] = _prior_run(184, 2.0, "suspect", {})
    for draw in (220, 222):
        runs[f"{draw}/truth, new"] = _prior_run(draw, 0.7, "ok")
    rows = script.recipe_rows({"runs": runs})
    assert [row[:3] for row in rows] == [
        [plan, "180-199", "1 / 1"],
        [plan, "200", "0 / 0"],
        [plan, "180-200", "1 / 1"],
    ]
    # The draw's refit (0.9) replaced its failed fit (2.1): worst 0.9.
    assert rows[0][3:] == ["0.80", "0.90", "0 / 20"]
    assert rows[2][3:] == ["0.80", "1.30", "1 / 21"]
    assert "0.90" in script.render({"runs": runs})  # no meta: no commands yet


def test_trust_prior_estimates(bench):
    script = bench("bench_trust_prior")
    fit = type("Fit", (), {"classes_": np.arange(3)})()
    fit.fit_report_ = FitReport(
        "suspect",
        predicted_shares={0: 0.6, 1: 0.4, 2: 0.0},  # class 2 collapsed away
        expected_shares=dict.fromkeys(range(3), 1 / 3),
    )
    y = np.array([0, 0, 0, 1, 2])
    np.testing.assert_allclose(script.prior_of("truth", fit, y), [0.6, 0.2, 0.2])
    assert script.prior_of("labels", fit, y) == "uniform"
    shares = script.prior_of("shares", fit, y)
    assert shares.min() > 0 and np.isclose(shares.sum(), 1)
    with pytest.raises(ValueError, match="'trth'"):
        script.prior_of("trth", fit, y)


def test_trust_prior_refits_suspect_fits_only_with_each_plans_settings(
    bench, monkeypatch
):
    script = bench("bench_trust_prior")
    made = []

    class Fake:
        def __init__(self, **params):
            self.params = params
            made.append(params)

        def fit(self, X, y):
            self.classes_ = np.arange(3)
            suspect = self.params.get("balance_weight", 0) == 0
            shares = {0: 0.5, 1: 0.3, 2: 0.2}
            self.fit_report_ = FitReport(
                "suspect" if suspect else "ok",
                predicted_shares=shares,
                expected_shares=dict.fromkeys(range(3), 1 / 3),
            )
            return self

        def predict(self, X):
            return np.zeros(len(X), int)

    monkeypatch.setattr("skassoc.SemiSupervisedAssociationClassifier", Fake)
    y = np.repeat(np.arange(3), [30, 12, 12])  # unequal: "truth" is not "labels"
    data = (np.zeros((54, 4)), y), (np.zeros((3, 4)), np.array([0, 1, 2]))
    args = argparse.Namespace(
        max_iter=None, refit_all=False, plans=["labels x2, new", "truth, new"]
    )
    run = script.run_draw(4, data, "cpu", args)
    assert run["verdict"] == "suspect" and sorted(run["refits"]) == args.plans
    assert [p.get("balance_weight") for p in made] == [None, 10.0, 5.0]
    assert made[1]["class_prior"] == "uniform"
    np.testing.assert_allclose(made[2]["class_prior"], [30 / 54, 12 / 54, 12 / 54])
    assert {p["random_state"] for p in made} == {4}
    made.clear()
    monkeypatch.setattr(Fake, "fit", lambda self, X, y: _ok_fit(self))
    assert script.run_draw(4, data, "cpu", args)["refits"] == {}
    assert len(made) == 1  # an "ok" fit is not refitted


def _ok_fit(clf):
    clf.classes_ = np.arange(3)
    clf.fit_report_ = FitReport("ok", predicted_shares=dict.fromkeys(range(3), 1 / 3))
    return clf


def test_results_record_each_argument_as_a_shell_reads_it(bench, tmp_path):
    h = bench("_harness")
    results = {"runs": {}}
    argv = ["--plans", "labels x2, new", "--draws", "2,3"]
    cpu = torch.device("cpu")
    h.save_results(tmp_path / "r.json", results, "bench_x.py", argv, cpu)
    command = results["meta"]["commands"][-1]
    assert shlex.split(command)[2:] == argv
    assert command.endswith("bench_x.py --plans 'labels x2, new' --draws 2,3")


def test_trust_prior_inputs_moves_the_surplus_where_the_inputs_point(
    bench, monkeypatch
):
    script = bench("bench_trust_prior")
    fit = type("Fit", (), {"classes_": np.arange(3)})()
    fit.fit_report_ = FitReport(
        "suspect",
        predicted_shares={0: 0.5, 1: 0.3, 2: 0.2},
        expected_shares=dict.fromkeys(range(3), 1 / 3),
    )
    fit.predict = lambda X: np.zeros(len(X), int)  # every sample in class 0
    # The inputs give class 0's predictions to class 2 (and 0): all its
    # surplus goes to 2, none to 1.
    spread = lambda features, labeled, y, unlabeled, seed: unlabeled % 2 * 2  # noqa: E731
    monkeypatch.setattr("skassoc._input_view.spread_labels", spread)
    y_semi = np.array([0, 1, 2] + [-1] * 10)
    prior = script.inputs_prior(fit, np.zeros((13, 2)), y_semi, seed=0)
    np.testing.assert_allclose(prior, [1 / 3, 0.3, 0.2 + 0.5 - 1 / 3])
    monkeypatch.setattr("skassoc._input_view.spread_labels", lambda *a: None)
    np.testing.assert_allclose(
        script.inputs_prior(fit, np.zeros((13, 2)), y_semi, seed=0),
        script.cut_prior(fit.fit_report_),
    )


def _by_key(name):
    return json.loads((RESULTS / f"{name}.json").read_text())["runs"]


def _same_first_fits(loop, new, dataset=None):
    runs = [(k, r) for k, r in _by_key(loop).items() if dataset in (None, r["dataset"])]
    first = _by_key(new)
    return sum(r["accuracy"] == first[k]["accuracy"] for k, r in runs), len(runs)


def _continued_against_new(loop, new, dataset):
    """Draws where the loop's suggested refit ended above, level, below the
    new fit's, on ``dataset``."""
    first = _by_key(new)
    signs = [
        np.sign(
            r["refits"]["association"]["accuracy"]
            - first[k]["refits"]["association"]["accuracy"]
        )
        for k, r in _by_key(loop).items()
        if r["dataset"] == dataset
    ]
    return [signs.count(s) for s in (1, 0, -1)]


def test_trust_page_comparisons_of_two_results_files_hold():
    """The trust page compares the loop's refits with the new fits of other
    files; its counts are read from those files."""
    page = (ROOT / "docs/benchmarks/trust.rst").read_text()
    text = " ".join(page.split())
    warm, warm_20 = "label_suggestions_warm_cpu", "label_suggestions_warm_20_draws_cpu"
    new, new_20 = "label_suggestions_cpu", "label_suggestions_20_draws_cpu"
    assert _same_first_fits(warm, new) == (69, 70)
    assert "69 of the 70 first fits equal" in text
    assert _same_first_fits("label_suggestions_warm_8_cpu", new) == (40, 80)
    for dataset in ("mnist", "synthetic-digits"):
        assert _same_first_fits("label_suggestions_warm_8_cpu", new, dataset)[0] == 0
    assert (
        "40 of the 80 first fits equal the first table's, "
        "none on mnist and synthetic-digits" in text
    )
    assert _continued_against_new(warm_20, new_20, "optdigits-8x8")[0] == 17
    assert _continued_against_new(warm_20, new_20, "semeion-16x16")[2] == 13
    assert (
        "ahead on 17 of the 20 draws of optdigits-8x8 and behind on 13 of the 20"
        in text
    )
    assert _continued_against_new(warm, new, "winequality-red")[2] == 9
    assert "behind on 9 of the 10 of winequality-red" in text


def test_trust_page_weight_20_refits_all_end_above_weight_10():
    """The trust page: every refit at balance weight 20 ended above the
    one at 10 of the same draw."""
    x2, x4 = {}, {}
    for run in _by_key("trust_prior_cuda").values():
        for plan, errors in (("labels x2, new", x2), ("labels x4, new", x4)):
            if plan in run["refits"]:
                errors.setdefault(run["draw"], []).append(
                    run["refits"][plan]["test_error_percent"]
                )
    pairs = [(a, b) for d in x2.keys() & x4.keys() for a in x2[d] for b in x4[d]]
    assert len(pairs) >= 16 and all(b > a for a, b in pairs)
    page = (ROOT / "docs/benchmarks/trust.rst").read_text()
    assert "At 20 every refit ended above the one at 10 on the same draw." in " ".join(
        page.split()
    )
