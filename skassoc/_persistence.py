"""Save and load fitted estimators in a file that holds no pickle and runs nothing.

A model file (format 3) is one zip archive, starting at its first byte, with
two members and no others:

``metadata.json``
    The format name and version, the skassoc and torch versions that wrote
    it, the estimator's hyperparameters and output configuration
    (``set_output``), the network's description, the classes and the class
    frequencies that predictions assume, the training history and the
    SHA-256 of ``weights.safetensors``.
``weights.safetensors``
    The network's ``state_dict`` on the CPU in the safetensors format,
    stored uncompressed.

What a file may do when it is loaded, and what it may not:

- It is read as data: JSON, and tensors through safetensors; nothing in it
  is imported, executed or unpickled.
- It describes a built-in network only. The description is checked against
  limits, and the names, shapes and dtypes in the weights' header against
  the network built on torch's meta device (which allocates nothing),
  *before* any tensor is read; so a small file cannot make the process
  allocate much more than its own size. Weights must be finite float32
  tensors (integer counters of batch norm aside).
- Each hyperparameter is taken only from a safe list, each within a bounded
  domain, and together they may not ask a refit for more than a budget of
  memory and work (see ``_refit_cost_problem``). ``compile`` and ``device``,
  which reach a compiler and the hardware, are never taken from a file:
  ``compile`` is off and ``device`` is ``load``'s argument; a file that sets
  them gets a warning.

Files of formats 1 and 2 stored the weights with :func:`torch.save`, whose
reader unpickles; :func:`load_model` refuses them, and
:func:`convert_model_file` converts them once, reading the old weights
without unpickling (see ``_legacy_weights``).
"""

import contextlib
import glob
import hashlib
import json
import math
import os
import secrets
import stat
import struct
import warnings
import zipfile
import zlib
from numbers import Real

import numpy as np
import safetensors.torch
import torch

from ._augmentation import FEATURE_NOISE, PAPER_AUGMENTATION
from ._batches import UNLABELED_POOLS
from ._defaults import MAX_LABELED_PER_CLASS, MAX_UNLABELED_BATCH_SIZE, network_macs
from ._defaults import MAX_STEPS as AUTO_MAX_STEPS
from ._device import resolve_device
from ._fitted import FittedState, get_fitted_state, set_fitted_state
from ._image_format import check_image_size, formatted_shape
from ._legacy_weights import LegacyWeightsError, read_records, read_tensors
from ._model import ModelSpec, build_model, placed, spec_of_model
from ._networks import NETWORKS, auto_network_name
from ._prior import check_class_prior, uniform_prior
from ._sampling import UNLABELED_SAMPLINGS
from ._settings import walker_memory_bytes
from ._training import LR_SCHEDULES
from ._utils import is_integer, user_stacklevel
from ._version import __version__

try:  # POSIX: lets a save tell a crashed save's temporary file from a live one.
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

__all__ = [
    "save_model",
    "load_model",
    "convert_model_file",
    "FORMAT_NAME",
    "FORMAT_VERSION",
]

FORMAT_NAME = "skassoc-model"
#: Bump on any change that an older skassoc could not read correctly.
#: Version 2 added the class frequencies (``class_prior``); version 3 stores
#: the weights as safetensors instead of a torch pickle, and the output
#: configuration of ``set_output``.
FORMAT_VERSION = 3
METADATA_MEMBER = "metadata.json"
# Why safetensors: its reader has no code path at all (a JSON header of
# names, dtypes, shapes and byte offsets, then the raw bytes), it has no
# strides or views (a tensor is exactly its bytes, so a small file cannot
# claim a large tensor), and it checks every offset against the buffer.
# NumPy's npz with allow_pickle=False is pickle-free too, but it is a zip
# of .npy files inside our zip, each with a header that allows any dtype,
# Fortran order and object arrays (refused only by a flag).
WEIGHTS_MEMBER = "weights.safetensors"
#: Where files of formats 1 and 2 kept their torch.save weights.
LEGACY_WEIGHTS_MEMBER = "weights.pt"
TEMPORARY_SUFFIX = ".skassoc-tmp"

# metadata.json holds a few KiB of settings and a loss history of about a
# hundred entries per curve; deflated JSON shrinks by a factor of about ten.
MAX_METADATA_BYTES = 4 * 2**20
MAX_METADATA_RATIO = 50
# The safetensors header of a built-in network takes about 100 bytes a
# tensor, and the largest has about 60 tensors.
MAX_HEADER_BYTES = 2**20
# Limits on what a file may describe or ask the next fit to use; the user
# guide's table of model file limits gives each one's reason.
MAX_WIDTH = 2**16  # embedding, hidden layers, image sides, classes
MAX_LAYERS = 64
MAX_STEPS = 10**5
MAX_BATCH = 2**16
MAX_PREDICT_BATCH = 2**14
MAX_STEP_BYTES = 16 * 2**30
MAX_FIT_MACS = 3 * 10**16
MAX_WEIGHT = 1e6  # loss weights, L2 scales
MAX_LABEL_CHARS = 1024
# Values of the tensors a file may lack (buffers older files did not have).
MAX_DEFAULTED_VALUES = 1024
# End of central directory record of a zip without comment: 22 bytes.
_END_RECORD = struct.Struct("<4s4H2LH")
# The dtypes of built-in networks' weights, as safetensors names them.
_SAFETENSORS_DTYPES = {"F32": torch.float32, "I64": torch.int64}
# The containers of set_output(transform=...) that a file may ask for.
OUTPUT_CONTAINERS = ("default", "pandas", "polars")
# How often a save tries a new temporary name after another save's
# clean-up took its file (see _locked_temporary).
_TEMPORARY_TRIES = 100

_CLASS_VALUE_CHECKS = {
    "b": lambda v: isinstance(v, bool),
    "i": is_integer,
    "u": is_integer,
    "f": lambda v: isinstance(v, float),
    "U": lambda v: isinstance(v, str) and len(v) <= MAX_LABEL_CHARS,
    "O": lambda v: isinstance(v, str) and len(v) <= MAX_LABEL_CHARS,
}
# Parameters a file never sets: they reach a compiler or the hardware.
NEVER_FROM_FILE = ("compile", "device")


class InvalidModelFile(Exception):
    """Why a file is not a valid model file; load_model adds the file name."""


# ------------------------------------------------------- parameter domains


def _one_of(*values):
    def check(value):
        return any(value == v and type(value) is type(v) for v in values)

    return check


def _int_in(low, high, *also):
    def check(value):
        return (is_integer(value) and low <= value <= high) or _one_of(*also)(value)

    return check


def _float_in(low, high, *also, low_open=False):
    def check(value):
        if _one_of(*also)(value):
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
            and number <= high
        )

    return check


def _sizes(min_len, max_len, low=1, high=MAX_WIDTH, allow_none=False):
    def check(value):
        if value is None:
            return allow_none
        return (
            isinstance(value, list)
            and min_len <= len(value) <= max_len
            and all(_int_in(low, high)(v) for v in value)
        )

    return check


def _image_size(value):
    return value is None or _int_in(1, MAX_WIDTH)(value) or _sizes(2, 2)(value)


def _augmentation(value):
    if value is None or value in ("auto", "paper"):
        return True
    if not isinstance(value, dict):
        return False
    keys = FEATURE_NOISE if "feature_noise" in value else PAPER_AUGMENTATION
    if set(value) - set(keys):
        return False
    bounded = _float_in(0, 100)
    return all(
        isinstance(item, bool)
        if key == "unlabeled"
        else (key == "feature_noise" and isinstance(item, str) and item == "auto")
        or bounded(item)
        for key, item in value.items()
    )


def _class_weight(value):
    """None, "balanced", or a dict stored as ``[[label, weight], ...]``."""
    if value is None or value == "balanced":
        return True

    def is_label(key):
        if isinstance(key, str):
            return len(key) <= MAX_LABEL_CHARS
        return is_integer(key) or _float_in(-math.inf, math.inf)(key)

    return (
        isinstance(value, list)
        and len(value) <= MAX_WIDTH
        and all(
            isinstance(pair, list)
            and len(pair) == 2
            and not isinstance(pair[0], bool)
            and is_label(pair[0])
            and _float_in(0, MAX_WEIGHT)(pair[1])
            for pair in value
        )
    )


def _class_prior(value):
    """ "auto", "uniform", or one positive, finite frequency per class."""
    if value in ("auto", "uniform"):
        return True
    positive = _float_in(0, math.inf, low_open=True)
    return (
        isinstance(value, list)
        and 2 <= len(value) <= MAX_WIDTH
        and all(positive(item) for item in value)
    )


#: The hyperparameters a file may set, each with the values it may take.
SAFE_PARAMS = {
    "network": _one_of("auto", *NETWORKS),
    "input_shape": _sizes(2, 3, allow_none=True),
    "image_size": _image_size,
    "image_channels": _one_of(None, 1, 3),
    "embedding_dim": _int_in(1, MAX_WIDTH),
    "hidden_layer_sizes": _sizes(0, MAX_LAYERS),
    "labeled_per_class": _int_in(1, MAX_BATCH, "auto"),
    "unlabeled_batch_size": _int_in(1, MAX_BATCH, "auto"),
    "unlabeled_sampling": _one_of(*UNLABELED_SAMPLINGS),
    "max_iter": _int_in(1, MAX_STEPS, "auto"),
    "learning_rate": _float_in(0, 10, low_open=True),
    "lr_decay": _float_in(0, 1, low_open=True),
    "lr_decay_steps": _int_in(1, MAX_STEPS, "auto"),
    "lr_schedule": _one_of(*LR_SCHEDULES),
    "lr_warmup_steps": _int_in(0, MAX_STEPS),
    "walker_weight": _float_in(0, MAX_WEIGHT),
    "visit_weight": _float_in(0, MAX_WEIGHT),
    "logit_weight": _float_in(0, MAX_WEIGHT),
    "association_delay": _int_in(0, MAX_STEPS),
    "association_ramp_steps": _int_in(0, MAX_STEPS),
    "l2_scale": _float_in(0, MAX_WEIGHT, "auto"),
    "augmentation": _augmentation,
    "consistency_weight": _float_in(0, MAX_WEIGHT, "auto"),
    "balance_weight": _float_in(0, MAX_WEIGHT),
    "ema_decay": _float_in(0, 1, None),
    "precision": _one_of("auto", "fp32", "tf32", "bf16"),
    "cuda_graph": _one_of(True, False, "auto"),
    "predict_batch_size": _int_in(1, MAX_PREDICT_BATCH, "auto"),
    "random_state": _int_in(0, 2**32 - 1, None),
    "verbose": _int_in(0, 100, True, False),
    "warm_start": _one_of(True, False),
    "validation_interval": _int_in(1, MAX_STEPS),
    "unlabeled_pool": _one_of(*UNLABELED_POOLS),
    "early_stopping": _one_of(True, False),
    "validation_fraction": lambda v: _float_in(0, 1, low_open=True)(v) and v < 1,
    "n_iter_no_change": _int_in(1, MAX_STEPS),
    "tol": _float_in(0, MAX_WEIGHT),
    "class_weight": _class_weight,
    "class_prior": _class_prior,
}
# Parameters stored as JSON lists that the estimator takes as tuples.
_TUPLE_PARAMS = ("input_shape", "image_size", "hidden_layer_sizes")


# ------------------------------------------------------ what a refit costs


def _refit_cost_problem(params, spec):
    """Why a fit with ``params`` would cost more than a model file may ask.

    A file's parameters are those of the next fit (``warm_start``, or a
    search that clones the loaded model): parameters that the domains above
    accept one by one could still, together, ask for a step beyond any
    memory or a fit of days. The step's memory (the walker's matrices, see
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
    views = 1 if params.get("consistency_weight", "auto") == 0 else 2
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
        n_weights = sum(t.numel() for t in _meta_model(spec).state_dict().values())
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


# ----------------------------------------------------------------- saving


def save_model(estimator, path):
    """Save a fitted estimator to one file, without pickle.

    Parameters
    ----------
    estimator : SemiSupervisedAssociationClassifier
        A fitted estimator with a built-in network.
    path : str, bytes or os.PathLike
        Where to write the model (see the estimator's ``save``).

    Raises
    ------
    sklearn.exceptions.NotFittedError
        If the estimator is not fitted.
    ValueError
        If the estimator uses a custom network, a parameter or the labels
        cannot be stored as JSON, a parameter (or their refit cost) is
        outside the values that :func:`load_model` accepts, or ``path`` is
        not a regular file. Nothing is written then.
    """
    path = _as_path(path)
    state = get_fitted_state(estimator)
    _check_builtin(state.network)
    spec = spec_of_model(
        state.model, state.network, state.input_shape, state.n_features_in
    )
    params = _encode_params(estimator.get_params(deep=False))
    _check_savable_cost(params, spec)
    weights = _weights_bytes(state.model)
    metadata = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "skassoc_version": _skassoc_version(),
        "torch_version": str(torch.__version__),
        "params": params,
        "output_config": _encode_output_config(estimator),
        "network": _encode_spec(spec),
        "classes": _encode_classes(state.classes),
        "class_prior": _encode_class_prior(state.class_prior, len(state.classes)),
        "feature_names_in": (
            None
            if state.feature_names_in is None
            else [str(name) for name in state.feature_names_in]
        ),
        "n_iter": int(state.n_iter),
        "history": {
            str(key): _to_json(list(values)) for key, values in state.history.items()
        },
        "weights_sha256": hashlib.sha256(weights).hexdigest(),
    }
    _write_atomically(path, _metadata_bytes(metadata), weights)


def _check_builtin(network):
    if network not in NETWORKS:
        raise ValueError(
            "save can only save estimators with a built-in network "
            f"({sorted(NETWORKS)}); this one uses a custom torch.nn.Module, "
            "whose code a model file cannot hold without pickle. Pickle it "
            "(trusted files only), or save the weights with "
            "torch.save(estimator.model_.state_dict(), path); to load them, fit "
            "an estimator with the same network for max_iter=1 on data of the "
            "same shape and classes, then call estimator.model_.load_state_dict("
            "torch.load(path, weights_only=True))."
        )


def _metadata_bytes(metadata):
    # allow_nan: a loss history may hold NaN; Python's json reads it back.
    return json.dumps(metadata, indent=2, allow_nan=True).encode("utf-8")


def _check_savable_cost(params, spec):
    problem = _refit_cost_problem(params, spec)
    if problem is not None:
        raise ValueError(
            f"Cannot save these parameters: {problem}, which is more than a "
            "model file may ask a refit for (load would refuse the file). "
            "The fitted model does not need them: lower max_iter or the "
            "batch sizes with set_params before saving, and set them again "
            "after loading."
        )


def _encode_output_config(estimator):
    """The ``set_output`` container of ``transform``, if one was set."""
    config = getattr(estimator, "_sklearn_output_config", {})
    if "transform" not in config:
        return {}
    container = config["transform"]
    if container not in OUTPUT_CONTAINERS:
        raise ValueError(
            f"Cannot save set_output(transform={container!r}): a model file "
            f"holds one of {list(OUTPUT_CONTAINERS)}."
        )
    return {"transform": container}


def _encode_class_prior(class_prior, n_classes):
    """The fitted frequencies as a list; ValueError if load would refuse them."""
    encoded = [float(value) for value in np.ravel(class_prior)]
    if len(encoded) != n_classes or not _class_prior(encoded):
        raise ValueError(
            f"Cannot save class_prior_={encoded[:10]}: a model file holds one "
            f"positive, finite frequency for each of the {n_classes} classes."
        )
    return encoded


def _skassoc_version():
    return __version__


def _as_path(path):
    """``path`` as a str; a clear TypeError for what is not a path."""
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise TypeError(
            f"path must be a str, bytes or os.PathLike file name; got "
            f"{type(path).__name__}. (File objects are not supported: the "
            "model is written under a temporary name and renamed.)"
        )
    return os.fsdecode(os.fspath(path))


def _weights_bytes(model):
    # Contiguous CPU copies: a model trained on a GPU is channels-last there,
    # and the file must not depend on where or how it was trained.
    state = {
        name: tensor.detach().to("cpu").contiguous()
        for name, tensor in model.state_dict().items()
    }
    return safetensors.torch.save(state)


def _encode_params(params):
    """JSON-ready parameters (without those a file never sets)."""
    encoded = {}
    for name, value in params.items():
        if name in NEVER_FROM_FILE:
            continue
        if name == "class_weight" and isinstance(value, dict):
            # JSON keys are strings; the labels keep their type as pairs.
            value = [[key, weight] for key, weight in value.items()]
        if name == "class_prior" and isinstance(value, torch.Tensor):
            # fit reads the values; a tensor that requires grad has them too.
            value = value.detach().cpu().numpy()
        if name == "class_prior" and not isinstance(value, (str, list)):
            value = np.asarray(value).tolist()  # an array or a pandas Series
        try:
            encoded[name] = _to_json(value)
        except TypeError:
            hint = (
                " Use an int or None for random_state (a RandomState instance "
                "cannot be saved)."
                if name == "random_state"
                else ""
            )
            raise ValueError(
                f"Cannot save parameter {name}={value!r}: a model file stores "
                "parameters as JSON, which holds only None, booleans, numbers, "
                f"strings, and lists and string-keyed dicts of them.{hint}"
            ) from None
        # load refuses values outside these domains: a file with one could
        # never be loaded, so it is not written.
        if not SAFE_PARAMS[name](encoded[name]):
            raise ValueError(
                f"Cannot save parameter {name}={value!r}: it is outside the "
                "values a model file may hold (load would refuse the file). "
                "Pickle the estimator instead (trusted files only)."
            )
    return encoded


def _to_json(value):
    """``value`` as plain JSON types; TypeError if it has no JSON form."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    if is_integer(value):
        return int(value)
    if isinstance(value, Real):
        return float(value)
    if isinstance(value, (list, tuple)):
        return [_to_json(item) for item in value]
    # A settings dict, such as ``augmentation={"unlabeled": False}``.
    if isinstance(value, dict) and all(isinstance(key, str) for key in value):
        return {key: _to_json(item) for key, item in value.items()}
    raise TypeError(type(value).__name__)


def _encode_spec(spec):
    return {
        "name": spec.network,
        "input_shape": _to_json(spec.input_shape),
        "n_features": int(spec.n_features),
        "embedding_dim": int(spec.embedding_dim),
        "hidden_layer_sizes": _to_json(spec.hidden_layer_sizes),
        "image_size": _to_json(spec.image_size),
        "image_channels": _to_json(spec.image_channels),
    }


def _encode_classes(classes):
    classes = np.asarray(classes)
    kind = classes.dtype.kind
    if classes.ndim != 1 or kind not in _CLASS_VALUE_CHECKS:
        raise ValueError(_unsupported_classes(classes))
    if kind not in "UO":
        # .tolist() gives Python bools, ints, floats: exact in JSON (floats
        # are written with repr, which round-trips).
        return {"dtype": classes.dtype.str, "values": classes.tolist()}
    if not all(isinstance(label, str) for label in classes):
        raise ValueError(_unsupported_classes(classes))
    values = [str(label) for label in classes]
    longest = max(values, key=len)
    if len(longest) > MAX_LABEL_CHARS:
        raise ValueError(
            f"Cannot save classes_ with a label of {len(longest)} characters "
            f"({longest[:40]!r}...): a model file holds labels of up to "
            f"{MAX_LABEL_CHARS} characters (load refuses longer ones, which "
            "bounds the memory a file's labels may take). Map the labels to "
            "shorter ones, or to integers, before fitting."
        )
    # The width of a "<U2000" array holding short labels is not kept: load
    # bounds it, and the labels need only the width of the longest.
    dtype = np.asarray(values).dtype if kind == "U" else classes.dtype
    return {"dtype": dtype.str, "values": values}


def _unsupported_classes(classes):
    return (
        f"Cannot save classes_ of dtype {classes.dtype} "
        f"({classes[:5].tolist()!r}...): a model file stores labels as JSON, "
        "so they must be booleans, integers, floats or strings."
    )


def _check_target(path):
    """Refuse to replace what is not a regular file (or a link, replaced)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
        raise ValueError(
            f"{path!r} exists and is not a regular file (a directory, FIFO or "
            "device); save writes model files only over regular files. Choose "
            "another path."
        )


def _write_atomically(path, metadata, weights):
    _check_target(path)
    _remove_stale_temporaries(path)
    handle, tmp_path = _locked_temporary(path)
    try:
        with handle:
            with zipfile.ZipFile(handle, "w") as archive:
                archive.writestr(
                    METADATA_MEMBER, metadata, compress_type=zipfile.ZIP_DEFLATED
                )
                # Stored, not deflated: float weights barely compress, stored
                # members read back at disk speed, and load can require it
                # (no decompression bomb can hide there).
                archive.writestr(
                    WEIGHTS_MEMBER, weights, compress_type=zipfile.ZIP_STORED
                )
            handle.flush()
            os.fsync(handle.fileno())
            # Renamed while still locked: no clean-up can take it before.
            os.replace(tmp_path, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_path)
        raise


def _locked_temporary(path):
    """A new temporary file beside ``path``, open for writing and locked.

    A fresh name beside the target: os.replace is atomic only within one file
    system, and "x" mode never clobbers another writer's file. The lock is
    held until the file is renamed, so a save that finds it free knows its
    writer has died. Between creating the file and locking it, another
    save's clean-up may take it for such a file and delete it: the name then
    no longer leads to the locked file, and a new name is tried.
    """
    for _ in range(_TEMPORARY_TRIES):
        tmp_path = f"{path}.{secrets.token_hex(6)}{TEMPORARY_SUFFIX}"
        handle = open(tmp_path, "xb")
        if fcntl is None:
            return handle, tmp_path
        fcntl.flock(handle, fcntl.LOCK_EX)
        if _names_file(tmp_path, handle):
            return handle, tmp_path
        handle.close()
    raise OSError(
        f"Could not keep a temporary file beside {path!r}: other saves kept "
        "deleting it."
    )


def _names_file(path, handle):
    """Whether ``path`` is still a name of the open file ``handle``."""
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    opened = os.fstat(handle.fileno())
    return (named.st_dev, named.st_ino) == (opened.st_dev, opened.st_ino)


def _remove_stale_temporaries(path):
    """Delete the temporary files of earlier saves of ``path`` that crashed.

    A live save holds a lock on its temporary file until it renames it (see
    :func:`_locked_temporary`), so a temporary file whose lock can be taken,
    and that its name still leads to, belongs to a dead process. Without
    ``fcntl`` (Windows) they are left for the user to delete.
    """
    if fcntl is None:
        return
    for stale in glob.glob(glob.escape(path) + ".*" + TEMPORARY_SUFFIX):
        with contextlib.suppress(OSError):
            with open(stale, "rb") as handle:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if _names_file(stale, handle):
                    os.unlink(stale)


# ---------------------------------------------------------------- loading


def load_model(estimator_class, path, *, device="auto"):
    """Read a model file written by :func:`save_model`.

    Parameters
    ----------
    estimator_class : type
        The estimator to build (``SemiSupervisedAssociationClassifier``).
    path : str, bytes or os.PathLike
        The model file.
    device : str or torch.device, default="auto"
        Where to place the model.

    Returns
    -------
    estimator : estimator_class
        Fitted, with the file's parameters (``device`` is this function's)
        and output configuration, the model on ``device``.

    Raises
    ------
    ValueError
        If the file is not a valid model file, asks for more than the
        limits allow, was written by a newer skassoc, or is of format 1 or
        2 (see :func:`convert_model_file`).
    """
    resolved = resolve_device(device)
    name = _as_path(path)
    try:
        metadata, weights_member, weights = _read_archive(name)
        version = _check_format(metadata, name, weights_member)
        if version < FORMAT_VERSION:
            raise ValueError(_legacy_advice(name, metadata, version))
        params, state, output = _decode_file(metadata, weights, resolved)
    except InvalidModelFile as exc:
        raise ValueError(f"{name!r} is not a valid skassoc model file: {exc}") from None
    estimator = estimator_class(**params, device=device)
    set_fitted_state(estimator, state)
    if output:
        estimator.set_output(**output)
    return estimator


def _legacy_advice(path, metadata, version):
    return (
        f"{path!r} is a skassoc model file of format version {version} "
        f"(skassoc {str(metadata.get('skassoc_version', '?'))[:40]}), whose "
        "weights are a torch pickle; this skassoc reads only format "
        f"{FORMAT_VERSION}, which holds no pickle. Convert the file once with "
        f"skassoc.convert_model_file({path!r}, new_path), which reads the old "
        "weights without unpickling them and checks them as load does, or "
        "fit the model again and save it."
    )


def _decode_file(metadata, weights, device):
    """The parameters, fitted state and output configuration of a file."""
    params = _decode_params(_field(metadata, "params", dict))
    output = _decode_output_config(metadata.get("output_config"))
    state = _decode_state(metadata, weights, device, params)
    return params, state, output


# -------------------------------------------------------------- converting


def convert_model_file(source, destination):
    """Convert a model file of format 1 or 2 to today's format, without pickle.

    Files of formats 1 and 2, written by earlier versions of skassoc,
    stored the network's weights with :func:`torch.save`, whose reader
    unpickles; :meth:`~skassoc.SemiSupervisedAssociationClassifier.load`
    refuses them. This reads their weights without unpickling: the pickle's
    opcodes are decoded, never executed, and only a plain dict of
    contiguous float32 and int64 tensors is accepted, each tensor matched
    against the network the file describes before its bytes are read. The
    converted file is checked as ``load`` checks it before it is written;
    ``compile`` and ``device``, which ``load`` never takes from a file, are
    left out of it.

    Parameters
    ----------
    source : str, bytes or os.PathLike
        A model file of format 1 or 2.
    destination : str, bytes or os.PathLike
        Where to write the converted file (``source`` itself replaces it).

    Raises
    ------
    ValueError
        If ``source`` is not a valid model file of format 1 or 2 (already
        converted, tampered with), or its parameters are beyond today's
        limits of model files.

    See Also
    --------
    SemiSupervisedAssociationClassifier.load : Load the converted file.

    Notes
    -----
    Read more in the :ref:`User Guide <user_guide_persistence>`.
    """
    source, destination = _as_path(source), _as_path(destination)
    try:
        metadata, weights_member, legacy = _read_archive(source)
        version = _check_format(metadata, source, weights_member)
        if version == FORMAT_VERSION:
            raise ValueError(
                f"{source!r} is already of format {FORMAT_VERSION}: there is "
                "nothing to convert; load it."
            )
        metadata, weights = _converted(metadata, legacy, version)
        _decode_file(metadata, weights, torch.device("cpu"))
    except InvalidModelFile as exc:
        raise ValueError(
            f"{source!r} is not a valid skassoc model file: {exc}"
        ) from None
    _write_atomically(destination, _metadata_bytes(metadata), weights)


def _converted(metadata, legacy, version):
    """The metadata and safetensors weights of format 3 for an older file."""
    _check_checksum(metadata, legacy, LEGACY_WEIGHTS_MEMBER)
    classes = _decode_classes(_field(metadata, "classes", dict))
    spec = _decode_spec(_field(metadata, "network", dict), len(classes))
    try:
        records = read_records(legacy)
        present = {key: (record.shape, record.dtype) for key, record in records.items()}
        _check_weights_fit(_expected_weights(spec), present)
        weights = safetensors.torch.save(read_tensors(legacy, records))
    except LegacyWeightsError as exc:
        raise InvalidModelFile(f"{LEGACY_WEIGHTS_MEMBER}: {exc}") from None
    params = {
        name: value
        for name, value in _field(metadata, "params", dict).items()
        if name not in NEVER_FROM_FILE
    }
    if version == 1:
        # Written before class_prior existed: it predicted with equal ones.
        params.setdefault("class_prior", "uniform")
        metadata["class_prior"] = uniform_prior(len(classes)).tolist()
    metadata.update(
        format_version=FORMAT_VERSION,
        skassoc_version=_skassoc_version(),
        torch_version=str(torch.__version__),
        params=params,
        output_config={},
        weights_sha256=hashlib.sha256(weights).hexdigest(),
    )
    return metadata, weights


# ----------------------------------------------------------- the archive


def _read_archive(path):
    """The metadata (parsed), the weights member's name and its bytes."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise InvalidModelFile(f"cannot read it: {exc}") from None
    if not stat.S_ISREG(mode):
        raise InvalidModelFile("it is not a regular file.")
    with open(path, "rb") as handle:
        _check_zip_bounds(handle)
        try:
            with zipfile.ZipFile(handle) as archive:
                weights_member = _weights_member(archive)
                raw_metadata = _read_member(archive, METADATA_MEMBER)
                weights = _read_member(archive, weights_member)
        except InvalidModelFile:
            raise
        except (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError) as exc:
            raise InvalidModelFile(
                f"it is not a complete zip archive (truncated or corrupted): {exc}"
            ) from None
        except (NotImplementedError, RuntimeError, ValueError, OSError) as exc:
            # Unsupported compression or encrypted members: not written by us.
            raise InvalidModelFile(f"unreadable zip archive: {exc}") from None
    try:
        metadata = json.loads(raw_metadata.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        # ValueError covers JSONDecodeError and UnicodeDecodeError; deep
        # nesting in a crafted file raises RecursionError.
        raise InvalidModelFile(f"{METADATA_MEMBER} is not valid JSON: {exc}") from None
    if not isinstance(metadata, dict):
        raise InvalidModelFile(f"{METADATA_MEMBER} is not a JSON object.")
    return metadata, weights_member, weights


def _check_zip_bounds(handle):
    """The archive must start at the file's first byte and end at its last.

    A zip reader finds its directory from the end, so bytes before the
    archive (a pickle, say: a polyglot file) or after it would go unseen.
    """
    size = handle.seek(0, os.SEEK_END)
    handle.seek(0)
    head = handle.read(4)
    if head != b"PK\x03\x04":
        raise InvalidModelFile("it does not start with a zip archive.")
    if size < _END_RECORD.size:
        raise InvalidModelFile("it is too short to be a zip archive.")
    handle.seek(size - _END_RECORD.size)
    record = _END_RECORD.unpack(handle.read(_END_RECORD.size))
    signature, comment_length = record[0], record[-1]
    if signature != b"PK\x05\x06" or comment_length != 0:
        raise InvalidModelFile(
            "it does not end with the zip archive's directory (data appended, "
            "or an archive comment)."
        )
    handle.seek(0)


def _weights_member(archive):
    """The name of the weights member, after checks of the archive's members."""
    names = archive.namelist()
    allowed = {METADATA_MEMBER, WEIGHTS_MEMBER, LEGACY_WEIGHTS_MEMBER}
    unknown = sorted(set(names) - allowed)
    if unknown:
        raise InvalidModelFile(f"the archive holds unknown members {unknown[:3]}.")
    for name in set(names):
        if names.count(name) > 1:
            raise InvalidModelFile(f"the archive holds {name} twice.")
    if METADATA_MEMBER not in names:
        raise InvalidModelFile(f"the archive has no {METADATA_MEMBER}.")
    weights = [name for name in names if name != METADATA_MEMBER]
    if len(weights) != 1:
        raise InvalidModelFile(
            f"the archive has no {WEIGHTS_MEMBER}"
            if not weights
            else f"the archive holds both {weights[0]} and {weights[1]}."
        )
    return weights[0]


def _read_member(archive, member):
    """One member's bytes, after checks of its place and sizes."""
    info = archive.getinfo(member)
    if info.header_offset < 0 or info.flag_bits & 0x1:
        raise InvalidModelFile(f"{member} is encrypted or misplaced.")
    if member != METADATA_MEMBER:
        if info.compress_type != zipfile.ZIP_STORED:
            raise InvalidModelFile(f"{member} is compressed; it is always stored.")
        limit = info.compress_size
    else:
        limit = min(MAX_METADATA_BYTES, MAX_METADATA_RATIO * info.compress_size + 2**16)
    if info.file_size > limit:
        raise InvalidModelFile(
            f"{member} declares {info.file_size} bytes, more than the "
            f"{limit} it may hold."
        )
    # read() checks each member's CRC-32; the bound keeps a member that lies
    # about its size from inflating further.
    with archive.open(info) as stream:
        data = stream.read(limit + 1)
    if len(data) > limit:
        raise InvalidModelFile(f"{member} inflates beyond {limit} bytes.")
    return data


def _check_format(metadata, path, weights_member):
    """The file's format version, once its name, version and weights agree."""
    if metadata.get("format") != FORMAT_NAME:
        raise InvalidModelFile(
            f"its format is {str(metadata.get('format'))[:40]!r}, not {FORMAT_NAME!r}."
        )
    version = metadata.get("format_version")
    if not is_integer(version) or version < 1:
        raise InvalidModelFile(f"bad format_version {str(version)[:40]!r}.")
    if version > FORMAT_VERSION:
        # A readable file from the future: not a corrupt one, so say so.
        raise ValueError(
            f"{path!r} uses skassoc model format version {version}, written by "
            f"skassoc {str(metadata.get('skassoc_version', '?'))[:40]}; this "
            f"skassoc ({_skassoc_version()}) reads format versions up to "
            f"{FORMAT_VERSION}. Upgrade skassoc to load it."
        )
    expected = WEIGHTS_MEMBER if version == FORMAT_VERSION else LEGACY_WEIGHTS_MEMBER
    if weights_member != expected:
        raise InvalidModelFile(
            f"format version {version} keeps its weights in {expected}, not "
            f"{weights_member}."
        )
    return version


def _decode_params(params):
    """The parameters a file may set, each checked against its domain."""
    decoded = {}
    ignored = []
    for name, value in params.items():
        if name in NEVER_FROM_FILE:
            ignored.append(name)
            continue
        check = SAFE_PARAMS.get(name)
        if check is None:
            raise InvalidModelFile(f"unknown parameter {name[:40]!r}.")
        if not check(value):
            raise InvalidModelFile(
                f"parameter {name} = {str(value)[:60]} is outside the values a "
                "model file may set."
            )
        if name == "class_weight" and isinstance(value, list):
            value = {key: weight for key, weight in value}
        decoded[name] = (
            tuple(value) if name in _TUPLE_PARAMS and isinstance(value, list) else value
        )
    if ignored:
        warnings.warn(
            f"The model file sets {', '.join(ignored)}, which model files may "
            "not configure: compile stays off and device is load's argument. "
            "Set them with set_params if you trust them.",
            UserWarning,
            stacklevel=user_stacklevel(),
        )
    return decoded


def _decode_output_config(config):
    """``set_output``'s arguments from the file: {} or one known container."""
    valid = isinstance(config, dict) and (
        config == {}
        or (list(config) == ["transform"] and config["transform"] in OUTPUT_CONTAINERS)
    )
    if not valid:
        raise InvalidModelFile(
            f"bad output_config {str(config)[:60]} (set_output's transform "
            f"container, one of {list(OUTPUT_CONTAINERS)}, or nothing)."
        )
    return dict(config)


def _decode_state(metadata, weights, device, params):
    """The fitted state of the file: its network, built only once checked."""
    _check_checksum(metadata, weights, WEIGHTS_MEMBER)
    classes = _decode_classes(_field(metadata, "classes", dict))
    spec = _decode_spec(_field(metadata, "network", dict), len(classes))
    present = _safetensors_header(weights)
    _check_weights_fit(_expected_weights(spec), present)
    problem = _refit_cost_problem(params, spec)
    if problem is not None:
        raise InvalidModelFile(
            f"its parameters ask a refit for more than a model file may: {problem}."
        )
    state_dict = _read_weights(weights, present)
    model = _build_loaded(spec, state_dict)
    names = metadata.get("feature_names_in")
    if names is not None and (
        not isinstance(names, list)
        or len(names) != spec.n_features
        or not all(isinstance(n, str) for n in names)
    ):
        raise InvalidModelFile("feature_names_in does not match n_features.")
    n_iter = _field(metadata, "n_iter", int)
    if n_iter < 0:
        raise InvalidModelFile("n_iter is negative.")
    return FittedState(
        model=placed(model, device, spec),
        classes=classes,
        class_prior=_decode_class_prior(metadata, len(classes)),
        input_shape=spec.input_shape,
        network=spec.network,
        n_features_in=spec.n_features,
        # scikit-learn keeps feature names as an object array of str.
        feature_names_in=None if names is None else np.asarray(names, dtype=object),
        n_iter=n_iter,
        history=_decode_history(_field(metadata, "history", dict)),
        device=device,
    )


def _check_checksum(metadata, weights, member):
    expected = _field(metadata, "weights_sha256", str)
    if hashlib.sha256(weights).hexdigest() != expected:
        raise InvalidModelFile(
            f"the SHA-256 of {member} does not match the one in "
            f"{METADATA_MEMBER}; the file was corrupted or altered."
        )


def _decode_spec(entry, n_classes):
    name = _field(entry, "name", str)
    if name not in NETWORKS:
        raise InvalidModelFile(f"unknown network {name[:40]!r}.")
    shape = entry.get("input_shape")
    if not _sizes(3, 3, allow_none=True)(shape):
        raise InvalidModelFile(f"bad input_shape {str(shape)[:60]}.")
    n_features = _field(entry, "n_features", int)
    if not 1 <= n_features <= MAX_WIDTH**2:
        raise InvalidModelFile(f"n_features {n_features} is out of bounds.")
    if shape is not None and math.prod(shape) != n_features:
        raise InvalidModelFile(
            f"input_shape {shape} does not hold n_features={n_features} values."
        )
    hidden = entry.get("hidden_layer_sizes")
    image_size = entry.get("image_size")
    channels = entry.get("image_channels")
    checks = {
        "embedding_dim": _int_in(1, MAX_WIDTH)(entry.get("embedding_dim")),
        "hidden_layer_sizes": _sizes(0, MAX_LAYERS)(hidden),
        "image_size": _sizes(2, 2, allow_none=True)(image_size),
        "image_channels": _one_of(None, 1, 3)(channels),
        "image options": shape is not None or (image_size, channels) == (None, None),
        "channel conversion": channels is None
        or (shape is not None and shape[0] in (1, 3)),
    }
    bad = [key for key, ok in checks.items() if not ok]
    if bad:
        raise InvalidModelFile(f"bad network description ({', '.join(bad)}).")
    return ModelSpec(
        network=name,
        input_shape=None if shape is None else tuple(shape),
        n_features=n_features,
        n_classes=n_classes,
        embedding_dim=entry["embedding_dim"],
        hidden_layer_sizes=tuple(hidden),
        image_size=None if image_size is None else tuple(image_size),
        image_channels=channels,
    )


# ------------------------------------------------------------- the weights


def _meta_model(spec):
    """``spec``'s model on torch's meta device: shapes only, no memory.

    Initialising meta tensors draws no random numbers, so no generator is
    touched (a fit in another thread keeps its stream).
    """
    with torch.device("meta"):
        return build_model(spec)


def _expected_weights(spec):
    """Name, shape and dtype of each tensor of ``spec``'s ``state_dict``."""
    try:
        skeleton = _meta_model(spec)
    except (ValueError, RuntimeError, TypeError) as exc:
        # A description that passed the checks but builds no network (e.g.
        # an image smaller than the network needs).
        raise InvalidModelFile(f"cannot rebuild its network: {exc}") from None
    return {key: (tuple(t.shape), t.dtype) for key, t in skeleton.state_dict().items()}


def _read_weights(weights, present):
    """The weights as a dict of CPU tensors, refused unless finite.

    ``present`` is what the safetensors header declares, already matched
    against the network: no tensor is read, copied or checked before its
    shape and dtype are known to be the network's.
    """
    try:
        state = safetensors.torch.load(weights)
    except Exception as exc:  # any failure to read it means a bad file
        # SafetensorError: offsets outside the buffer, gaps, overlaps, a
        # torn file.
        raise InvalidModelFile(
            f"{WEIGHTS_MEMBER} is not a valid safetensors buffer: "
            f"{type(exc).__name__}: {str(exc)[:200]}"
        ) from None
    if {key: (tuple(t.shape), t.dtype) for key, t in state.items()} != present:
        raise InvalidModelFile(f"{WEIGHTS_MEMBER} holds other tensors than its header.")
    for key, tensor in state.items():
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise InvalidModelFile(f"weight {key[:60]!r} holds NaN or infinity.")
    return state


def _safetensors_header(weights):
    """Name, shape and dtype of each tensor that the safetensors header declares."""
    if len(weights) < 8:
        raise InvalidModelFile(f"{WEIGHTS_MEMBER} is too short for a header.")
    (size,) = struct.unpack("<Q", weights[:8])
    if size > min(MAX_HEADER_BYTES, len(weights) - 8):
        raise InvalidModelFile(
            f"{WEIGHTS_MEMBER} declares a header of {size} bytes; it holds at "
            f"most {MAX_HEADER_BYTES}, within the member."
        )
    try:
        header = json.loads(weights[8 : 8 + size], object_pairs_hook=_unique_keys)
    except (ValueError, RecursionError) as exc:
        raise InvalidModelFile(
            f"the header of {WEIGHTS_MEMBER} is not valid JSON: {exc}"
        ) from None
    if not isinstance(header, dict):
        raise InvalidModelFile(f"the header of {WEIGHTS_MEMBER} is not a JSON object.")
    present = {}
    for key, entry in header.items():
        if key == "__metadata__":
            # safetensors' free-form strings, which save never writes.
            raise InvalidModelFile(f"{WEIGHTS_MEMBER} holds a __metadata__ entry.")
        shape = entry.get("shape") if isinstance(entry, dict) else None
        dtype = entry.get("dtype") if isinstance(entry, dict) else None
        if not (
            isinstance(shape, list)
            and all(is_integer(size) and size >= 0 for size in shape)
            and isinstance(dtype, str)
        ):
            raise InvalidModelFile(
                f"bad header entry {key[:60]!r} in {WEIGHTS_MEMBER}."
            )
        # Other dtypes stay names, which no network's tensor matches.
        present[key] = (tuple(shape), _SAFETENSORS_DTYPES.get(dtype, dtype[:10]))
    return present


def _unique_keys(pairs):
    # Two entries of one name: this parser and safetensors' might keep
    # different ones, and the one checked would not be the one read.
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError("a name appears twice")
    return dict(pairs)


def _build_loaded(spec, state_dict):
    """``spec``'s model with the checked weights of the file."""
    try:
        with torch.random.fork_rng(devices=[]):
            model = build_model(spec)
        model.load_state_dict(state_dict, strict=True)
    except (ValueError, RuntimeError, TypeError) as exc:
        # A small tensor missing that the network cannot fill.
        raise InvalidModelFile(f"cannot rebuild its network: {exc}") from None
    return model.eval()


def _check_weights_fit(expected, present):
    """Refuse weights that do not fill the described network.

    Tensors missing from the file are allowed only if they are small (at
    most ``MAX_DEFAULTED_VALUES`` values): buffers that files of earlier
    versions lack, such as an image network's input scale, which the
    network then fills with its defaults.
    """
    missing = set(expected) - set(present)
    defaulted = sum(math.prod(expected[key][0]) for key in missing)
    differ = any(expected[key] != present[key] for key in set(expected) & set(present))
    if differ or set(present) - set(expected) or defaulted > MAX_DEFAULTED_VALUES:
        raise InvalidModelFile(_mismatch(expected, present))


def _mismatch(expected, present):
    missing = sorted(set(expected) - set(present))
    extra = sorted(set(present) - set(expected))
    differ = sorted(
        key for key in set(expected) & set(present) if expected[key] != present[key]
    )
    details = []
    if missing:
        details.append(f"missing {missing[:3]}")
    if extra:
        details.append(f"unexpected {extra[:3]}")
    if differ:
        key = differ[0]
        details.append(
            f"{key} is {present[key][0]} {present[key][1]}, the network needs "
            f"{expected[key][0]} {expected[key][1]}"
        )
    return "its weights do not fit the network it describes: " + "; ".join(details)


# ------------------------------------------------------ metadata checking


def _field(mapping, key, kind):
    value = mapping.get(key)
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if not ok:
        raise InvalidModelFile(f"metadata field {key!r} is missing or malformed.")
    return value


def _decode_classes(entry):
    values = _field(entry, "values", list)
    try:
        dtype = np.dtype(_field(entry, "dtype", str))
    except TypeError as exc:
        raise InvalidModelFile(f"bad classes dtype: {exc}") from None
    if dtype.kind not in _CLASS_VALUE_CHECKS or dtype.fields is not None:
        raise InvalidModelFile(f"unsupported classes dtype {dtype}.")
    if dtype.itemsize > 4 * MAX_LABEL_CHARS:
        raise InvalidModelFile(f"classes dtype {dtype} is implausibly wide.")
    if not 2 <= len(values) <= MAX_WIDTH or not all(
        _CLASS_VALUE_CHECKS[dtype.kind](value) for value in values
    ):
        raise InvalidModelFile(f"bad classes values for dtype {dtype}.")
    try:
        classes = np.asarray(values, dtype=dtype)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidModelFile(f"bad classes values: {exc}") from None
    # A too-short string dtype would silently truncate labels.
    if classes.tolist() != values or len(np.unique(classes)) != len(classes):
        raise InvalidModelFile(f"classes do not fit their dtype {dtype}.")
    return classes


def _decode_class_prior(metadata, n_classes):
    """The fitted class frequencies."""
    prior = _field(metadata, "class_prior", list)
    if not _class_prior(prior):
        raise InvalidModelFile("class_prior is malformed.")
    try:
        return check_class_prior(prior, n_classes)
    except ValueError as exc:
        raise InvalidModelFile(str(exc)) from None


def _decode_history(history):
    for key, values in history.items():
        if not isinstance(values, list) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in values
        ):
            raise InvalidModelFile(f"bad history entry {key[:40]!r}.")
    return {key: list(values) for key, values in history.items()}
