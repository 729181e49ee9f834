"""Where a fit starts from: this estimator's fit, a model file, a run store.

``fit`` asks :func:`previous_run` for the fitted state it starts from (see
the estimator's ``warm_start`` and ``resume_from``), and :func:`store_run`
keeps its run in a :class:`~skassoc._run_store.RunStore` when it has one.
"""

import os
import warnings
from pathlib import Path
from typing import NamedTuple

import torch.distributed as dist

from ._fitted import get_fitted_state, is_fitted
from ._io._model_file import load_model, save_model
from ._run_store import RunStore
from ._settings import is_builtin_network
from ._utils import user_stacklevel

__all__ = ["Start", "previous_run", "store_run"]


def _unusable(estimator):
    """Why ``estimator``'s runs cannot be stored, or None."""
    if not isinstance(estimator.random_state, int):
        return "random_state is not an int"
    if not is_builtin_network(estimator.network):
        return "its network is a custom module"
    return None


class Start(NamedTuple):
    """Where a fit starts.

    Attributes
    ----------
    previous : FittedState or None
        The fitted state it starts from; None: a new network.
    origin : {"estimator", "file", "store"} or None
        This estimator's own fit (``warm_start``), the model file of
        ``resume_from``, or the run of its store.
    store_path : pathlib.Path or None
        With a :class:`~skassoc._run_store.RunStore`, the file of this fit's
        run (its key hashes all of ``X``: computed once a fit).
    """

    previous: object = None
    origin: str | None = None
    store_path: Path | None = None


def previous_run(estimator, inputs):
    """The :class:`Start` of a fit of ``estimator`` on ``inputs``.

    Raises
    ------
    ValueError
        If ``resume_from`` names no file, or a store that cannot hold this
        fit's runs.
    """
    if estimator.warm_start and is_fitted(estimator):
        return Start(get_fitted_state(estimator), "estimator")
    source = estimator.resume_from
    if source is None:
        return Start()
    if not isinstance(source, RunStore):
        if not os.path.isfile(source):
            raise ValueError(
                f"resume_from={os.fspath(source)!r} is no file. Give the path of "
                "a model file (a checkpoint), or leave resume_from=None."
            )
        loaded = load_model(type(estimator), source, device=estimator.device)
        return Start(get_fitted_state(loaded), "file")
    path = _prepared_path(source, estimator, inputs)
    if not path.is_file():
        return Start(store_path=path)
    try:
        loaded = load_model(type(estimator), path, device=estimator.device)
    except ValueError as exc:
        # A cache: a file that cannot be read is trained again, and replaced.
        warnings.warn(
            f"A stored run of this fit cannot be read ({exc}; in {source!r}); "
            "training from scratch and storing the new run in its place.",
            UserWarning,
            stacklevel=user_stacklevel(),
        )
        return Start(store_path=path)
    return Start(get_fitted_state(loaded), "store", path)


def _prepared_path(store, estimator, inputs):
    """The file of this fit's run in ``store``; the store checked to be usable
    before any training (a failure after it would waste the run)."""
    problem = _unusable(estimator)
    if problem is not None:
        raise ValueError(
            f"resume_from={store!r} keeps runs as model files of fits with an "
            f"int random_state and a built-in network, but {problem}."
            " Set random_state to an int (and use a built-in network), or "
            "leave resume_from=None."
        )
    path = store.path(estimator, inputs)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(
            f"resume_from={store!r} cannot keep runs: its directory cannot be "
            f"made ({exc}). Give a directory that can be written."
        ) from exc
    return path


def store_run(estimator, start):
    """Keep ``estimator``'s run (just fitted) in its ``resume_from`` store.

    Only a run of the parameters' own: one that started from scratch or from
    the store (a warm start from other data or a file would store a run that
    is not this fit's). A failure to write warns: the fit itself succeeded.
    """
    store, path = estimator.resume_from, start.store_path
    if path is None or start.origin not in (None, "store"):
        return
    if dist.is_available() and dist.is_initialized() and dist.get_rank() != 0:
        return  # a data-parallel fit's processes hold one run: process 0 keeps it
    try:
        if get_fitted_state(estimator).training_state is None:
            # Early stopping kept an earlier step's weights: nothing to continue.
            path.unlink(missing_ok=True)
            return
        save_model(estimator, path, training_state=True)
    except (OSError, ValueError) as exc:
        warnings.warn(
            f"The fit succeeded, but {store!r} could not keep its run ({exc}); "
            "a later fit will train it from scratch.",
            UserWarning,
            stacklevel=user_stacklevel(),
        )
