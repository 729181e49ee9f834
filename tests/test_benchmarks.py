"""Smoke tests of the benchmark scripts (bench_mnist.py has its own file).

bench_svhn.py and bench_stl10.py run on tiny fake data sets written into
tmp_path, bench_speed.py on the real MNIST files when they are there, all for
a few training steps on the CPU: the point is that they read the files,
train, write their JSON and table, and fail clearly without data, not the
figures. bench_concurrency.py needs a GPU: only its argument checks and its
refusal without one are tested here.
"""

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.io

BENCH_DIR = Path(__file__).resolve().parents[1] / "benchmarks"
MNIST_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "mnist"

# Keys of the environment record that every result file starts with.
ENVIRONMENT_KEYS = {
    "device",
    "device_type",
    "torch",
    "sklearn",
    "numpy",
    "python",
    "skassoc",
    "git_revision",
    "date",
}


@pytest.fixture
def bench(monkeypatch):
    """Import a benchmark script (and its _common module) by name."""
    monkeypatch.syspath_prepend(str(BENCH_DIR))

    def load(name):
        return importlib.import_module(name)

    return load


@pytest.fixture
def no_env(monkeypatch, tmp_path):
    """Keep the user's environment from choosing the data folders."""
    monkeypatch.delenv("SKASSOC_SVHN_DIR", raising=False)
    monkeypatch.delenv("SKASSOC_STL10_DIR", raising=False)
    monkeypatch.setenv("SCIKIT_LEARN_DATA", str(tmp_path / "sklearn_data"))


def write_fake_svhn(folder, n_train=30, n_test=10, seed=0):
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.RandomState(seed)
    for name, n in (("train_32x32.mat", n_train), ("test_32x32.mat", n_test)):
        X = rng.randint(0, 256, size=(32, 32, 3, n)).astype(np.uint8)
        y = (np.arange(n) % 10 + 1).astype(np.uint8).reshape(-1, 1)
        scipy.io.savemat(folder / name, {"X": X, "y": y})
    return folder


def write_fake_stl10(folder, n_train=20, n_test=10, n_unlabeled=10, seed=0):
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.RandomState(seed)
    for subset, n in (("train", n_train), ("test", n_test), ("unlabeled", n_unlabeled)):
        images = rng.randint(0, 256, size=(n, 3, 96, 96)).astype(np.uint8)
        images.tofile(folder / f"{subset}_X.bin")
        if subset != "unlabeled":
            labels = (np.arange(n) % 10 + 1).astype(np.uint8)
            labels.tofile(folder / f"{subset}_y.bin")
    return folder


def check_results(path, benchmark, score_key, n_runs):
    results = json.loads(Path(path).read_text())
    assert {"meta", "rows", "runs", "table"} <= set(results)
    meta = results["meta"]
    assert ENVIRONMENT_KEYS <= set(meta)
    assert meta["benchmark"] == benchmark
    assert meta["device_type"] == "cpu"
    assert meta["command"].startswith(f"bench_{benchmark}.py")
    assert meta["wall_seconds"] > 0
    assert len(results["runs"]) == n_runs
    for run in results["runs"]:
        assert run["status"] == "ok", run.get("error")
        assert 0 <= run[score_key] <= 100
        assert run["fit_seconds"] > 0
    (row,) = results["rows"]
    assert row["runs_ok"] == n_runs
    assert row[score_key]["n"] == n_runs
    assert row[score_key]["median"] is not None
    assert row["fit_seconds"]["median"] > 0
    return results


def test_bench_svhn_smoke(bench, tmp_path, capsys, torch_single_thread):
    data_home = write_fake_svhn(tmp_path / "svhn")
    out = tmp_path / "results" / "svhn.json"
    bench_svhn = bench("bench_svhn")
    bench_svhn.main(
        ["--data-home", str(data_home), "--device", "cpu", "--seeds", "0", "1",
         "--max-iter", "3", "--labels", "20", "--unlabeled-batch-size", "10",
         "--out", str(out)]
    )  # fmt: skip
    results = check_results(out, "svhn", "test_error_percent", n_runs=2)
    meta = results["meta"]
    assert meta["seeds"] == [0, 1]
    assert meta["n_train"] == 30 and meta["n_test"] == 10
    assert meta["data_home"] == str(data_home)
    assert meta["paper_max_iter"] == 100_000
    # --max-iter shortens the schedule and its decay interval alike.
    assert meta["params"]["max_iter"] == 3
    assert meta["params"]["lr_decay_steps"] == 2  # 60,000 * 3 / 100,000
    assert meta["params"]["visit_weight"] == 0.25
    assert meta["params"]["augmentation"] == "paper"
    for seed, run in zip((0, 1), results["runs"]):
        assert run["seed"] == seed and run["labels"] == 20
        assert run["n_iter"] == 3
        # 2 labels per class: a labeled batch takes both of every class.
        assert run["params"]["labeled_per_class"] == 2
        assert run["params"]["random_state"] == seed
    row = results["rows"][0]
    assert row["labels"] == 20 and row["labels_per_class"] == 2
    assert row["paper"] is None
    printed = capsys.readouterr().out
    assert "Error % (median)" in printed
    assert f"wrote {out}" in printed


def test_bench_stl10_smoke(bench, tmp_path, capsys, torch_single_thread):
    # The archive's folder layout: the files sit in stl10_binary/.
    write_fake_stl10(tmp_path / "stl10" / "stl10_binary", n_unlabeled=12)
    out = tmp_path / "stl10.json"
    bench_stl10 = bench("bench_stl10")
    bench_stl10.main(
        ["--data-home", str(tmp_path / "stl10"), "--device", "cpu", "--seeds", "0",
         "--max-iter", "2", "--labels-per-class", "1", "--unlabeled-subset", "5",
         "--unlabeled-batch-size", "10", "--out", str(out)]
    )  # fmt: skip
    results = check_results(out, "stl10", "test_accuracy_percent", n_runs=1)
    meta = results["meta"]
    assert meta["data_home"] == str(tmp_path / "stl10" / "stl10_binary")
    assert meta["n_train"] == 20 and meta["n_test"] == 10
    assert meta["n_unlabeled_file"] == 12 and meta["n_unlabeled_used"] == 5
    assert meta["params"]["network"] == "stl10"
    assert meta["params"]["max_iter"] == 2
    (run,) = results["runs"]
    assert run["n_iter"] == 2
    assert run["params"]["labeled_per_class"] == 1
    assert run["test_error_percent"] == pytest.approx(
        100 - run["test_accuracy_percent"]
    )
    assert "Accuracy % (median)" in capsys.readouterr().out


def test_stl10_training_set(bench, tmp_path):
    # Training images first (all but k per class unlabeled), then the
    # unlabeled images, all with target -1; a subset is drawn per seed.
    from skassoc.datasets import load_stl10

    write_fake_stl10(tmp_path, n_train=20, n_unlabeled=12)
    train = load_stl10("train", data_home=tmp_path)
    test = load_stl10("test", data_home=tmp_path)
    unlabeled = load_stl10("unlabeled", data_home=tmp_path)
    bench_stl10 = bench("bench_stl10")
    params = dict(bench_stl10.PARAMS)
    _, X, y, _, _ = bench_stl10.run_inputs(train, test, unlabeled, params, 1, None, 0)
    assert X.shape == (32, 3, 96, 96) and len(y) == 32
    np.testing.assert_array_equal(X[:20], train.data)
    np.testing.assert_array_equal(X[20:], unlabeled.data)
    assert (y[20:] == -1).all()
    assert sorted(y[:20][y[:20] != -1]) == list(range(10))

    _, X, y, _, _ = bench_stl10.run_inputs(train, test, unlabeled, params, 1, 5, 0)
    assert X.shape == (25, 3, 96, 96)
    flat = unlabeled.data.reshape(12, -1)
    for image in X[20:]:
        assert (flat == image.reshape(-1)).all(axis=1).any()


def test_bench_svhn_missing_data_exits(tmp_path, no_env):
    # A real process: the exit status and the message a user sees.
    missing = tmp_path / "nowhere"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    completed = subprocess.run(
        [sys.executable, str(BENCH_DIR / "bench_svhn.py"), "--device", "cpu",
         "--data-home", str(missing), "--out", str(tmp_path / "svhn.json")],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert completed.returncode != 0
    assert "train_32x32.mat" in completed.stderr
    assert repr(str(missing)) in completed.stderr
    assert "http://ufldl.stanford.edu/housenumbers/" in completed.stderr
    assert "--data-home" in completed.stderr
    assert "SKASSOC_SVHN_DIR" in completed.stderr
    assert "Traceback" not in completed.stderr
    assert not (tmp_path / "svhn.json").exists()


def test_bench_stl10_missing_data_exits(bench, tmp_path, no_env):
    # train and test present, the unlabeled file missing.
    folder = write_fake_stl10(tmp_path / "stl10")
    (folder / "unlabeled_X.bin").unlink()
    with pytest.raises(SystemExit) as excinfo:
        bench("bench_stl10").main(
            ["--device", "cpu", "--data-home", str(folder),
             "--out", str(tmp_path / "stl10.json")]
        )  # fmt: skip
    message = str(excinfo.value.code)
    assert excinfo.value.code not in (0, None)
    assert "unlabeled_X.bin" in message
    assert "https://cs.stanford.edu/~acoates/stl10/" in message
    assert "--data-home" in message
    assert "SKASSOC_STL10_DIR" in message
    assert not (tmp_path / "stl10.json").exists()


def test_bench_svhn_failed_run_is_recorded(bench, tmp_path, capsys):
    # 50 labels need 5 images of every class; the fake train set has 3.
    data_home = write_fake_svhn(tmp_path / "svhn")
    out = tmp_path / "svhn.json"
    with pytest.raises(SystemExit, match="1 of 1 runs failed"):
        bench("bench_svhn").main(
            ["--data-home", str(data_home), "--device", "cpu", "--seeds", "0",
             "--max-iter", "3", "--labels", "50", "--out", str(out)]
        )  # fmt: skip
    results = json.loads(out.read_text())
    (run,) = results["runs"]
    assert run["status"] == "error"
    assert "ValueError" in run["error"]
    assert results["rows"][0]["runs_ok"] == 0
    assert "n/a" in capsys.readouterr().out


@pytest.mark.parametrize(
    "script, args, match",
    [
        ("bench_svhn", ["--labels", "15"], "positive multiples of 10"),
        ("bench_svhn", ["--labels", "a,b"], "--labels takes integers"),
        ("bench_svhn", ["--seeds", "0", "0"], "--seeds must be distinct"),
        ("bench_svhn", ["--max-iter", "0"], "--max-iter must be at least 1"),
        ("bench_stl10", ["--labels-per-class", "0"], "--labels-per-class must be"),
        ("bench_stl10", ["--unlabeled-subset", "0"], "--unlabeled-subset must be"),
        ("bench_speed", ["--accuracy-recipe", "domain_adaptation"], "invalid choice"),
        ("bench_concurrency", ["--streams", "0"], "positive integers"),
        ("bench_concurrency", ["--precisions", "fp16"], "tf32 and/or bf16"),
        ("bench_concurrency", ["--fit-steps", "-1"], "--fit-steps takes 0"),
        ("bench_concurrency", ["--pool-size", "100"], "at least 200"),
    ],
)
def test_bench_invalid_arguments(bench, capsys, script, args, match):
    with pytest.raises(SystemExit) as excinfo:
        bench(script).parse_args(args)
    assert excinfo.value.code == 2
    assert match in capsys.readouterr().err


def test_source_digest_follows_the_files(bench, tmp_path):
    common = bench("_common")
    for folder in ("skassoc", "benchmarks"):
        (tmp_path / folder).mkdir()
    (tmp_path / "skassoc" / "a.py").write_text("x = 1\n")
    (tmp_path / "benchmarks" / "b.py").write_text("y = 2\n")
    first = common.source_digest(tmp_path)
    assert common.source_digest(tmp_path) == first
    (tmp_path / "skassoc" / "a.py").write_text("x = 2\n")
    assert common.source_digest(tmp_path) != first
    # Only Python sources count: result files may change freely.
    (tmp_path / "skassoc" / "a.py").write_text("x = 1\n")
    (tmp_path / "benchmarks" / "results.json").write_text("{}")
    assert common.source_digest(tmp_path) == first
    assert len(common.source_digest()) == 64


def test_common_helpers(bench):
    common = bench("_common")
    params = {"max_iter": 100_000, "lr_decay_steps": 60_000, "visit_weight": 0.25}
    short = common.shortened_schedule(params, 1000)
    assert short == {"max_iter": 1000, "lr_decay_steps": 600, "visit_weight": 0.25}
    assert params["max_iter"] == 100_000  # not modified in place
    assert common.shortened_schedule(params, 1)["lr_decay_steps"] == 1

    summary = common.summarize([3.0, 1.0, 2.0])
    assert summary == {"n": 3, "median": 2.0, "std": 1.0, "min": 1.0, "max": 3.0}
    assert common.summarize([4.0])["std"] is None
    assert common.summarize([])["median"] is None

    assert common.resolve_device("cpu").type == "cpu"
    with pytest.raises(SystemExit, match="is not a device"):
        common.resolve_device("tpu-ish")


def _da_file(path, runs, max_iter=100, device_type="cuda"):
    path.write_text(
        json.dumps(
            {
                "environment": {"device_type": device_type},
                "args": {"max_iter": max_iter, "source_size": 600},
                "runs": runs,
            }
        )
    )
    return path


def _da_run(seed, error, status="ok"):
    return {
        "pair": "synth-mnist",
        "condition": "adapted",
        "seed": seed,
        "params": {"max_iter": 100},
        "test_error_percent": error,
        "fit_seconds": 1.0,
        "status": status,
    }


def test_domain_adaptation_merge(bench, tmp_path):
    da = bench("bench_domain_adaptation")
    a = _da_file(tmp_path / "a.json", [_da_run(0, 2.0)])
    b = _da_file(tmp_path / "b.json", [_da_run(1, 4.0)])
    failed = _da_file(tmp_path / "f.json", [_da_run(1, 9.0, status="error")])
    merged = tmp_path / "m.json"
    da.merge([a, b, failed, a], merged)
    result = json.loads(merged.read_text())
    # a merged twice counts once; the failed rerun of seed 1 does not win.
    assert sorted(r["seed"] for r in result["runs"]) == [0, 1]
    assert result["table"][0]["test_error_percent"]["median"] == 3.0
    # Settings must agree, also with the args a merged file keeps.
    other = _da_file(tmp_path / "o.json", [_da_run(2, 1.0)], max_iter=200)
    with pytest.raises(SystemExit, match="--max-iter"):
        da.merge([merged, other], tmp_path / "x.json")
    with pytest.raises(SystemExit, match="devices"):
        da.merge([a, _da_file(tmp_path / "c.json", [], device_type="cpu")], None)
    with pytest.raises(SystemExit):
        da.parse_args(["--seeds", "0", "0"])


def test_bench_concurrency_needs_a_gpu(bench, monkeypatch):
    script = bench("bench_concurrency")
    monkeypatch.setattr(script.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="needs a GPU"):
        script.main(["--steps", "1"])


def test_bench_speed_smoke(bench, tmp_path, capsys, monkeypatch, torch_single_thread):
    if not (MNIST_DIR / "train-images-idx3-ubyte.gz").is_file():
        pytest.skip(f"real MNIST files not found in {MNIST_DIR}")
    script = bench("bench_speed")
    recipe_params = script.recipe_params
    requested = []

    def recording_recipe_params(name):
        requested.append(name)
        return recipe_params(name)

    monkeypatch.setattr(script, "recipe_params", recording_recipe_params)
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
            f"--json={tmp_path / 'speed.json'}",
        ]
    )
    # (b) fits the paper's recipe; the fit of (c) the recipe asked for.
    assert requested[-1] == "improved" and "paper" in requested[:-1]
    results = json.loads((tmp_path / "speed.json").read_text())
    assert results["training"]["skassoc"]["steps_per_s"] > 0
    accuracy = results["time_to_accuracy"]
    assert accuracy["recipe"] == "improved"
    assert [fit["max_iter"] for fit in accuracy["fits"]] == [3]
    assert "recipe 'improved'" in capsys.readouterr().out


def test_bench_concurrency_measures_each_setting_once(bench):
    args = bench("bench_concurrency").parse_args(
        ["--streams", "8", "2", "8", "--precisions", "bf16", "tf32", "bf16"]
    )
    assert args.streams == [2, 8]
    assert args.precisions == ["bf16", "tf32"]


def test_bench_concurrency_skassoc_fits_in_threads(
    bench, torch_single_thread, monkeypatch
):
    # Part (d) on the CPU: the same fits, one after another and in threads.
    import threading

    script = bench("bench_concurrency")
    fits = []
    fit = script.SemiSupervisedAssociationClassifier.fit

    def recording_fit(self, X, y):
        fits.append((threading.get_ident(), self.max_iter, self.random_state))
        return fit(self, X, y)

    monkeypatch.setattr(
        script.SemiSupervisedAssociationClassifier, "fit", recording_fit
    )
    args = script.parse_args(
        ["--streams", "2", "--fit-steps", "2", "--pool-size", "200"]
    )
    X, y = script.synthetic_images(args.pool_size)
    assert X.shape == (200, 28, 28) and X.dtype == np.uint8
    assert (y != -1).sum() == 100 and np.bincount(y[y != -1]).tolist() == [10] * 10
    rows = script.measure_fits("fp32", args, "cpu")
    assert [row["fits"] for row in rows] == [1, 2]
    serial, threads = rows
    assert threads["serial_s"] == pytest.approx(2 * serial["serial_s"])
    assert threads["speedup"] == pytest.approx(
        threads["serial_s"] / threads["threads_s"]
    )
    assert threads["ms_per_step"] == pytest.approx(threads["threads_s"] / 4 * 1e3)
    # A warm-up fit, two fits one after another in this thread, then two
    # fits at once, each in a thread of its own.
    main = threading.get_ident()
    assert [(t == main, steps, seed) for t, steps, seed in fits[:3]] == [
        (True, 2, 0),
        (True, 2, 0),
        (True, 2, 1),
    ]
    threaded = fits[3:]
    assert sorted(seed for _, _, seed in threaded) == [0, 1]
    assert len({t for t, _, _ in threaded} - {main}) == 2
