"""The budget of a refit: the memory and work a file's parameters may ask."""

import math

from .._defaults import MAX_LABELED_PER_CLASS, MAX_UNLABELED_BATCH_SIZE, network_macs
from .._defaults import MAX_STEPS as AUTO_MAX_STEPS
from .._engine._loss_terms import LOSS_TERMS
from .._nn._image_format import check_image_size, formatted_shape
from .._nn._model import ModelSpec
from .._nn._networks import auto_network_name
from .._params import PARAMS
from .._settings import walker_memory_bytes
from ._limits import MAX_BATCH, MAX_FIT_MACS, MAX_STEP_BYTES
from ._weights import meta_model

__all__ = ["refit_cost_problem"]


def refit_cost_problem(params, spec):
    """Why a fit with ``params`` would cost more than a model file may ask.

    A file's parameters are those of the next fit (``warm_start``, or a
    search that clones the loaded model): parameters that the domains of
    ``_limits`` accept one by one could still, together, ask for a step
    beyond any memory or a fit of days. The step's memory (the walker's matrices, see
    :func:`walker_memory_bytes`, and the network's weights with their
    gradients and Adam's moments) and the whole fit's multiply-adds (the
    network's forward and backward passes over every embedded sample, and
    the walker's matrix products) must stay within ``MAX_STEP_BYTES`` and
    ``MAX_FIT_MACS``, for the network of the file and for the one its
    parameters describe (``set_params`` after the fit may differ).
    ``"auto"`` counts as the most it can become.

    Returns
    -------
    problem : str or None
    """
    n_labeled = spec.n_classes * _at_most(
        params, "labeled_per_class", MAX_LABELED_PER_CLASS
    )
    n_unlabeled = _at_most(params, "unlabeled_batch_size", MAX_UNLABELED_BATCH_SIZE)
    steps = _at_most(params, "max_iter", AUTO_MAX_STEPS)
    views = _views(params)
    if n_labeled > MAX_BATCH:
        return (
            f"labeled_per_class x {spec.n_classes} classes = {n_labeled} "
            f"labeled samples a step, more than {MAX_BATCH}"
        )
    rows = n_labeled + views * n_unlabeled
    batch = f"{n_labeled} labeled and {views} x {n_unlabeled} unlabeled samples"
    for network in _refit_networks(params, spec):
        n_weights, sample_macs = _network_cost(network)
        memory = walker_memory_bytes(n_labeled, n_unlabeled, views) + 16 * n_weights
        if memory > MAX_STEP_BYTES:
            return (
                f"a step of {batch} through a network of {n_weights} weights "
                f"needs about {memory / 2**30:.0f} GiB, more than "
                f"{MAX_STEP_BYTES // 2**30} GiB"
            )
        walker_macs = n_labeled * n_unlabeled * (views * network.embedding_dim)
        walker_macs += n_labeled * n_labeled * n_unlabeled
        # The backward pass costs about twice the forward one.
        fit_macs = 3 * steps * (rows * sample_macs + walker_macs)
        if fit_macs > MAX_FIT_MACS:
            return (
                f"{steps} steps of {batch} need about {fit_macs:.1e} "
                f"multiply-adds, more than {MAX_FIT_MACS:.0e}"
            )
    return None


def _views(params):
    """How many views of the unlabeled batch a step embeds: two where a loss
    term that is on (a weight of ``"auto"`` counts as on) needs a second
    one (the consistency loss), else one."""
    defaults = {p.name: p.default for p in PARAMS}
    for term in LOSS_TERMS.values():
        weight = params.get(term.weight_param, defaults.get(term.weight_param, 0))
        if "second_view" in term.needs and (not term.optional or weight != 0):
            return 2
    return 1


def _at_most(params, name, auto_bound):
    value = params.get(name, "auto")
    return auto_bound if value == "auto" else value


def _refit_networks(params, spec):
    """The file's network, then the one a fit on data like its own would build."""
    yield spec
    network = params.get("network", "auto")
    image_size = params.get("image_size")
    channels = params.get("image_channels")
    if spec.input_shape is None and (
        network not in ("auto", "mlp") or (image_size, channels) != (None, None)
    ):
        return  # such a fit needs images: it stops at its validation
    size = None if image_size is None else check_image_size(image_size)
    shape = None
    if spec.input_shape is not None:
        shape = formatted_shape(spec.input_shape, size, channels)
    if network == "auto":
        network = auto_network_name(shape)
    yield ModelSpec(
        network=network,
        input_shape=spec.input_shape,
        n_features=spec.n_features,
        n_classes=spec.n_classes,
        embedding_dim=params.get("embedding_dim", spec.embedding_dim),
        hidden_layer_sizes=(
            tuple(params.get("hidden_layer_sizes", spec.hidden_layer_sizes))
            if network == "mlp"
            else ()
        ),
        image_size=size,
        image_channels=channels,
    )


def _network_cost(spec):
    """Weights of ``spec``'s network (counted on torch's meta device, which
    allocates nothing) and multiply-adds of one sample's forward pass."""
    try:
        n_weights = sum(t.numel() for t in meta_model(spec).state_dict().values())
    except (ValueError, RuntimeError, TypeError):
        # No such network (an image too small for it, say): a fit would
        # refuse it before training.
        return 0, 0
    shape = spec.network_shape
    n_features = spec.n_features if shape is None else math.prod(shape)
    macs = network_macs(
        spec.network, shape, n_features, spec.embedding_dim, spec.hidden_layer_sizes
    )
    return n_weights, macs
