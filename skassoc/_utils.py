"""Small helpers shared by every module: integer checks, constant features
and warning levels."""

import inspect
import numbers
import os

import numpy as np

__all__ = ["is_integer", "user_stacklevel", "varies"]

#: A feature whose standard deviation is at most this fraction of its mean
#: is constant. The float64 mean of a constant read in chunks misses it by
#: far less (so its computed deviation is tiny but not 0), and float32 data,
#: whose last digit is 6e-8 of the value, varies by far more.
CONSTANT_TOLERANCE = 1e-9


def is_integer(value):
    """Whether ``value`` is an integer (NumPy's included) and not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(
        value, (bool, np.bool_)
    )


def varies(std, mean):
    """Whether each feature varies, from its standard deviation and mean.

    Works on NumPy arrays and torch tensors alike; see
    :data:`CONSTANT_TOLERANCE`.
    """
    return std > CONSTANT_TOLERANCE * abs(mean)


def user_stacklevel():
    """The ``stacklevel`` that points a warning at the first caller outside skassoc.

    For warnings raised deep inside ``fit``: how deep depends on the code
    path (and on scikit-learn's wrappers), so count the frames instead.
    """
    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    sklearn_base = os.path.join("sklearn", "base.py")
    frame = inspect.currentframe()
    level = 0
    while frame is not None:
        filename = os.path.abspath(frame.f_code.co_filename)
        ours = filename.startswith(package)
        # scikit-learn's decorator around fit (_fit_context) is not the caller.
        fit_wrapper = filename.endswith(sklearn_base) and frame.f_code.co_name == (
            "wrapper"
        )
        if not (ours or fit_wrapper):
            break
        frame = frame.f_back
        level += 1
    return max(level, 1)
