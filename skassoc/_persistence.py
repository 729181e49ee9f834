"""Save and load fitted estimators in a pickle-free file that runs nothing.

A model file is one zip archive, starting at its first byte, with two
members and no others:

``metadata.json``
    The format name and version, the skassoc and torch versions that wrote
    it, the estimator's hyperparameters, the network's description, the
    classes and the class frequencies that predictions assume, the training
    history and the SHA-256 of ``weights.pt``.
``weights.pt``
    The network's ``state_dict`` on the CPU, written by :func:`torch.save`
    and stored uncompressed.

What a file may do when it is loaded, and what it may not:

- It is read as data: JSON, and tensors through
  ``torch.load(weights_only=True)``; nothing in it is imported or executed.
- It describes a built-in network only. The description is checked against
  limits and against the shapes of the weights actually present *before*
  the network is built (on torch's meta device, which allocates nothing),
  so a small file cannot make the process allocate much more than its own
  size. Weights must be finite float32 tensors (integer counters of batch
  norm aside).
- Each hyperparameter is taken only from a safe list, each within a bounded
  domain (batch sizes, steps, widths). ``compile`` and ``device``, which
  reach a compiler and the hardware, are never taken from a file:
  ``compile`` is off and ``device`` is ``load``'s argument; a file that sets
  them gets a warning.
"""

import contextlib
import glob
import hashlib
import io
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
import torch

from ._augmentation import FEATURE_NOISE, PAPER_AUGMENTATION
from ._batches import UNLABELED_POOLS
from ._device import resolve_device
from ._fitted import FittedState, get_fitted_state
from ._model import ModelSpec, build_model, placed, spec_of_model
from ._networks import NETWORKS
from ._prior import check_class_prior, uniform_prior
from ._sampling import UNLABELED_SAMPLINGS
from ._training import LR_SCHEDULES
from ._utils import is_integer, user_stacklevel
from ._version import __version__

try:  # POSIX: lets a save tell a crashed save's temporary file from a live one.
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

__all__ = ["save_model", "load_model", "FORMAT_NAME", "FORMAT_VERSION"]

FORMAT_NAME = "skassoc-model"
#: Bump on any change that an older skassoc could not read correctly.
#: Version 2 added the class frequencies (``class_prior``); a version-1 file
#: predicts with equal ones, as the skassoc that wrote it did.
FORMAT_VERSION = 2
METADATA_MEMBER = "metadata.json"
WEIGHTS_MEMBER = "weights.pt"
TEMPORARY_SUFFIX = ".skassoc-tmp"

# metadata.json holds a few KiB of settings and a loss history of about a
# hundred entries per curve; deflated JSON shrinks by a factor of about ten.
MAX_METADATA_BYTES = 4 * 2**20
MAX_METADATA_RATIO = 50
# Limits on what a file may describe or ask the next fit to use.
MAX_WIDTH = 2**16  # embedding, hidden layers, image sides, classes
MAX_LAYERS = 64
MAX_BATCH = 2**20
MAX_STEPS = 10**7
MAX_WEIGHT = 1e6  # loss weights, L2 scales
MAX_LABEL_CHARS = 1024
# Values of the tensors a file may lack (buffers older files did not have).
MAX_DEFAULTED_VALUES = 1024
# End of central directory record of a zip without comment: 22 bytes.
_END_RECORD = struct.Struct("<4s4H2LH")

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
        return is_integer(key) or _float_in(-MAX_STEPS, MAX_STEPS)(key)

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
    "predict_batch_size": _int_in(1, MAX_BATCH, "auto"),
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
        cannot be stored as JSON, a parameter is outside the values that
        :func:`load_model` accepts, or ``path`` is not a regular file.
    """
    path = _as_path(path)
    state = get_fitted_state(estimator)
    if state.network not in NETWORKS:
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
    weights = _weights_bytes(state.model)
    params = estimator.get_params(deep=False)
    spec = spec_of_model(
        state.model, state.network, state.input_shape, state.n_features_in
    )
    metadata = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "skassoc_version": _skassoc_version(),
        "torch_version": str(torch.__version__),
        "params": _encode_params(params),
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
    # allow_nan: a loss history may hold NaN; Python's json reads it back.
    text = json.dumps(metadata, indent=2, allow_nan=True)
    _write_atomically(path, text.encode("utf-8"), weights)


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
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def _encode_params(params):
    """JSON-ready parameters (without those a file never sets)."""
    encoded = {}
    for name, value in params.items():
        if name in NEVER_FROM_FILE:
            continue
        if name == "class_weight" and isinstance(value, dict):
            # JSON keys are strings; the labels keep their type as pairs.
            value = [[key, weight] for key, weight in value.items()]
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
    if kind == "O":
        if not all(isinstance(label, str) for label in classes):
            raise ValueError(_unsupported_classes(classes))
        values = [str(label) for label in classes]
    else:
        # .tolist() gives Python bools, ints, floats and strs: exact in JSON
        # (floats are written with repr, which round-trips).
        values = classes.tolist()
    return {"dtype": classes.dtype.str, "values": values}


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
    # A fresh name beside the target: os.replace is atomic only within one
    # file system, and "x" mode never clobbers another writer's file.
    tmp_path = f"{path}.{secrets.token_hex(6)}{TEMPORARY_SUFFIX}"
    try:
        with open(tmp_path, "xb") as handle:
            if fcntl is not None:
                # Held until the file is renamed: a save that finds the
                # lock free knows this writer has died.
                fcntl.flock(handle, fcntl.LOCK_EX)
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
            os.replace(tmp_path, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_path)
        raise


def _remove_stale_temporaries(path):
    """Delete the temporary files of earlier saves of ``path`` that crashed.

    A live save holds a lock on its temporary file until it renames it, so a
    temporary file whose lock can be taken belongs to a dead process.
    Without ``fcntl`` (Windows) they are left for the user to delete.
    """
    if fcntl is None:
        return
    for stale in glob.glob(glob.escape(path) + ".*" + TEMPORARY_SUFFIX):
        with contextlib.suppress(OSError):
            with open(stale, "rb") as handle:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                os.unlink(stale)


# ---------------------------------------------------------------- loading


def load_model(path, *, device="auto"):
    """Read a model file written by :func:`save_model`.

    Parameters
    ----------
    path : str, bytes or os.PathLike
        The model file.
    device : str or torch.device, default="auto"
        Where to place the model.

    Returns
    -------
    params : dict
        The estimator's parameters (``device`` is this function's).
    state : FittedState
        Its fitted state, the model on ``device``.

    Raises
    ------
    ValueError
        If the file is not a valid model file, asks for more than the
        limits allow, or was written by a newer skassoc.
    """
    resolved = resolve_device(device)
    name = _as_path(path)
    try:
        metadata, weights = _read_archive(name)
        _check_format(metadata, name)
        params = _decode_params(_field(metadata, "params", dict))
        if metadata["format_version"] == 1:
            # Written before class_prior existed: it predicted with equal ones.
            params.setdefault("class_prior", "uniform")
        params["device"] = device
        state = _decode_state(metadata, weights, resolved)
    except InvalidModelFile as exc:
        raise ValueError(f"{name!r} is not a valid skassoc model file: {exc}") from None
    return params, state


def _read_archive(path):
    """The metadata (parsed) and the weights' bytes of the archive at ``path``."""
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
                raw_metadata = _read_member(archive, METADATA_MEMBER)
                weights = _read_member(archive, WEIGHTS_MEMBER)
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
    return metadata, weights


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


def _read_member(archive, member):
    """One member's bytes, after checks of the archive's members and sizes."""
    names = archive.namelist()
    unknown = sorted(set(names) - {METADATA_MEMBER, WEIGHTS_MEMBER})
    if unknown:
        raise InvalidModelFile(f"the archive holds unknown members {unknown[:3]}.")
    if member not in names:
        raise InvalidModelFile(f"the archive has no {member}.")
    if names.count(member) > 1:
        raise InvalidModelFile(f"the archive holds {member} twice.")
    info = archive.getinfo(member)
    if info.header_offset < 0 or info.flag_bits & 0x1:
        raise InvalidModelFile(f"{member} is encrypted or misplaced.")
    if member == WEIGHTS_MEMBER:
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


def _check_format(metadata, path):
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


def _decode_state(metadata, weights, device):
    """The fitted state of the file: its network, built only once checked."""
    expected = _field(metadata, "weights_sha256", str)
    if hashlib.sha256(weights).hexdigest() != expected:
        raise InvalidModelFile(
            f"the SHA-256 of {WEIGHTS_MEMBER} does not match the one in "
            f"{METADATA_MEMBER}; the file was corrupted or altered."
        )
    classes = _decode_classes(_field(metadata, "classes", dict))
    spec = _decode_spec(_field(metadata, "network", dict), len(classes))
    state_dict = _read_weights(weights)
    model = _build_checked(spec, state_dict)
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


def _read_weights(weights):
    """The weights as a dict of CPU tensors, refused unless plain and finite."""
    try:
        state = torch.load(io.BytesIO(weights), map_location="cpu", weights_only=True)
    except Exception as exc:  # any failure to read it means a bad file
        # weights_only refuses anything but tensors and plain containers;
        # its UnpicklingError (or a torn file's error) lands here.
        raise InvalidModelFile(
            f"{WEIGHTS_MEMBER} is not a plain tensor state dict: "
            f"{type(exc).__name__}: {str(exc)[:200]}"
        ) from None
    if not isinstance(state, dict) or not all(
        isinstance(key, str)
        and isinstance(value, torch.Tensor)
        and value.layout == torch.strided
        for key, value in state.items()
    ):
        raise InvalidModelFile(
            f"{WEIGHTS_MEMBER} is not a tensor state dict (of dense tensors)."
        )
    for key, tensor in state.items():
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise InvalidModelFile(f"weight {key[:60]!r} holds NaN or infinity.")
    return state


def _build_checked(spec, state_dict):
    """Build ``spec``'s model after checking it against the weights present.

    The network is first built on torch's meta device (shapes only, no
    memory), so an architecture that the weights do not fill is refused
    before anything of its size is allocated. Tensors missing from the file
    are allowed only if they are small (at most ``MAX_DEFAULTED_VALUES``
    values): buffers that files of earlier versions lack, such as an image
    network's input scale, which the network then fills with its defaults.
    """
    try:
        # Building draws random initial weights, which the saved ones
        # replace; fork the RNG so loading leaves the caller's stream as it was.
        with torch.random.fork_rng(devices=[]):
            with torch.device("meta"):
                skeleton = build_model(spec)
            expected = {
                key: (tuple(t.shape), t.dtype)
                for key, t in skeleton.state_dict().items()
            }
            present = {key: (tuple(t.shape), t.dtype) for key, t in state_dict.items()}
            _check_weights_fit(expected, present)
            model = build_model(spec)
        model.load_state_dict(state_dict, strict=True)
    except InvalidModelFile:
        raise
    except (ValueError, RuntimeError, TypeError) as exc:
        # A description that passed the checks above but builds no network
        # (e.g. an image smaller than the network needs), or a small tensor
        # missing that the network cannot fill.
        raise InvalidModelFile(f"cannot rebuild its network: {exc}") from None
    return model.eval()


def _check_weights_fit(expected, present):
    """Refuse weights that do not fill the described network (see above)."""
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
    """The fitted class frequencies; equal ones in a version-1 file."""
    if metadata["format_version"] == 1:
        return uniform_prior(n_classes)
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
