"""Resolve an estimator's parameters into the settings of one fit.

Every ``"auto"`` value and every check that involves more than one parameter
(or a parameter and the data) lives here, so that ``fit`` reads as the
recipe: validated inputs in, :class:`FitSettings` out.
"""

import math
import os
from dataclasses import dataclass

import numpy as np
import torch
from sklearn.utils import check_random_state

from . import _params
from ._defaults import (
    AUTO_CONSISTENCY_WEIGHT,
    auto_feature_noise,
    auto_labeled_per_class,
    auto_max_iter,
    auto_unlabeled_batch_size,
    cpu_step_seconds,
    network_macs,
    sparse_step_seconds,
)
from ._engine._augmentation import resolve_augmentation
from ._engine._config import TrainingConfig, default_log_interval
from ._engine._device import cpu_has_native_bf16, cuda_has_native_bf16, resolve_device
from ._engine._loss_terms import active_terms, needs_of
from ._engine._signal_augmentation import is_signal_settings
from ._engine._sparse_augmentation import resolve_sparse_augmentation
from ._engine._spawn import resolve_devices
from ._inputs import UNLABELED
from ._nn._image_format import check_image_size
from ._nn._model import ModelSpec, is_builtin, spec_of_model
from ._nn._networks import (
    NETWORKS,
    auto_network_name,
    embeds_rows,
    takes_hidden_layer_sizes,
)
from ._prior import check_class_prior, training_class_prior
from ._sparse import SPARSE_NETWORKS, check_sparse_fit_options, check_sparse_network
from ._utils import is_integer

__all__ = ["FitSettings", "describe_settings", "fit_seed", "resolve_fit_settings"]

# The authors' code decays the logit layer's weights by 1e-4 for every network.
LOGIT_L2_SCALE = 1e-4
# L2 scale of a custom module with l2_scale="auto".
CUSTOM_L2_SCALE = 1e-4
#: The keyword arguments of torch.compile that ``compile`` may hold.
COMPILE_ARGUMENTS = frozenset({"fullgraph", "dynamic", "backend", "mode", "options"})
#: torch.compile modes that capture CUDA graphs of their own.
GRAPH_MODES = frozenset({"reduce-overhead", "max-autotune"})
# Steps of max_iter="auto" for a custom module: the paper's 20,000 on a GPU;
# on a CPU, enough for a useful model in minutes.
AUTO_MAX_ITER = {"cuda": 20_000, "cpu": 2_000, "mps": 2_000}
AUTO_PREDICT_BATCH_SIZE = {"cuda": 8192, "cpu": 1024, "mps": 1024}


@dataclass(frozen=True)
class FitSettings:
    """Everything one fit needs beyond the data, with no ``"auto"`` left.

    Attributes
    ----------
    device : torch.device
    seed : int
        Seeds torch's generators for the fit.
    spec : ModelSpec
        The network to build (``embedding_dim`` of a custom module is probed
        when it is built).
    warm_start : bool
        Whether training continues from the previous fit's weights.
    labeled_per_class, unlabeled_batch_size : int
    unlabeled_sampling : str
    training : TrainingConfig
        The training loop's hyperparameters.
    unlabeled_pool : str
        What the unlabeled batch is drawn from (see ``_batches``).
    class_prior : str or ndarray
        The checked ``class_prior`` parameter (see ``_prior``).
    """

    device: torch.device
    seed: int
    spec: ModelSpec
    warm_start: bool
    labeled_per_class: int
    unlabeled_batch_size: int
    unlabeled_sampling: str
    training: TrainingConfig
    unlabeled_pool: str = "unlabeled"
    class_prior: str | np.ndarray = "uniform"


def fit_device(estimator):
    """The device a fit of ``estimator`` trains on (in this process)."""
    return resolve_device(_one_device(estimator) or estimator.device)


def _one_device(estimator):
    """The device of ``devices`` when it lists one (it overrides ``device``)."""
    devices = getattr(estimator, "devices", None)
    if devices is None:
        return None
    devices = resolve_devices(devices)
    return devices[0] if len(devices) == 1 else None


def fit_seed(random_state):
    """The seed of torch's generators (and of the validation split) for a fit."""
    return int(check_random_state(random_state).randint(np.iinfo(np.int32).max))


def resolve_fit_settings(estimator, inputs, previous=None, seed=None):
    """The settings of fitting ``estimator`` on ``inputs``.

    Parameters
    ----------
    estimator : SemiSupervisedAssociationClassifier
        Its parameters, already validated one by one.
    inputs : TrainingData
        The validated training data.
    previous : FittedState, default=None
        The fit to continue from with ``warm_start=True``.
    seed : int, default=None
        The fit's seed (:func:`fit_seed`); None draws it from
        ``random_state``.

    Raises
    ------
    ValueError
        If parameters contradict each other or the data.
    """
    device = fit_device(estimator)
    _check_hidden_layer_sizes(estimator.hidden_layer_sizes)
    _check_image_options(estimator, inputs.image_shape)
    spec = _model_spec(estimator, inputs)
    if previous is not None:
        _check_warm_start(estimator, inputs, spec, previous)
        spec = _fitted_spec(previous)
    if seed is None:
        seed = fit_seed(estimator.random_state)
    feature_vectors = embeds_feature_vectors(inputs, spec)
    augmentation = (
        resolve_sparse_augmentation(estimator.augmentation)
        if spec.network in SPARSE_NETWORKS
        else _check_augmentation(
            estimator, inputs, feature_vectors, seed, signals=spec.network == "signal"
        )
    )
    copied = copied_settings(estimator)
    copied["loss_weights"]["consistency_weight"] = resolve_consistency_weight(
        estimator, augmentation, feature_vectors
    )
    precision = resolve_precision(estimator.precision, device, inputs.images)
    class_prior = check_class_prior(estimator.class_prior, len(inputs.classes))
    needs = needs_of(active_terms(copied["loss_weights"]))
    labeled_per_class, unlabeled_batch_size, max_iter = _resolve_batching(
        estimator, inputs, spec, device, precision, "second_view" in needs
    )
    training = TrainingConfig(
        **copied,
        max_iter=max_iter,
        lr_decay_steps=_resolve_lr_decay_steps(estimator.lr_decay_steps, max_iter),
        lr_warmup_steps=_check_lr_warmup_steps(estimator.lr_warmup_steps, max_iter),
        l2_scale=_resolve_l2_scale(estimator.l2_scale, spec.network),
        logit_l2_scale=LOGIT_L2_SCALE,
        precision=precision,
        # Sparse batches change shape every step: no graph can replay them.
        cuda_graph=device.type == "cuda"
        and estimator.cuda_graph in ("auto", True)
        and not inputs.sparse,
        channels_last=inputs.images,
        log_interval=default_log_interval(max_iter),
        augmentation=augmentation,
        class_prior=training_class_prior(class_prior),
        compile=_compile_options(estimator.compile, estimator.cuda_graph, device),
        # Every step updates each weight of the wide first layer: fused,
        # that is one pass over them (several times faster on a CPU).
        fused_adam=spec.network in SPARSE_NETWORKS,
    )
    return FitSettings(
        device=device,
        seed=int(seed),
        spec=spec,
        warm_start=previous is not None,
        labeled_per_class=labeled_per_class,
        unlabeled_batch_size=unlabeled_batch_size,
        unlabeled_sampling=estimator.unlabeled_sampling,
        training=training,
        unlabeled_pool=estimator.unlabeled_pool,
        class_prior=class_prior,
    )


def copied_settings(estimator):
    """The training settings that are ``estimator``'s parameters as they are.

    Each parameter whose row of :data:`~skassoc._params.PARAMS` has a
    ``to_training`` conversion, converted by it; the loss weights (rows of
    part ``"losses"``) in the dict ``"loss_weights"``. The other settings of
    :class:`TrainingConfig` (and ``consistency_weight``) are resolved by
    :func:`resolve_fit_settings`.
    """
    copied = {"loss_weights": {}}
    for param in _params.PARAMS:
        if param.to_training is None:
            continue
        value = param.to_training(_params.param_value(estimator, param.name))
        if param.part == "losses":
            copied["loss_weights"][param.name] = value
        else:
            copied[param.name] = value
    return copied


def _resolve_batching(estimator, inputs, spec, device, precision, second_view):
    """``labeled_per_class``, ``unlabeled_batch_size`` and ``max_iter``.

    Their ``"auto"`` values follow the rules of :mod:`skassoc._defaults`,
    from the training labels, the size of the unlabeled pool, the network,
    the device and whether a loss term (the consistency loss) embeds a
    second copy of the unlabeled batch.
    """
    labeled = inputs.encoded >= 0
    counts = np.bincount(inputs.encoded[labeled], minlength=len(inputs.classes))
    n_unlabeled = int(np.count_nonzero(inputs.encoded == UNLABELED))
    n_pool = n_unlabeled if estimator.unlabeled_pool == "unlabeled" else 0
    # With nothing unlabeled (or unlabeled_pool="all"), every training sample
    # is in the pool.
    n_pool = n_pool or int(n_unlabeled + labeled.sum())
    labeled_per_class = estimator.labeled_per_class
    if labeled_per_class == "auto":
        labeled_per_class = auto_labeled_per_class(counts[counts > 0])
    unlabeled_batch_size = estimator.unlabeled_batch_size
    if unlabeled_batch_size == "auto":
        unlabeled_batch_size = auto_unlabeled_batch_size(n_pool)
    # As Python ints: a NumPy one (np.uint8(5), say) passes validation but
    # would overflow in the batch arithmetic.
    labeled_per_class, unlabeled_batch_size = (
        int(labeled_per_class),
        int(unlabeled_batch_size),
    )
    max_iter = estimator.max_iter
    if max_iter == "auto" and spec.network == "custom":
        # No work estimate for a user's module: the paper's steps on a GPU.
        max_iter = AUTO_MAX_ITER[device.type]
    elif max_iter == "auto":
        macs = network_macs(
            spec.network,
            spec.network_shape,
            spec.n_features,
            spec.embedding_dim,
            spec.hidden_layer_sizes,
        )
        views = 2 if second_view else 1
        step_samples = labeled_per_class * len(counts) + views * unlabeled_batch_size
        step_seconds = cpu_step_seconds(
            spec.network, spec.network_shape, macs, step_samples, precision == "bf16"
        )
        if inputs.sparse:
            step_seconds = sparse_step_seconds(
                spec.n_features,
                spec.hidden_layer_sizes,
                spec.embedding_dim,
                inputs.data.row_lengths(),
                step_samples,
            )
        max_iter = auto_max_iter(n_pool, unlabeled_batch_size, step_seconds, device)
    return labeled_per_class, unlabeled_batch_size, int(max_iter)


def describe_settings(settings):
    """One line that says what a fit's ``"auto"`` parameters became.

    Printed by a ``verbose`` fit before it trains: ``skassoc: network
    <name> on <device>, <max_iter> steps of <labeled_per_class> labeled
    samples per class and <unlabeled_batch_size> unlabeled ones``, then the
    feature noise or "image augmentation" and the consistency weight, where
    there are any.
    """
    training = settings.training
    parts = [
        f"network {settings.spec.network} on {settings.device}",
        f"{training.max_iter} steps of {settings.labeled_per_class} labeled "
        f"samples per class and {settings.unlabeled_batch_size} unlabeled ones",
    ]
    augmentation = training.augmentation
    if augmentation is not None and "feature_noise" in augmentation:
        parts.append(f"feature noise {augmentation['feature_noise']:.3g}")
    elif augmentation is not None and "feature_dropout" in augmentation:
        parts.append(f"feature dropout {augmentation['feature_dropout']:.3g}")
    elif augmentation is not None:
        kind = "signal" if is_signal_settings(augmentation) else "image"
        parts.append(f"{kind} augmentation")
    consistency_weight = training.loss_weights["consistency_weight"]
    if consistency_weight > 0:
        parts.append(f"consistency weight {consistency_weight:g}")
    return "skassoc: " + ", ".join(parts)


def resolve_precision(precision, device, images):
    """The arithmetic of ``precision="auto"`` on ``device``."""
    if precision != "auto":
        return precision
    if device.type == "cuda":
        # bf16 autocast makes the convolutional networks' step (images, and
        # signals, which arrive as images one value high) faster than TF32
        # (docs/benchmarks/speed.rst) at the same MNIST test error within
        # draw noise (docs/benchmarks/mnist.rst); GPUs before Ampere emulate
        # bf16, slowly, and keep TF32. Rows and sparse rows stay in TF32:
        # the MLPs in bf16 are unmeasured on a GPU.
        return "bf16" if images and cuda_has_native_bf16(device) else "tf32"
    # bf16 convolutions roughly double a CPU's speed where it has native
    # bf16 arithmetic; elsewhere they are emulated and slower.
    if device.type == "cpu" and images and cpu_has_native_bf16():
        return "bf16"
    return "fp32"


def resolve_predict_batch_size(value, device):
    """Samples per forward pass at inference (``"auto"`` by device)."""
    return _resolve_auto(value, AUTO_PREDICT_BATCH_SIZE, device)


def _resolve_auto(value, defaults, device):
    return defaults[device.type] if value == "auto" else int(value)


def _resolve_lr_decay_steps(lr_decay_steps, max_iter):
    # "auto": a quarter of the run (5,000 of the paper's 20,000 steps).
    if lr_decay_steps == "auto":
        return max(1, round(max_iter / 4))
    return int(lr_decay_steps)


def _check_lr_warmup_steps(lr_warmup_steps, max_iter):
    if lr_warmup_steps >= max_iter:
        raise ValueError(
            f"lr_warmup_steps={lr_warmup_steps} leaves no step after the warm-up "
            f"of a fit of max_iter={max_iter} steps; lower lr_warmup_steps below "
            "max_iter."
        )
    return int(lr_warmup_steps)


def _resolve_l2_scale(l2_scale, network):
    if l2_scale != "auto":
        return float(l2_scale)
    if network in NETWORKS:
        return float(NETWORKS[network].default_l2_scale)
    return CUSTOM_L2_SCALE


def _model_spec(estimator, inputs):
    """The network ``fit`` builds for ``inputs`` (a custom one's width unknown)."""
    network = estimator.network
    spec = ModelSpec(
        network="custom" if isinstance(network, torch.nn.Module) else network,
        input_shape=inputs.image_shape,
        n_features=inputs.n_features,
        n_classes=len(inputs.classes),
        embedding_dim=int(estimator.embedding_dim),
        hidden_layer_sizes=tuple(int(w) for w in estimator.hidden_layer_sizes),
        image_size=check_image_size(estimator.image_size),
        image_channels=estimator.image_channels,
    )
    if spec.network == "auto" and inputs.sparse:
        spec = _replace(spec, network="sparse_mlp")
    elif spec.network == "auto":
        spec = _replace(spec, network=auto_network_name(spec.network_shape))
    if inputs.sparse:
        check_sparse_network(spec.network)
        check_sparse_fit_options(estimator)
    if not takes_hidden_layer_sizes(spec.network):
        spec = _replace(spec, hidden_layer_sizes=())
    return spec


def _fitted_spec(previous):
    """The spec of the network a previous fit built (for warm starts)."""
    return spec_of_model(
        previous.model, previous.network, previous.input_shape, previous.n_features_in
    )


def _replace(spec, **changes):
    return ModelSpec(**{**spec.__dict__, **changes})


def _check_hidden_layer_sizes(sizes):
    if not all(is_integer(width) and width >= 1 for width in sizes):
        raise ValueError(
            "hidden_layer_sizes must hold positive ints (the width of each "
            f"hidden layer of the MLP); got {sizes!r}."
        )


def _check_image_options(estimator, image_shape):
    image_size = check_image_size(estimator.image_size)
    if image_shape is None and (
        image_size is not None or estimator.image_channels is not None
    ):
        raise ValueError(
            "image_size and image_channels need image inputs; pass X as "
            "(n, h, w) or (n, c, h, w) images, or set input_shape for flat "
            "rows."
        )
    if image_shape is not None and estimator.image_channels is not None:
        if image_shape[0] not in (1, 3):
            raise ValueError(
                f"image_channels={estimator.image_channels} converts between "
                f"grey (1 channel) and colour (3); the images have "
                f"{image_shape[0]} channels. Leave image_channels=None for them."
            )


def embeds_feature_vectors(inputs, spec):
    """Whether a built-in network embeds feature vectors (which "auto" noises)."""
    return inputs.image_shape is None and embeds_rows(spec.network)


def _check_augmentation(estimator, inputs, feature_vectors, seed, signals=False):
    """The full augmentation settings, after the checks against the data.

    A ``feature_noise`` of ``"auto"`` becomes its size for ``inputs``,
    measured on rows chosen with ``seed``. ``signals``: the built-in 1-D
    network embeds the inputs (which take the signal augmentation).
    """
    image_shape = inputs.image_shape
    augmentation = resolve_augmentation(
        estimator.augmentation, feature_vectors, signals
    )
    if augmentation is None or is_signal_settings(augmentation):
        return augmentation
    if "feature_noise" in augmentation:
        if not feature_vectors:
            raise ValueError(
                "augmentation['feature_noise'] adds noise to feature vectors in "
                "units of each feature's standard deviation, which the built-in "
                "MLP learns: it needs 2-D X without input_shape and "
                "network='mlp' (or 'auto'). For images, use the image settings "
                "(e.g. augmentation='paper')."
            )
        if augmentation["feature_noise"] == "auto":
            augmentation["feature_noise"] = auto_feature_noise(inputs.data, seed)
        return augmentation
    if image_shape is None:
        raise ValueError(
            "The image augmentation needs image inputs; pass X as (n, h, w) or "
            "(n, c, h, w) images, or set input_shape for flat rows. Feature "
            "vectors take augmentation={'feature_noise': std}."
        )
    if augmentation["blur_probability"] > 0 and min(image_shape[1:]) < 4:
        raise ValueError(
            "The augmentation's 7x7 blur reflects 3 pixels at the borders, "
            f"so it needs images of at least 4x4 pixels; these are "
            f"{image_shape[1]}x{image_shape[2]}. Set "
            "augmentation['blur_probability'] = 0 for them."
        )
    return augmentation


def resolve_consistency_weight(estimator, augmentation, feature_vectors):
    """``consistency_weight`` as a float.

    ``"auto"`` is ``AUTO_CONSISTENCY_WEIGHT`` with feature noise (of a
    nonzero size) while the walker or visit loss is on, else 0.
    """
    weight = estimator.consistency_weight
    if weight == "auto":
        noise = augmentation is not None and (
            augmentation.get("feature_noise", 0) > 0
            or augmentation.get("feature_dropout", 0) > 0
        )
        walks = estimator.walker_weight > 0 or estimator.visit_weight > 0
        return AUTO_CONSISTENCY_WEIGHT if noise and walks else 0.0
    if weight > 0 and augmentation is None:
        example = (
            "{'feature_noise': 0.5}"
            if feature_vectors
            else "'paper', or {'unlabeled': False} to warp the labeled batch "
            "and the second copy only"
        )
        raise ValueError(
            f"consistency_weight={weight} compares every unlabeled sample with "
            "a random augmentation of it, but there is no augmentation "
            "(augmentation=None, or 'auto' where it adds none). Set "
            f"augmentation (e.g. {example}), or set consistency_weight=0."
        )
    return float(weight)


def _check_warm_start(estimator, inputs, spec, previous):
    """Refuse a warm start whose data or network differ from the previous fit's."""
    before = (previous.n_features_in, previous.input_shape)
    if (inputs.n_features, inputs.image_shape) != before:
        raise ValueError(
            "Continuing a fit (warm_start=True, or resume_from) needs inputs "
            "shaped like those of the previous "
            f"fit ({before[0]} features, image shape {before[1]}); got "
            f"{inputs.n_features} features, image shape {inputs.image_shape}. "
            "Set warm_start=False to train a new model."
        )
    if not np.array_equal(inputs.classes, previous.classes):
        raise ValueError(
            "Continuing a fit (warm_start=True, or resume_from) needs the "
            "classes of the previous fit "
            f"({previous.classes.tolist()}); got {inputs.classes.tolist()}. Set "
            "warm_start=False to train a new model."
        )
    fitted = _fitted_spec(previous)
    wanted = {
        "image_size": spec.image_size,
        "image_channels": spec.image_channels,
        "network": spec.network,
    }
    had = {
        "image_size": fitted.image_size,
        "image_channels": fitted.image_channels,
        "network": fitted.network,
    }
    if spec.network == "custom" and fitted.network != "custom":
        wanted["network"] = "a module"
    if spec.network == fitted.network != "custom":
        wanted["embedding_dim"], had["embedding_dim"] = (
            spec.embedding_dim,
            fitted.embedding_dim,
        )
    if spec.network == fitted.network and takes_hidden_layer_sizes(spec.network):
        wanted["hidden_layer_sizes"] = spec.hidden_layer_sizes
        had["hidden_layer_sizes"] = fitted.hidden_layer_sizes
    changed = [name for name in wanted if wanted[name] != had[name]]
    if changed:
        details = ", ".join(f"{n}: {had[n]!r} -> {wanted[n]!r}" for n in changed)
        raise ValueError(
            "Continuing a fit (warm_start=True, or resume_from) trains the "
            "fitted network on, but these "
            f"parameters now ask for another one ({details}). Set them back, "
            "or set warm_start=False to train a new model."
        )


def _compile_options(compile, cuda_graph, device):
    """Keyword arguments of ``torch.compile``, or None without compiling."""
    # By value, not identity: NumPy booleans pass parameter validation.
    if isinstance(compile, dict):
        options = dict(compile)
    elif compile:
        options = {}
    else:
        return None
    unknown = set(options) - COMPILE_ARGUMENTS
    if unknown:
        raise ValueError(
            f"compile has unknown keys {sorted(unknown)}; it takes keyword "
            f"arguments of torch.compile: {sorted(COMPILE_ARGUMENTS)}."
        )
    if "mode" in options and "options" in options:
        raise ValueError(
            "compile takes 'mode' or 'options', not both (torch.compile "
            "refuses them together); put the mode's settings in 'options'."
        )
    uses_graph = device.type == "cuda" and cuda_graph in ("auto", True)
    inner_graphs = (options.get("options") or {}).get("triton.cudagraphs")
    if uses_graph and (options.get("mode") in GRAPH_MODES or inner_graphs):
        what = (
            f"mode {options['mode']!r}"
            if "mode" in options
            else "option 'triton.cudagraphs'"
        )
        raise ValueError(
            f"compile {what} captures CUDA graphs of its own, which cannot "
            "run inside skassoc's CUDA graph of the whole step. Use mode "
            "'max-autotune-no-cudagraphs' (or the default mode), or set "
            "cuda_graph=False."
        )
    return options


def is_builtin_network(network):
    """Whether the ``network`` parameter names a built-in network (or "auto")."""
    return network == "auto" or is_builtin(network)


def walker_memory_bytes(n_labeled, n_unlabeled, views):
    """A rough upper estimate of the memory of one step's walker matrices.

    Each view of the unlabeled batch makes labeled x unlabeled matrices:
    the similarities and both transition matrices in float64 and float32,
    and the walker's class probabilities (see ``_losses``); the round trip
    makes labeled x labeled ones: its probabilities in float64 and float32,
    the same-class targets and the cross-entropy's terms. With the gradients
    of the backward pass, each shape counts as twelve float64 matrices.

    Parameters
    ----------
    n_labeled : int
        Rows of the labeled batch (``labeled_per_class`` times the classes).
    n_unlabeled : int
        Rows of one view of the unlabeled batch.
    views : {1, 2}
        Views of the unlabeled batch (2 with the consistency loss).

    Returns
    -------
    bytes : int
    """
    return 12 * 8 * (views * n_labeled * n_unlabeled + n_labeled * n_labeled)


def step_memory_bytes(
    *,
    n_labeled,
    n_unlabeled,
    views,
    embedding_dim,
    activation_bytes,
    n_parameters,
    chunk_size,
):
    """A rough upper estimate of one training step's memory, in bytes.

    The activations of every embedded sample (kept for the backward pass;
    those of one chunk when the batch is embedded in chunks of
    ``chunk_size``, None: not chunked), the embeddings, the walker matrices
    (:func:`walker_memory_bytes`) and the parameters with their gradients
    and Adam's two moments.
    """
    rows = n_labeled + views * n_unlabeled
    chunk = chunk_size or rows
    # Forward activations and their gradients: twice the forward's outputs.
    activations = 2 * activation_bytes * min(rows, chunk)
    embeddings = 4 * rows * embedding_dim * 4
    walker = walker_memory_bytes(n_labeled, n_unlabeled, views)
    return int(activations + embeddings + walker + 4 * 4 * n_parameters)


def available_memory_bytes(device):
    """Memory a fit can still take on ``device``, or None where unknown."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return math.prod(
            os.sysconf(name) for name in ("SC_AVPHYS_PAGES", "SC_PAGE_SIZE")
        )
    except (ValueError, OSError, AttributeError):
        return None
