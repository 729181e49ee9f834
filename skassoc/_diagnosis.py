"""What a fit can tell about itself without test labels (``fit_report_``).

A few-label fit fails in one typical way: a style of one class that no
labeled sample shows is embedded with another class, confidently (the
network's margin and the association's walks both agree with the wrong
class there, so neither uncertainty nor round trips reveal it). What it
changes that the training data can show is the share of the unlabeled
samples each class receives: the class that takes the style grows by the
style's share. The report compares the predicted shares with the shares
the fit expects (the given ``class_prior``, or those of labels drawn at
random; labels drawn as many a class say nothing about the classes'
shares, and then the shares go unchecked), and adds what the association
graph says about the unlabeled samples: how many lie in regions that no
labeled sample's walk reaches, and how often round trips change class.
A share excess is cleared when the inputs side with the class: the labels
spread over the training inputs (:mod:`._input_view`), which the fit
cannot have bent, agree with its predictions clearly better than with
the other classes'.

The scores are computed on at most :data:`REPORT_SAMPLES` unlabeled samples
and :data:`REPORT_LABELED` labeled ones (random subsets beyond), from one
pass of the trained network.
"""

import math
import warnings
from dataclasses import dataclass, field

import numpy as np
import scipy.stats
import torch

from ._input_view import spread_labels
from ._prior import apply_class_prior, uniform_prior
from ._utils import user_stacklevel

__all__ = [
    "FitReport",
    "FitReportWarning",
    "REPORT_SCORES",
    "class_share_scores",
    "largest_excess",
    "diagnose_embeddings",
    "fit_report",
    "graph_step",
    "warn_if_suspect",
]

#: Unlabeled samples the report reads, at most: a share measured on 50,000
#: samples has a standard error of at most 0.0023 (binomial), small beside
#: the excess that a style given to another class causes.
REPORT_SAMPLES = 50_000
#: Labeled samples the report reads, at most (the graph's rows).
REPORT_LABELED = 2_000
#: Unlabeled samples of the graph's scores, at most (its columns): the
#: graph holds three labeled-by-unlabeled matrices, 80 MB each at most.
GRAPH_SAMPLES = 10_000
#: Unlabeled samples embedded at once by the report.
REPORT_CHUNK = 1_024

#: A class whose predicted share of the unlabeled samples exceeds its
#: expected share by more than this fraction of it (and by more than the
#: sampling noise) makes the verdict "suspect". See docs/benchmarks/trust.rst
#: for how often it flags failed and good fits.
SHARE_EXCESS_TOLERANCE = 0.1
#: Standard errors the excess must exceed as well: on few unlabeled
#: samples a share is itself too noisy to read. This holds up to
#: :data:`SHARE_Z_CLASSES` classes; with more, see :func:`share_excess_z`.
SHARE_EXCESS_Z = 3.0
#: The number of classes whose largest excess :data:`SHARE_EXCESS_Z` is read
#: for (MNIST's ten, where the verdict was measured).
SHARE_Z_CLASSES = 10
#: Fits shorter than this many steps are not warned about: their shares say
#: more about the short training (a smoke test, a search's quick candidate)
#: than about the data; their report still gives the verdict.
WARN_MIN_STEPS = 100
#: A sample whose walk visits are below this fraction of a uniform visit
#: counts as rarely visited.
LOW_VISIT = 0.5
#: A share excess whose class's predictions the labels spread over the
#: inputs give to other classes less often than the other classes' by more
#: than this (``excess_class_input_disagreement`` below its negative) reads
#: as a class more frequent than expected, not as a region handed to it:
#: the verdict stays "ok". See docs/benchmarks/trust.rst for where failed
#: and good fits score.
FREQUENT_CLASS_MARGIN = 0.05
#: A class predicted at more than this many times its expected share is not
#: read as merely frequent, whatever the inputs say: the expected shares are
#: then far off (give them as class_prior) or the fit is (a fit at chance
#: level, where every class disagrees with the inputs, lets the class that
#: took the most samples disagree least). It lies well above the ratios of
#: the MNIST fits the verdict was measured on (the ratio columns of
#: docs/benchmarks/trust.rst), whose verdicts it leaves as they were.
FREQUENT_CLASS_MAX_RATIO = 2.0

#: The report's scores, with what each measures (the user guide's table).
REPORT_SCORES = {
    "class_share_excess": (
        "largest excess of a class's predicted share of the unlabeled samples "
        "over its expected share (class_prior when given, or the shares of "
        "labels drawn at random)"
    ),
    "class_share_ratio": "that class's predicted share over its expected share",
    "class_share_z": (
        "that class's excess in standard errors (against given shares, the "
        "normal quantile of its count's binomial tail; against the shares of "
        "random labels, the two-proportion test's score)"
    ),
    "low_visit_share": (
        "share of the unlabeled samples that the walks from the labeled ones "
        f"visit less than {LOW_VISIT:g} times as often as a uniform visit"
    ),
    "round_trip_change": (
        "probability that a round trip from a labeled sample through the "
        "unlabeled ones ends in another class"
    ),
    "label_agreement": (
        "share of the labeled samples that the network classifies as labeled"
    ),
    "excess_class_low_visit": (
        "share of the rarely visited samples (as in low_visit_share) among "
        "the predictions of the class of the largest share excess, less the "
        "median of the other classes' shares"
    ),
    "excess_class_input_disagreement": (
        "share of the predictions of the class of the largest share excess "
        "that the labels spread over the inputs give to another class, less "
        "the median of the other classes' shares"
    ),
}


class FitReportWarning(UserWarning):
    """Warned by ``fit`` when its :class:`FitReport` says ``"suspect"``."""


@dataclass(frozen=True, eq=False)
class FitReport:
    """What a fit says about itself, from its training data alone.

    Attributes
    ----------
    verdict : {"ok", "suspect", "not checked"}
        ``"suspect"`` when a class takes a markedly larger share of the
        unlabeled samples than expected (see ``reasons``), unless the labels
        spread over the inputs agree with that class's predictions clearly
        more often than with the other classes' (a class merely more
        frequent than expected; ``scores["excess_class_input_disagreement"]``);
        ``"not checked"``
        when the fit has no unlabeled samples or a single class, or when
        the classes' expected shares are unknown (``class_prior="auto"``
        with as many labels a class; ``reasons`` says which).
    reasons : tuple of str
        Why the verdict is not ``"ok"``, in words.
    scores : dict of str to float
        The scores of :data:`REPORT_SCORES` (NaN where not computed).
    predicted_shares, expected_shares : dict of label to float
        Per class: its share of the unlabeled samples' predictions, and the
        share the fit expects (empty when unknown). With ``class_prior``
        given, the predictions are weighed by it as ``predict`` weighs
        them; with ``"auto"`` they are the network's own, before the
        frequencies that ``predict`` estimates.
    n_labeled, n_unlabeled : int
        Samples the report was computed on.
    """

    verdict: str
    reasons: tuple = ()
    scores: dict = field(default_factory=dict)
    predicted_shares: dict = field(default_factory=dict)
    expected_shares: dict = field(default_factory=dict)
    n_labeled: int = 0
    n_unlabeled: int = 0

    def __eq__(self, other):
        # Through the JSON values, where a NaN score (not computed) is None:
        # NaN is unequal to itself, which would make equal reports differ.
        if not isinstance(other, FitReport):
            return NotImplemented
        return self.to_dict() == other.to_dict() and list(
            self.predicted_shares
        ) == list(other.predicted_shares)

    __hash__ = None

    def __str__(self):
        lines = [f"verdict: {self.verdict}"]
        lines += [f"  {reason}" for reason in self.reasons]
        lines += [f"{name}: {value:.4g}" for name, value in self.scores.items()]
        return "\n".join(lines)

    def to_dict(self):
        """The report as JSON values; shares as lists in the order of the classes."""
        return {
            "verdict": self.verdict,
            "reasons": list(self.reasons),
            "scores": {k: _json_float(v) for k, v in self.scores.items()},
            "predicted_shares": list(self.predicted_shares.values()),
            "expected_shares": list(self.expected_shares.values()),
            "n_labeled": self.n_labeled,
            "n_unlabeled": self.n_unlabeled,
        }

    @classmethod
    def from_dict(cls, entry, classes):
        """The report :meth:`to_dict` gave, for a model of ``classes``.

        Raises
        ------
        ValueError
            If ``entry`` is not such a report (nothing in it runs).
        """
        if not isinstance(entry, dict) or set(entry) != _REPORT_KEYS:
            raise ValueError("bad fit_report entry.")
        verdict, reasons = entry["verdict"], entry["reasons"]
        if verdict not in VERDICTS or not _strings(reasons):
            raise ValueError("bad fit_report verdict or reasons.")
        scores = entry["scores"]
        if not isinstance(scores, dict) or not all(
            isinstance(k, str) and (v is None or _number(v)) for k, v in scores.items()
        ):
            raise ValueError("bad fit_report scores.")
        shares = [entry["predicted_shares"], entry["expected_shares"]]
        for values in shares:
            if not isinstance(values, list) or not (
                values == []
                or (len(values) == len(classes) and all(map(_number, values)))
            ):
                raise ValueError("bad fit_report shares.")
            if values and not all(0 <= v <= 1 for v in values):
                raise ValueError("bad fit_report shares.")
        if entry["expected_shares"] and min(entry["expected_shares"]) <= 0:
            raise ValueError("bad fit_report shares.")
        counts = entry["n_labeled"], entry["n_unlabeled"]
        if not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts
        ):
            raise ValueError("bad fit_report sample counts.")
        labels = np.asarray(classes).tolist()
        # A report saved before a score existed lacks it: NaN, not computed.
        scores = {k: math.nan if v is None else float(v) for k, v in scores.items()}
        return cls(
            verdict,
            tuple(reasons),
            {**dict.fromkeys(REPORT_SCORES, math.nan), **scores},
            *(dict(zip(labels, v)) if v else {} for v in shares),
            *counts,
        )


VERDICTS = ("ok", "suspect", "not checked")
_REPORT_KEYS = {
    "verdict",
    "reasons",
    "scores",
    "predicted_shares",
    "expected_shares",
    "n_labeled",
    "n_unlabeled",
}


def _number(value):
    """A finite int or float (an int too large for a float is not)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def _strings(values, most=8, longest=2_000):
    return (
        isinstance(values, list)
        and len(values) <= most
        and all(isinstance(v, str) and len(v) <= longest for v in values)
    )


def _json_float(value):
    return None if value is None or math.isnan(value) else float(value)


def largest_excess(shares, expected):
    """Index of the class whose share most exceeds its expected share: the
    class a suspect report names."""
    return int(np.argmax(np.subtract(shares, expected)))


def class_share_scores(proba_unlabeled, expected, expected_from=None):
    """Predicted class shares and the largest excess over ``expected``.

    Parameters
    ----------
    proba_unlabeled : ndarray of shape (n_unlabeled, n_classes)
        The probabilities the predictions take the largest of.
    expected : ndarray of shape (n_classes,)
    expected_from : int, optional
        When ``expected`` are the shares of this many labels drawn at random,
        their sampling noise adds to that of the predicted shares.

    Returns
    -------
    shares : ndarray of shape (n_classes,)
        Shares of the predicted classes.
    worst : int
        The class of the largest excess.
    excess, z : float
        Its excess, and the excess in standard errors.
    """
    n, n_classes = proba_unlabeled.shape
    counts = np.bincount(proba_unlabeled.argmax(1), minlength=n_classes)
    shares = counts / n
    excess = shares - expected
    worst = largest_excess(shares, expected)
    z = _excess_z(int(counts[worst]), n, float(expected[worst]), expected_from)
    return shares, worst, float(excess[worst]), z


def _excess_z(count, n, share, expected_from=None):
    """A class's excess of ``count`` predictions among ``n`` over its expected
    ``share``, in standard errors.

    Given shares are exact: the score is the normal quantile of the count's
    binomial upper tail, since the count of a class expected a few times is
    skewed, its upper tail heavier than the normal one (the excess over its
    normal standard error flags perfect fits of many small classes several
    times more often than the verdict's threshold intends). Shares of
    ``expected_from`` labels drawn at random are measured too: the score is
    the two-proportion test's, whose variance is that of the pooled share.
    The labels' own share would be biased low, since the class that most
    exceeds it is likely one its labels under-count.
    """
    if expected_from:
        pooled = (count + share * expected_from) / (n + expected_from)
        variance = max(pooled * (1 - pooled), 1e-12) * (1 / n + 1 / expected_from)
        return float((count / n - share) / math.sqrt(variance))
    z = (count / n - share) / math.sqrt(max(share * (1 - share), 1e-12) / n)
    if count > n * share and 0 < share < 1:
        tail = scipy.stats.binom.sf(count - 1, n, share)
        if tail > 0:  # smaller than a float: z is far above any threshold
            # A tail that holds the count itself can pass one half for the
            # smallest excess: an excess never scores below 0.
            z = max(scipy.stats.norm.isf(tail), 0.0)
    return float(z)


def graph_step(n_unlabeled):
    """Every how many unlabeled samples one is a row of the association
    graph: at most :data:`GRAPH_SAMPLES` rows, evenly spaced (samples
    ordered by class keep every class)."""
    return max(1, math.ceil(n_unlabeled / GRAPH_SAMPLES))


def _graph_scores(emb_labeled, y_labeled, emb_unlabeled, predicted, excess_class):
    """Visit and round-trip scores of the association graph (torch, float32),
    on at most :data:`GRAPH_SAMPLES` unlabeled samples (evenly spaced over
    them: samples ordered by class keep every class).

    ``predicted`` holds the predicted classes of ``emb_unlabeled``'s rows;
    ``excess_class`` is the class of the largest share excess, or None.
    """
    step = graph_step(len(emb_unlabeled))
    a = torch.as_tensor(emb_labeled, dtype=torch.float32)
    b = torch.as_tensor(emb_unlabeled[::step], dtype=torch.float32)
    similarity = a @ b.T
    p_ab = torch.softmax(similarity, dim=1)
    p_ba = torch.softmax(similarity.T, dim=1)
    low = (p_ab.mean(0) * b.shape[0] < LOW_VISIT).cpu().numpy()
    labels = torch.as_tensor(y_labeled)
    same_class = (labels[:, None] == labels[None, :]).float()
    # Round trips a -> b -> a' (a labeled-by-labeled matrix), summed over
    # the a' of another class; chunked so that memory stays bounded.
    change = torch.cat(
        [
            ((p_ab[rows] @ p_ba) * (1 - same_class[rows])).sum(1)
            for rows in torch.split(torch.arange(a.shape[0]), 1024)
        ]
    )
    return {
        "low_visit_share": float(low.mean()),
        "round_trip_change": float(change.mean()),
        # A region handed to a class holds none of its labels, so the walks
        # seldom reach it. Reported only: the fit's own embedding makes such
        # a region look like one of its new class, and failed fits of some
        # recipes score near zero (docs/benchmarks/trust.rst); the verdict
        # reads the inputs' opinion (_input_disagreement) instead.
        "excess_class_low_visit": _excess_less_median(
            low, np.asarray(predicted)[::step], excess_class
        ),
    }


def _input_disagreement(spread, predicted, excess_class):
    """The share of the excess class's predictions that the labels spread
    over the inputs (``spread``, see :mod:`._input_view`) give to another
    class, less the median of the other predicted classes' shares.

    A region of another class that the network hands to a class lies, in
    the inputs, near that other class's labels, so the spread labels
    disagree with the class there more often than with the others. A class
    merely more frequent than expected holds samples like its own labels,
    and the spread labels agree with it as often as with the others or
    more. None for ``spread`` (no input view) gives NaN.
    """
    if spread is None:
        return math.nan
    return _excess_less_median(spread != predicted, predicted, excess_class)


def _excess_less_median(flag, predicted, excess_class):
    """The share of ``flag`` among the excess class's predictions, less the
    median of the other predicted classes' shares (NaN without another)."""
    if excess_class is None or not np.any(predicted == excess_class):
        return math.nan
    others = np.setdiff1d(np.unique(predicted), [excess_class])
    if len(others) == 0:  # a single predicted class: nothing to compare with
        return math.nan
    shares = [flag[predicted == c].mean() for c in others]
    return float(flag[predicted == excess_class].mean() - np.median(shares))


def diagnose_embeddings(
    emb_labeled,
    y_labeled,
    proba_labeled,
    emb_unlabeled,
    proba_unlabeled,
    expected,
    classes,
    expected_from=None,
    graph_predictions=None,
    spread=None,
):
    """The :class:`FitReport` of a fit from its samples' embeddings.

    Parameters
    ----------
    emb_labeled : ndarray of shape (n_labeled, dim)
    y_labeled : ndarray of shape (n_labeled,)
        Encoded labels (0..n_classes-1).
    proba_labeled : ndarray of shape (n_labeled, n_classes)
    emb_unlabeled : ndarray of shape (n_graph, dim)
        Embeddings of the association graph's unlabeled samples: those of
        ``proba_unlabeled``'s rows, or a subset of them whose predicted
        classes ``graph_predictions`` gives.
    proba_unlabeled : ndarray of shape (n_unlabeled, n_classes)
        The probabilities that predictions take the largest of.
    expected : ndarray of shape (n_classes,) or None
        The shares the fit expects; None when unknown (see
        :func:`expected_shares`).
    classes : ndarray of shape (n_classes,)
    expected_from : int, optional
        See :func:`class_share_scores`.
    graph_predictions : ndarray of shape (n_graph,), optional
        The predicted classes of ``emb_unlabeled``'s rows; by default those
        of ``proba_unlabeled``, which then has the same rows.
    spread : ndarray of shape (n_graph,), optional
        The classes that the labels spread over the inputs give the graph's
        rows (:func:`._input_view.spread_labels`); without them the verdict
        reads the class shares alone.

    Returns
    -------
    report : FitReport
    """
    n_classes = len(classes)
    n_labeled, n_unlabeled = len(y_labeled), len(proba_unlabeled)
    if n_unlabeled == 0 or n_labeled == 0 or n_classes < 2:
        return FitReport(
            "not checked",
            ("the fit has no unlabeled samples or a single class",),
            dict.fromkeys(REPORT_SCORES, math.nan),
            n_labeled=n_labeled,
            n_unlabeled=n_unlabeled,
        )
    if graph_predictions is None:
        graph_predictions = proba_unlabeled.argmax(1)
    if len(graph_predictions) != len(emb_unlabeled):
        raise ValueError(
            f"{len(emb_unlabeled)} graph rows but {len(graph_predictions)} "
            "predicted classes: pass graph_predictions, one per row of "
            "emb_unlabeled, when those rows are a subset of proba_unlabeled's."
        )
    if spread is not None and len(spread) != len(emb_unlabeled):
        raise ValueError(
            f"{len(emb_unlabeled)} graph rows but {len(spread)} spread labels: "
            "pass spread, one per row of emb_unlabeled."
        )
    share_scores = None
    if expected is not None:
        share_scores = class_share_scores(proba_unlabeled, expected, expected_from)
    excess_class = None if share_scores is None else share_scores[1]
    graph_scores = {
        **_graph_scores(
            emb_labeled, y_labeled, emb_unlabeled, graph_predictions, excess_class
        ),
        "label_agreement": float(np.mean(proba_labeled.argmax(1) == y_labeled)),
        "excess_class_input_disagreement": _input_disagreement(
            spread, np.asarray(graph_predictions), excess_class
        ),
    }
    if share_scores is None:
        shares = np.bincount(proba_unlabeled.argmax(1), minlength=n_classes)
        return FitReport(
            "not checked",
            (_UNKNOWN_SHARES,),
            {**dict.fromkeys(_SHARE_SCORES, math.nan), **graph_scores},
            dict(zip(classes.tolist(), (shares / n_unlabeled).tolist(), strict=True)),
            {},
            n_labeled,
            n_unlabeled,
        )
    return _checked_report(
        classes, expected, share_scores, graph_scores, n_labeled, n_unlabeled
    )


def _checked_report(classes, expected, share_scores, graph_scores, *counts):
    """The report of a fit whose classes' expected shares are known: its
    verdict is :func:`is_suspect` of the share excess of
    :func:`class_share_scores` and of the graph's scores."""
    shares, worst, excess, z = share_scores
    ratio = shares[worst] / expected[worst]
    scores = {
        "class_share_excess": excess,
        "class_share_ratio": float(ratio),
        "class_share_z": z,
        **graph_scores,
    }
    reasons = ()
    if is_suspect(scores, len(classes)):
        reasons = (
            f"class {classes.tolist()[worst]!r} takes {shares[worst]:.1%} of the "
            f"unlabeled samples where {expected[worst]:.1%} is expected: a region of "
            "another class may have been given to it. Label the samples "
            "suggest_labels returns and refit; if the classes' true shares are "
            "unequal, give them as class_prior.",
        )
    return FitReport(
        "suspect" if reasons else "ok",
        reasons,
        scores,
        dict(zip(classes.tolist(), shares.tolist(), strict=True)),
        dict(zip(classes.tolist(), np.asarray(expected).tolist(), strict=True)),
        *counts,
    )


_SHARE_SCORES = ("class_share_excess", "class_share_ratio", "class_share_z")
_UNKNOWN_SHARES = (
    "the classes' shares are unknown, so they were not checked: the labels "
    "are as many a class, which says nothing about how frequent the classes "
    "are, and class_prior='auto' assumes nothing. Pass class_prior='uniform' "
    "if the classes are about equally frequent, or their frequencies, to "
    "have the fit's class shares checked."
)


def is_suspect(scores, n_classes=None):
    """The verdict's rule, on a report's scores: a class's share excess
    (:data:`SHARE_EXCESS_TOLERANCE`, :func:`share_excess_z`) that the inputs
    do not explain as a frequent class (:data:`FREQUENT_CLASS_MARGIN`,
    :data:`FREQUENT_CLASS_MAX_RATIO`; a missing or NaN
    ``excess_class_input_disagreement`` explains nothing).
    ``n_classes``: the fit's, None for at most :data:`SHARE_Z_CLASSES`."""
    return share_excess(scores, n_classes) and not _frequent_class(scores)


def share_excess(scores, n_classes=None):
    """The share part of :func:`is_suspect`: a class takes markedly more of
    the unlabeled samples than expected."""
    ratio, z = scores["class_share_ratio"], scores["class_share_z"]
    return ratio - 1 > SHARE_EXCESS_TOLERANCE and z > share_excess_z(n_classes)


def share_excess_z(n_classes=None):
    """Standard errors a class's share excess must exceed among ``n_classes``.

    The verdict reads the largest of the classes' excesses, and the more
    classes, the likelier noise alone puts one of them above a fixed
    threshold. Up to :data:`SHARE_Z_CLASSES` classes the threshold is
    :data:`SHARE_EXCESS_Z`; with more, it rises so that the chance that
    some class's noise passes it stays that of :data:`SHARE_Z_CLASSES`
    classes (a Bonferroni correction of the normal tail: about 3.2
    standard errors for 20 classes, 3.6 for 100).
    """
    if n_classes is None or n_classes <= SHARE_Z_CLASSES:
        return SHARE_EXCESS_Z
    # Upper tails straight (norm.sf, norm.isf): no 1 - p to round.
    tail = SHARE_Z_CLASSES * scipy.stats.norm.sf(SHARE_EXCESS_Z) / n_classes
    return float(scipy.stats.norm.isf(tail))


def _frequent_class(scores):
    disagreement = scores.get("excess_class_input_disagreement")
    return (
        disagreement is not None
        and disagreement < -FREQUENT_CLASS_MARGIN
        and scores["class_share_ratio"] <= FREQUENT_CLASS_MAX_RATIO
    )


def warn_if_suspect(report, n_iter):
    """Warn with the report's reasons when its verdict is ``"suspect"`` (for a
    fit of at least :data:`WARN_MIN_STEPS` steps)."""
    if report is not None and report.verdict == "suspect" and n_iter >= WARN_MIN_STEPS:
        warnings.warn(
            f"fit_report_ finds this fit suspect: {' '.join(report.reasons)}",
            FitReportWarning,
            stacklevel=user_stacklevel(),
        )


def report_samples(encoded, seed):
    """Indices of the labeled and unlabeled samples the report reads."""
    rng = np.random.default_rng(seed)
    labeled = np.flatnonzero(encoded >= 0)
    unlabeled = np.flatnonzero(encoded == -1)
    if len(labeled) > REPORT_LABELED:
        labeled = np.sort(rng.choice(labeled, REPORT_LABELED, replace=False))
    if len(unlabeled) > REPORT_SAMPLES:
        unlabeled = np.sort(rng.choice(unlabeled, REPORT_SAMPLES, replace=False))
    return labeled, unlabeled


def expected_shares(class_prior, encoded, n_classes):
    """The shares a fit expects, and how many labels they were drawn from.

    Given frequencies, and ``"uniform"``, are what the user says. With
    ``"auto"`` the fit assumes no frequencies (it estimates them from the
    very predictions the report checks); labels of unequal counts are read
    as a random draw, whose shares estimate the classes' (with sampling
    noise), while labels of equal counts were drawn as many a class and say
    nothing about them: then no share is expected.

    Returns
    -------
    expected : ndarray of shape (n_classes,) or None
        None when the shares are unknown (the class shares go unchecked).
    expected_from : int or None
        The number of labels, when their shares carry sampling noise.
    """
    if not isinstance(class_prior, str):
        return np.asarray(class_prior, dtype=float), None
    if class_prior == "uniform":
        return uniform_prior(n_classes), None
    counts = np.bincount(encoded[encoded >= 0], minlength=n_classes)
    if counts.sum() == 0 or np.all(counts == counts[0]):
        return None, None
    return counts / counts.sum(), int(counts.sum())


def fit_report(embed, logits_layer, encoded, classes, class_prior, seed, features=None):
    """The :class:`FitReport` of a trained model.

    Parameters
    ----------
    embed : callable
        ``embed(indices)`` returns the embeddings of those training samples
        (float32 ndarray), a batch at a time.
    logits_layer : torch.nn.Linear
        The model's classification layer.
    encoded : ndarray of shape (n_samples,)
        The training labels, encoded (-1 unlabeled; held-out samples < -1).
    classes : ndarray of shape (n_classes,)
    class_prior : {"auto", "uniform"} or ndarray of shape (n_classes,)
        The checked parameter: given frequencies weigh the predictions (as
        ``predict`` does) and are the shares expected.
    seed : int
        Picks the samples beyond the caps.
    features : callable, optional
        ``features(indices)`` returns those training samples' inputs (see
        :func:`._input_view.spread_labels`): the second opinion that can
        clear a share excess. Without it the verdict reads the shares alone.

    Returns
    -------
    report : FitReport
    """
    labeled, unlabeled = report_samples(encoded, seed)
    weight = logits_layer.weight.detach().double().cpu().numpy()
    bias = logits_layer.bias.detach().double().cpu().numpy()
    expected, expected_from = expected_shares(class_prior, encoded, len(classes))

    def embed_and_proba(indices):
        if len(indices) == 0:
            return np.empty((0, weight.shape[1]), np.float32), np.empty((0, len(bias)))
        embeddings = embed(indices)
        # float32 products: a float64 copy of 50,000 embeddings would take
        # more memory than the rest of the report.
        logits = embeddings @ weight.T.astype(np.float32)
        proba = _softmax(logits.astype(np.float64) + bias)
        if not isinstance(class_prior, str):
            proba = apply_class_prior(proba, expected)
        return embeddings, proba

    emb_labeled, proba_labeled = embed_and_proba(labeled)
    # A chunk at a time, keeping the embeddings of the graph's samples only:
    # the report's memory stays far below that of its samples' inputs.
    step = graph_step(len(unlabeled))
    graph, proba = [], []
    for start in range(0, len(unlabeled), REPORT_CHUNK):
        emb, chunk_proba = embed_and_proba(unlabeled[start : start + REPORT_CHUNK])
        graph.append(emb[(-start) % step :: step])
        proba.append(chunk_proba)
    emb_unlabeled = np.concatenate(graph) if graph else emb_labeled[:0]
    proba_unlabeled = np.concatenate(proba) if proba else proba_labeled[:0]
    # The graph's rows are every step-th unlabeled sample, as above.
    graph_predictions = proba_unlabeled[::step].argmax(1)
    spread = None
    if features is not None and expected is not None:
        # Only a checked share excess reads it: unknown shares name no class.
        spread = spread_labels(
            features, labeled, encoded[labeled], unlabeled[::step], seed
        )
    return diagnose_embeddings(
        emb_labeled,
        encoded[labeled],
        proba_labeled,
        emb_unlabeled,
        proba_unlabeled,
        expected,
        np.asarray(classes),
        expected_from,
        graph_predictions,
        spread,
    )


def _softmax(logits):
    logits = logits - logits.max(1, keepdims=True)
    exp = np.exp(logits)
    return exp / exp.sum(1, keepdims=True)
