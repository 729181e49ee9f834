"""Spreading a search over several GPUs: one dask worker per GPU.

Each worker process sees one GPU (``CUDA_VISIBLE_DEVICES``), so the
estimator's ``device="cuda"`` means "this worker's GPU" and joblib's dask
backend hands the search's fits to whichever worker is free. Skipped without
at least two GPUs or without dask.distributed.
"""

import os

import joblib
import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import GridSearchCV

from skassoc import SemiSupervisedAssociationClassifier

dask = pytest.importorskip("dask")
distributed = pytest.importorskip("distributed")

N_GPUS = torch.cuda.device_count()
pytestmark = pytest.mark.skipif(N_GPUS < 2, reason="needs two or more GPUs")


@pytest.fixture(scope="module")
def gpu_client():
    workers = {
        f"gpu{k}": {
            "cls": distributed.Nanny,
            "options": {
                "nthreads": 1,
                "env": {"CUDA_VISIBLE_DEVICES": str(k), "OMP_NUM_THREADS": "1"},
            },
        }
        for k in range(N_GPUS)
    }
    scheduler = {
        "cls": distributed.Scheduler,
        "options": {"dashboard_address": "127.0.0.1:0"},
    }
    with dask.config.set({"distributed.worker.multiprocessing-method": "spawn"}):
        with distributed.SpecCluster(workers=workers, scheduler=scheduler) as cluster:
            with distributed.Client(cluster) as client:
                client.wait_for_workers(N_GPUS)
                yield client


def test_each_worker_owns_one_gpu(gpu_client):
    def visible():
        import torch

        return os.environ["CUDA_VISIBLE_DEVICES"], torch.cuda.device_count()

    seen = gpu_client.run(visible)
    assert sorted(gpu for gpu, _ in seen.values()) == [str(k) for k in range(N_GPUS)]
    assert all(count == 1 for _, count in seen.values())


def test_grid_search_spreads_over_the_gpus(gpu_client):
    X, y = load_digits(return_X_y=True)
    X = (X * 15).astype(np.uint8).reshape(-1, 8, 8)
    y_semi = np.where(np.arange(len(y)) % 5 == 0, y, -1)
    labeled = np.flatnonzero(y_semi != -1)
    unlabeled = np.flatnonzero(y_semi == -1)
    # Score on labeled samples held out of training.
    cv = [
        (np.concatenate([labeled[k::2], unlabeled]), labeled[1 - k :: 2])
        for k in range(2)
    ]

    def gpu_of_fit(estimator, X, y):
        # Runs where the estimator was fitted: the worker's one GPU.
        assert estimator.device_.type == "cuda"
        return int(os.environ["CUDA_VISIBLE_DEVICES"])

    search = GridSearchCV(
        SemiSupervisedAssociationClassifier(
            max_iter=300, device="cuda", random_state=0, labeled_per_class=5
        ),
        {"visit_weight": [0.25, 0.5, 1.0, 2.0], "walker_weight": [0.5, 1.0]},
        scoring={"accuracy": "accuracy", "gpu": gpu_of_fit},
        refit=False,
        cv=cv,
    )
    with joblib.parallel_backend("dask"):
        search.fit(X, y_semi)
    gpus = np.concatenate(
        [search.cv_results_[f"split{k}_test_gpu"] for k in range(2)]
    ).astype(int)
    assert set(gpus.tolist()) == set(range(N_GPUS))
    assert search.cv_results_["mean_test_accuracy"].max() > 0.8


def test_stacked_search_trains_each_folds_group_on_a_worker(gpu_client):
    """StackedGridSearchCV hands each fold's stacked candidates to joblib:
    under the Dask backend, the folds train on the workers' GPUs."""
    from skassoc.model_selection import (
        SemiSupervisedStratifiedKFold,
        StackedGridSearchCV,
    )

    X, y = load_digits(return_X_y=True)
    X = (X * 15).astype(np.uint8).reshape(-1, 8, 8)
    y_semi = np.where(np.arange(len(y)) % 5 == 0, y, -1)
    estimator = SemiSupervisedAssociationClassifier(
        max_iter=300, device="cuda", random_state=0, labeled_per_class=5
    )
    grid = {"visit_weight": [0.5, 1.0], "walker_weight": [0.5, 1.0]}
    cv = SemiSupervisedStratifiedKFold(N_GPUS)
    local = StackedGridSearchCV(estimator, grid, cv=cv, refit=False).fit(X, y_semi)
    with joblib.parallel_backend("dask"):
        spread = StackedGridSearchCV(estimator, grid, cv=cv, refit=False, n_jobs=-1)
        spread.fit(X, y_semi)
    # Other GPUs round differently: the same scores within a few samples.
    np.testing.assert_allclose(
        spread.cv_results_["mean_test_score"],
        local.cv_results_["mean_test_score"],
        atol=0.02,
    )

    def gpu_of_fold(estimator, X, y):
        # Scored where the fold trained: the worker's one GPU.
        return int(os.environ.get("CUDA_VISIBLE_DEVICES", "-1"))

    with joblib.parallel_backend("dask"):
        where = StackedGridSearchCV(
            estimator, grid, cv=cv, refit=False, n_jobs=-1, scoring=gpu_of_fold
        ).fit(X, y_semi)
    gpus = {int(where.cv_results_[f"split{k}_test_score"][0]) for k in range(N_GPUS)}
    assert len(gpus) > 1, gpus
