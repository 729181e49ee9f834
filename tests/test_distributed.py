"""Hyperparameter search on a dask.distributed cluster through joblib.

A real ``LocalCluster`` with two worker processes stands in for a cluster of
machines: the search's fits travel to the workers exactly as they would to
workers on other hosts.
"""

import os

import joblib
import numpy as np
import pytest
from sklearn.datasets import load_digits
from sklearn.model_selection import GridSearchCV, StratifiedKFold

import skassoc
from skassoc import SemiSupervisedAssociationClassifier
from skassoc.datasets import make_semi_supervised_labels

dask = pytest.importorskip("dask")
distributed = pytest.importorskip("distributed")

pytestmark = pytest.mark.usefixtures("torch_single_thread")

N_WORKERS = 2
PARAM_GRID = {"visit_weight": [0.0, 1.0], "walker_weight": [0.0, 1.0]}


@pytest.fixture(scope="module")
def client():
    """A client of a two-process LocalCluster, closed after the module's tests.

    Workers are spawned, not forked (a forked child of a process that has
    started torch's threads can hang), and each runs torch on one thread.
    """
    with dask.config.set({"distributed.worker.multiprocessing-method": "spawn"}):
        with distributed.LocalCluster(
            n_workers=N_WORKERS,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            # No dashboard; the scheduler's small HTTP server on a free port
            # rather than 8787, which another cluster may hold.
            scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
            env={"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
        ) as cluster:
            with distributed.Client(cluster) as client:
                yield client


@pytest.fixture(scope="module")
def digits_semi():
    """400 digits with 6 labels per class (60 labeled, 340 unlabeled)."""
    X, y = load_digits(return_X_y=True)
    X, y = X[:400], y[:400]
    return X, y, make_semi_supervised_labels(y, 6, random_state=0)


def labeled_folds(y_semi, n_splits=2):
    """(train, test) pairs whose test folds hold labeled samples only."""
    labeled = np.flatnonzero(y_semi != -1)
    unlabeled = np.flatnonzero(y_semi == -1)
    folds = StratifiedKFold(n_splits, shuffle=True, random_state=0)
    return [
        (np.concatenate([labeled[train], unlabeled]), labeled[test])
        for train, test in folds.split(labeled, y_semi[labeled])
    ]


def make_search(y_semi):
    def fit_pid(estimator, X, y):
        # Scored in the process that fitted ``estimator``; cloudpickle ships
        # this local function to the workers by value.
        return os.getpid()

    clf = SemiSupervisedAssociationClassifier(
        network="mlp",
        hidden_layer_sizes=(16,),
        embedding_dim=8,
        labeled_per_class=3,
        unlabeled_batch_size=32,
        max_iter=30,
        learning_rate=1e-2,
        device="cpu",
        random_state=0,
    )
    return GridSearchCV(
        clf,
        PARAM_GRID,
        scoring={"accuracy": "accuracy", "pid": fit_pid},
        refit="accuracy",
        cv=labeled_folds(y_semi),
    )


def fit_pids(search):
    """The process ids that the fits of ``search`` reported, one per fit."""
    pids = [search.cv_results_[f"split{i}_test_pid"] for i in range(search.n_splits_)]
    pids = np.concatenate(pids)
    assert len(pids) == 4 * 2  # candidates times folds
    return set(pids.astype(int).tolist())


def test_workers_are_separate_single_threaded_processes(client):
    def describe_worker():
        import torch

        import skassoc

        return os.getpid(), torch.get_num_threads(), skassoc.__file__

    workers = client.run(describe_worker)
    assert len(workers) == N_WORKERS
    pids = {pid for pid, _, _ in workers.values()}
    assert len(pids) == N_WORKERS
    assert os.getpid() not in pids
    for _, n_threads, module_file in workers.values():
        assert n_threads == 1
        # The workers run the code under test, not some other installed copy.
        assert module_file == skassoc.__file__


def test_grid_search_on_cluster_matches_local(client, digits_semi):
    X, y, y_semi = digits_semi

    local = make_search(y_semi).fit(X, y_semi)
    with joblib.parallel_backend("dask"):
        remote = make_search(y_semi).fit(X, y_semi)

    # Every fit ran on a worker process of the cluster, none in this one.
    worker_pids = set(client.run(os.getpid).values())
    assert fit_pids(local) == {os.getpid()}
    assert fit_pids(remote) <= worker_pids

    # CPU fits with an int random_state are deterministic, so the cluster
    # reproduces the local search score for score.
    for key in ["mean_test_accuracy", "split0_test_accuracy", "split1_test_accuracy"]:
        np.testing.assert_allclose(remote.cv_results_[key], local.cv_results_[key])
    # The grid is not degenerate: the candidates score differently.
    assert len(np.unique(local.cv_results_["mean_test_accuracy"])) > 1
    assert remote.best_params_ == local.best_params_
    assert remote.best_params_.keys() == PARAM_GRID.keys()

    assert remote.best_estimator_.n_iter_ == 30
    pred = remote.predict(X)
    assert pred.shape == (len(X),)
    assert set(pred) <= set(range(10))
    np.testing.assert_array_equal(pred, local.predict(X))
    # Trained on 30 labels per training fold, still far above chance (0.1).
    assert remote.score(X, y) > 0.3
