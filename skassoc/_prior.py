"""The class frequencies that training and predictions assume (``class_prior``).

Every labeled batch holds as many samples of each class, so the trained
network's probabilities assume that every class is equally frequent. On
imbalanced data that favours the rare classes. ``class_prior="auto"``
estimates the class frequencies among the unlabeled training samples as the
mean of the network's probabilities there, and predictions weigh each class's
probability by its estimated frequency (Bayes' rule for a change of class
frequencies; Saerens, Latinne and Decaestecker, 2002).

The visit loss makes the same assumption during training: its walks start
equally often at every labeled sample, so a uniform visit of the unlabeled
batch asks each class to take an equal share of it. Given frequencies start
its walks at each class in proportion to them instead (and the balance loss
aims at them).
"""

from collections.abc import Mapping

import numpy as np

from ._inputs import UNLABELED

__all__ = [
    "PRIOR_SAMPLES",
    "apply_class_prior",
    "check_class_prior",
    "estimate_class_prior",
    "label_frequencies",
    "prior_samples",
    "training_class_prior",
    "uniform_prior",
]

#: Samples the frequencies of ``"auto"`` are estimated on, at most: a random
#: subset of the unlabeled training samples beyond it. A share estimated on
#: 10,000 samples has a standard error of at most 0.005 (binomial), far
#: below the error of the network's probabilities, and the estimate costs
#: one prediction of at most that many samples.
PRIOR_SAMPLES = 10_000


def check_class_prior(class_prior, n_classes):
    """``class_prior`` as float64 frequencies summing to 1, or the string as is.

    Parameters
    ----------
    class_prior : {"auto", "uniform"} or array-like of shape (n_classes,)
        The estimator's parameter.
    n_classes : int
        Classes of the labeled samples.

    Returns
    -------
    class_prior : str or ndarray of shape (n_classes,)

    Raises
    ------
    ValueError
        If an array is not one positive, finite frequency per class.
    """
    if isinstance(class_prior, str):
        return class_prior
    if isinstance(class_prior, Mapping) or hasattr(class_prior, "keys"):
        # A dict or a pandas Series names its classes; matching them by
        # position instead (value_counts sorts by count) would be wrong.
        raise ValueError(
            "class_prior takes one frequency per class in the order of the "
            "sorted labels (classes_), not a dict or a pandas Series; pass "
            "e.g. series.sort_index().to_numpy() or [freq[c] for c in "
            "sorted(freq)]."
        )
    if np.ma.isMaskedArray(class_prior):
        raise ValueError("class_prior must not be a masked array.")
    if callable(getattr(class_prior, "detach", None)):
        # A torch tensor that requires grad refuses numpy's conversion.
        class_prior = class_prior.detach().cpu()
    values = np.asarray(class_prior)
    if values.ndim != 1 or len(values) != n_classes or values.dtype.kind not in "iuf":
        raise ValueError(
            f"class_prior must be 'auto', 'uniform' or one number per class "
            f"({n_classes} classes, in the order of classes_); got {class_prior!r}."
        )
    # A copy: the fitted frequencies never change with the caller's array.
    prior = np.array(values, dtype=np.float64)
    with np.errstate(over="ignore"):
        normalised = abs(prior.sum() - 1) <= 1e-12
    # Frequencies that sum to 1 stay bit for bit (a saved model's); others
    # are scaled by the largest first, so that their sum cannot overflow.
    if not normalised and np.isfinite(prior).all() and (prior > 0).all():
        prior /= prior.max()
        prior /= prior.sum()
    if not (np.isfinite(prior).all() and (prior > 0).all()):
        raise ValueError(
            "class_prior must hold positive, finite frequencies, none so much "
            f"smaller than the largest that it rounds to 0; got {values.tolist()}. "
            "Give a rare class a small positive frequency instead of 0."
        )
    return prior


def prior_samples(encoded, seed):
    """Indices of the unlabeled samples that ``"auto"`` estimates the frequencies on.

    At most :data:`PRIOR_SAMPLES` of them, drawn at random with ``seed``, in
    increasing order (a memory map reads them front to back); none when no
    sample is unlabeled (see :func:`label_frequencies`).
    """
    indices = np.flatnonzero(encoded == UNLABELED)
    if len(indices) > PRIOR_SAMPLES:
        rng = np.random.default_rng(seed)
        indices = np.sort(rng.choice(indices, PRIOR_SAMPLES, replace=False))
    return indices


def label_frequencies(encoded, n_classes):
    """The class frequencies of the trained labels (held-out samples left out).

    ``"auto"``'s frequencies when no sample is unlabeled: the labels give
    them exactly.
    """
    labels = encoded[encoded >= 0]
    return np.bincount(labels, minlength=n_classes) / len(labels)


def training_class_prior(class_prior):
    """The class frequencies that training assumes, for a checked ``class_prior``.

    Parameters
    ----------
    class_prior : str or ndarray of shape (n_classes,)
        The output of :func:`check_class_prior`.

    Returns
    -------
    frequencies : tuple of float, or None
        The given frequencies; None for ``"auto"`` and ``"uniform"``, which
        train as the paper. ``"auto"`` does not train with the labels'
        frequencies: a few labels drawn at random give noisy ones, and on
        balanced data those cost accuracy.
    """
    if isinstance(class_prior, str):
        return None
    return tuple(float(frequency) for frequency in class_prior)


def estimate_class_prior(proba):
    """Class frequencies of the samples of ``proba``: their mean probabilities.

    This is probabilistic classify-and-count (Bella et al., 2010). The
    maximum-likelihood estimate, the expectation-maximisation of Saerens et
    al. (2002), goes further from equal frequencies, but a network whose
    probabilities are off (a short fit, a small model) sends it to a corner,
    where a few classes take all the weight. The mean moves no further from
    equal frequencies than the network's own probabilities do.

    Parameters
    ----------
    proba : ndarray of shape (n_samples, n_classes)
        The network's class probabilities (the equal-frequency ones).

    Returns
    -------
    prior : ndarray of shape (n_classes,)
        Frequencies summing to 1, each at least about ``1 / n_samples``.
    """
    proba = np.asarray(proba, dtype=np.float64)
    # n samples cannot tell a frequency below 1 / n from 0, and a 0 would
    # rule the class out of every prediction.
    prior = np.maximum(proba.mean(axis=0), 1 / len(proba))
    return prior / prior.sum()


def apply_class_prior(proba, prior):
    """``proba`` reweighted by the class frequencies ``prior``, rows summing to 1.

    Equal frequencies leave ``proba`` untouched (not even rounded).
    """
    if np.all(prior == prior[0]):
        return proba
    weighted = proba * prior
    total = weighted.sum(axis=1, keepdims=True)
    # A row whose every weighted probability underflowed keeps its own.
    return np.divide(weighted, total, out=proba.copy(), where=total > 0)


def uniform_prior(n_classes):
    """Equal frequencies of ``n_classes`` classes."""
    return np.full(n_classes, 1.0 / n_classes)
