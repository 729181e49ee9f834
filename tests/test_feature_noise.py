"""Feature vectors' default augmentation: feature noise and the consistency loss."""

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from skassoc import SemiSupervisedAssociationClassifier
from skassoc._defaults import (
    MAX_FEATURE_NOISE,
    NOISE_PER_SPACING,
    SPACING_MIN_ROWS,
    SPACING_ROWS,
    SPACING_VALUES,
    auto_feature_noise,
)
from skassoc._engine._augmentation import (
    FEATURE_NOISE,
    FeatureNoise,
    resolve_augmentation,
)
from skassoc._nn._networks import MLPNet
from skassoc._settings import fit_seed
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
    assert FEATURE_NOISE == {"feature_noise": "auto", "unlabeled": False}
    assert resolve_augmentation("auto", False) is None
    assert resolve_augmentation({"feature_noise": 0.2}, True) == {
        "feature_noise": 0.2,
        "unlabeled": False,
    }
    with pytest.raises(ValueError, match=r"feature vectors take only"):
        resolve_augmentation({"feature_noise": 0.2, "affine_std": 0.1}, True)
    with pytest.raises(ValueError, match=r"'feature_noise'\] must be a finite"):
        resolve_augmentation({"feature_noise": -1.0}, True)


def test_auto_noise_reaches_the_nearest_neighbour():
    # Samples 1 apart on a line: the nearest one is 1 / std standardised
    # units away. A second column, the first rescaled, doubles neither
    # the noise (distances grow by sqrt(2), as does the feature count) nor
    # depends on its scale.
    line = np.arange(100.0)[:, None]
    expected = NOISE_PER_SPACING / line.std()
    assert auto_feature_noise(line, seed=0) == pytest.approx(expected)
    both = np.hstack([line, 1e4 * line - 7])
    assert auto_feature_noise(both, seed=0) == pytest.approx(expected)
    # Denser samples get less noise; duplicates do not count as neighbours.
    denser = np.arange(0, 100, 0.5)[:, None]
    assert auto_feature_noise(denser, seed=0) == pytest.approx(expected / 2, rel=0.01)
    assert auto_feature_noise(np.repeat(line, 3, axis=0), seed=0) == pytest.approx(
        expected
    )
    assert auto_feature_noise(np.ones((50, 3)), seed=0) == 0.0


def test_auto_noise_ignores_constant_features_and_rounding_copies():
    X = np.random.default_rng(0).normal(size=(300, 5))
    noise = auto_feature_noise(X, seed=0)
    padded = np.hstack([X, np.zeros((300, 20)), np.full((300, 1), 7.0)])
    assert auto_feature_noise(padded, seed=0) == pytest.approx(noise)
    # Copies that differ by rounding only are duplicates, not neighbours.
    jittered = np.vstack([X, X + 1e-12])
    assert auto_feature_noise(jittered, seed=0) == pytest.approx(noise, rel=0.05)


def test_constants_that_round_in_float64_stay_constant(tmp_path, write_memmap):
    # The float64 mean of 0.1s is not exactly 0.1, so their deviation is
    # tiny but not 0: they still neither count nor get scaled.
    rng = np.random.default_rng(0)
    X = np.hstack([rng.normal(size=(1000, 5)), np.full((1000, 5), 0.1)])
    assert X[:, 5].std() > 0
    noise = auto_feature_noise(X[:, :5], seed=0)
    assert auto_feature_noise(X, seed=0) == pytest.approx(noise)
    network = MLPNet(10)
    network.fit_normalization(write_memmap(tmp_path / "x.npy", X))
    assert (network.scale[5:] == 1).all() and (network.scale[:5] != 1).all()


def test_auto_noise_is_bounded():
    # Two distinct rows lie far apart once standardised.
    two_rows = np.repeat([[0.0, 1.0], [1.0, 0.0]], 50, axis=0)
    assert auto_feature_noise(two_rows, seed=0) == MAX_FEATURE_NOISE
    assert resolve_augmentation({"feature_noise": "auto"}, True) == {
        "feature_noise": "auto",
        "unlabeled": False,
    }
    with pytest.raises(ValueError, match=r"number >= 0 or 'auto'; got array"):
        resolve_augmentation({"feature_noise": np.array([0.5, 1.0])}, True)


class _RowReader:
    """An array that records how many rows are read from it."""

    def __init__(self, array):
        self.array, self.shape, self.rows_read = array, array.shape, 0

    def __getitem__(self, rows):
        self.rows_read += len(rows)
        return self.array[rows]


def test_auto_noise_reads_few_rows_of_large_or_wide_data(monkeypatch):
    rng = np.random.default_rng(0)
    tall = _RowReader(rng.normal(size=(SPACING_ROWS + 1000, 3)))
    noise = auto_feature_noise(tall, seed=0)
    assert tall.rows_read == SPACING_ROWS
    # Other rows, about the same spacing.
    assert auto_feature_noise(tall.array, seed=1) == pytest.approx(noise, rel=0.1)
    # Room for 100 values: 10 rows of 10 features, but never fewer than
    # SPACING_MIN_ROWS rows.
    monkeypatch.setattr("skassoc._defaults.SPACING_VALUES", 100)
    wide = _RowReader(rng.normal(size=(SPACING_MIN_ROWS + 100, 10)))
    auto_feature_noise(wide, seed=0)
    assert wide.rows_read == SPACING_MIN_ROWS


def test_auto_noise_of_wide_rows_is_that_of_narrow_ones():
    # A line of 40 points, each feature repeated: the same spacing per
    # feature, measured on all 40 rows however wide they are.
    line = np.arange(40.0)[:, None]
    wide = np.repeat(line.astype(np.float32), SPACING_VALUES // 10, axis=1)
    expected = NOISE_PER_SPACING / line.std()
    assert auto_feature_noise(wide, seed=0) == pytest.approx(expected, rel=1e-5)


def test_auto_noise_reads_a_memmap_as_an_array(tmp_path, write_memmap):
    X = np.random.default_rng(0).normal(size=(300, 5))
    mapped = write_memmap(tmp_path / "x.npy", X)
    assert auto_feature_noise(mapped, seed=3) == auto_feature_noise(X, seed=3)


def test_auto_noise_is_what_a_fit_trains_with(fast_params, scaled_blobs):
    X, y = scaled_blobs
    # The fit measures its float32 copy of X.
    noise = auto_feature_noise(
        X.astype(np.float32), fit_seed(fast_params["random_state"])
    )
    assert 0 < noise < MAX_FEATURE_NOISE
    auto = _fit(fast_params, X, y)
    chosen = _fit(fast_params, X, y, augmentation={"feature_noise": noise})
    other = _fit(fast_params, X, y, augmentation={"feature_noise": 2 * noise})
    np.testing.assert_array_equal(auto.predict_proba(X), chosen.predict_proba(X))
    assert not np.array_equal(auto.predict_proba(X), other.predict_proba(X))


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


@pytest.mark.parametrize("stacking", ["auto", "streams"])
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


@pytest.mark.parametrize("noise", [0.3, "auto"])
def test_feature_noise_settings_are_saved(fast_params, scaled_blobs, tmp_path, noise):
    X, y = scaled_blobs
    augmentation = {"feature_noise": noise, "unlabeled": True}
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
