"""A fit's result does not depend on the caller's torch threads or on n_jobs."""

import numpy as np
import pytest
import torch
from sklearn.model_selection import GridSearchCV

import skassoc._classifier
import skassoc._fit
from skassoc import SemiSupervisedAssociationClassifier

IMAGE_FIT = {
    "network": "mnist",
    "embedding_dim": 8,
    "labeled_per_class": 2,
    "unlabeled_batch_size": 16,
    "max_iter": 4,
    "device": "cpu",
    "random_state": 0,
}


@pytest.fixture
def caller_threads():
    """Restore the process's torch thread count after the test."""
    previous = torch.get_num_threads()
    yield
    torch.set_num_threads(previous)


def fit_on_threads(n_threads, params, X, y):
    torch.set_num_threads(n_threads)
    clf = SemiSupervisedAssociationClassifier(**params).fit(X, y)
    assert torch.get_num_threads() == n_threads  # restored after the fit
    # Predict on one thread: only the fit is compared.
    torch.set_num_threads(1)
    return clf.predict_proba(X)


@pytest.mark.parametrize("network", ["mlp", "image"])
def test_fits_on_one_and_two_caller_threads_are_identical(
    caller_threads, fast_params, blobs_semi, digits_images, network
):
    if network == "mlp":
        params, (X, y) = fast_params, blobs_semi
    else:
        X, y = digits_images
        y = np.where(np.arange(len(y)) % 4 == 0, y, -1)
        params = IMAGE_FIT
    one = fit_on_threads(1, params, X, y)
    two = fit_on_threads(2, params, X, y)
    np.testing.assert_array_equal(one, two)


def test_fit_runs_on_one_thread_and_restores_the_callers(
    caller_threads, fast_params, blobs_semi, monkeypatch
):
    seen = []
    original = skassoc._fit.train

    def recording_train(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return original(*args, **kwargs)

    monkeypatch.setattr(skassoc._fit, "train", recording_train)
    torch.set_num_threads(2)
    SemiSupervisedAssociationClassifier(**fast_params).fit(*blobs_semi)
    assert seen == [1]
    assert torch.get_num_threads() == 2


def test_failing_fit_restores_the_callers_threads(
    caller_threads, fast_params, blobs_semi, monkeypatch
):
    def failing_train(*args, **kwargs):
        assert torch.get_num_threads() == 1
        raise RuntimeError("training failed")

    monkeypatch.setattr(skassoc._fit, "train", failing_train)
    torch.set_num_threads(2)
    with pytest.raises(RuntimeError, match="training failed"):
        SemiSupervisedAssociationClassifier(**fast_params).fit(*blobs_semi)
    assert torch.get_num_threads() == 2


def labeled_only_folds(y, n_folds=2):
    """Train on every unlabeled sample and the other folds' labeled ones."""
    labeled = np.flatnonzero(y != -1)
    unlabeled = np.flatnonzero(y == -1)
    folds = np.arange(len(labeled)) % n_folds
    return [
        (np.sort(np.r_[unlabeled, labeled[folds != k]]), labeled[folds == k])
        for k in range(n_folds)
    ]


def test_grid_search_results_do_not_depend_on_n_jobs(fast_params, blobs_semi):
    X, y = blobs_semi
    grid = {"learning_rate": [3e-3, 1e-2], "max_iter": [10, 20]}
    results = []
    for n_jobs in (1, 2):
        search = GridSearchCV(
            SemiSupervisedAssociationClassifier(**fast_params),
            grid,
            cv=labeled_only_folds(y),
            n_jobs=n_jobs,
        ).fit(X, y)
        results.append(search.cv_results_)
    np.testing.assert_array_equal(
        results[0]["mean_test_score"], results[1]["mean_test_score"]
    )
    np.testing.assert_array_equal(
        results[0]["rank_test_score"], results[1]["rank_test_score"]
    )
