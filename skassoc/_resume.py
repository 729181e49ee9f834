"""Where a fit starts from: this estimator's fit, a model file, a run store.

``fit`` asks :func:`previous_run` for the fitted state it continues (see the
estimator's ``warm_start`` and ``resume_from``), and :func:`store_run` keeps
its run in a :class:`~skassoc._run_store.RunStore` when it has one.
"""

from ._fitted import get_fitted_state
from ._io._model_file import load_model, save_model
from ._nn._networks import NETWORKS
from ._run_store import RunStore

__all__ = ["previous_run", "store_run"]


def _usable(estimator):
    """Why ``estimator``'s runs cannot be stored, or None."""
    if not isinstance(estimator.random_state, int):
        return "random_state is not an int"
    if not isinstance(estimator.network, str) or (
        estimator.network != "auto" and estimator.network not in NETWORKS
    ):
        return "its network is a custom module"
    return None


def previous_run(estimator, inputs):
    """The fitted state that ``estimator``'s fit starts from (its
    ``resume_from``), or None: a model file's, or a store's run."""
    store = estimator.resume_from
    if store is None:
        return None
    if not isinstance(store, RunStore):
        return get_fitted_state(
            load_model(type(estimator), store, device=estimator.device)
        )
    if _usable(estimator) is not None:
        raise ValueError(
            f"resume_from={store!r} keeps runs as model files of fits with an "
            f"int random_state and a built-in network, but {_usable(estimator)}."
            " Set random_state to an int (and use a built-in network), or "
            "leave resume_from=None."
        )
    path = store.path(estimator, inputs)
    if not path.is_file():
        return None
    state = get_fitted_state(load_model(type(estimator), path, device=estimator.device))
    run = state.training_state
    max_iter = estimator.max_iter
    if run is None or (not isinstance(max_iter, str) and run.n_iter >= max_iter):
        return None
    return state


def store_run(estimator, inputs):
    """Keep ``estimator``'s run (just fitted) in its ``resume_from`` store."""
    store = estimator.resume_from
    if not isinstance(store, RunStore):
        return
    path = store.path(estimator, inputs)
    if get_fitted_state(estimator).training_state is None:
        # Early stopping kept an earlier step's weights: nothing to continue.
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    save_model(estimator, path, training_state=True)
