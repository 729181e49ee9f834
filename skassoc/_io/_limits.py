"""The limits of a model file: what it may describe and ask of a refit.

Each bound below is one row of the user guide's table of model file limits,
which gives its reason; the checks below are the domains of values of the
hyperparameters a file may set (``skassoc._params`` gives each parameter its
check, as ``SAFE_PARAMS``). ``load_model`` refuses a file beyond them and
``save_model`` refuses to write one.
"""

import math
from numbers import Real

from .._engine._augmentation import FEATURE_NOISE, PAPER_AUGMENTATION
from .._engine._signal_augmentation import SIGNAL_AUGMENTATION, is_signal_settings
from .._engine._sparse_augmentation import FEATURE_DROPOUT_KEYS, is_dropout_settings
from .._utils import is_integer

__all__ = [
    "CLASS_DTYPES",
    "CLASS_VALUE_CHECKS",
    "one_of",
    "int_in",
    "float_in",
    "sizes",
    "is_class_prior",
    "image_size_domain",
    "augmentation_domain",
    "class_weight_domain",
]

# metadata.json holds settings and a bounded loss history; the ratio bounds
# how far a deflated member may expand, which well-formed JSON stays within.
MAX_METADATA_BYTES = 4 * 2**20
MAX_METADATA_RATIO = 50
# The safetensors header lists each tensor's name, dtype, shape and offsets;
# the largest built-in network's header fits well within this bound.
MAX_HEADER_BYTES = 2**20
# Limits on what a file may describe or ask the next fit to use; the user
# guide's table of model file limits gives each one's reason.
MAX_WIDTH = 2**16  # embedding, hidden layers, image sides, classes
MAX_FEATURES = MAX_WIDTH**2  # values of one sample (n_features)
MAX_LAYERS = 64
MAX_STEPS = 10**5
MAX_BATCH = 2**16
MAX_PREDICT_BATCH = 2**14
MAX_STEP_BYTES = 16 * 2**30
MAX_FIT_MACS = 3 * 10**16
MAX_WEIGHT = 1e6  # loss weights, L2 scales
MAX_LABEL_CHARS = 1024
# Characters of the array of string labels (classes x its width): 4 MiB.
MAX_LABEL_ARRAY_CHARS = 2**20
# Values of the tensors a file may lack (buffers older files did not have).
MAX_DEFAULTED_VALUES = 1024
# Rows of the training data that a training state's sampler may index: its
# shuffled epoch is the whole unlabeled pool (not a batch, so MAX_BATCH
# would refuse MNIST's), one int64 a row. The bytes must be in the file, so
# the bound only keeps the indices within what a fit could have had.
MAX_TRAINING_ROWS = 2**31

#: The dtypes of ``classes_`` that a model file holds, besides strings
#: ("<U" and the width): NumPy's booleans, integers and floats of
#: little-endian byte order (not long double, whose size depends on the
#: platform), and objects (str labels).
CLASS_DTYPES = frozenset(
    ["|b1", "|i1", "<i2", "<i4", "<i8", "|u1", "<u2", "<u4", "<u8"]
    + ["<f2", "<f4", "<f8", "|O"]
)

#: The label types of ``classes_`` (by dtype kind), each with its check.
CLASS_VALUE_CHECKS = {
    "b": lambda v: isinstance(v, bool),
    "i": is_integer,
    "u": is_integer,
    "f": lambda v: isinstance(v, float) and math.isfinite(v),  # as fit's
    "U": lambda v: isinstance(v, str) and len(v) <= MAX_LABEL_CHARS,
    "O": lambda v: isinstance(v, str) and len(v) <= MAX_LABEL_CHARS,
}


# ------------------------------------------------------- parameter domains


def one_of(*values):
    """A check that a value is one of ``values``, of the same type."""

    def check(value):
        return any(value == v and type(value) is type(v) for v in values)

    return check


def int_in(low, high, *also):
    """A check for an integer in ``[low, high]``, or one of ``also``."""

    def check(value):
        return (is_integer(value) and low <= value <= high) or one_of(*also)(value)

    return check


def float_in(low, high, *also, low_open=False, high_open=False):
    """A check for a finite real number in ``[low, high]``, or one of ``also``.

    ``low_open`` and ``high_open`` exclude the bound on their side.
    """

    def check(value):
        if one_of(*also)(value):
            return True
        if not isinstance(value, Real) or isinstance(value, bool):
            return False
        try:
            number = float(value)
        except OverflowError:  # a JSON integer beyond float64
            return False
        return (
            math.isfinite(number)
            and (low < number if low_open else low <= number)
            and (number < high if high_open else number <= high)
        )

    return check


def sizes(min_len, max_len, low=1, high=MAX_WIDTH, allow_none=False):
    """A check for a list of ``min_len`` to ``max_len`` integers in bounds."""

    def check(value):
        if value is None:
            return allow_none
        return (
            isinstance(value, list)
            and min_len <= len(value) <= max_len
            and all(int_in(low, high)(v) for v in value)
        )

    return check


def image_size_domain(value):
    """A check for ``image_size``: None, one side, or ``[height, width]``."""
    return value is None or int_in(1, MAX_WIDTH)(value) or sizes(2, 2)(value)


def augmentation_domain(value):
    """A check for ``augmentation``: None, "auto", "paper" or a dict of settings."""
    if value is None or value in ("auto", "paper"):
        return True
    if not isinstance(value, dict):
        return False
    keys = FEATURE_NOISE if "feature_noise" in value else PAPER_AUGMENTATION
    if is_signal_settings(value):
        keys = SIGNAL_AUGMENTATION
    if is_dropout_settings(value):
        keys = FEATURE_DROPOUT_KEYS
    if set(value) - set(keys):
        return False
    bounded = float_in(0, 100)
    return all(
        isinstance(item, bool)
        if key == "unlabeled"
        else (key == "feature_noise" and isinstance(item, str) and item == "auto")
        or bounded(item)
        for key, item in value.items()
    )


def class_weight_domain(value):
    """None, "balanced", or a dict stored as ``[[label, weight], ...]``."""
    if value is None or value == "balanced":
        return True

    def is_label(key):
        if isinstance(key, str):
            return len(key) <= MAX_LABEL_CHARS
        return is_integer(key) or float_in(-math.inf, math.inf)(key)

    return (
        isinstance(value, list)
        and len(value) <= MAX_WIDTH
        and all(
            isinstance(pair, list)
            and len(pair) == 2
            and not isinstance(pair[0], bool)
            and is_label(pair[0])
            and float_in(0, MAX_WEIGHT)(pair[1])
            for pair in value
        )
        # One weight a label: as a dict, the last of two (0 and 0.0 are one
        # key) would silently win.
        and len({pair[0] for pair in value}) == len(value)
    )


def is_class_prior(value):
    """ "auto", "uniform", or one positive, finite frequency per class."""
    if value in ("auto", "uniform"):
        return True
    positive = float_in(0, math.inf, low_open=True)
    return (
        isinstance(value, list)
        and 2 <= len(value) <= MAX_WIDTH
        and all(positive(item) for item in value)
    )
