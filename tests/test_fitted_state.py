"""A fitted model is never lost, mixed with another, or silently wrong."""

import sys
import threading
import warnings

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.utils._param_validation import InvalidParameterError

import skassoc._classifier
import skassoc._engine._builtin
import skassoc._engine._optim
import skassoc._engine._step
import skassoc._fit
from skassoc import SemiSupervisedAssociationClassifier

pytestmark = pytest.mark.usefixtures("torch_single_thread")


def make_clf(fast_params, **overrides):
    return SemiSupervisedAssociationClassifier(**{**fast_params, **overrides})


@pytest.fixture
def paused_training(monkeypatch):
    """Hold every fit at its training call until the test releases it."""
    started, release = threading.Event(), threading.Event()
    original = skassoc._fit.train

    def train(*args, **kwargs):
        started.set()
        assert release.wait(60)
        return original(*args, **kwargs)

    monkeypatch.setattr(skassoc._fit, "train", train)
    return started, release


def test_refit_changes_nothing_until_training_succeeds(
    labeled_params, blobs, paused_training, tmp_path
):
    """Readers in other threads see the old model whole while a refit runs."""
    X, y = blobs
    frame = pd.DataFrame(X, columns=list("abcd"))
    clf = make_clf(labeled_params)
    started, release = paused_training
    release.set()
    clf.fit(frame, y)
    expected = clf.predict(frame)
    release.clear()
    started.clear()
    # The refit sees the columns in another order and other classes.
    swapped = frame[list("dcba")]
    refit = threading.Thread(target=clf.fit, args=(swapped, y + 10))
    refit.start()
    try:
        assert started.wait(60)
        assert list(clf.feature_names_in_) == list("abcd")
        np.testing.assert_array_equal(clf.classes_, np.unique(y))
        np.testing.assert_array_equal(clf.predict(frame), expected)
        clf.save(tmp_path / "during.skassoc")
    finally:
        release.set()
        refit.join()
    during = SemiSupervisedAssociationClassifier.load(
        tmp_path / "during.skassoc", device="cpu"
    )
    np.testing.assert_array_equal(during.predict(frame), expected)
    assert list(clf.feature_names_in_) == list("dcba")
    np.testing.assert_array_equal(clf.classes_, np.unique(y) + 10)


def test_interrupt_before_the_first_step_keeps_the_previous_model(
    labeled_params, blobs, monkeypatch
):
    X, y = blobs
    clf = make_clf(labeled_params).fit(X, y)
    model, proba = clf.model_, clf.predict_proba(X)

    def interrupted(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(skassoc._engine._step.AssociationStep, "__call__", interrupted)
    with pytest.raises(KeyboardInterrupt):
        clf.fit(X[:, ::-1], y)
    assert clf.model_ is model
    np.testing.assert_array_equal(clf.predict_proba(X), proba)


def test_concurrent_fits_of_one_estimator_leave_it_whole(labeled_params, blobs):
    X, y = blobs
    clf = make_clf(labeled_params, max_iter=20)
    inputs = [(X, y), (np.hstack([X, X]), y), (X[:, :3], y)]
    errors = []

    def fit(data):
        try:
            clf.fit(*data)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=fit, args=(d,)) for d in inputs * 2]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    # Whichever fit finished last, its attributes belong together.
    n_features = clf.n_features_in_
    assert clf.model_.embedder.layers[0].in_features == n_features
    assert clf.predict(np.zeros((2, n_features))).shape == (2,)


@pytest.mark.parametrize("method", ["predict", "predict_proba", "transform"])
def test_a_bad_predict_batch_size_set_after_fit_is_refused(
    labeled_params, blobs, method
):
    X, y = blobs
    clf = make_clf(labeled_params).fit(X, y)
    clf.set_params(predict_batch_size=-5)
    with pytest.raises(InvalidParameterError, match="predict_batch_size"):
        getattr(clf, method)(X)


def test_predictions_never_touch_the_warning_filters(
    labeled_params, blobs, monkeypatch
):
    """warnings.catch_warnings swaps process-wide filters: not thread-safe."""
    X, y = blobs
    clf = make_clf(labeled_params).fit(X, y)
    read_only = X.copy()
    read_only.setflags(write=False)
    callers = []

    class Recording(warnings.catch_warnings):
        def __init__(self, *args, **kwargs):
            callers.append(sys._getframe(1).f_globals.get("__name__", ""))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(warnings, "catch_warnings", Recording)
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        clf.predict(read_only)
        clf.transform(read_only)
    assert [c for c in callers if c.startswith("skassoc")] == []
    assert shown == []


def test_nan_probabilities_raise(labeled_params, blobs):
    X, y = blobs
    clf = make_clf(labeled_params).fit(X, y)
    with torch.no_grad():
        clf.model_.logits.weight.fill_(float("nan"))
    with pytest.raises(ValueError, match="NaN"):
        clf.predict(X)


def test_predict_proba_is_float64(labeled_params, blobs):
    X, y = blobs
    proba = make_clf(labeled_params).fit(X, y).predict_proba(X)
    assert proba.dtype == np.float64
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-12)


class _Flat(torch.nn.Module):
    """A linear map of 4 features to ``width`` outputs.

    A bare weight, not a ``Linear``: torch warns when it initialises a Linear
    with zero outputs.
    """

    def __init__(self, width, dtype=torch.float32):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(width, 4, dtype=dtype))

    def forward(self, x):
        return torch.nn.functional.linear(x, self.weight)


@pytest.mark.parametrize(
    "module, match",
    [
        (_Flat(0), "embedding_dim >= 1"),
        (_Flat(8, dtype=torch.float64), "float64"),
        (_Flat(8).to("meta"), "meta device"),
    ],
)
def test_bad_custom_modules_get_clear_errors(fast_params, blobs, module, match):
    X, y = blobs
    with pytest.raises(ValueError, match=match):
        make_clf(fast_params, network=module).fit(X, y)


@pytest.mark.parametrize(
    "convert",
    [
        lambda X: torch.tensor(X, dtype=torch.float32, requires_grad=True),
        lambda X: torch.tensor(X, dtype=torch.bfloat16),
        lambda X: X.astype(">f8"),
    ],
    ids=["requires_grad", "bfloat16", "big_endian"],
)
def test_unusual_input_types_just_work(labeled_params, blobs, convert):
    X, y = blobs
    clf = make_clf(labeled_params).fit(convert(X), y)
    assert clf.predict(convert(X)).shape == (len(X),)


def test_big_endian_memory_maps_just_work(fast_params, digits, tmp_path):
    X, y = digits
    mapped = np.lib.format.open_memmap(
        tmp_path / "X.npy", mode="w+", dtype=">f4", shape=X.shape
    )
    mapped[:] = X
    y_semi = np.where(np.arange(len(y)) % 3 == 0, y, -1)
    from_map = make_clf(fast_params).fit(mapped, y_semi)
    from_array = make_clf(fast_params).fit(X.astype(np.float32), y_semi)
    np.testing.assert_allclose(
        from_map.predict_proba(mapped), from_array.predict_proba(X), atol=1e-6
    )


def test_torch_datasets_are_refused_with_advice(fast_params, blobs):
    X, y = blobs
    dataset = torch.utils.data.TensorDataset(torch.tensor(X), torch.tensor(y))
    for data in (dataset, torch.utils.data.DataLoader(dataset)):
        with pytest.raises(TypeError, match="one array"):
            make_clf(fast_params).fit(data, y)


def test_sparse_input_of_another_format_than_csr_or_csc_is_refused(fast_params, blobs):
    from scipy import sparse

    X, y = blobs
    with pytest.raises(TypeError, match="tocsr"):
        make_clf(fast_params).fit(sparse.coo_matrix(X), y)


def test_unsigned_labels_that_wrapped_round_warn(labeled_params, blobs):
    X, y = blobs
    y_uint8 = y.astype(np.uint8)
    wrapped = np.where(np.arange(len(y)) % 3 == 0, y_uint8, np.uint8(255))
    with pytest.warns(UserWarning, match="-1 wrapped round"):
        make_clf(labeled_params).fit(X, wrapped)


def test_a_step_too_large_for_memory_is_refused_before_training(
    fast_params, blobs, monkeypatch
):
    X, y = blobs
    monkeypatch.setattr(
        skassoc._classifier, "available_memory_bytes", lambda device: 2**20
    )

    def step(self):  # pragma: no cover - must not run
        raise AssertionError("training started")

    monkeypatch.setattr(skassoc._engine._step.AssociationStep, "__call__", step)
    with pytest.raises(ValueError, match=r"GiB .*unlabeled_batch_size"):
        make_clf(fast_params, unlabeled_batch_size=20_000).fit(X, y)


def test_the_real_memory_check_refuses_absurd_batches(fast_params, blobs):
    X, y = blobs
    with pytest.raises(ValueError, match="One training step needs about"):
        make_clf(fast_params, labeled_per_class=10**7, embedding_dim=1024).fit(X, y)
