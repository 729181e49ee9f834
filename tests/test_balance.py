"""The balance loss in the estimator: recorded, saved, checked."""

import numpy as np
import pytest

from skassoc import SemiSupervisedAssociationClassifier
from skassoc._stacked import fit_candidates


def test_balance_loss_is_recorded_and_changes_the_fit(fast_params, blobs_semi):
    X, y = blobs_semi
    plain = SemiSupervisedAssociationClassifier(**fast_params).fit(X, y)
    balanced = SemiSupervisedAssociationClassifier(**fast_params, balance_weight=5.0)
    balanced.fit(X, y)
    assert "balance" not in plain.history_
    assert all(np.isfinite(balanced.history_["balance"]))
    assert min(balanced.history_["balance"]) >= 0
    assert not np.allclose(balanced.predict_proba(X), plain.predict_proba(X))


def test_balance_weight_is_saved(fast_params, blobs_semi, tmp_path):
    X, y = blobs_semi
    clf = SemiSupervisedAssociationClassifier(**fast_params, balance_weight=2.0)
    clf.fit(X, y)
    clf.save(tmp_path / "m.skassoc")
    # On the CPU, where it was fitted ("auto" would pick a GPU where there is one).
    loaded = SemiSupervisedAssociationClassifier.load(
        tmp_path / "m.skassoc", device="cpu"
    )
    assert loaded.balance_weight == 2.0
    np.testing.assert_array_equal(loaded.predict_proba(X), clf.predict_proba(X))


def test_stacked_fits_refuse_a_bad_weight(fast_params, blobs_semi):
    X, y = blobs_semi
    estimator = SemiSupervisedAssociationClassifier(**fast_params, balance_weight=-1.0)
    with pytest.raises(ValueError, match=r"'balance_weight' parameter"):
        fit_candidates(estimator, [{"visit_weight": 0.5}], X, y)
