"""benchmarks/_harness.py and bench_mnist.py: cases, runs, resume, tables."""

import importlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

from skassoc import SemiSupervisedAssociationClassifier, recipe_params

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
MNIST_DIR = ROOT.parent / "shared" / "data" / "mnist"


@pytest.fixture
def bench(monkeypatch):
    """Import a benchmark module by name."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    return importlib.import_module


@pytest.fixture
def mnist_dir():
    if not (MNIST_DIR / "train-images-idx3-ubyte.gz").is_file():
        pytest.skip(f"real MNIST files not found in {MNIST_DIR}")
    return MNIST_DIR


# ------------------------------------------------------- the harness alone


class Blobs:
    """Data of the tiny harness runs: 4-feature blobs, 5 labels per class."""

    def __init__(self, args):
        from sklearn.datasets import make_blobs

        X, y = make_blobs(150, n_features=4, centers=3, random_state=0)
        self.X, self.y, self.X_test, self.y_test = X[:120], y[:120], X[120:], y[120:]
        self.meta = {"n_eval": 30}


FAST = {
    "network": "mlp",
    "hidden_layer_sizes": (8,),
    "embedding_dim": 4,
    "labeled_per_class": 3,
    "unlabeled_batch_size": 16,
    "max_iter": 5,
    "learning_rate": 1e-2,
}


def _tiny(bench, calls):
    harness = bench("_harness")
    from skassoc.datasets import make_semi_supervised_labels

    def fit(config, data, device):
        calls.append(config["params"]["random_state"])
        y = make_semi_supervised_labels(data.y, 5, random_state=config["label_seed"])
        test = data.X_test, data.y_test
        return harness.fit_estimator(config["params"], data.X, y, *test, device)

    cases = [
        harness.Case("t", "fast", "15", FAST, 2, "fast"),
        harness.Case("t", "visit2", "15", {**FAST, "visit_weight": 2.0}, 2),
        # The same runs as "fast": trained once, shown twice.
        harness.Case("u", "fast", "15", FAST, 1, "fast again"),
        harness.Case("u", "seeds", "15", FAST, 2, label_draw=1),
    ]
    parts = [
        (part, part, "note", harness.TABLE_HEADER, harness.table_cells)
        for part in ("t", "u")
    ]

    def render(results):
        return harness.render_parts(results, "Tiny", ["a note"], parts)

    def main(argv):
        args = harness.parse(harness.make_parser("tiny", "tiny"), argv)
        return harness.main(cases, args, fit, render, Blobs)

    return main


def test_tiny_run_resumes_filters_and_renders(
    bench, tmp_path, torch_single_thread, capsys
):
    calls = []
    main = _tiny(bench, calls)
    out, table = tmp_path / "tiny.json", tmp_path / "tiny.rst"
    common = ["--device=cpu", f"--json={out}", f"--table={table}"]

    main([*common, "--only", "t/fast/*"])
    results = json.loads(out.read_text())
    assert sorted(results["runs"]) == ["t/fast/15/0", "t/fast/15/1"]
    assert calls == [0, 1]
    run = results["runs"]["t/fast/15/1"]
    assert run["status"] == "ok" and run["n_iter"] == 5
    assert run["config"]["params"]["random_state"] == 1
    assert run["config"]["label_seed"] == 1
    assert run["device"] == results["meta"]["device"]
    assert run["git_revision"] == results["meta"]["git_revision"]
    assert run["source_digest"] == results["meta"]["source_digest"]

    # Resume: the two finished runs are not trained again; "u/fast" shares
    # their signature, so only visit2 (2 runs) and seeds (2) are trained.
    # Run 0 of "u/seeds" (label draw 1, seed 1) is run 1 of "t/fast".
    main(common)
    assert len(calls) == 5 and sorted(calls[2:]) == [0, 1, 1001]
    results = json.loads(out.read_text())
    assert results["runs"]["u/fast/15/0"]["shared_with"] == ["t/fast/15/0"]
    assert results["runs"]["u/seeds/15/0"]["shared_with"] == ["t/fast/15/1"]
    seeds = results["runs"]["u/seeds/15/1"]["config"]
    assert (seeds["label_seed"], seeds["params"]["random_state"]) == (1, 1001)
    main(common)
    assert len(calls) == 5

    # A row's runs share one precision: more draws in another are refused.
    before = json.loads(out.read_text())
    before["runs"]["t/fast/15/0"]["precision"] = "bf16"
    out.write_text(json.dumps(before))
    with pytest.raises(SystemExit, match=r"row t/fast/15 holds runs trained in"):
        main([*common, "--only", "t/fast/*", "--draws=3"])
    assert len(calls) == 5
    before["runs"]["t/fast/15/0"]["precision"] = "fp32"
    out.write_text(json.dumps(before))

    text = table.read_text()
    # Headings are rubrics (the file goes in the middle of a page's section),
    # and where the runs were made stays in the JSON, out of the table.
    assert text.startswith(".. rubric:: Tiny\n\n- a note\n")
    assert "fast again" in text and "visit2" in text
    assert "t/visit2/15/1" in text  # the per-run table
    meta = results["meta"]
    recorded = {meta["device"], meta["git_revision"][:7], meta["torch"]} - {"?"}
    assert recorded and not any(value in text for value in recorded)

    # --render-only rebuilds the same table from the JSON alone, fitting
    # nothing and leaving the JSON as it is.
    before = out.read_bytes()
    table.unlink()
    main([*common, "--render-only"])
    assert table.read_text() == text and out.read_bytes() == before
    assert len(calls) == 5
    capsys.readouterr()


FAST_RUNS = {"t/fast/15/0", "t/fast/15/1"}
VISIT2_RUNS = {"t/visit2/15/0", "t/visit2/15/1"}


@pytest.mark.parametrize(
    "split, expected",
    [
        # One row a file, picked with --only.
        ([["--only", "t/fast*"], ["--only", "t/visit2*"]], [FAST_RUNS, VISIT2_RUNS]),
        # Every other run a file, dealt out with --shard.
        (
            [["--only", "t/*", "--shard=0/2"], ["--only", "t/*", "--shard=1/2"]],
            [{"t/fast/15/0", "t/visit2/15/0"}, {"t/fast/15/1", "t/visit2/15/1"}],
        ),
    ],
)
def test_runs_in_separate_files_merge_into_one_table(
    bench, tmp_path, torch_single_thread, split, expected
):
    calls = []
    main = _tiny(bench, calls)
    parts = []
    for options in split:
        path = tmp_path / f"{len(parts)}.json"
        main(["--device=cpu", *options, f"--json={path}"])
        parts.append(path)
    assert sorted(calls) == [0, 0, 1, 1]  # four runs, each in one file
    assert [set(json.loads(p.read_text())["runs"]) for p in parts] == expected
    merged = tmp_path / "all.json"
    main(["--merge", *map(str, parts), f"--json={merged}"])
    results = json.loads(merged.read_text())
    assert len(results["runs"]) == 4 and len(results["meta"]["shards"]) == 2
    table = (tmp_path / "all.rst").read_text()
    assert "fast         15     2" in table and "visit2       15     2" in table
    # Merging into a merged file keeps its own meta and lists its shards
    # after it, never nested.
    again = tmp_path / "again.json"
    main(["--merge", str(merged), str(parts[0]), f"--json={again}"])
    shards = json.loads(again.read_text())["meta"]["shards"]
    assert not any("shards" in shard for shard in shards)
    merged_from = [shard.get("merged_from") for shard in shards]
    assert merged_from == [list(map(str, parts)), None, None, None]


def test_parser(bench):
    harness = bench("_harness")
    parser = harness.make_parser("x", "stem")
    args = harness.parse(parser, ["--device", "cpu"])
    assert args.json == str(harness.RESULTS_DIR / "stem_cpu.json")
    assert args.table == str(harness.RESULTS_DIR / "stem_cpu.rst")
    assert args.draws is None
    args = harness.parse(parser, ["--device=cuda:1", "--only", "a*"])
    assert args.json.endswith("stem_cuda.json") and args.only == ["a*"]
    assert args.shard is None
    assert harness.parse(parser, ["--shard=2/4", "--json=a.json"]).shard == (2, 4)
    bad_values = [["--draws", "0"], ["--max-iter", "0"]]
    for shard in ("4/4", "1", "a/2", "-1/2", "1/0", "\u00b2/4"):
        bad_values.append([f"--shard={shard}", "--json=a.json"])
    # Shards need files of their own, and only run cases.
    bad_values.append(["--shard=0/2"])
    bad_values.append(["--shard=0/2", "--json=a.json", "--merge", "b.json"])
    bad_values.append(["--shard=0/2", "--json=a.json", "--render-only"])
    for bad in bad_values:
        with pytest.raises(SystemExit):
            harness.parse(parser, bad)


@pytest.mark.parametrize("kind", ["fifo", "directory", "device"])
def test_results_are_never_written_over_what_is_not_a_regular_file(
    bench, tmp_path, capsys, make_special_file, kind
):
    harness, mnist = bench("_harness"), bench("bench_mnist")
    special = tmp_path / "special"
    make_special_file(special, kind)
    mode = os.lstat(special).st_mode
    with pytest.raises(ValueError, match="is not a regular file"):
        harness.write_text(special, "results\n")
    # The scripts refuse it as --table or --json before running anything.
    committed = f"--json={RESULTS / 'mnist_cpu.json'}"
    for argv in (
        ["--render-only", committed, f"--table={special}"],
        ["--device=cpu", "--only=no/such/case", f"--json={special}"],
    ):
        with pytest.raises(SystemExit):
            mnist.main(argv)
        assert "is not a regular file" in capsys.readouterr().err
    assert os.lstat(special).st_mode == mode
    assert sorted(p.name for p in tmp_path.iterdir()) == ["special"]


def test_results_are_written_whole_or_not_at_all(bench, tmp_path, monkeypatch):
    harness = bench("_harness")
    path, target = tmp_path / "results.json", tmp_path / "elsewhere.json"
    path.write_text("old\n")

    def crash(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(harness.os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        harness.write_text(path, "new\n")
    assert path.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]
    monkeypatch.undo()
    # A link is replaced, not written through.
    target.write_text("kept\n")
    path.unlink()
    path.symlink_to(target)
    harness.write_text(path, "new\n")
    assert not path.is_symlink() and path.read_text() == "new\n"
    assert target.read_text() == "kept\n"


def test_merge_needs_its_own_json(bench, tmp_path, monkeypatch, capsys):
    """Without --json, --merge would overwrite the committed results."""
    mnist = bench("bench_mnist")
    monkeypatch.setattr(mnist.h, "RESULTS_DIR", tmp_path)
    committed = tmp_path / "mnist_cpu.json"
    committed.write_text('{"committed": true}\n')
    part = tmp_path / "part.json"
    part.write_text(json.dumps({"meta": {}, "rows": [], "runs": {}}))
    refused = {
        "name --json": ["--device=cpu", "--merge", str(part)],
        "leave out --render-only": [
            "--merge",
            str(part),
            f"--json={tmp_path / 'm.json'}",
            "--render-only",
        ],
    }
    for message, argv in refused.items():
        with pytest.raises(SystemExit):
            mnist.main(argv)
        assert message in capsys.readouterr().err
    assert committed.read_text() == '{"committed": true}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mnist_cpu.json", "part.json"]


def test_resuming_into_the_other_devices_file_is_refused(
    bench, tmp_path, torch_single_thread
):
    calls = []
    main = _tiny(bench, calls)
    path = tmp_path / "tiny.json"
    meta = {"device_type": "cuda", "device": "NVIDIA H100"}
    path.write_text(json.dumps({"meta": meta, "rows": [], "runs": {}}))
    before = path.read_bytes()
    with pytest.raises(SystemExit, match="holds runs on cuda, and this run is on cpu"):
        main(["--device=cpu", f"--json={path}"])
    assert calls == [] and path.read_bytes() == before
    assert not (tmp_path / "tiny.rst").exists()


VALID = {"meta": {"device_type": "cpu"}, "rows": [], "runs": {}}
ROW = dict(part="t", setting="s", labels="15", title="s", paper="", draws=1, keys=[])


@pytest.mark.parametrize(
    "content, problem",
    [
        (None, "it does not exist"),
        ("{not json", "cannot be read as JSON"),
        ("[1, 2]", "it is not a JSON object"),
        ({"rows": [], "runs": {}}, '"meta" is not a JSON object'),
        ({**VALID, "rows": [{"part": "t"}]}, '"rows" is not a list of rows'),
        ({**VALID, "runs": []}, '"runs" is not a JSON object of runs'),
        ({**VALID, "runs": {"t/s/15/0": {"status": "ok"}}}, "a finished run lacks"),
        ({**VALID, "meta": {"device_type": "cuda"}}, "joins the files of one device"),
    ],
)
def test_merge_names_a_malformed_file(bench, tmp_path, content, problem):
    calls = []
    main = _tiny(bench, calls)
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps({**VALID, "rows": [ROW]}))
    if content is not None:
        bad.write_text(content if isinstance(content, str) else json.dumps(content))
    out = tmp_path / "merged.json"
    with pytest.raises(SystemExit, match=problem) as raised:
        main(["--merge", str(good), str(bad), f"--json={out}"])
    assert str(bad) in str(raised.value)
    assert not out.exists() and calls == []


def test_scores_and_median_interval(bench):
    harness = bench("_harness")
    y_true = np.array([7, 7, 7, 4, 4, 9, 1, 2])
    y_pred = np.array([3, 3, 7, 9, 9, 4, 2, 2])
    s = harness.scores(y_true, y_pred)
    assert s["most_confused"] == [[4, 9, 2], [7, 3, 2], [1, 2, 1]]
    assert s["most_confused_indices"] == [3, 4]
    assert s["test_error_percent"] == 75.0 and s["n_eval"] == 8
    assert harness.scores(y_true, y_true)["most_confused"] == []
    # 40 draws: the 14th and 27th smallest; none below 6 draws.
    assert harness.median_interval(np.arange(40.0)) == (13.0, 26.0)
    assert harness.median_interval(np.arange(5.0)) is None


# ------------------------------------------------------------ bench_mnist


def test_cases_are_the_committed_rows_and_would_resume_them(bench):
    """The cases plan exactly the rows and runs of the committed results: a
    rerun with the defaults on a GPU skips every run and keeps every row."""
    mnist = bench("bench_mnist")
    harness = bench("_harness")
    args = mnist.parse_args(["--device", "cuda"])
    common = {"train_subset": None, "train_subset_seed": None, "eval_subset": None}
    rows, _ = harness.plan(mnist.CASES, args, "cuda", common)
    committed = json.loads((RESULTS / "mnist_cuda.json").read_text())["rows"]

    def ident(row):
        return row["part"], row["setting"], row["labels"]

    assert sorted(rows, key=ident) == sorted(committed, key=ident)
    names = [case.name for case in mnist.CASES]
    assert len(set(names)) == len(names)


def test_cases_are_valid_parameter_sets(bench):
    mnist = bench("bench_mnist")
    known = set(SemiSupervisedAssociationClassifier().get_params())
    for case in mnist.CASES:
        if case.method == "skassoc":
            assert set(case.params) <= known, case.name
    paper = recipe_params("paper")
    ablations = mnist.ABLATIONS
    improved = {**paper, **ablations["+labeled augmentation+visit1.5"]}
    assert improved == recipe_params("improved")
    consistency = {**paper, **ablations["+labeled augmentation+visit1.5+consistency"]}
    assert consistency == recipe_params("consistency")


def test_class_frequencies(bench):
    mnist = bench("bench_mnist")
    y_train = np.repeat(np.arange(10), np.arange(1, 11) * 100)
    every = mnist.class_frequencies("training labels", y_train, label_seed=0)
    np.testing.assert_allclose(every, np.arange(1, 11) / 55)
    # A random sample: frequencies of its labels, one sample per label seed.
    sample = mnist.class_frequencies(1000, y_train, label_seed=0)
    assert sample.shape == (10,) and sample.sum() == pytest.approx(1.0)
    assert np.allclose(sample * 1000, np.round(sample * 1000))
    assert not np.array_equal(sample, every)
    np.testing.assert_array_equal(
        sample, mnist.class_frequencies(1000, y_train, label_seed=0)
    )
    assert not np.array_equal(
        sample, mnist.class_frequencies(1000, y_train, label_seed=1)
    )
    # Drawn without replacement: a sample of every label is the exact count.
    np.testing.assert_allclose(mnist.class_frequencies(5500, y_train, 0), every)
    with pytest.raises(ValueError, match="5501 random training labels"):
        mnist.class_frequencies(5501, y_train, label_seed=0)


def test_training_sets(bench):
    mnist = bench("bench_mnist")
    x_train = np.arange(6 * 4).reshape(6, 2, 2)
    y_semi = np.array([-1, 3, -1, -1, 5, -1])
    x_fit, y_fit = mnist.training_set("all", x_train, y_semi)
    assert x_fit is x_train and y_fit is y_semi
    x_fit, y_fit = mnist.training_set("labeled", x_train, y_semi)
    np.testing.assert_array_equal(x_fit, x_train[[1, 4]])
    np.testing.assert_array_equal(y_fit, [3, 5])
    # As in the authors' code: every image in the unlabeled pool, the
    # labeled ones also in the labeled set, with their labels.
    x_fit, y_fit = mnist.training_set("all as unlabeled", x_train, y_semi)
    np.testing.assert_array_equal(x_fit, x_train[[0, 1, 2, 3, 4, 5, 1, 4]])
    np.testing.assert_array_equal(y_fit, [-1, -1, -1, -1, -1, -1, 3, 5])
    with pytest.raises(ValueError, match="unknown training set 'test'"):
        mnist.training_set("test", x_train, y_semi)


@pytest.mark.parametrize(
    "name", ["mnist_cuda", "mnist_cpu", "mnist_cuda_tf32_association"]
)
def test_render_only_reproduces_the_committed_table(bench, tmp_path, name, capsys):
    mnist = bench("bench_mnist")
    table = tmp_path / f"{name}.rst"
    mnist.main(["--render-only", f"--json={RESULTS / name}.json", f"--table={table}"])
    assert table.read_bytes() == (RESULTS / f"{name}.rst").read_bytes()
    capsys.readouterr()


def test_tables_set_rows_against_paper_on_their_own_draws(bench):
    mnist = bench("bench_mnist")

    def row(part, setting, draws):
        keys = [f"{part}/{setting}/100/{d}" for d in range(draws)]
        return dict(part=part, setting=setting, labels="100", title=setting) | dict(
            paper="", draws=draws, keys=keys, signatures=None
        )

    errors = {"paper": [1.0, 2.0, 0.5, 0.9, 0.8, 1.1, 1.2, 0.7, 0.6, 1.0, 0.4, 0.9]}
    errors["x"] = [0.9, 2.5, 0.4, 0.8, 0.9, 1.0, 1.0, 0.8, 0.5, 0.9, 0.3, 1.0]
    runs = {
        f"{part}/{s}/100/{d}": {"status": "ok", "draw": d, "fit_seconds": 1.0}
        | {"test_error_percent": e}
        for part in ("recipes", "ablations")
        for s, values in errors.items()
        for d, e in enumerate(values)
    }
    rows = [row("recipes", "paper", 12), row("recipes", "x", 12)]
    cells = mnist.recipe_cells(rows, runs)
    # Medians of draws 0-9 and 10+, and the later draws below "paper" (1 of 2).
    assert cells[1][7:10] == ["0.90", "0.65", "1/2"] and cells[0][9] == ""
    rows = [row("ablations", "paper", 12), row("ablations", "x", 4)]
    cells = mnist.ablation_cells(rows, runs)
    # "x" ran on draws 0-3 only: "paper" there has a median of 0.95; x is
    # below it on draws 0, 2 and 3.
    assert cells[1][7:9] == ["0.95", "3/4"] and cells[0][7:9] == ["", ""]
    assert cells[1][2] == "4"


def test_tiny_mnist_run(
    bench, mnist_dir, tmp_path, torch_single_thread, capsys, monkeypatch
):
    mnist = bench("bench_mnist")
    fitted_params = {}
    fit_estimator = mnist.h.fit_estimator

    def recording_fit(params, *args, **kwargs):
        fitted_params[params["max_iter"], params.get("balance_weight", 0.0)] = params
        return fit_estimator(params, *args, **kwargs)

    monkeypatch.setattr(mnist.h, "fit_estimator", recording_fit)
    out = tmp_path / "m.json"
    only = ["table1/paper/100", "baselines/label_spreading/100", "ablations/as the*"]
    only.append("recipes/balanced+class_prior/100")
    sub = ["--train-subset=300", "--eval-subset=100"]
    mnist.main(
        [
            "--device=cpu",
            f"--data-home={mnist_dir}",
            *(a for pattern in only for a in ("--only", pattern)),
            "--draws=1",
            "--max-iter=2",
            *sub,
            f"--json={out}",
        ]
    )
    results = json.loads(out.read_text())
    runs = results["runs"]
    assert sorted(runs) == [
        "ablations/as the authors' code/100/0",
        "baselines/label_spreading/100/0",
        "recipes/balanced+class_prior/100/0",
        "table1/paper/100/0",
    ]
    assert all(run["status"] == "ok" for run in runs.values())
    authors = runs["ablations/as the authors' code/100/0"]
    assert authors["n_fit"] == 300 + authors["n_labeled"]
    assert authors["config"]["params"]["max_iter"] == 2
    assert authors["config"]["params"]["lr_decay_steps"] == 1
    # The class frequencies of the training subset, recorded with the run.
    y_subset = mnist.Data(mnist.parse_args([f"--data-home={mnist_dir}"] + sub)).y_train
    given = runs["recipes/balanced+class_prior/100/0"]["class_prior"]
    np.testing.assert_allclose(given, np.bincount(y_subset, minlength=10) / 300)
    # ... and the estimator was given them; the other runs keep "uniform".
    balanced = fitted_params[2, recipe_params("balanced")["balance_weight"]]
    np.testing.assert_array_equal(balanced["class_prior"], given)
    assert fitted_params[2, 0.0]["class_prior"] == "uniform"
    table = (tmp_path / "m.rst").read_text()
    assert "Quick run: max_iter=2" in table and "LabelSpreading" in table
    capsys.readouterr()
