"""Inputs a careless or hostile user passes: near misses, extremes, odd files.

Each of them once gave a silently wrong result or a raw library error.
"""

import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from skassoc import RECIPES, SemiSupervisedAssociationClassifier
from skassoc._inputs import LARGEST_INPUT, reads_as_marker
from skassoc._nn._networks import auto_network_name
from skassoc.datasets import load_svhn, make_semi_supervised_labels

DOCS = Path(__file__).resolve().parents[1] / "docs"


def make_clf(fast_params, **overrides):
    return SemiSupervisedAssociationClassifier(**{**fast_params, **overrides})


def _string_labels(y_semi, marker):
    """The blobs' labels as class names, ``marker`` where they are -1."""
    names = np.array(["ant", "bee", "cat"], dtype=object)
    return np.where(y_semi == -1, marker, names[np.maximum(y_semi, 0)])


# Unlabeled markers -----------------------------------------------------------


@pytest.mark.parametrize(
    "marker",
    [
        " -1",
        "-1 ",
        "-1.0",
        "\u22121",  # the minus sign of typography
        "\u20131",  # an en dash, as word processors write it
        "\uff0d\uff11",  # full-width
        "\ufeff-1",  # a byte-order mark left by a CSV file's first cell
        '"-1"',
        "-1,0",
    ],
)
def test_near_miss_markers_read_as_minus_one(marker):
    assert reads_as_marker(marker)


@pytest.mark.parametrize(
    "label", ["-1", "-10", "1", "-1.5", "class-1", "-", "\u2212", "(-1)", "nan", -1.0]
)
def test_legitimate_labels_are_not_near_misses(label):
    assert not reads_as_marker(label)


@pytest.mark.parametrize("dtype", [object, str])
@pytest.mark.parametrize("marker", [" -1", "-1.0", "\u22121"])
def test_a_near_miss_marker_warns_that_it_is_trained_as_a_class(
    fast_params, blobs_semi, dtype, marker
):
    X, y_semi = blobs_semi
    y = _string_labels(y_semi, marker)
    # Some samples carry the exact marker, the others the near miss.
    unlabeled = np.flatnonzero(y_semi == -1)
    y[unlabeled[:20]] = "-1"
    with pytest.warns(UserWarning, match="read as -1") as record:
        clf = make_clf(fast_params, max_iter=2).fit(X, y.astype(dtype))
    assert marker in clf.classes_
    message = str(record[0].message)
    assert f"{marker!r} ({len(unlabeled) - 20} samples)" in message
    assert "np.where" in message


def test_exact_markers_and_legitimate_labels_do_not_warn(fast_params, blobs_semi):
    X, y_semi = blobs_semi
    for y in (
        _string_labels(y_semi, "-1"),
        _string_labels(y_semi, -1),
        np.where(y_semi == -1, "-1", np.array(["-10", "10", "1"])[y_semi]),
    ):
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message=".*read as -1")
            make_clf(fast_params, max_iter=2).fit(X, y)


# Sample weights --------------------------------------------------------------


def test_huge_sample_weights_fit_as_the_same_ratios_of_moderate_ones(
    fast_params, blobs_semi
):
    X, y = blobs_semi
    half = np.arange(len(y)) % 2 == 0

    def proba(sample_weight):
        clf = make_clf(fast_params).fit(X, y, sample_weight=sample_weight)
        return clf.predict_proba(X)

    huge = proba(np.where(half, 1e308, 1e307))
    moderate = proba(np.where(half, 10.0, 1.0))
    np.testing.assert_allclose(huge, moderate, atol=1e-6)
    # The weights changed the fit (overflowing weights once gave an
    # unweighted fit).
    assert np.abs(huge - proba(None)).max() > 1e-4


# Values beyond the networks' float32 input scaling ---------------------------


def _digits_at(digits, largest, images):
    """300 digits, pixels scaled to -largest..largest, as images or rows."""
    X, y = digits
    X = X[:300] - 8.0  # pixels -8..8: a scale straddling 0
    y_semi = make_semi_supervised_labels(y[:300], 3, random_state=0)
    varying = X.std(axis=0) > 0
    X = (X * (largest / np.abs(X).max())).astype(np.float32)
    if images:
        return X.reshape(-1, 8, 8), y_semi
    # As rows, without the constant border pixels: the MLP leaves them
    # unscaled, so their augmentation noise is not relative to their size.
    return X[:, varying], y_semi


@pytest.mark.parametrize("network", ["mlp", "small"])
def test_values_beyond_the_float32_scaling_are_refused(
    fast_params, digits, network, tmp_path, write_memmap
):
    X, y = _digits_at(digits, 3e38, images=network == "small")
    clf = make_clf(fast_params, network=network, max_iter=2)
    with pytest.raises(ValueError, match="too large for float32.*Rescale X"):
        clf.fit(X, y)
    with pytest.raises(ValueError, match="too large for float32.*Rescale X"):
        clf.fit(write_memmap(tmp_path / "X.npy", X), y)
    fitted = clf.fit(X / 1e30, y)
    with pytest.raises(ValueError, match="too large for float32"):
        fitted.predict(X)


@pytest.mark.parametrize("network", ["mlp", "small"])
def test_values_up_to_the_limit_fit_as_small_ones_do(fast_params, digits, network):
    images = network == "small"
    params = {**fast_params, "network": network, "max_iter": 10}
    small_X, y = _digits_at(digits, 8.0, images)
    large_X, _ = _digits_at(digits, LARGEST_INPUT, images)
    small = SemiSupervisedAssociationClassifier(**params).fit(small_X, y)
    large = SemiSupervisedAssociationClassifier(**params).fit(large_X, y)
    np.testing.assert_allclose(
        small.predict_proba(small_X), large.predict_proba(large_X), atol=1e-3
    )


# Plotting --------------------------------------------------------------------


@pytest.fixture
def frame_fitted(fast_params, digits):
    """An MLP fitted on a DataFrame of 8x8 digits (columns p0..p63)."""
    pd = pytest.importorskip("pandas")
    pytest.importorskip("matplotlib")
    X, y = digits
    frame = pd.DataFrame(X[:200], columns=[f"p{i}" for i in range(64)])
    y_semi = make_semi_supervised_labels(y[:200], 3, random_state=0)
    clf = make_clf(fast_params, input_shape=(8, 8), max_iter=2).fit(frame, y_semi)
    return clf, frame, y[:200]


def test_plots_refuse_reordered_columns_as_transform_does(frame_fitted):
    import matplotlib.pyplot as plt

    from skassoc.plotting import plot_association_graph, plot_nearest_neighbors

    clf, frame, y = frame_fitted
    reordered = frame[frame.columns[::-1]]
    with pytest.raises(ValueError, match="feature names") as from_transform:
        clf.transform(reordered)
    figures = plt.get_fignums()
    with pytest.raises(ValueError, match="feature names") as raised:
        plot_association_graph(clf, reordered[:10], y[:10], frame[10:30])
    assert str(raised.value) == str(from_transform.value)
    with pytest.raises(ValueError, match="feature names"):
        plot_association_graph(clf, frame[:10], y[:10], reordered[10:30])
    with pytest.raises(ValueError, match="feature names"):
        plot_nearest_neighbors(clf, reordered[:2], frame[2:50], n_neighbors=3)
    with pytest.raises(ValueError, match="feature names"):
        plot_nearest_neighbors(clf, frame[:2], reordered[2:50], n_neighbors=3)
    assert plt.get_fignums() == figures  # refused before drawing


def test_plots_take_a_dataframe_of_the_fitted_columns_silently(frame_fitted):
    import matplotlib.pyplot as plt

    from skassoc.plotting import plot_association_graph, plot_nearest_neighbors

    clf, frame, y = frame_fitted
    with warnings.catch_warnings():
        # Converted to an array first, the frames lost their column names
        # and scikit-learn warned of it.
        warnings.simplefilter("error")
        plot_association_graph(clf, frame[:10], y[:10], frame[10:30])
        plot_nearest_neighbors(
            clf, frame[:2], frame[2:50], n_neighbors=3, y_query=y[:2], y_pool=y[2:50]
        )
    plt.close("all")


# Data set files --------------------------------------------------------------


def test_load_svhn_names_a_matlab_v73_file(tmp_path):
    # The 128-byte header of a MATLAB v7.3 file (version 0x0200), before
    # the HDF5 data from byte 512.
    header = b"MATLAB 7.3 MAT-file, Platform: GLNXA64, HDF5 schema 1.00 .".ljust(116)
    content = header + bytes(8) + b"\x00\x02IM" + bytes(384) + b"\x89HDF\r\n\x1a\n"
    (tmp_path / "train_32x32.mat").write_bytes(content + bytes(512))
    with pytest.raises(ValueError, match=r"MATLAB v7\.3 file \(an HDF5 file\)") as e:
        load_svhn(data_home=tmp_path)
    assert "download 'train_32x32.mat' again" in str(e.value)
    assert "h5py" in str(e.value)


# Recipes ---------------------------------------------------------------------


def test_editing_one_recipe_leaves_the_others_unchanged(monkeypatch):
    before = {name: repr(params) for name, params in RECIPES.items()}
    for name, params in RECIPES.items():
        if isinstance(params.get("augmentation"), dict):
            monkeypatch.setitem(params["augmentation"], "affine_std", 9.0)
            others = {n: repr(p) for n, p in RECIPES.items() if n != name}
            assert others == {n: r for n, r in before.items() if n != name}
            monkeypatch.undo()


# Labels ----------------------------------------------------------------------


def _missing_labels():
    cases = [
        np.array([0.0, 1.0, np.nan, 1.0, 0.0, 1.0]),
        np.array(["a", "b", None, "a", "b", "a"], dtype=object),
        np.array(["a", "b", float("nan"), "a", "b", "a"], dtype=object),
    ]
    try:
        import pandas as pd
    except ImportError:
        return cases
    return cases + [
        pd.Series(["a", "b", pd.NA, "a", "b", "a"], dtype="string"),
        pd.Series([0, 1, None, 1, 0, 1], dtype="Int64"),
        pd.Categorical(["a", "b", None, "a", "b", "a"]),
    ]


@pytest.mark.parametrize("y", _missing_labels(), ids=lambda y: str(type(y).__name__))
def test_make_semi_supervised_labels_refuses_missing_labels(y):
    with pytest.raises(ValueError, match=r"1 missing label\(s\).*index 2"):
        make_semi_supervised_labels(y, 1, random_state=0)


# Docs against the code -------------------------------------------------------


def test_user_guide_names_the_network_that_8x8_images_get():
    text = (DOCS / "user_guide.rst").read_text(encoding="utf-8")
    claims = re.findall(r"clf\.input_shape_\)\s+# (\w+) \(1, 8, 8\)", text)
    assert claims, "the user guide's 8x8 example has moved"
    assert set(claims) == {auto_network_name((1, 8, 8))}


def test_predict_runs_on_the_callers_threads_as_the_faq_says(fast_params, blobs_semi):
    X, y = blobs_semi
    seen = []
    clf = make_clf(fast_params, max_iter=2).fit(X, y)
    clf.model_.logits.register_forward_pre_hook(
        lambda module, args: seen.append(torch.get_num_threads())
    )
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        clf.predict(X)
    finally:
        torch.set_num_threads(previous)
    assert seen and set(seen) == {2}
    faq = " ".join((DOCS / "faq.rst").read_text(encoding="utf-8").split())
    assert "``predict``, ``predict_proba``, ``transform`` and ``score``" in faq
    assert "they run on the caller's PyTorch thread count" in faq
