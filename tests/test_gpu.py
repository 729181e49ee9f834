"""The GPU code paths: CUDA graphs, precisions, augmentation, concurrency.

Skipped without CUDA; each test has a CPU counterpart elsewhere in the suite.
"""

import os
import pickle
import subprocess
import sys

import joblib
import numpy as np
import pytest
import torch
from scipy import sparse
from sklearn.datasets import load_digits
from sklearn.model_selection import GridSearchCV

from skassoc import SemiSupervisedAssociationClassifier
from skassoc._engine._sampling import AssociationBatchSampler
from skassoc.callbacks import Callback
from skassoc.datasets import make_synthetic_signals

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device"
)


@pytest.fixture(scope="module")
def digit_images():
    X, y = load_digits(return_X_y=True)
    X = (X * 15).astype(np.uint8).reshape(-1, 8, 8)
    y_semi = y.copy()
    y_semi[np.arange(len(y)) % 5 != 0] = -1
    return X, y, y_semi


def fit(X, y, **params):
    defaults = dict(max_iter=300, device="cuda", random_state=0, labeled_per_class=5)
    return SemiSupervisedAssociationClassifier(**{**defaults, **params}).fit(X, y)


def test_cuda_graph_trains_like_the_eager_loop(digit_images):
    X, y, y_semi = digit_images
    graph = fit(X, y_semi, cuda_graph=True, precision="fp32")
    eager = fit(X, y_semi, cuda_graph=False, precision="fp32")
    # Same recipe, same seed: the graph changes speed, not the result (beyond
    # the non-determinism of GPU kernels).
    assert abs(graph.score(X, y) - eager.score(X, y)) < 0.05
    assert graph.score(X, y) > 0.8
    assert len(graph.history_["step"]) == len(eager.history_["step"])


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_given_class_frequencies_inside_the_graph(digit_images, precision):
    # The visit loss's start weights live on the device before capture.
    X, y, y_semi = digit_images
    prior = np.linspace(1, 2, 10)
    graph = fit(X, y_semi, cuda_graph=True, precision=precision, class_prior=prior)
    eager = fit(X, y_semi, cuda_graph=False, precision=precision, class_prior=prior)
    assert np.isfinite(graph.history_["visit"]).all()
    np.testing.assert_allclose(
        graph.history_["visit"], eager.history_["visit"], rtol=0.05
    )
    assert graph.score(X, y) > 0.8


def test_epoch_dealing_reaches_the_captured_graph():
    # The host deals each step's unlabeled indices into a buffer that the
    # graph reads on every replay: replays must see every batch of a pass.
    classes = [torch.arange(0, 4), torch.arange(4, 8)]
    pool = torch.arange(8, 38)
    sampler = AssociationBatchSampler(classes, pool, 2, 7, "cuda", "epochs")
    seen = torch.zeros(7, dtype=torch.long, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        seen.copy_(sampler.sample()[1])
    dealt = []
    for _ in range(30):  # seven passes of 30 in batches of 7
        sampler.advance()
        graph.replay()
        dealt.append(seen.clone())
    for one_pass in torch.cat(dealt).cpu().reshape(7, 30):
        assert sorted(one_pass.tolist()) == pool.tolist()


def test_epochs_in_the_graph_train_like_the_eager_loop(digit_images, monkeypatch):
    X, y, y_semi = digit_images
    dealt = []
    advance = AssociationBatchSampler.advance

    def recording_advance(sampler):
        advance(sampler)
        dealt.append(sampler._unlabeled_batch.clone())

    monkeypatch.setattr(AssociationBatchSampler, "advance", recording_advance)
    params = dict(unlabeled_sampling="epochs", precision="fp32")
    graph = fit(X, y_semi, cuda_graph=True, **params)
    # The graph fit dealt a batch before each of its steps (warm-up ones and
    # replays), every unlabeled sample once an epoch.
    assert len(dealt) == graph.n_iter_
    pool = np.flatnonzero(y_semi == -1)
    stream = torch.cat(dealt).cpu().numpy()
    n_epochs = len(stream) // len(pool)
    assert n_epochs >= 1
    for one_epoch in stream[: n_epochs * len(pool)].reshape(n_epochs, len(pool)):
        np.testing.assert_array_equal(np.sort(one_epoch), pool)
    eager = fit(X, y_semi, cuda_graph=False, **params)
    assert abs(graph.score(X, y) - eager.score(X, y)) < 0.05
    assert graph.score(X, y) > 0.8


@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16"])
def test_precisions_train(digit_images, precision):
    X, y, y_semi = digit_images
    clf = fit(X, y_semi, precision=precision)
    assert np.isfinite(clf.history_["total"]).all()
    assert clf.score(X, y) > 0.8
    assert clf.predict_proba(X).dtype == np.float64


@pytest.mark.parametrize(
    "augmentation",
    [
        {"unlabeled": True},
        {"unlabeled": False},
        {"unlabeled": False, "elastic_alpha": 3.0, "elastic_sigma": 1.0},
    ],
    ids=["both_batches", "labeled_batch", "labeled_batch_elastic"],
)
def test_augmentation_and_average_inside_the_graph(digit_images, augmentation):
    X, y, y_semi = digit_images
    clf = fit(X, y_semi, augmentation=augmentation, ema_decay=0.99)
    assert clf.score(X, y) > 0.6


@pytest.mark.parametrize("unlabeled", [False, True], ids=["labeled_batch", "both"])
@pytest.mark.parametrize("precision", ["tf32", "bf16"])
def test_consistency_loss_inside_the_graph(digit_images, unlabeled, precision):
    # The loss is captured with the step, recorded and finite, and the fit
    # learns; what the loss does is tested on the CPU (test_consistency.py).
    X, y, y_semi = digit_images
    augmentation = {"unlabeled": unlabeled, "blur_probability": 0.0}
    clf = fit(
        X,
        y_semi,
        augmentation=augmentation,
        consistency_weight=1.0,
        precision=precision,
    )
    consistency = clf.history_["consistency"]
    assert np.isfinite(consistency).all()
    assert consistency[-1] < consistency[0]
    assert clf.score(X, y) > 0.6


@pytest.mark.parametrize(
    "max_iter, interval, expected", [(2, 1, [1, 2]), (300, 120, [120, 240, 300])]
)
@pytest.mark.parametrize("ema_decay", [None, 0.99])
def test_validation_between_graph_replays(
    digit_images, max_iter, interval, expected, ema_decay
):
    # Scores during the eager warm-up (2 steps) and between replays, with the
    # averaged weights swapped in and out of the captured parameters.
    X, y, y_semi = digit_images
    X_val, y_val = X[1::5], y[1::5]
    clf = SemiSupervisedAssociationClassifier(
        max_iter=max_iter,
        validation_interval=interval,
        ema_decay=ema_decay,
        device="cuda",
        random_state=0,
        labeled_per_class=5,
        class_prior="uniform",  # validation scores the network's own probabilities
    ).fit(X, y_semi, X_val=X_val, y_val=y_val)
    assert clf.history_["validation_step"] == expected
    last = clf.history_["validation_score"][-1]
    assert abs(last - clf.score(X_val, y_val)) <= 1 / len(y_val)
    if max_iter == 300:
        assert last > 0.8


@pytest.mark.parametrize("precision", ["tf32", "bf16"])
def test_compiled_network_inside_the_graph(digit_images, precision):
    X, y, y_semi = digit_images
    clf = fit(X, y_semi, precision=precision, compile=True)
    assert np.isfinite(clf.history_["total"]).all()
    assert clf.score(X, y) > 0.8


def test_divergence_is_caught_inside_the_graph(digit_images):
    X, _, y_semi = digit_images
    clf = SemiSupervisedAssociationClassifier(
        learning_rate=1e30, max_iter=50, device="cuda", random_state=0
    )
    with pytest.raises(FloatingPointError, match="step"):
        clf.fit(X, y_semi)
    assert not hasattr(clf, "model_")


@pytest.mark.parametrize("max_iter", [1, 2, 3, 4])
def test_runs_within_the_graph_warm_up_log_and_check_losses(digit_images, max_iter):
    # The graph is captured after 3 eager warm-up steps: shorter runs never
    # replay it, and still record their losses.
    X, _, y_semi = digit_images
    clf = fit(X, y_semi, max_iter=max_iter, lr_decay_steps=1)
    assert clf.history_["step"] == [max_iter]
    # The rate of the last step run, as on the CPU path.
    assert clf.history_["learning_rate"] == [
        pytest.approx(1e-3 * 0.33 ** (max_iter - 1))
    ]
    assert np.isfinite(clf.history_["total"]).all()
    if max_iter == 1:
        return  # the losses of step 1 come before any update
    diverging = SemiSupervisedAssociationClassifier(
        learning_rate=1e30, max_iter=max_iter, device="cuda", random_state=0
    )
    # Pixels up to 2.4e37: within the inputs fit accepts, and enough, with
    # that rate, to overflow the first steps.
    with pytest.raises(FloatingPointError, match="step"):
        diverging.fit(X.astype(np.float32) * 1e35, y_semi)


def test_model_of_a_missing_gpu_unpickles_on_this_one(digit_images):
    X, _, y_semi = digit_images
    clf = fit(X, y_semi, max_iter=5)
    expected = clf.predict_proba(X)
    clf.device_ = torch.device("cuda", torch.cuda.device_count())  # not here
    loaded = pickle.loads(pickle.dumps(clf))
    assert loaded.device_ == torch.device("cuda")
    np.testing.assert_allclose(loaded.predict_proba(X), expected, atol=1e-5)


def test_grid_search_with_parallel_fits_on_one_gpu(digit_images):
    X, y, _ = digit_images
    search = GridSearchCV(
        # Fully labeled data, on purpose: the unlabeled batch is drawn from
        # all samples.
        SemiSupervisedAssociationClassifier(
            max_iter=100, device="cuda", random_state=0, unlabeled_pool="all"
        ),
        {"visit_weight": [0.5, 1.0], "walker_weight": [0.5, 1.0]},
        cv=2,
        n_jobs=2,
    ).fit(X, y)
    assert search.best_score_ > 0.5


def test_cuda_model_unpickles_on_a_machine_without_cuda(digit_images, tmp_path):
    X, _, y_semi = digit_images
    clf = fit(X, y_semi, max_iter=20)
    path = tmp_path / "model.pkl"
    path.write_bytes(pickle.dumps(clf))
    np.save(tmp_path / "X.npy", X)
    np.save(tmp_path / "expected.npy", clf.predict_proba(X))
    # A fresh interpreter that sees no GPU at all. (The GPU computed in TF32,
    # the CPU computes in float32: probabilities agree to about 1e-3.)
    script = (
        "import pickle, numpy as np, torch; "
        "assert not torch.cuda.is_available(); "
        f"clf = pickle.loads(open({str(path)!r}, 'rb').read()); "
        "assert clf.device_.type == 'cpu'; "
        f"X = np.load({str(tmp_path / 'X.npy')!r}); "
        f"expected = np.load({str(tmp_path / 'expected.npy')!r}); "
        "np.testing.assert_allclose(clf.predict_proba(X), expected, atol=1e-2)"
    )
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-2000:]


def test_large_unlabeled_batch_fits_in_memory(digit_images):
    X, _, y_semi = digit_images
    clf = fit(X, y_semi, unlabeled_batch_size=20_000, max_iter=5)
    assert clf.n_iter_ == 5


def test_grid_search_in_threads_shares_one_gpu(digit_images):
    """Threads fit on streams of their own (and capture graphs side by side)."""
    X, y, _ = digit_images
    grid = {"visit_weight": [0.5, 1.0], "walker_weight": [0.5, 1.0]}
    estimator = SemiSupervisedAssociationClassifier(
        max_iter=200,
        device="cuda",
        random_state=0,
        precision="fp32",
        unlabeled_pool="all",  # fully labeled data, on purpose
    )
    with joblib.parallel_backend("threading", n_jobs=4):
        threaded = GridSearchCV(estimator, grid, cv=2).fit(X, y)
    serial = GridSearchCV(estimator, grid, cv=2, n_jobs=1).fit(X, y)
    np.testing.assert_allclose(
        threaded.cv_results_["mean_test_score"],
        serial.cv_results_["mean_test_score"],
        atol=0.05,
    )
    assert threaded.best_score_ > 0.7


def test_memory_mapped_pool_feeds_the_graph(digit_images, tmp_path):
    X, y, y_semi = digit_images
    np.save(tmp_path / "X.npy", X)
    mapped = np.load(tmp_path / "X.npy", mmap_mode="r")
    from_disk = fit(mapped, y_semi, precision="fp32")
    in_memory = fit(X, y_semi, precision="fp32")
    assert abs(from_disk.score(X, y) - in_memory.score(X, y)) < 0.05
    assert from_disk.score(X, y) > 0.8


def test_image_format_on_the_gpu(digit_images):
    X, y, y_semi = digit_images
    clf = fit(X, y_semi, image_size=32, image_channels=3)
    assert clf.network_ == "svhn"
    assert clf.score(X, y) > 0.7


def test_walker_products_ignore_tf32():
    from skassoc._engine._losses import association_matrices

    generator = torch.Generator().manual_seed(0)
    # Dot products of a few tens, as between trained embeddings: TF32's
    # 10-bit mantissas move them by hundredths, and P_ab by percents.
    a = torch.randn(100, 128, generator=generator) * 1.5
    b = torch.randn(120, 128, generator=generator) * 1.5
    expected = association_matrices(a.double(), b.double())
    allowed = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        plain = (a.cuda() @ b.cuda().T).double().cpu()
        got = association_matrices(a.cuda(), b.cuda())
    finally:
        torch.backends.cuda.matmul.allow_tf32 = allowed
    if torch.allclose(plain, a.double() @ b.double().T, rtol=1e-5, atol=1e-5):
        pytest.skip("this GPU computes float32 products without TF32")
    for p, p_expected in zip(got, expected):
        assert p.dtype == torch.float32
        torch.testing.assert_close(p.cpu().double(), p_expected, rtol=1e-4, atol=1e-7)


class _Reader(Callback):
    """Reads the model's weights (a host copy) at every log point."""

    def __init__(self):
        self.norms = []

    def on_log(self, run):
        with run.fitted_weights():
            self.norms.append(float(run.model.logits.weight.detach().norm()))


@pytest.mark.parametrize("ema_decay", [None, 0.99])
def test_callbacks_run_between_graph_replays(digit_images, ema_decay):
    """A callback that reads the weights between replays changes nothing
    (beyond the non-determinism of GPU kernels between two fits)."""
    X, y, y_semi = digit_images
    reader = _Reader()
    plain = fit(X, y_semi, precision="fp32", ema_decay=ema_decay)
    watched = fit(X, y_semi, precision="fp32", ema_decay=ema_decay, callbacks=[reader])
    assert len(reader.norms) == len(watched.history_["step"])
    assert abs(watched.score(X, y) - plain.score(X, y)) < 0.02
    np.testing.assert_allclose(
        watched.history_["total"], plain.history_["total"], rtol=0.05
    )


def test_a_run_continues_on_the_gpu_within_rounding(digit_images, tmp_path):
    """Stopped, checkpointed, loaded and continued: the uninterrupted model."""
    from skassoc.callbacks import Checkpoint

    class StopAt(Callback):
        def on_log(self, run):
            if run.step >= 150:
                run.stop()

    X, y, y_semi = digit_images
    params = dict(precision="fp32", ema_decay=0.99, augmentation="paper")
    straight = fit(X, y_semi, **params)
    path = tmp_path / "run.skassoc"
    fit(X, y_semi, **params, callbacks=[StopAt(), Checkpoint(path, every=100)])
    resumed = SemiSupervisedAssociationClassifier.load(path, device="cuda")
    assert resumed.n_iter_ == 150
    # The precision of the fits it is compared with, said outright.
    resumed.set_params(warm_start=True, precision="fp32").fit(X, y_semi)
    assert resumed.n_iter_ == 300
    # Within the rounding of GPU kernels, which two uninterrupted fits
    # differ by too.
    np.testing.assert_allclose(
        resumed.predict_proba(X), straight.predict_proba(X), atol=1e-2
    )
    assert np.mean(resumed.predict(X) == straight.predict(X)) > 0.99


@pytest.mark.parametrize(
    "settings",
    [{"balance_weight": 1.0}, {"class_weight": "balanced", "ema_decay": 0.99}],
)
def test_stacked_candidates_with_every_setting_inside_the_graph(digit_images, settings):
    from skassoc._stacked import fit_candidates

    X, y, y_semi = digit_images
    params = dict(
        max_iter=200,
        device="cuda",
        random_state=0,
        labeled_per_class=5,
        precision="fp32",
        **settings,
    )
    grid = [{"visit_weight": 0.5}, {"visit_weight": 1.0}]
    stacked = fit_candidates(
        SemiSupervisedAssociationClassifier(**params), grid, X, y_semi
    )
    for candidate, est in zip(grid, stacked, strict=True):
        separate = SemiSupervisedAssociationClassifier(**params, **candidate)
        separate.fit(X, y_semi)
        # GPU kernels round the two ways differently: close, not equal.
        np.testing.assert_allclose(
            est.predict_proba(X), separate.predict_proba(X), atol=1e-2
        )
        assert np.mean(est.predict(X) == separate.predict(X)) > 0.99


@pytest.fixture(scope="module")
def two_channel_signals():
    X, y = make_synthetic_signals(300, length=64, random_state=0)
    X = np.concatenate([X, np.cumsum(X, axis=-1) / 8], axis=1)  # (n, 2, 1, 64)
    y_semi = np.where(np.arange(len(y)) % 10 == 0, y, -1)
    return X, y, y_semi


def test_signal_network_and_augmentation_inside_the_graph(two_channel_signals):
    # The signal augmentation draws its shifts, warps and noise on the
    # device and is captured with the step; graph and eager loop agree.
    X, y, y_semi = two_channel_signals
    params = dict(precision="fp32", labeled_per_class=3)
    graph = fit(X, y_semi, cuda_graph=True, **params)
    eager = fit(X, y_semi, cuda_graph=False, **params)
    assert graph.network_ == "signal"
    assert abs(graph.score(X, y) - eager.score(X, y)) < 0.1
    assert graph.score(X, y) > 0.6
    np.testing.assert_allclose(
        graph.history_["walker"], eager.history_["walker"], rtol=0.3
    )


def test_sparse_rows_train_and_predict_on_the_gpu(digit_images):
    # Sparse rows are gathered on the host and multiplied sparsely on the
    # device; the model predicts from sparse and dense rows alike.
    X, y, y_semi = digit_images
    rows = sparse.csr_matrix(X.reshape(len(X), -1).astype(np.float32))
    clf = fit(rows, y_semi)
    assert clf.network_ == "sparse_mlp"
    assert clf.score(rows, y) > 0.8
    # The dense rows' first product runs on TF32 tensor cores, the sparse
    # one in float32: equal within TF32's rounding.
    np.testing.assert_allclose(
        clf.predict_proba(rows), clf.predict_proba(rows.toarray()), atol=5e-3
    )
    assert np.mean(clf.predict(rows) == clf.predict(rows.toarray())) > 0.99
