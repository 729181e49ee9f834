"""benchmarks/bench_mnist.py: its ablation table, diagnostics and a tiny run."""

import importlib
import json
from pathlib import Path

import numpy as np
import pytest

from skassoc import SemiSupervisedAssociationClassifier, recipe_params
from skassoc._augmentation import resolve_augmentation

BENCH_DIR = Path(__file__).resolve().parents[1] / "benchmarks"
MNIST_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "mnist"


@pytest.fixture
def bench_mnist(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH_DIR))
    return importlib.import_module("bench_mnist")


def test_most_confused_counts_the_frequent_errors_first(bench_mnist):
    y_true = np.array([7, 7, 7, 4, 4, 9, 1, 2])
    y_pred = np.array([3, 3, 7, 9, 9, 4, 2, 2])
    assert bench_mnist.most_confused(y_true, y_pred) == [
        [4, 9, 2],
        [7, 3, 2],
        [1, 2, 1],
    ]
    assert bench_mnist.most_confused(y_true, y_pred, n=1) == [[4, 9, 2]]
    assert bench_mnist.most_confused(y_true, y_true) == []


def test_confused_indices_are_the_test_images_of_the_first_confusion(bench_mnist):
    y_true = np.array([7, 7, 7, 4, 4, 9, 1, 2])
    y_pred = np.array([3, 3, 7, 9, 9, 4, 2, 2])
    confusions = bench_mnist.most_confused(y_true, y_pred)
    assert bench_mnist.confused_indices(y_true, y_pred, confusions) == [3, 4]
    assert bench_mnist.confused_indices(y_true, y_pred, [[7, 3, 2]]) == [0, 1]
    assert bench_mnist.confused_indices(y_true, y_true, []) == []


def test_every_ablation_is_a_valid_parameter_set(bench_mnist):
    for overrides in bench_mnist.ABLATIONS.values():
        params = {**recipe_params("paper"), **overrides}
        SemiSupervisedAssociationClassifier(**params)._validate_params()
        if isinstance(params.get("augmentation"), dict):
            resolve_augmentation(params["augmentation"])
    improved = {
        **recipe_params("paper"),
        **bench_mnist.ABLATIONS["+labeled augmentation+visit1.5"],
    }
    assert improved == recipe_params("improved")
    consistency = {
        **recipe_params("paper"),
        **bench_mnist.ABLATIONS["+labeled augmentation+visit1.5+consistency"],
    }
    assert consistency == recipe_params("consistency")


def test_training_sets(bench_mnist):
    x_train = np.arange(6 * 4).reshape(6, 2, 2)
    y_semi = np.array([-1, 3, -1, -1, 5, -1])
    x_fit, y_fit = bench_mnist.training_set("all", x_train, y_semi)
    assert x_fit is x_train and y_fit is y_semi
    x_fit, y_fit = bench_mnist.training_set("labeled", x_train, y_semi)
    np.testing.assert_array_equal(x_fit, x_train[[1, 4]])
    np.testing.assert_array_equal(y_fit, [3, 5])
    # As in the authors' code: every image in the unlabeled pool, the
    # labeled ones also in the labeled set, with their labels.
    x_fit, y_fit = bench_mnist.training_set("all as unlabeled", x_train, y_semi)
    np.testing.assert_array_equal(x_fit, x_train[[0, 1, 2, 3, 4, 5, 1, 4]])
    np.testing.assert_array_equal(y_fit, [-1, -1, -1, -1, -1, -1, 3, 5])
    with pytest.raises(ValueError, match="unknown training set 'test'"):
        bench_mnist.training_set("test", x_train, y_semi)
    assert set(bench_mnist.ABLATION_TRAINING_SETS) <= set(bench_mnist.ABLATIONS)


def test_tiny_run_records_rows_and_confusions(
    bench_mnist, tmp_path, capsys, torch_single_thread
):
    if not (MNIST_DIR / "train-images-idx3-ubyte.gz").is_file():
        pytest.skip(f"real MNIST files not found in {MNIST_DIR}")
    out = tmp_path / "mnist.json"
    bench_mnist.main(
        [
            "--device=cpu",
            f"--data-home={MNIST_DIR}",
            "--parts=table1,recipes,ablations,checkpoints,seeds",
            "--seed-draws=1",
            "--seed-recipes=improved",
            "--seeds-per-draw=2",
            "--recipes=improved",
            "--ablations=+labeled augmentation+visit1.5,bf16,as the authors' code",
            "--draws=1",
            "--ablation-draws=1",
            "--max-iter=3",
            "--train-subset=2000",
            "--eval-subset=200",
            f"--json={out}",
            "--markdown=none",
            f"--rst={tmp_path / 'mnist.rst'}",
        ]
    )
    results = json.loads(out.read_text())
    runs = results["runs"]
    assert all(run["status"] == "ok" for run in runs.values())
    digest = results["meta"]["source_digest"]
    assert all(run["source_digest"] == digest for run in runs.values())
    assert {row["setting"] for row in results["rows"]} >= {
        "paper",
        "improved",
        "+labeled augmentation+visit1.5",
        "bf16",
    }
    for run in runs.values():
        errors = sum(count for _, _, count in run["most_confused"])
        assert errors <= round(run["test_error_percent"] * run["n_eval"] / 100)
        if run["most_confused"]:
            assert len(run["most_confused_indices"]) == run["most_confused"][0][2]
    # Identical configurations run once: recipe "improved" at 100 labels is
    # the "+labeled augmentation+visit1.5" ablation.
    improved = runs["recipes/improved/100/0"]
    assert "ablations/+labeled augmentation+visit1.5/100/0" in improved["shared_with"]
    assert "+labeled augmentation+visit1.5" in (tmp_path / "mnist.rst").read_text()
    # Fitted on the 2000 training images unlabeled plus the labeled ones again.
    authors = runs["ablations/as the authors' code/100/0"]
    assert authors["config"]["fit_on"] == "all as unlabeled"
    assert authors["config"]["params"]["precision"] == "fp32"
    assert authors["n_fit"] == 2000 + authors["n_labeled"] == 2100
    assert runs["ablations/bf16/100/0"]["n_fit"] == 2000
    # The checkpoints part trains its own run (tracking the test error after
    # the last step: 3 steps, fewer than the interval), not Table 1's.
    tracked = runs["checkpoints/paper/100/0"]
    assert "table1/paper/100/0" not in tracked["shared_with"]
    assert "test_error_steps" not in runs["table1/paper/100/0"]
    assert tracked["test_error_steps"] == [3]
    assert tracked["lowest_test_error_step"] == 3
    assert tracked["lowest_test_error_percent"] == pytest.approx(
        tracked["test_error_percent"]
    )
    rst = (tmp_path / "mnist.rst").read_text()
    assert "Lowest: median" in rst and "never a result" in rst
    # The seeds part: its first seed is the recipes table's run of that draw,
    # the next one another network seed on the same labels.
    first, second = (
        runs["seeds/improved-draw0/100/0"],
        runs["seeds/improved-draw0/100/1"],
    )
    assert "recipes/improved/100/0" in first["shared_with"]
    assert second["config"]["label_seed"] == 0
    assert second["config"]["params"]["random_state"] == 1000
    assert 'recipe "improved", label draw 0' in rst
    assert not any(key.startswith("seeds/paper") for key in runs)


def test_seed_recipes_must_be_mnist_recipes(bench_mnist, capsys):
    args = bench_mnist.parse_args(["--seed-recipes", "improved,paper"])
    assert args.seed_recipes == ["improved", "paper"]
    with pytest.raises(SystemExit):
        bench_mnist.parse_args(["--seed-recipes", "domain_adaptation"])
    assert "--seed-recipes takes recipes for MNIST" in capsys.readouterr().err


def _run(key, signature, error, started):
    return {
        "key": key,
        "signature": signature,
        "status": "ok",
        "test_error_percent": error,
        "fit_seconds": 1.0,
        "started": started,
    }


def test_rows_count_only_runs_of_their_own_settings(bench_mnist):
    row = {
        "keys": ["t/paper/100/0", "t/paper/100/1"],
        "signatures": ["new0", "new1"],
        "draws": 2,
    }
    runs = {
        "t/paper/100/0": _run(
            "t/paper/100/0", "new0", 1.0, "2026-01-02 00:00:00 +0000"
        ),
        # Left from a resumed file trained with other settings.
        "t/paper/100/1": _run(
            "t/paper/100/1", "old1", 9.0, "2026-01-01 00:00:00 +0000"
        ),
    }
    stats = bench_mnist.row_stats(row, runs)
    assert stats["runs"] == 1 and stats["planned"] == 2
    assert stats["errors"] == [1.0]
    # Rows written before signatures were recorded take any finished run.
    legacy = {key: value for key, value in row.items() if key != "signatures"}
    assert bench_mnist.row_stats(legacy, runs)["errors"] == [1.0, 9.0]


def test_merging_shards_keeps_the_runs_trained_last(bench_mnist, tmp_path):
    # Each shard resumed from one file carries the other shard's old run.
    old = _run("k/0", "old", 9.0, "2026-01-01 00:00:00 +0000")
    fresh = _run("k/0", "new", 1.0, "2026-01-02 00:00:00 +0000")
    for name, record in [("r0.json", fresh), ("r1.json", old)]:
        (tmp_path / name).write_text(json.dumps({"runs": {"k/0": record}, "rows": []}))
    runs, _, _ = bench_mnist.load_results([tmp_path / "r0.json", tmp_path / "r1.json"])
    assert runs["k/0"]["signature"] == "new"
    failed = {**_run("k/0", "newer", 2.0, "2026-01-03 00:00:00 +0000")}
    failed["status"] = "error"
    (tmp_path / "r2.json").write_text(json.dumps({"runs": {"k/0": failed}, "rows": []}))
    runs, _, _ = bench_mnist.load_results([tmp_path / "r0.json", tmp_path / "r2.json"])
    assert runs["k/0"]["signature"] == "new"  # a finished run beats a failed one


def test_the_current_plan_replaces_older_rows(bench_mnist):
    old = {"part": "t", "setting": "paper", "labels": "100", "draws": 5, "keys": []}
    new = {**old, "draws": 2}
    assert bench_mnist.merge_rows([old], [new]) == [old]
    assert bench_mnist.merge_rows([old], [new], prefer_new=True) == [new]


def test_header_names_every_device_the_runs_trained_on(bench_mnist):
    meta = {"device": "GPU A"}
    one = {
        "k/0": {"device": "GPU A", "signature": "s0"},
        "k/1": {"device": "GPU A", "signature": "s1"},
    }
    assert bench_mnist.run_devices(one, meta) == "GPU A"
    # Shards merged from two machines: the first shard's device is not all.
    # A run shared by two table entries counts once, a failed run not at all.
    two = {
        **one,
        "k/2": {"device": "GPU B", "signature": "s2"},
        "other/2": {"device": "GPU B", "signature": "s2"},
        "k/3": {"device": "GPU C", "signature": "s3", "status": "error"},
    }
    assert bench_mnist.run_devices(two, meta) == "runs on GPU A (2), GPU B (1)"
    assert bench_mnist.run_devices({}, meta) == "GPU A"


def test_header_names_every_revision_behind_the_results(bench_mnist):
    merged_twice = {
        "git_revision": "a",
        "shards": [{"git_revision": "a", "shards": [{"git_revision": "c"}]}, {}],
    }
    assert bench_mnist.git_revisions(merged_twice) == ["a", "c"]
    # Resumed runs record their own revision; the file's metadata does not.
    runs = {"k/0": {"signature": "s0", "git_revision": "d"}, "k/1": {"signature": "s1"}}
    assert bench_mnist.git_revisions({"git_revision": "a"}, runs) == ["a", "d"]
    assert bench_mnist.git_revisions({}) == ["?"]


def test_recipes_table_shows_the_draws_after_the_choice_apart(bench_mnist):
    first = bench_mnist.SELECTION_DRAWS
    draws = [0, 1, first, first + 1, first + 2]
    errors = [0.5, 0.7, 0.9, 1.1, 3.0]
    keys = [f"recipes/improved/100/{d}" for d in draws]
    runs = {
        key: {**_run(key, f"s{d}", e, "2026-01-01 00:00:00 +0000"), "draw": d}
        for key, d, e in zip(keys, draws, errors, strict=True)
    }
    row = {
        "title": 'recipe "improved"',
        "labels": "100",
        "paper": None,
        "keys": keys,
        "signatures": [f"s{d}" for d in draws],
        "draws": len(draws),
    }
    header = bench_mnist.RECIPE_HEADER
    (cells,) = bench_mnist.recipe_cells([row], runs)
    assert len(cells) == len(header)
    by_column = dict(zip(header, cells, strict=True))
    assert by_column["Error % (median)"] == "0.90"
    assert by_column[f"Median, draws 0-{first - 1}"] == "0.60"
    assert by_column[f"Median, draws {first}+"] == "1.10"
    # Without later draws there is nothing to set apart.
    early = {**row, "keys": keys[:2], "signatures": row["signatures"][:2], "draws": 2}
    (cells,) = bench_mnist.recipe_cells([early], runs)
    by_column = dict(zip(header, cells, strict=True))
    assert by_column[f"Median, draws {first}+"] == ""
    assert by_column["Error % (median)"] == "0.60"


def test_recipes_table_counts_the_later_draws_beaten_against_paper(bench_mnist):
    first = bench_mnist.SELECTION_DRAWS
    draws = [0, first, first + 1, first + 2]
    paper_errors = [0.9, 0.8, 0.9, 1.0]
    # Better on draw 0 (not counted: a draw of the choice) and on two of the
    # three later draws; worse on the third.
    improved_errors = [0.5, 0.7, 0.8, 1.5]
    runs, rows = {}, []
    for setting, errors in (("paper", paper_errors), ("improved", improved_errors)):
        keys = [f"recipes/{setting}/100/{d}" for d in draws]
        for key, d, e in zip(keys, draws, errors, strict=True):
            runs[key] = {**_run(key, key, e, "2026-01-01 00:00:00 +0000"), "draw": d}
        rows.append(
            {
                "title": f'recipe "{setting}"',
                "setting": setting,
                "labels": "100",
                "paper": None,
                "keys": keys,
                "signatures": keys,
                "draws": len(draws),
            }
        )
    column = bench_mnist.RECIPE_HEADER.index(f'Draws {first}+ better than "paper"')
    paper_cells, improved_cells = bench_mnist.recipe_cells(rows, runs)
    assert improved_cells[column] == "2/3"
    assert paper_cells[column] == ""


def test_median_interval_is_the_binomial_order_statistics(bench_mnist):
    # 40 values: the 95 % interval runs from the 14th to the 27th smallest.
    values = np.arange(40.0)[::-1]
    assert bench_mnist.median_interval(values) == (13.0, 26.0)
    # A good draw turned into a failure, however bad, shifts it by one rank.
    values[-1] = 1000.0
    assert bench_mnist.median_interval(values) == (14.0, 27.0)
    # With 6 values the interval is the range; with 5 there is none.
    assert bench_mnist.median_interval([3.0, 1.0, 2.0, 6.0, 5.0, 4.0]) == (1.0, 6.0)
    assert bench_mnist.median_interval([1.0, 2.0, 3.0, 4.0, 5.0]) is None
    assert bench_mnist.interval_cell([1.0, 2.0, 3.0, 4.0, 5.0]) == "n/a"


def test_ablations_table_sets_each_row_against_paper_on_its_own_draws(bench_mnist):
    # "paper" ran on four draws, the ablation on the first two only: its
    # comparison uses those two (median 0.85), not all four (0.95).
    runs, rows = {}, []
    for setting, errors in (("paper", [0.9, 0.8, 1.0, 1.1]), ("+ema", [0.7, 0.8])):
        keys = [f"ablations/{setting}/100/{d}" for d in range(len(errors))]
        for d, (key, e) in enumerate(zip(keys, errors, strict=True)):
            runs[key] = {**_run(key, key, e, "2026-01-01 00:00:00 +0000"), "draw": d}
        rows.append(
            {
                "title": setting,
                "setting": setting,
                "labels": "100",
                "paper": None,
                "keys": keys,
                "signatures": keys,
                "draws": len(keys),
            }
        )
    header = bench_mnist.ABLATION_HEADER
    paper_cells, ema_cells = bench_mnist.ablation_cells(rows, runs)
    assert len(ema_cells) == len(header)
    by_column = dict(zip(header, ema_cells, strict=True))
    assert by_column['"paper", same draws'] == "0.85"
    # Below on draw 0, tied on draw 1 (a tie is not below).
    assert by_column['Draws below "paper"'] == "1/2"
    assert by_column["Error % (median)"] == "0.75"
    paper_by_column = dict(zip(header, paper_cells, strict=True))
    assert paper_by_column['"paper", same draws'] == ""
    assert paper_by_column["Error % (median)"] == "0.95"
