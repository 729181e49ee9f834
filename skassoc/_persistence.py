"""Save and load fitted estimators in a safe, pickle-free file format.

A model file is one zip archive with two members:

``metadata.json``
    The format name and version, the skassoc and torch versions that wrote
    it, the estimator's parameters, its fitted attributes (except the
    network) and the SHA-256 of ``weights.pt``.
``weights.pt``
    The network's ``state_dict`` on the CPU, written by :func:`torch.save`.

Loading reads the metadata with :mod:`json`, rebuilds the built-in network
from it, and reads the weights with ``torch.load(weights_only=True)``, which
only accepts tensors and plain containers. Nothing in the file is ever
executed, unlike :mod:`pickle` or :mod:`joblib`, so a model file from an
untrusted source is as safe to open as a JSON document.
"""

import contextlib
import hashlib
import io
import json
import math
import os
import secrets
import zipfile
import zlib
from numbers import Integral, Real

import numpy as np
import torch
from sklearn.utils.validation import check_is_fitted

from ._image_format import ImageFormat, format_settings, formatted_shape
from ._networks import (
    NETWORKS,
    AssociationModel,
    MLPNet,
    build_network,
    place_model,
)
from ._validation import resolve_device

__all__ = ["save_model", "load_model", "FORMAT_NAME", "FORMAT_VERSION"]

FORMAT_NAME = "skassoc-model"
#: Bump on any change that an older skassoc could not read correctly.
FORMAT_VERSION = 1
METADATA_MEMBER = "metadata.json"
WEIGHTS_MEMBER = "weights.pt"
# metadata.json is small (a few KiB plus the loss history); the cap keeps a
# crafted archive from making load_model inflate gigabytes into memory.
MAX_METADATA_BYTES = 64 * 2**20
# Label dtypes that JSON stores exactly: booleans, integers, floats, strings
# (NumPy unicode, or object arrays of str as pandas gives).
_CLASS_KINDS = {"b", "i", "u", "f", "U", "O"}


_CLASS_VALUE_CHECKS = {
    "b": lambda v: isinstance(v, bool),
    "i": lambda v: _is_int(v),
    "u": lambda v: _is_int(v),
    "f": lambda v: isinstance(v, float),
    "U": lambda v: isinstance(v, str),
    "O": lambda v: isinstance(v, str),
}


class _InvalidModelFile(Exception):
    """Why a file is not a valid model file; load_model adds the file name."""


# ----------------------------------------------------------------- saving


def save_model(estimator, path):
    """Save a fitted estimator to one file, without pickle.

    Parameters
    ----------
    estimator : SemiSupervisedAssociationClassifier
        A fitted estimator with a built-in network (not a custom
        ``torch.nn.Module``).
    path : str or os.PathLike
        Where to write the model; the extension ``.skassoc`` is suggested.
        An existing file is replaced. The file is written under a temporary
        name and renamed at the end, so a failed save never leaves a
        truncated model behind.

    Raises
    ------
    sklearn.exceptions.NotFittedError
        If the estimator is not fitted.
    ValueError
        If the estimator uses a custom network, or a parameter or the labels
        cannot be stored as JSON.

    See Also
    --------
    load_model : Load a model saved by this function.

    Notes
    -----
    The file holds the estimator's parameters, its fitted attributes and the
    network's weights (moved to the CPU, so a model trained on a GPU loads on
    a machine without one). It holds no optimizer state: ``warm_start`` on a
    loaded model continues from its weights with a fresh optimizer, exactly
    as it does on the original.
    """
    check_is_fitted(estimator, "model_")
    network = estimator.network_
    if isinstance(estimator.get_params()["network"], torch.nn.Module) or (
        network not in NETWORKS
    ):
        raise ValueError(
            "save_model can only save estimators with a built-in network "
            f"({sorted(NETWORKS)}); this one uses a custom torch.nn.Module, "
            "whose code a model file cannot hold without pickle. Pickle it "
            "(trusted files only), or save the weights with "
            "torch.save(estimator.model_.state_dict(), path); to load them, fit "
            "an estimator with the same network for max_iter=1 on data of the "
            "same shape and classes, then call estimator.model_.load_state_dict("
            "torch.load(path, weights_only=True))."
        )
    weights = _weights_bytes(estimator.model_)
    params, tuple_params = _encode_params(estimator.get_params(deep=False))
    metadata = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "skassoc_version": _skassoc_version(),
        "torch_version": str(torch.__version__),
        "params": params,
        "tuple_params": tuple_params,
        "fitted": _encode_fitted(estimator),
        "weights_sha256": hashlib.sha256(weights).hexdigest(),
    }
    # allow_nan: a loss history may hold NaN; Python's json reads it back.
    text = json.dumps(metadata, indent=2, allow_nan=True)
    _write_atomically(path, text.encode("utf-8"), weights)


def _skassoc_version():
    # Imported here: skassoc/__init__ imports the classifier, which will
    # import this module.
    from . import __version__

    return __version__


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
    """JSON-ready parameters, and the names of those that were tuples."""
    encoded, tuple_params = {}, []
    for name, value in params.items():
        if name == "device":
            # "auto", "cpu", "cuda:1" or a torch.device: all round-trip as str.
            encoded[name] = str(value)
            continue
        if isinstance(value, tuple):
            tuple_params.append(name)
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
    return encoded, sorted(tuple_params)


def _to_json(value):
    """``value`` as plain JSON types; TypeError if it has no JSON form."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, Integral):
        return int(value)
    if isinstance(value, Real):
        return float(value)
    if isinstance(value, (list, tuple)):
        return [_to_json(item) for item in value]
    # A settings dict, such as ``augmentation={"unlabeled": False}``.
    if isinstance(value, dict) and all(isinstance(key, str) for key in value):
        return {key: _to_json(item) for key, item in value.items()}
    raise TypeError(type(value).__name__)


def _encode_fitted(estimator):
    fitted = {
        "classes": _encode_classes(estimator.classes_),
        "input_shape": _to_json(estimator.input_shape_),
        "network": estimator.network_,
        "embedding_dim": int(estimator.embedding_dim_),
        # The architecture comes from the fitted network itself, not from the
        # current parameters: set_params after fit, or a warm-start fit, can
        # leave hidden_layer_sizes describing a different network.
        "hidden_layer_sizes": _hidden_layer_sizes(estimator.model_.embedder),
        # Likewise the image format the network was trained on, not the
        # current image_size and image_channels.
        "input_format": _encode_input_format(estimator.model_.input_format),
        "n_features_in": int(estimator.n_features_in_),
        "n_iter": int(estimator.n_iter_),
        "history": {
            str(key): _to_json(list(values))
            for key, values in estimator.history_.items()
        },
        # Informational only: load_model places the model where it is told.
        "device": str(estimator.device_),
    }
    if hasattr(estimator, "feature_names_in_"):
        fitted["feature_names_in"] = [str(n) for n in estimator.feature_names_in_]
    return fitted


def _encode_input_format(input_format):
    size, channels = format_settings(input_format)
    if size is None and channels is None:
        return None
    return {"size": _to_json(size), "channels": _to_json(channels)}


def _hidden_layer_sizes(embedder):
    return list(embedder.hidden_layer_sizes) if isinstance(embedder, MLPNet) else []


def _encode_classes(classes):
    classes = np.asarray(classes)
    kind = classes.dtype.kind
    if classes.ndim != 1 or kind not in _CLASS_KINDS:
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


def _write_atomically(path, metadata, weights):
    path = os.fspath(path)
    # A fresh name beside the target: os.replace is atomic only within one
    # file system, and "x" mode never clobbers another writer's file.
    tmp_path = f"{path}.{secrets.token_hex(6)}.tmp"
    try:
        with open(tmp_path, "xb") as handle:
            with zipfile.ZipFile(handle, "w") as archive:
                archive.writestr(
                    METADATA_MEMBER, metadata, compress_type=zipfile.ZIP_DEFLATED
                )
                # Stored, not deflated: float weights barely compress, and
                # stored members read back at disk speed.
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


# ---------------------------------------------------------------- loading


def load_model(path, *, device="auto"):
    """Load an estimator saved by :func:`save_model`.

    Loading executes nothing from the file: the metadata is JSON and the
    weights are read with ``torch.load(weights_only=True)``, so files from
    untrusted sources are safe to open. The file's checksum, members and
    weights are verified; a damaged or altered file raises ValueError.

    Parameters
    ----------
    path : str or os.PathLike
        The model file.
    device : str or torch.device, default="auto"
        Where to place the model: ``"auto"`` (a GPU when there is one, else
        the CPU), ``"cpu"``, ``"cuda"`` or ``"cuda:N"``. A model trained on a
        GPU loads on the CPU.

    Returns
    -------
    estimator : SemiSupervisedAssociationClassifier
        The fitted estimator, ready to predict. Its parameters are those it
        was saved with (``device`` included); ``device_`` is where it now is.

    Raises
    ------
    ValueError
        If the file is not a valid model file (not a zip archive, truncated,
        a member missing, bad JSON, checksum or weights mismatch), was
        written by a newer skassoc, or ``device`` is not available.

    See Also
    --------
    save_model : Save a fitted estimator.
    """
    device = resolve_device(device)
    name = os.fspath(path)
    try:
        metadata, weights = _read_archive(name)
        _check_format(metadata, name)
        return _rebuild(metadata, weights, device)
    except _InvalidModelFile as exc:
        raise ValueError(f"{name!r} is not a valid skassoc model file: {exc}") from None


def _read_archive(path):
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            for member in (METADATA_MEMBER, WEIGHTS_MEMBER):
                if member not in names:
                    raise _InvalidModelFile(f"the archive has no {member}.")
                if names.count(member) > 1:
                    raise _InvalidModelFile(f"the archive holds {member} twice.")
            if archive.getinfo(METADATA_MEMBER).file_size > MAX_METADATA_BYTES:
                raise _InvalidModelFile(f"{METADATA_MEMBER} is implausibly large.")
            # read() checks each member's CRC-32, catching corrupted bytes.
            raw_metadata = archive.read(METADATA_MEMBER)
            weights = archive.read(WEIGHTS_MEMBER)
    except _InvalidModelFile:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError) as exc:
        raise _InvalidModelFile(
            f"it is not a complete zip archive (truncated or corrupted): {exc}"
        ) from None
    except (NotImplementedError, RuntimeError, ValueError) as exc:
        # Unsupported compression or encrypted members: not written by us.
        raise _InvalidModelFile(f"unreadable zip archive: {exc}") from None
    try:
        metadata = json.loads(raw_metadata.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        # ValueError covers JSONDecodeError and UnicodeDecodeError; deep
        # nesting in a crafted file raises RecursionError.
        raise _InvalidModelFile(f"{METADATA_MEMBER} is not valid JSON: {exc}") from None
    if not isinstance(metadata, dict):
        raise _InvalidModelFile(f"{METADATA_MEMBER} is not a JSON object.")
    return metadata, weights


def _check_format(metadata, path):
    if metadata.get("format") != FORMAT_NAME:
        raise _InvalidModelFile(
            f"its format is {metadata.get('format')!r}, not {FORMAT_NAME!r}."
        )
    version = metadata.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise _InvalidModelFile(f"bad format_version {version!r}.")
    if version > FORMAT_VERSION:
        # A readable file from the future: not a corrupt one, so say so.
        raise ValueError(
            f"{path!r} uses skassoc model format version {version}, written by "
            f"skassoc {metadata.get('skassoc_version', '?')}; this skassoc "
            f"({_skassoc_version()}) reads format versions up to "
            f"{FORMAT_VERSION}. Upgrade skassoc to load it."
        )


def _rebuild(metadata, weights, device):
    # Imported here: the classifier module will import this one.
    from ._classifier import SemiSupervisedAssociationClassifier

    expected = _field(metadata, "weights_sha256", str)
    if hashlib.sha256(weights).hexdigest() != expected:
        raise _InvalidModelFile(
            f"the SHA-256 of {WEIGHTS_MEMBER} does not match the one in "
            f"{METADATA_MEMBER}; the file was corrupted or altered."
        )
    params = _decode_params(metadata)
    fitted = _field(metadata, "fitted", dict)
    classes = _decode_classes(_field(fitted, "classes", dict))
    network = _field(fitted, "network", str)
    if network not in NETWORKS:
        raise _InvalidModelFile(f"unknown network {network!r}.")
    input_shape = _decode_shape(fitted.get("input_shape"))
    n_features = _positive_int(fitted, "n_features_in")
    embedding_dim = _positive_int(fitted, "embedding_dim")
    hidden = _field(fitted, "hidden_layer_sizes", list)
    if not all(_is_int(width) and width > 0 for width in hidden):
        raise _InvalidModelFile(f"bad hidden_layer_sizes {hidden!r}.")
    if input_shape is not None and math.prod(input_shape) != n_features:
        raise _InvalidModelFile(
            f"input_shape {input_shape} does not hold n_features_in="
            f"{n_features} values."
        )
    n_iter = _field(fitted, "n_iter", int)
    history = _decode_history(_field(fitted, "history", dict))

    try:
        estimator = SemiSupervisedAssociationClassifier(**params)
        # fit would validate the parameters; a loaded model is never fit, so
        # check them here, before predict trips over a malformed one.
        estimator._validate_params()
    except (TypeError, ValueError) as exc:
        raise _InvalidModelFile(
            f"its parameters do not fit this skassoc ({exc}); it was written "
            f"by skassoc {metadata.get('skassoc_version', '?')}."
        ) from None
    if "input_format" in fitted:
        input_format, network_shape = _decode_input_format(
            fitted["input_format"], input_shape
        )
    else:
        # Files written before the format was stored: it came from the
        # parameters saved beside it.
        try:
            input_format, network_shape = estimator._input_format(input_shape)
        except ValueError as exc:
            raise _InvalidModelFile(f"bad image_size ({exc}).") from None
    model = _build_model(
        network,
        network_shape,
        n_features,
        embedding_dim,
        hidden,
        classes,
        input_format,
    )
    _load_weights(model, weights)
    model.eval()
    model = place_model(model, device, images=input_shape is not None)

    estimator.model_ = model
    estimator.classes_ = classes
    estimator.input_shape_ = input_shape
    estimator.network_ = network
    estimator.embedding_dim_ = embedding_dim
    estimator.n_features_in_ = n_features
    if "feature_names_in" in fitted:
        names = _field(fitted, "feature_names_in", list)
        if len(names) != n_features or not all(isinstance(n, str) for n in names):
            raise _InvalidModelFile("feature_names_in does not match n_features_in.")
        # scikit-learn keeps feature names as an object array of str.
        estimator.feature_names_in_ = np.asarray(names, dtype=object)
    estimator.n_iter_ = n_iter
    estimator.history_ = history
    estimator.device_ = device
    return estimator


def _build_model(
    network, input_shape, n_features, embedding_dim, hidden, classes, input_format
):
    # Building a network draws random initial weights, which the saved ones
    # replace at once; fork the RNG so loading leaves the caller's torch
    # random stream as it was.
    try:
        with torch.random.fork_rng(devices=[]):
            embedder = build_network(
                network, input_shape, n_features, embedding_dim, tuple(hidden)
            )
            return AssociationModel(embedder, embedding_dim, len(classes), input_format)
    except (ValueError, RuntimeError, TypeError) as exc:
        # Metadata that passed the checks above but describes no buildable
        # network (e.g. an image smaller than the network needs).
        raise _InvalidModelFile(f"cannot rebuild its network: {exc}") from None


def _load_weights(model, weights):
    try:
        state = torch.load(io.BytesIO(weights), map_location="cpu", weights_only=True)
    except Exception as exc:  # any failure to read it means a bad file
        # weights_only refuses anything but tensors and plain containers;
        # its UnpicklingError (or a torn file's error) lands here.
        raise _InvalidModelFile(
            f"{WEIGHTS_MEMBER} is not a plain tensor state dict: "
            f"{type(exc).__name__}: {exc}"
        ) from None
    if not isinstance(state, dict) or not all(
        isinstance(key, str) and isinstance(value, torch.Tensor)
        for key, value in state.items()
    ):
        raise _InvalidModelFile(f"{WEIGHTS_MEMBER} is not a tensor state dict.")
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise _InvalidModelFile(
            f"its weights do not fit the network it describes: {exc}"
        ) from None


# ------------------------------------------------------ metadata checking


def _field(mapping, key, kind):
    value = mapping.get(key)
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if not ok:
        raise _InvalidModelFile(f"metadata field {key!r} is missing or malformed.")
    return value


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _positive_int(mapping, key):
    value = _field(mapping, key, int)
    if value < 1:
        raise _InvalidModelFile(f"metadata field {key!r} must be positive.")
    return value


def _decode_params(metadata):
    params = dict(_field(metadata, "params", dict))
    tuple_params = _field(metadata, "tuple_params", list)
    if not all(isinstance(name, str) for name in tuple_params):
        raise _InvalidModelFile(f"bad tuple_params {tuple_params!r}.")
    for name in tuple_params:
        if name in params and isinstance(params[name], list):
            params[name] = tuple(params[name])
    if not isinstance(params.get("network"), str):
        raise _InvalidModelFile("its network parameter is not a built-in name.")
    return params


def _decode_input_format(entry, input_shape):
    """The saved image format and the shape the network sees after it."""
    if entry is None:
        return None, input_shape
    if input_shape is None or not isinstance(entry, dict):
        raise _InvalidModelFile(f"bad input_format {entry!r}.")
    size = entry.get("size")
    channels = entry.get("channels")
    try:
        input_format = ImageFormat(size, channels)
    except (TypeError, ValueError) as exc:
        raise _InvalidModelFile(f"bad input_format ({exc}).") from None
    if channels is not None and input_shape[0] not in (1, 3):
        raise _InvalidModelFile(
            f"input_format converts to {channels} channels, but the images have "
            f"{input_shape[0]}."
        )
    return input_format, formatted_shape(input_shape, input_format.size, channels)


def _decode_shape(shape):
    if shape is None:
        return None
    if (
        not isinstance(shape, list)
        or len(shape) != 3
        or not all(_is_int(size) and size > 0 for size in shape)
    ):
        raise _InvalidModelFile(f"bad input_shape {shape!r}.")
    return tuple(shape)


def _decode_classes(entry):
    values = _field(entry, "values", list)
    try:
        dtype = np.dtype(_field(entry, "dtype", str))
    except TypeError as exc:
        raise _InvalidModelFile(f"bad classes dtype: {exc}") from None
    if dtype.kind not in _CLASS_KINDS or dtype.fields is not None:
        raise _InvalidModelFile(f"unsupported classes dtype {dtype}.")
    if len(values) < 2 or not all(
        _CLASS_VALUE_CHECKS[dtype.kind](value) for value in values
    ):
        raise _InvalidModelFile(f"bad classes values for dtype {dtype}.")
    try:
        classes = np.asarray(values, dtype=dtype)
    except (TypeError, ValueError, OverflowError) as exc:
        raise _InvalidModelFile(f"bad classes values: {exc}") from None
    # A too-short string dtype would silently truncate labels.
    if classes.tolist() != values:
        raise _InvalidModelFile(f"classes do not fit their dtype {dtype}.")
    return classes


def _decode_history(history):
    for key, values in history.items():
        if not isinstance(values, list) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in values
        ):
            raise _InvalidModelFile(f"bad history entry {key!r}.")
    return {key: list(values) for key, values in history.items()}
