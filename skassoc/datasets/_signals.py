"""A seeded generator of labelled signals, in the spirit of Cylinder-Bell-Funnel.

:func:`make_synthetic_signals` draws time series whose class is the shape of
one event at a random place and of a random duration, in noise: the
classic synthetic problem of time-series classification (Saito, 1994),
with up to six shapes and any number of channels.
"""

import numpy as np
from sklearn.utils import check_random_state

from ._generators import _check_positive_int

__all__ = ["make_synthetic_signals", "SIGNAL_SHAPES"]


def _cylinder(u):
    return np.ones_like(u)


def _bell(u):
    return u


def _funnel(u):
    return 1 - u


def _burst(u):
    return np.sin(2 * np.pi * 3 * u)


def _peak(u):
    return 1 - np.abs(2 * u - 1)


def _dip(u):
    return -np.ones_like(u)


#: The event of each class, as a function of the time ``u`` through the
#: event (0 at its start, 1 at its end). The first three are Saito's
#: cylinder, bell and funnel.
SIGNAL_SHAPES = {
    "cylinder": _cylinder,
    "bell": _bell,
    "funnel": _funnel,
    "burst": _burst,
    "peak": _peak,
    "dip": _dip,
}
#: Where an event starts and how long it lasts, as fractions of the length
#: (Saito's 16-32 and 32-96 of 128 steps).
_START = (1 / 8, 1 / 4)
_DURATION = (1 / 4, 3 / 4)
#: The event's amplitude: 6 plus a standard normal, as Saito's.
_AMPLITUDE = 6.0
_MIN_LENGTH = 8


def make_synthetic_signals(
    n_samples=1000, *, n_classes=3, length=128, n_channels=1, random_state=None
):
    """Generate signals whose class is the shape of one event in noise.

    =================   ==========================================
    Classes                                 ``n_classes``, up to 6
    Samples per class   ``n_samples // n_classes`` or one more
    Sample shape        ``n_channels`` x 1 x ``length``
    Values                                                   float
    =================   ==========================================

    The Cylinder-Bell-Funnel problem of Saito (1994), with more shapes and
    channels: each signal holds one event, a plateau (cylinder), a rising
    ramp (bell), a falling ramp (funnel), an oscillation of three periods
    (burst), a triangle (peak) or a negative plateau (dip), the first
    ``n_classes`` of these in this order, at a random place and of a random
    duration, in Gaussian noise. Every channel holds the same event, each
    with its own amplitude and noise. The class is in the shape alone: an
    event's place and duration vary within each class, so that a method
    must recognise the shape wherever it lies, and at whatever speed.

    Parameters
    ----------
    n_samples : int, default=1000
        Number of signals.

    n_classes : int, default=3
        Number of classes, 2 to 6 (the first three are Cylinder-Bell-Funnel).

    length : int, default=128
        Values of each signal, at least 8.

    n_channels : int, default=1
        Channels of each signal.

    random_state : int, RandomState instance or None, default=None
        Controls every random choice. Pass an int for reproducible output
        across multiple function calls.

    Returns
    -------
    X : ndarray of shape (n_samples, n_channels, 1, length), dtype=float64
        The signals, each an image one value high: the layout that
        :class:`~skassoc.SemiSupervisedAssociationClassifier` reads as
        signals (its 1-D network). ``X.reshape(n_samples, -1)`` gives flat
        rows, and ``X[:, 0, 0]`` one-channel signals of ``length`` values,
        to fit with ``input_shape=(length,)``.

    y : ndarray of shape (n_samples,), dtype=int64
        The shape of each signal's event, ``0`` to ``n_classes - 1``, in
        the order listed above.

    Raises
    ------
    ValueError
        If ``n_samples``, ``n_channels`` or ``length`` is not an integer of
        at least 1, 1 or 8, or ``n_classes`` is not one of 2 to 6.

    Notes
    -----
    The classes are balanced (their counts differ by at most one) and come
    in random order. For each signal: the event starts at a uniform random
    time in the first eighth to quarter of the signal and lasts a uniform
    random quarter to three quarters of it (Saito's 16-32 and 32-96 steps
    of 128); in each channel its amplitude is 6 plus a standard normal
    value, and standard normal noise is added to every value.

    N. Saito, "Local Feature Extraction and Its Applications Using a
    Library of Bases", PhD thesis, Yale University, 1994.

    Examples
    --------
    >>> from skassoc.datasets import make_synthetic_signals
    >>> X, y = make_synthetic_signals(30, n_channels=2, random_state=0)
    >>> X.shape, y.dtype
    ((30, 2, 1, 128), dtype('int64'))
    >>> sorted(set(y.tolist()))
    [0, 1, 2]
    """
    n_samples = _check_positive_int(n_samples, "n_samples")
    length = _check_positive_int(length, "length", _MIN_LENGTH)
    n_channels = _check_positive_int(n_channels, "n_channels")
    n_classes = _check_positive_int(n_classes, "n_classes", 2)
    if n_classes > len(SIGNAL_SHAPES):
        raise ValueError(
            f"n_classes must be at most {len(SIGNAL_SHAPES)} (the shapes "
            f"{', '.join(SIGNAL_SHAPES)}); got {n_classes}."
        )
    rng = check_random_state(random_state)
    y = rng.permutation(np.arange(n_samples) % n_classes).astype(np.int64)
    start = rng.uniform(*_START, size=(n_samples, 1)) * length
    end = start + rng.uniform(*_DURATION, size=(n_samples, 1)) * length
    time = np.arange(length)[None, :]
    inside = (time >= start) & (time <= end)
    through = np.clip((time - start) / (end - start), 0, 1)
    events = np.zeros((n_samples, length))
    for label, shape in enumerate(list(SIGNAL_SHAPES.values())[:n_classes]):
        rows = y == label
        events[rows] = shape(through[rows])
    events *= inside
    amplitude = _AMPLITUDE + rng.standard_normal((n_samples, n_channels, 1))
    noise = rng.standard_normal((n_samples, n_channels, length))
    X = amplitude * events[:, None, :] + noise
    return X[:, :, None, :], y
