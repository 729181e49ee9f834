"""fit_report_ (is my model any good?) and suggest_labels (what to label next)."""

import math
import threading
import warnings

import numpy as np
import pytest

from skassoc import SemiSupervisedAssociationClassifier
from skassoc._diagnosis import (
    FREQUENT_CLASS_MARGIN,
    FREQUENT_CLASS_MAX_RATIO,
    REPORT_SCORES,
    FitReport,
    FitReportWarning,
    class_share_scores,
    diagnose_embeddings,
    is_suspect,
)
from skassoc._suggest import suggest_from_embeddings
from skassoc.active import association_sampling


def _blobs(centres, sizes, rng, spread=0.05):
    return np.concatenate(
        [c + spread * rng.standard_normal((n, len(c))) for c, n in zip(centres, sizes)]
    ).astype(np.float32)


def _parts(pred_unlabeled, n_classes=2, foreign=0):
    """Embeddings, labels and probabilities of 5 labeled samples a class and
    unlabeled ones predicted ``pred_unlabeled``: each among the labels of its
    predicted class, but the last ``foreign`` ones in a region of their own,
    far from every label (a style handed to the class it is predicted)."""
    rng = np.random.default_rng(0)
    centres = 3 * np.eye(n_classes + 1, 4)
    y_lab = np.repeat(np.arange(n_classes), 5)
    where = np.array(pred_unlabeled, dtype=int)
    where[len(where) - foreign :] = n_classes
    emb_lab = centres[y_lab] + 0.02 * rng.standard_normal((len(y_lab), 4))
    emb_unl = centres[where] + 0.02 * rng.standard_normal((len(where), 4))
    eye = np.eye(n_classes)
    return (
        emb_lab.astype(np.float32),
        y_lab,
        eye[y_lab],
        emb_unl.astype(np.float32),
        eye[pred_unlabeled],
    )


def _report(pred_unlabeled, n_classes=2, expected=None, foreign=0):
    """A report whose unlabeled samples are predicted ``pred_unlabeled``."""
    expected = np.full(n_classes, 1 / n_classes) if expected is None else expected
    return diagnose_embeddings(
        *_parts(pred_unlabeled, n_classes, foreign),
        expected,
        np.array(["cat", "dog", "eel"][:n_classes]),
    )


def test_report_ok_when_shares_match_and_suspect_when_a_class_grows():
    ok = _report(np.repeat([0, 1], 500))
    assert ok.verdict == "ok" and ok.reasons == ()
    assert set(ok.scores) == set(REPORT_SCORES)
    assert ok.scores["class_share_excess"] == pytest.approx(0.0)
    # 150 samples of a region without labels (the last ones), predicted "cat".
    suspect = _report(np.repeat([1, 0], [350, 650]), foreign=150)
    assert suspect.verdict == "suspect"
    assert suspect.scores["class_share_excess"] == pytest.approx(0.15)
    assert suspect.predicted_shares == {"cat": 0.65, "dog": 0.35}
    assert "'cat'" in suspect.reasons[0]


def test_the_low_visit_score_tells_a_handed_over_region_from_a_frequent_class():
    # The same shares as the suspect report above, but every "cat" lies
    # among the cat labels: a frequent class, visited as often as the other.
    # A score near 0 clears nothing, so both are suspect; the score differs.
    frequent = _report(np.repeat([0, 1], [650, 350]))
    handed_over = _report(np.repeat([1, 0], [350, 650]), foreign=150)
    assert frequent.scores["class_share_excess"] == pytest.approx(0.15)
    assert abs(frequent.scores["excess_class_low_visit"]) <= FREQUENT_CLASS_MARGIN
    assert handed_over.scores["excess_class_low_visit"] > 0.1
    assert frequent.verdict == handed_over.verdict == "suspect"
    # The frequent class among its labels while 100 "dog" predictions lie
    # where no walk goes: the excess class is clearly the better visited.
    # The verdict does not read the walks (they see the fit's own
    # embedding): without the inputs' opinion the excess stays suspect.
    better_visited = _report(np.repeat([0, 1], [650, 350]), foreign=100)
    assert better_visited.scores["class_share_excess"] == pytest.approx(0.15)
    assert better_visited.scores["excess_class_low_visit"] == pytest.approx(-100 / 350)
    assert better_visited.verdict == "suspect"
    # The score is NaN when no class is expected.
    unchecked = diagnose_embeddings(
        *_parts(np.repeat([0, 1], [650, 350])), None, np.array(["cat", "dog"])
    )
    assert np.isnan(unchecked.scores["excess_class_low_visit"])


def test_the_verdict_clears_a_share_excess_only_beyond_the_margin():
    scores = {"class_share_ratio": 1.3, "class_share_z": 10.0}
    assert is_suspect(scores)  # reports stored before the score existed
    for disagreement, suspect in [
        (math.nan, True),
        (None, True),
        (0.2, True),
        (-FREQUENT_CLASS_MARGIN / 2, True),
        (-2 * FREQUENT_CLASS_MARGIN, False),
    ]:
        scores["excess_class_input_disagreement"] = disagreement
        assert is_suspect(scores) is suspect
    assert not is_suspect({**scores, "class_share_ratio": 1.05})
    # A class at more than twice its expected share is no frequent
    # class, whatever the inputs say (a fit at chance level can score so).
    assert not is_suspect({**scores, "class_share_ratio": FREQUENT_CLASS_MAX_RATIO})
    assert is_suspect({**scores, "class_share_ratio": 6.0})
    # The walks' score clears nothing, however low.
    assert is_suspect(
        {
            "class_share_ratio": 1.3,
            "class_share_z": 10.0,
            "excess_class_low_visit": -1.0,
        }
    )


def _spread_report(pred_unlabeled, spread):
    """A report of 1,000 unlabeled samples (uniform shares expected) whose
    labels spread over the inputs give the classes ``spread``."""
    return diagnose_embeddings(
        *_parts(pred_unlabeled),
        np.array([0.5, 0.5]),
        np.array(["cat", "dog"]),
        spread=np.asarray(spread),
    )


def test_the_inputs_clear_a_frequent_class_but_not_a_handed_over_region():
    rng = np.random.default_rng(0)
    pred = np.repeat([0, 1], [650, 350])
    # The spread labels err on a tenth of every class alike: the excess
    # class is no worse than the other, nothing clears the excess.
    noisy = np.where(rng.random(1000) < 0.1, 1 - pred, pred)
    alike = _spread_report(pred, noisy)
    assert alike.scores["excess_class_input_disagreement"] == pytest.approx(
        np.mean(noisy[:650] != 0) - np.mean(noisy[650:] != 1)
    )
    assert alike.verdict == "suspect"
    # A frequent class: the spread labels agree with every cat, err on a
    # tenth of the dogs: "ok".
    frequent = _spread_report(pred, np.where(np.arange(1000) < 650, 0, noisy))
    assert frequent.scores["excess_class_input_disagreement"] == pytest.approx(
        -np.mean(noisy[650:] != 1)
    )
    assert frequent.verdict == "ok" and frequent.reasons == ()
    # A region handed to "cat": the inputs put 150 of the cats with the dog
    # labels, and the excess stays suspect.
    handed_over = _spread_report(pred, np.where(np.arange(1000) < 500, 0, 1))
    assert handed_over.scores["excess_class_input_disagreement"] == pytest.approx(
        150 / 650
    )
    assert handed_over.verdict == "suspect"
    # Spread labels must be one per graph row.
    with pytest.raises(ValueError, match="one per row"):
        _spread_report(pred, noisy[:10])


def test_a_fit_diverged_into_one_class_is_suspect_whatever_the_inputs_say():
    """The user guide's loop falls back to a new fit on this verdict."""
    pred = np.repeat([0, 1, 2], [880, 10, 10])
    diverged = diagnose_embeddings(
        *_parts(pred, n_classes=3),
        np.full(3, 1 / 3),
        np.array(["cat", "dog", "eel"]),
        # Inputs that side with the cats and with none of the others, as the
        # spread labels of a class merely more frequent than expected would.
        spread=np.zeros(900, dtype=int),
    )
    assert diverged.scores["excess_class_input_disagreement"] == pytest.approx(-1.0)
    assert diverged.scores["class_share_ratio"] == pytest.approx(880 / 300)
    assert diverged.verdict == "suspect" and "'cat'" in diverged.reasons[0]


def test_report_compares_with_given_shares_and_ignores_noise():
    # The same predictions, expected 65/35: nothing to report.
    assert (
        _report(np.repeat([0, 1], [650, 350]), expected=np.array([0.65, 0.35])).verdict
        == "ok"
    )
    # 14 of 20 in one class: a large excess, but within the sampling noise.
    assert _report(np.repeat([0, 1], [14, 6])).verdict == "ok"


def test_report_not_checked_without_unlabeled_samples():
    report = _report(np.array([], dtype=int))
    assert report.verdict == "not checked" and report.n_unlabeled == 0


def test_report_round_trips_through_its_dict_and_refuses_bad_ones():
    report = _report(np.repeat([0, 1, 2], [500, 300, 200]), n_classes=3)
    classes = np.array(["cat", "dog", "eel"])
    assert FitReport.from_dict(report.to_dict(), classes) == report
    assert FitReport.from_dict(report.to_dict(), classes.tolist()) == report
    bad = [
        {**report.to_dict(), "verdict": "great"},
        {**report.to_dict(), "scores": {"x": "1"}},
        {**report.to_dict(), "predicted_shares": [0.5, 0.5]},
        {**report.to_dict(), "n_labeled": True},
        {**report.to_dict(), "scores": {"x": 10**400}},
        {**report.to_dict(), "scores": {"x": float("nan")}},
        {**report.to_dict(), "expected_shares": [0.0, 0.5, 0.5]},
        {**report.to_dict(), "extra": 1},
        [],
    ]
    for entry in bad:
        with pytest.raises(ValueError, match="fit_report"):
            FitReport.from_dict(entry, classes)


@pytest.fixture(scope="module")
def fitted_blobs():
    """Four blobs, two a class; one blob of class 1 has no label."""
    rng = np.random.default_rng(0)
    centres = np.eye(4, 8) * 3
    X = _blobs(centres, [60, 60, 60, 60], rng, spread=0.3)
    y_true = np.repeat([0, 0, 1, 1], 60)
    y = np.full(len(X), -1)
    for blob in (0, 1, 2):  # blob 3 (class 1) stays unlabeled
        y[blob * 60 : blob * 60 + 3] = y_true[blob * 60]
    clf = SemiSupervisedAssociationClassifier(
        max_iter=20, random_state=0, hidden_layer_sizes=(16,), embedding_dim=8
    )
    with warnings.catch_warnings():
        # A 20-step fit's class shares are whatever they are.
        warnings.simplefilter("ignore", FitReportWarning)
        clf.fit(X, y)
    return clf, X, y, y_true


def test_fit_sets_a_report_that_save_and_load_keep(fitted_blobs, tmp_path):
    clf, *_ = fitted_blobs
    report = clf.fit_report_
    assert isinstance(report, FitReport) and report.verdict in ("ok", "suspect")
    assert report.n_unlabeled == 231 and report.n_labeled == 9
    path = tmp_path / "model.skassoc"
    clf.save(path)
    assert SemiSupervisedAssociationClassifier.load(path).fit_report_ == report


def test_suggest_labels_covers_the_unlabeled_region_first(fitted_blobs):
    clf, X, y, _ = fitted_blobs
    picks = clf.suggest_labels(X, 3, y=y, random_state=0)
    assert len(set(picks.tolist())) == 3
    assert (y[picks] == -1).all()
    # Blob 3, the only one without a label, gets one.
    assert ((picks >= 180) & (picks < 240)).any()
    # modAL's signature, with a learner holding the labeled samples.
    learner = type("Learner", (), {"estimator": clf, "X_training": X[y != -1]})()
    pool = X[y == -1]
    chosen = association_sampling(learner, pool, n_instances=3, random_state=0)
    assert chosen.min() >= 0 and chosen.max() < len(pool)
    np.testing.assert_array_equal(pool[chosen], X[picks])
    # A fitted estimator given directly: any sample of the pool is a candidate.
    assert len(association_sampling(clf, pool, n_instances=2, random_state=0)) == 2


def test_suggest_labels_refuses_bad_input(fitted_blobs):
    clf, X, y, _ = fitted_blobs
    with pytest.raises(ValueError, match="no unlabeled sample"):
        clf.suggest_labels(X, 2, y=np.zeros(len(X), dtype=int))
    with pytest.raises(ValueError, match="labels for"):
        clf.suggest_labels(X, 2, y=y[:-1])
    with pytest.raises(ValueError, match="n_labels"):
        clf.suggest_labels(X, 0)


def test_suggestions_spread_over_regions_and_rank_uncovered_ones_first():
    rng = np.random.default_rng(1)
    centres = np.eye(5, 6) * 4
    pool = _blobs(centres, [100, 80, 60, 40, 20], rng)
    anchors = _blobs(centres[:1], [2], rng)  # blob 0 is covered
    picks = suggest_from_embeddings(pool, anchors, np.ones(len(pool)), 4, 0)
    blobs = np.searchsorted(np.cumsum([100, 80, 60, 40, 20]), picks, side="right")
    # Blobs 1-4 are uncovered: one pick each, the largest first.
    assert blobs.tolist() == [1, 2, 3, 4]
    # A region whose class takes more than its share ranks higher.
    ratio = np.where(np.arange(len(pool)) >= 280, 5.0, 1.0)
    first = suggest_from_embeddings(pool, anchors, ratio, 4, 0)[0]
    assert first >= 280


def test_a_suspect_class_gets_the_labels_in_its_uncovered_regions():
    rng = np.random.default_rng(2)
    # Blob 0 (predicted class 0) is large and has no label; blob 1 (class 1)
    # is covered by class 1's labels; blob 2, a style handed to class 1,
    # is small and has none.
    centres = np.eye(3, 6) * 4
    sizes = [200, 100, 30]
    pool = _blobs(centres, sizes, rng)
    predicted = np.repeat([0, 1, 1], sizes)
    anchors = _blobs(centres[1:2], [3], rng)
    ratio = np.ones(len(pool))
    unfocused = suggest_from_embeddings(pool, anchors, ratio, 1, 0)
    assert predicted[unfocused].tolist() == [0]  # the largest uncovered blob
    focus = (predicted == 1, np.ones(len(anchors), dtype=bool))
    picks = suggest_from_embeddings(pool, anchors, ratio, 3, 0, focus)
    assert (predicted[picks] == 1).all()
    assert (picks >= 300).any()  # blob 2 gets a label
    # A class with fewer predictions than labels: the rest from the pool.
    few = (np.arange(len(pool)) < 2, np.zeros(len(anchors), dtype=bool))
    picks = suggest_from_embeddings(pool, anchors, ratio, 5, 0, few)
    assert len(set(picks.tolist())) == 5 and {0, 1} <= set(picks.tolist())


def test_the_focus_is_the_class_of_the_largest_excess_and_each_row_once():
    from skassoc._suggest import _suspect_class

    # Class 0 takes 12 points more than expected, class 2 only 3, though
    # its ratio is larger: the report names class 0, and so does the focus.
    report = FitReport(
        "suspect",
        predicted_shares={"a": 0.62, "b": 0.30, "c": 0.08},
        expected_shares={"a": 0.5, "b": 0.45, "c": 0.05},
    )
    assert _suspect_class(report, np.array(["a", "b", "c"])) == 0
    # Ten copies of one row in the focus: one pick there, the rest from
    # distinct rows elsewhere.
    rng = np.random.default_rng(3)
    pool = rng.standard_normal((50, 6)).astype(np.float32)
    pool[:10] = pool[0]
    focus = (np.arange(50) < 10, np.zeros(0, dtype=bool))
    picks = suggest_from_embeddings(pool, pool[:0], np.ones(50), 3, 0, focus)
    assert len(picks) == 3 and (picks < 10).sum() == 1
    assert len({pool[i].tobytes() for i in picks}) == 3


def test_association_sampling_tells_the_suggestion_the_learners_labels(
    fitted_blobs, monkeypatch
):
    clf, X, y, _ = fitted_blobs
    seen = []
    monkeypatch.setattr(
        clf,
        "suggest_labels",
        lambda X, n, y, random_state: seen.append(y) or np.array([9]),
    )
    names = np.where(y == -1, "-1", np.where(y == 0, "zero", "one"))
    learner = type(
        "Learner", (), {"estimator": clf, "X_training": X, "y_training": names}
    )()
    pool = X[y == -1]
    assert association_sampling(learner, pool, n_instances=1).tolist() == [0]
    [given] = seen
    assert given[:9].tolist() == names[names != "-1"].tolist()
    assert (given[9:] == -1).all() and len(given) == 9 + len(pool)
    # Without y_training, the labeled rows match no class.
    learner.y_training = None
    seen.clear()
    association_sampling(learner, pool, n_instances=1)
    assert not np.isin(seen[0][: len(X)], ["zero", "one", 0, 1]).any()


def test_association_sampling_checks_the_learners_labels_and_rows(fitted_blobs):
    import scipy.sparse as sp

    clf, X, y, _ = fitted_blobs
    labeled = np.flatnonzero(y != -1)
    pool = X[y == -1]
    learner = type(
        "Learner",
        (),
        {"estimator": clf, "X_training": X[labeled], "y_training": y[labeled][:3]},
    )()
    with pytest.raises(ValueError, match="y_training has 3 labels for 9 rows"):
        association_sampling(learner, pool, n_instances=2)
    # A column of labels and COO rows are read as fit would read them; the
    # picks are those of the plain arrays.
    learner.y_training = y[labeled]
    expected = association_sampling(learner, pool, n_instances=2, random_state=0)
    learner.y_training = y[labeled][:, None]
    learner.X_training = sp.coo_matrix(X[labeled])
    with pytest.warns(Warning, match="column-vector y"):
        picks = association_sampling(learner, pool, n_instances=2, random_state=0)
    np.testing.assert_array_equal(picks, expected)
    # The learner's labels as fit's: suggesting from no class is refused
    # (a label with no class is one only association_sampling itself makes).
    learner.y_training = np.full(len(labeled), 7)
    with pytest.raises(ValueError, match="not classes of the fit: \\[7\\]"):
        association_sampling(learner, pool, n_instances=2)


@pytest.mark.parametrize("verdict", ["suspect", "ok"])
def test_suggest_labels_focuses_on_the_class_a_suspect_report_names(
    fitted_blobs, monkeypatch, verdict
):
    import dataclasses

    import skassoc._suggest as suggest

    clf, X, y, _ = fitted_blobs
    report = FitReport(
        verdict,
        ("class 0 takes too much",) if verdict == "suspect" else (),
        predicted_shares={0: 0.7, 1: 0.3},
        expected_shares={0: 0.5, 1: 0.5},
    )
    forward = clf._forward

    def reported(X, output):
        state, result = forward(X, output)
        return dataclasses.replace(state, fit_report=report), result

    monkeypatch.setattr(clf, "_forward", reported)
    seen = []
    original = suggest.suggest_from_embeddings

    def recording(*args):
        seen.append(args[-1])
        return original(*args)

    monkeypatch.setattr(suggest, "suggest_from_embeddings", recording)
    picks = clf.suggest_labels(X, 2, y=y, random_state=0)
    if verdict == "ok":
        assert seen == [None]
        return
    [(in_class, labeled_as_class)] = seen
    np.testing.assert_array_equal(labeled_as_class, y[y != -1] == 0)
    assert in_class.any() and not in_class.all()
    pool = np.flatnonzero(y == -1)
    assert in_class[np.searchsorted(pool, picks)].all()


@pytest.fixture
def report_interrupted(monkeypatch):
    """Training data whose fits' report a Ctrl-C interrupts."""

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(SemiSupervisedAssociationClassifier, "_fit_report", interrupted)
    X = np.random.default_rng(0).standard_normal((60, 4))
    return X, np.r_[np.repeat([0, 1], 5), np.full(50, -1)]


def test_ctrl_c_during_the_report_keeps_the_model(report_interrupted):
    X, y = report_interrupted
    clf = SemiSupervisedAssociationClassifier(max_iter=5, random_state=0)
    with pytest.raises(KeyboardInterrupt, match="fit_report_"):
        clf.fit(X, y)
    assert clf.n_iter_ == 5 and clf.fit_report_ is None
    assert clf.predict(X).shape == (60,)


def test_a_suspect_fit_of_100_steps_or_more_warns():
    from skassoc._diagnosis import WARN_MIN_STEPS, warn_if_suspect

    suspect = _report(np.repeat([1, 0], [350, 650]), foreign=150)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn_if_suspect(suspect, WARN_MIN_STEPS - 1)
        warn_if_suspect(_report(np.repeat([0, 1], 500)), WARN_MIN_STEPS)
        assert caught == []
        warn_if_suspect(suspect, WARN_MIN_STEPS)
    [warning] = caught
    assert warning.category is FitReportWarning
    assert "'cat' takes 65.0%" in str(warning.message)


def test_random_labels_noise_and_given_prior_set_the_expected_shares():
    from skassoc._diagnosis import expected_shares

    encoded = np.r_[np.zeros(8, int), np.ones(2, int), np.full(5, -1)]
    shares, noisy_from = expected_shares("auto", encoded, 2)
    np.testing.assert_allclose(shares, [0.8, 0.2])
    assert noisy_from == 10  # unequal counts: a random draw, noisy shares
    equal = np.r_[np.zeros(5, int), np.ones(5, int)]
    # Drawn as many a class: nothing known about the classes' shares.
    assert expected_shares("auto", equal, 2) == (None, None)
    np.testing.assert_allclose(expected_shares("uniform", encoded, 2)[0], [0.5, 0.5])
    given = np.array([0.9, 0.1])
    assert expected_shares(given, encoded, 2)[0] is not None
    # 60/40 predicted against labels' 50/50 from 10 random labels: noise.
    report = diagnose_embeddings(
        *_parts(np.repeat([0, 1], [600, 400])),
        np.array([0.5, 0.5]),
        np.array(["cat", "dog"]),
        expected_from=10,
    )
    assert report.verdict == "ok"


def test_suggest_labels_takes_sparse_rows():
    import scipy.sparse as sp

    X = sp.random(120, 30, density=0.2, format="csr", random_state=0, dtype=np.float32)
    y = np.full(120, -1)
    y[:6] = np.repeat([0, 1], 3)
    clf = SemiSupervisedAssociationClassifier(max_iter=3, random_state=0).fit(X, y)
    picks = clf.suggest_labels(X, 4, y=y, random_state=0)
    assert len(set(picks.tolist())) == 4 and (y[picks] == -1).all()
    learner = type("Learner", (), {"estimator": clf, "X_training": X[:6]})()
    chosen = association_sampling(learner, X[6:], n_instances=2, random_state=0)
    assert chosen.min() >= 0 and chosen.max() < 114


def test_suggest_labels_reads_string_labels_and_refuses_foreign_ones(fitted_blobs):
    from sklearn.base import clone
    from sklearn.exceptions import DataConversionWarning

    clf, X, y, _ = fitted_blobs
    names = np.where(y == -1, "-1", np.where(y == 0, "zero", "one"))
    # Labels of no class of the fit would not count for their class.
    with pytest.raises(ValueError, match=r"not classes of the fit: \['zero', 'one'\]"):
        clf.suggest_labels(X, 3, y=names)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FitReportWarning)
        named = clone(clf).fit(X, names)
    picks = named.suggest_labels(X, 3, y=names, random_state=0)
    assert (y[picks] == -1).all() and len(set(picks.tolist())) == 3
    # A column vector is read as fit reads it, with its warning.
    with pytest.warns(DataConversionWarning):
        column = clf.suggest_labels(X, 3, y=y[:, None], random_state=0)
    np.testing.assert_array_equal(column, clf.suggest_labels(X, 3, y=y, random_state=0))
    with pytest.raises(ValueError, match="X holds no sample"):
        clf.suggest_labels(X[:0], 3)


def test_ctrl_c_during_a_stacked_candidates_report_stops_the_search(
    report_interrupted,
):
    from skassoc._stacked import fit_candidates

    X, y = report_interrupted
    base = SemiSupervisedAssociationClassifier(max_iter=5, random_state=0)
    params = [{"visit_weight": 0.5}, {"visit_weight": 1.0}]
    with pytest.raises(KeyboardInterrupt, match="fit_report_"):
        fit_candidates(base, params, X, y)


def test_association_sampling_keeps_a_dataframes_column_names():
    pd = pytest.importorskip("pandas")
    rng = np.random.default_rng(0)
    X = pd.DataFrame(_blobs(np.eye(2, 4) * 3, [40, 40], rng), columns=list("abcd"))
    y = np.full(80, -1)
    y[[0, 1, 40, 41]] = [0, 0, 1, 1]
    clf = SemiSupervisedAssociationClassifier(max_iter=3, random_state=0).fit(X, y)
    # The learner's labeled rows with their columns in another order.
    labeled = X.iloc[:2][list("dcba")]
    learner = type("Learner", (), {"estimator": clf, "X_training": labeled})()
    with warnings.catch_warnings():
        # The estimator warns when X lacks the names it was fitted with.
        warnings.simplefilter("error", UserWarning)
        chosen = association_sampling(learner, X.iloc[2:], n_instances=3)
    assert len(set(chosen.tolist())) == 3 and chosen.max() < 78
    learner.X_training = X.iloc[:2].assign(e=1.0)
    with pytest.raises(ValueError, match=r"different columns: \['e'\]"):
        association_sampling(learner, X.iloc[2:], n_instances=3)


def test_a_pool_of_repeated_rows_still_gives_every_pick_asked_for():
    rng = np.random.default_rng(0)
    distinct = _blobs(np.eye(3, 4) * 3, [1, 1, 1], rng)
    pool = np.repeat(distinct, 5, axis=0)  # 3 distinct points, 15 samples
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        picks = suggest_from_embeddings(pool, pool[:0], np.ones(15), 6, 0)
    assert len(picks) == 6 and len(set(picks.tolist())) == 6
    # Spread first: the first three picks are the three distinct points.
    assert len({tuple(row) for row in pool[picks[:3]]}) == 3


@pytest.mark.parametrize("n_labels", [13, 15, 40])
def test_a_focused_suggestion_of_nearly_all_the_pool_or_more_ends(n_labels):
    """A suspect class's picks, then the rest of the pool: as many distinct
    samples as asked, or every sample once when the pool holds fewer (this
    once never returned)."""
    rng = np.random.default_rng(0)
    pool = _blobs(np.eye(3, 4) * 3, [5, 5, 5], rng)
    anchors = _blobs(np.eye(3, 4) * 3, [1, 1, 1], rng)
    in_class = np.repeat([True, False, False], 5)
    focus = (in_class, np.array([True, False, False]))
    found = []
    # In a thread, so that a return of the endless loop fails the test
    # instead of stalling the suite (a daemon: it cannot block the exit).
    worker = threading.Thread(
        target=lambda: found.append(
            suggest_from_embeddings(pool, anchors, np.ones(15), n_labels, 0, focus)
        ),
        daemon=True,
    )
    worker.start()
    worker.join(timeout=60)
    assert found, "suggest_from_embeddings did not return"
    [picks] = found
    assert len(picks) == min(n_labels, 15) == len(set(picks.tolist()))
    assert in_class[picks[:5]].all()  # the suspect class's samples first


def test_walk_visits_over_blocks_of_the_pool_equal_those_over_all_of_it(
    monkeypatch,
):
    import skassoc._suggest as suggest

    rng = np.random.default_rng(0)
    pool = rng.standard_normal((50, 4)).astype(np.float32)
    anchors = rng.standard_normal((6, 4)).astype(np.float32)
    whole = suggest._visits(pool, anchors)
    monkeypatch.setattr(suggest, "VISIT_CHUNK", 7)
    np.testing.assert_allclose(suggest._visits(pool, anchors), whole, rtol=1e-5)
    # One anchor's walk visits each sample with the softmax of its
    # similarities; 1 is the uniform visit.
    expected = np.exp(pool @ anchors[0])
    expected *= len(pool) / expected.sum()
    np.testing.assert_allclose(suggest._visits(pool, anchors[:1]), expected, rtol=1e-4)


def test_shares_go_unchecked_when_the_labels_are_as_many_a_class():
    # A 70/30 split, as a good fit of imbalanced classes predicts it: with
    # as many labels a class, "auto" knows nothing to compare it with.
    report = diagnose_embeddings(
        *_parts(np.repeat([0, 1], [700, 300])), None, np.array(["cat", "dog"])
    )
    assert (
        report.verdict == "not checked" and "class_prior='uniform'" in report.reasons[0]
    )
    assert np.isnan(report.scores["class_share_ratio"])
    assert report.predicted_shares == {"cat": 0.7, "dog": 0.3}
    assert report.expected_shares == {}
    assert np.isfinite(report.scores["round_trip_change"])
    assert FitReport.from_dict(report.to_dict(), np.array(["cat", "dog"])) == report
    # Told that the classes are equally frequent, the same fit is suspect.
    uniform = diagnose_embeddings(
        *_parts(np.repeat([0, 1], [700, 300])),
        np.array([0.5, 0.5]),
        np.array(["cat", "dog"]),
    )
    assert uniform.verdict == "suspect"


def test_fit_report_false_skips_the_check(monkeypatch, tmp_path):
    rng = np.random.default_rng(0)
    X = _blobs(np.eye(2, 4) * 3, [40, 40], rng)
    y = np.full(80, -1)
    y[[0, 1, 40, 41]] = [0, 0, 1, 1]
    calls = []
    original = SemiSupervisedAssociationClassifier._fit_report

    def counted(self, *args):
        calls.append(1)
        return original(self, *args)

    monkeypatch.setattr(SemiSupervisedAssociationClassifier, "_fit_report", counted)
    params = {"max_iter": 3, "random_state": 0}
    checked = SemiSupervisedAssociationClassifier(**params).fit(X, y)
    assert len(calls) == 1 and isinstance(checked.fit_report_, FitReport)
    clf = SemiSupervisedAssociationClassifier(fit_report=False, **params).fit(X, y)
    assert len(calls) == 1 and clf.fit_report_ is None
    assert len(clf.suggest_labels(X, 2, y=y, random_state=0)) == 2
    clf.save(tmp_path / "model.skassoc")
    loaded = SemiSupervisedAssociationClassifier.load(tmp_path / "model.skassoc")
    assert loaded.fit_report_ is None and loaded.fit_report is False


def test_every_distinct_row_is_picked_before_any_row_twice(monkeypatch):
    import skassoc._suggest as suggest

    # Mini-batch k-means (as on large pools) on one row repeated 600 times
    # and 19 others: clustered by distinct row, no region goes empty.
    monkeypatch.setattr(suggest, "FULL_KMEANS_SAMPLES", 0)
    distinct = np.random.default_rng(0).standard_normal((20, 8)).astype(np.float32)
    pool = np.concatenate([np.repeat(distinct[:1], 600, axis=0), distinct[1:]])
    picks = suggest.suggest_from_embeddings(pool, pool[:0], np.ones(len(pool)), 20, 0)
    assert len({tuple(row) for row in pool[picks]}) == 20


def test_the_report_of_a_trained_model_reads_its_graph_rows_aligned(monkeypatch):
    """``fit_report`` embeds the unlabeled samples a chunk at a time and keeps
    every step-th one for the graph: the graph's rows and their predicted
    classes are those of the same samples."""
    import torch

    from skassoc import _diagnosis

    monkeypatch.setattr(_diagnosis, "GRAPH_SAMPLES", 40)
    monkeypatch.setattr(_diagnosis, "REPORT_CHUNK", 7)
    rng = np.random.default_rng(1)
    pred = rng.permutation(np.repeat([0, 1], [130, 70]))
    emb_lab, y_lab, _, emb_unl, _ = _parts(pred, foreign=0)
    foreign = rng.choice(np.flatnonzero(pred == 0), 40, replace=False)
    emb_unl[foreign] = 3 * np.eye(4)[2] + 0.02 * rng.standard_normal((40, 4))
    embeddings = np.concatenate([emb_lab, emb_unl])
    encoded = np.r_[y_lab, np.full(len(pred), -1)]
    # cat: the first or the third axis; dog: the second.
    weight = np.array([[1.0, 0, 1, 0], [0, 1, 0, 0]])
    layer = torch.nn.Linear(4, 2)
    with torch.no_grad():
        layer.weight.copy_(torch.as_tensor(weight))
        layer.bias.zero_()
    classes = np.array(["cat", "dog"])
    report = _diagnosis.fit_report(
        lambda rows: embeddings[rows], layer, encoded, classes, "uniform", seed=0
    )
    step = 5  # 200 unlabeled samples, 40 in the graph
    direct = diagnose_embeddings(
        emb_lab,
        y_lab,
        _diagnosis._softmax(emb_lab.astype(np.float64) @ weight.T),
        emb_unl[::step],
        _diagnosis._softmax(emb_unl.astype(np.float64) @ weight.T),
        np.array([0.5, 0.5]),
        classes,
        graph_predictions=pred[::step],
    )
    assert report == direct
    assert report.scores["excess_class_low_visit"] > 0


def test_the_low_visit_score_compares_with_the_median_of_the_other_classes():
    # Three classes; a region without labels handed to "cat": the score is
    # cat's share of rarely visited samples less the median of the others'
    # (both 0), with one class predicted NaN (nothing to compare with).
    three = _report(np.repeat([1, 2, 0], [300, 300, 400]), n_classes=3, foreign=100)
    assert three.scores["excess_class_low_visit"] == pytest.approx(100 / 400)
    single = _report(np.zeros(300, int), foreign=100)
    assert single.verdict == "suspect"
    assert np.isnan(single.scores["excess_class_low_visit"])


def test_graph_rows_and_their_predictions_must_match():
    parts = list(_parts(np.repeat([0, 1], 50)))
    with pytest.raises(ValueError, match="graph_predictions, one per row"):
        diagnose_embeddings(
            *parts[:3],
            parts[3][::2],
            parts[4],
            np.array([0.5, 0.5]),
            np.array(["cat", "dog"]),
        )


def test_a_report_saved_before_a_score_existed_loads_it_as_nan():
    report = _report(np.repeat([0, 1], 500))
    entry = report.to_dict()
    del entry["scores"]["excess_class_low_visit"]
    loaded = FitReport.from_dict(entry, np.array(["cat", "dog"]))
    assert set(loaded.scores) == set(REPORT_SCORES)
    assert np.isnan(loaded.scores["excess_class_low_visit"])


def test_the_share_threshold_rises_with_the_classes_as_their_noise_does():
    from statistics import NormalDist

    from skassoc._diagnosis import (
        SHARE_EXCESS_Z,
        SHARE_Z_CLASSES,
        _checked_report,
        share_excess_z,
    )

    assert share_excess_z() == share_excess_z(2) == share_excess_z(10) == 3.0
    thresholds = [share_excess_z(k) for k in (11, 20, 100, 1000)]
    assert thresholds == sorted(thresholds) and thresholds[0] > 3.0
    # The figures the user guide gives.
    assert (round(share_excess_z(20), 1), round(share_excess_z(100), 1)) == (3.2, 3.6)
    # As likely that noise passes it somewhere among 100 classes as among 10.
    tail = 1 - NormalDist().cdf(share_excess_z(100))
    assert math.isclose(
        100 * tail, SHARE_Z_CLASSES * (1 - NormalDist().cdf(SHARE_EXCESS_Z))
    )
    # The report reads its own number of classes: the same excess, 3.3
    # standard errors, is suspect among 10 classes and not among 100.
    for n_classes, verdict in [(10, "suspect"), (100, "ok")]:
        expected = np.full(n_classes, 1 / n_classes)
        shares = expected.copy()
        shares[0], shares[1] = 1.5 / n_classes, 0.5 / n_classes
        share_scores = (shares, 0, 0.5 / n_classes, 3.3)
        classes = np.arange(n_classes)
        report = _checked_report(classes, expected, share_scores, {}, 5, 999)
        assert report.verdict == verdict


def test_perfect_fits_of_many_classes_seldom_look_suspect():
    """Perfect predictions of a population whose classes are as frequent as
    expected: only the noise of the shares can trip the verdict."""
    rng = np.random.default_rng(0)
    n_classes, expected = 100, np.full(100, 0.01)
    flagged = {None: 0, n_classes: 0}
    for _ in range(200):
        predicted = rng.integers(0, n_classes, 2_000)
        shares, worst, excess, z = class_share_scores(
            np.eye(n_classes)[predicted], expected
        )
        scores = {"class_share_ratio": shares[worst] / 0.01, "class_share_z": z}
        for n in flagged:
            flagged[n] += is_suspect(scores, n)
    # A threshold read for 10 classes flags many; the fit's own, few.
    assert flagged[None] >= 10 and flagged[n_classes] <= 4


def test_perfect_fits_of_few_samples_a_class_seldom_look_suspect():
    """Twenty classes, five unlabeled samples each expected: the counts are
    skewed, and the excess over its normal standard error would flag about
    one perfect fit in ten; the binomial tail keeps it near the intended
    rate (ten classes' chance of 3 standard errors, about 1.3 %)."""
    rng = np.random.default_rng(0)
    n_classes, n = 20, 100
    expected = np.full(n_classes, 1 / n_classes)
    flagged = 0
    for _ in range(500):
        predicted = rng.integers(0, n_classes, n)
        shares, worst, excess, z = class_share_scores(
            np.eye(n_classes)[predicted], expected
        )
        normal_z = excess / math.sqrt(expected[worst] * (1 - expected[worst]) / n)
        assert z <= normal_z + 1e-9  # the heavier tail: never a larger score
        scores = {"class_share_ratio": shares[worst] * n_classes, "class_share_z": z}
        flagged += is_suspect(scores, n_classes)
    assert flagged <= 15  # 3 %; the normal approximation flags about 45


def test_shares_of_random_labels_are_tested_as_two_measured_proportions():
    from scipy.stats import binom, norm

    from skassoc._diagnosis import _excess_z

    # Given shares: the binomial tail P(count >= 150), summed here term by
    # term; no excess: the plain standard score.
    tail = sum(binom.pmf(c, 1_000, 0.1) for c in range(150, 1_001))
    assert _excess_z(150, 1_000, 0.1) == pytest.approx(norm.isf(tail))
    assert _excess_z(90, 1_000, 0.1) == pytest.approx(-10 / math.sqrt(90))
    # A tail below the smallest float: the normal score, far above 3.
    assert 3 < _excess_z(10**6, 10**7, 0.01) < math.inf
    # The smallest excess never scores below 0, and more never scores less.
    assert _excess_z(3, 3, 0.999) == 0.0
    scores = [_excess_z(c, 500, 0.1) for c in range(50, 120)]
    assert scores == sorted(scores)
    # Shares of 1,000 labels: the pooled share's variance, 250 of 2,000.
    pooled = 250 / 2_000
    error = math.sqrt(pooled * (1 - pooled) * (1 / 1_000 + 1 / 1_000))
    assert _excess_z(150, 1_000, 0.1, expected_from=1_000) == pytest.approx(
        0.05 / error
    )


def test_a_style_handed_over_among_many_samples_is_flagged():
    """10 equally frequent classes, 5,000 unlabeled samples: a fifth of one
    class predicted as another (2 % of the samples) is flagged most of the
    time against given shares."""
    rng = np.random.default_rng(0)
    flagged = 0
    for _ in range(200):
        predicted = rng.integers(0, 10, 5_000)
        predicted[(predicted == 0) & (rng.random(5_000) < 0.2)] = 1
        shares, worst, _, z = class_share_scores(
            np.eye(10)[predicted], np.full(10, 0.1)
        )
        scores = {"class_share_ratio": shares[worst] / 0.1, "class_share_z": z}
        flagged += is_suspect(scores, 10)
    assert flagged >= 170


def test_perfect_fits_seldom_look_suspect_against_the_shares_of_random_labels():
    """50 labels drawn at random among 10 equally frequent classes: the
    class that most exceeds its labels' share is mostly one the labels
    under-count, whose own share's variance would be too small (about a
    quarter of these perfect fits looked suspect so)."""
    rng = np.random.default_rng(0)
    flagged = 0
    for _ in range(300):
        labels = rng.multinomial(50, np.full(10, 0.1)) / 50
        predicted = rng.integers(0, 10, 500)
        shares, worst, _, z = class_share_scores(np.eye(10)[predicted], labels, 50)
        ratio = shares[worst] / labels[worst] if labels[worst] else math.inf
        flagged += is_suspect({"class_share_ratio": ratio, "class_share_z": z}, 10)
    assert flagged <= 6
