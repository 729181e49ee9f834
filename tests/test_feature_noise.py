"""Feature vectors' default augmentation: feature noise and the consistency loss."""

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from skassoc import SemiSupervisedAssociationClassifier
from skassoc._augmentation import FEATURE_NOISE, FeatureNoise, resolve_augmentation
from skassoc._stacked import fit_candidates


@pytest.fixture(scope="module")
def scaled_blobs(blobs_semi):
    """The shared blobs, with features of very different scales: the noise
    must follow each one's."""
    X, y = blobs_semi
    return X * np.array([1.0, 100.0, 0.01, 5.0]), y


@pytest.fixture(scope="module")
def digits():
    """8x8 digit images as flat rows (pass input_shape=(8, 8))."""
    X, y = load_digits(return_X_y=True)
    X, y = X[:200] * 16, y[:200].copy()
    y[40:] = -1
    return X, y


def _fit(fast_params, X, y, **params):
    return SemiSupervisedAssociationClassifier(**{**fast_params, **params}).fit(X, y)


def test_auto_means_feature_noise_for_feature_vectors_only():
    assert resolve_augmentation("auto", True) == FEATURE_NOISE
    assert resolve_augmentation("auto", False) is None
    assert resolve_augmentation({"feature_noise": 0.2}, True) == {
        "feature_noise": 0.2,
        "unlabeled": False,
    }
    with pytest.raises(ValueError, match=r"feature vectors take only"):
        resolve_augmentation({"feature_noise": 0.2, "affine_std": 0.1}, True)
    with pytest.raises(ValueError, match=r"'feature_noise'\] must be a finite"):
        resolve_augmentation({"feature_noise": -1.0}, True)


def test_feature_noise_follows_each_feature_scale():
    scale = torch.tensor([1.0, 10.0, 0.1])
    torch.manual_seed(0)
    noisy = FeatureNoise(0.5, scale)(torch.zeros(20_000, 3))
    np.testing.assert_allclose(noisy.std(dim=0), 0.5 * scale, rtol=0.03)
    assert (noisy.mean(dim=0).abs() < 0.02 * scale).all()
    # Zero noise returns the batch and draws no random numbers.
    x = torch.ones(4, 3)
    torch.manual_seed(0)
    out = FeatureNoise(0.0, scale)(x)
    next_draw = torch.rand(1)
    torch.manual_seed(0)
    assert out is x
    assert torch.equal(torch.rand(1), next_draw)


@pytest.mark.parametrize(
    "params",
    [
        {"augmentation": {"feature_noise": 0.0}},
        {"walker_weight": 0.0, "visit_weight": 0.0},
    ],
    ids=["no_noise", "no_walks"],
)
def test_auto_consistency_is_off_without_noise_or_walks(
    fast_params, scaled_blobs, params
):
    X, y = scaled_blobs
    clf = _fit(fast_params, X, y, **params)
    assert "consistency" not in clf.history_


def test_default_fit_of_feature_vectors_uses_noise_and_consistency(
    fast_params, scaled_blobs, digits
):
    X, y = scaled_blobs
    clf = _fit(fast_params, X, y, augmentation="auto", consistency_weight="auto")
    assert min(clf.history_["consistency"]) > 0
    # The parameters stay as given (scikit-learn's contract); only the fit
    # resolves them.
    assert clf.get_params()["consistency_weight"] == "auto"
    # Images get neither by default.
    X_images, y_images = digits
    images = _fit(fast_params, X_images, y_images, input_shape=(8, 8))
    assert "consistency" not in images.history_


def test_zero_noise_fits_as_no_augmentation(fast_params, scaled_blobs):
    X, y = scaled_blobs
    plain = _fit(fast_params, X, y, augmentation=None, consistency_weight=0)
    silent = _fit(
        fast_params, X, y, augmentation={"feature_noise": 0.0}, consistency_weight=0
    )
    np.testing.assert_array_equal(silent.predict_proba(X), plain.predict_proba(X))
    noisy = _fit(
        fast_params, X, y, augmentation={"feature_noise": 0.5}, consistency_weight=0
    )
    assert not np.allclose(noisy.predict_proba(X), plain.predict_proba(X))


@pytest.mark.parametrize(
    "images, params, match",
    [
        (True, {"augmentation": {"feature_noise": 0.5}}, "needs 2-D X"),
        (
            True,
            {"network": "mlp", "augmentation": {"feature_noise": 0.5}},
            "needs 2-D X",
        ),
        (False, {"augmentation": "paper"}, "image augmentation needs image inputs"),
        (
            False,
            {"augmentation": None, "consistency_weight": 1.0},
            r"no augmentation .*\{'feature_noise': 0\.5\}",
        ),
    ],
)
def test_augmentation_that_does_not_suit_the_inputs_is_refused(
    fast_params, scaled_blobs, digits, images, params, match
):
    X, y = digits if images else scaled_blobs
    shape = {"input_shape": (8, 8)} if images else {}
    fitted = _fit(fast_params, X, y, **shape)
    before = fitted.predict_proba(X)
    with pytest.raises(ValueError, match=match):
        fitted.set_params(**params).fit(X, y)
    # The refused fit leaves the fitted model as it was.
    np.testing.assert_array_equal(fitted.predict_proba(X), before)


@pytest.mark.parametrize("stacking", ["vmap", "streams"])
def test_stacked_candidates_with_the_consistency_loss_equal_separate_fits(
    fast_params, scaled_blobs, stacking
):
    X, y = scaled_blobs
    estimator = SemiSupervisedAssociationClassifier(**fast_params)
    grid = [{"visit_weight": 0.5}, {"walker_weight": 2.0}]
    fitted = fit_candidates(estimator, grid, X, y, stacking=stacking)
    for params, stacked in zip(grid, fitted, strict=True):
        separate = _fit(fast_params, X, y, **params)
        np.testing.assert_allclose(
            stacked.predict_proba(X), separate.predict_proba(X), atol=1e-4
        )
        for loss in ("total", "consistency"):
            np.testing.assert_allclose(
                stacked.history_[loss], separate.history_[loss], rtol=1e-4
            )


def test_feature_noise_settings_are_saved(fast_params, scaled_blobs, tmp_path):
    X, y = scaled_blobs
    augmentation = {"feature_noise": 0.3, "unlabeled": True}
    clf = _fit(fast_params, X, y, augmentation=augmentation, consistency_weight=1.5)
    clf.save(tmp_path / "m.skassoc")
    loaded = SemiSupervisedAssociationClassifier.load(
        tmp_path / "m.skassoc", device="cpu"
    )
    assert loaded.get_params()["augmentation"] == augmentation
    assert loaded.consistency_weight == 1.5
    np.testing.assert_array_equal(loaded.predict_proba(X), clf.predict_proba(X))


def test_stacked_candidates_must_agree_on_the_auto_consistency(
    fast_params, scaled_blobs
):
    # Both weights at 0 switch "auto" off for that candidate only.
    X, y = scaled_blobs
    estimator = SemiSupervisedAssociationClassifier(**fast_params)
    grid = [{"walker_weight": 0.0, "visit_weight": 0.0}, {"walker_weight": 1.0}]
    with pytest.raises(ValueError, match=r"resolves to different weights \[0.0, 2.0\]"):
        fit_candidates(estimator, grid, X, y)
    fitted = fit_candidates(estimator.set_params(consistency_weight=0), grid, X, y)
    assert all("consistency" not in f.history_ for f in fitted)
