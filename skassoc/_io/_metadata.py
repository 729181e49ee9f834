"""The fields of ``metadata.json``: encoded from a fitted estimator, checked on load.

Encoding refuses what decoding would refuse, so that ``save`` never writes a
file that ``load`` cannot read; decoding takes nothing from a file without
checking it against its domain (see ``_limits``).
"""

import hashlib
import json
import math
import warnings
from numbers import Real

import numpy as np
import torch
from sklearn.utils._param_validation import (
    InvalidParameterError,
    validate_parameter_constraints,
)

from .._inputs import unlabeled_mask
from .._nn._model import ModelSpec
from .._nn._networks import NETWORKS
from .._params import NEVER_FROM_FILE, PARAMETER_CONSTRAINTS, SAFE_PARAMS
from .._prior import check_class_prior
from .._utils import is_integer, user_stacklevel
from .._version import __version__
from ._format import (
    FORMAT_NAME,
    FORMAT_VERSION,
    LEGACY_WEIGHTS_MEMBER,
    METADATA_MEMBER,
    TRAINING_STATE_MEMBER,
    WEIGHTS_MEMBER,
    InvalidModelFile,
)
from ._limits import (
    CLASS_DTYPES,
    CLASS_VALUE_CHECKS,
    MAX_FEATURES,
    MAX_LABEL_ARRAY_CHARS,
    MAX_LABEL_CHARS,
    MAX_LAYERS,
    MAX_STEPS,
    MAX_WIDTH,
    int_in,
    is_class_prior,
    one_of,
    sizes,
)

__all__ = [
    "OUTPUT_CONTAINERS",
    "encode_metadata",
    "encode_params",
    "metadata_bytes",
    "check_format",
    "check_checksum",
    "field",
    "decode_params",
    "decode_output_config",
    "decode_spec",
    "decode_classes",
    "decode_n_iter",
    "decode_feature_names",
    "decode_class_prior",
    "decode_history",
]

# The containers of set_output(transform=...) that a file may ask for.
OUTPUT_CONTAINERS = ("default", "pandas", "polars")
# Parameters stored as JSON lists that the estimator takes as tuples.
_TUPLE_PARAMS = ("input_shape", "image_size", "hidden_layer_sizes")


# ----------------------------------------------------------------- encoding


def encode_metadata(estimator, state, spec, params, weights):
    """The content of ``metadata.json`` for a fitted estimator.

    Parameters
    ----------
    estimator : SemiSupervisedAssociationClassifier
        The fitted estimator (for its output configuration).
    state : FittedState
        Its fitted state.
    spec : ModelSpec
        The description of its network.
    params : dict
        Its parameters, as :func:`encode_params` encodes them.
    weights : bytes
        The content of ``weights.safetensors``.

    Returns
    -------
    metadata : dict
    """
    names = state.feature_names_in
    return {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "skassoc_version": __version__,
        "torch_version": str(torch.__version__),
        "params": params,
        "output_config": _encode_output_config(estimator),
        "network": _encode_spec(spec),
        "classes": _encode_classes(state.classes),
        "class_prior": _encode_class_prior(state.class_prior, len(state.classes)),
        "feature_names_in": None if names is None else [str(n) for n in names],
        "n_iter": _encode_n_iter(state.n_iter),
        "history": {
            str(key): _to_json(list(values)) for key, values in state.history.items()
        },
        "weights_sha256": hashlib.sha256(weights).hexdigest(),
    }


def metadata_bytes(metadata):
    """``metadata`` as the bytes of ``metadata.json``."""
    # allow_nan: a loss history may hold NaN; Python's json reads it back.
    return json.dumps(metadata, indent=2, allow_nan=True).encode("utf-8")


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


def _encode_n_iter(n_iter):
    """The steps of the last fit; ValueError if load would refuse them."""
    if not 0 <= n_iter <= MAX_STEPS:
        raise ValueError(
            f"Cannot save a model fitted for n_iter_={n_iter} steps: a model "
            f"file records at most {MAX_STEPS} (load refuses more). Pickle the "
            "estimator instead (trusted files only)."
        )
    return int(n_iter)


def _encode_class_prior(class_prior, n_classes):
    """The fitted frequencies as a list; ValueError if load would refuse them."""
    encoded = [float(value) for value in np.ravel(class_prior)]
    if len(encoded) != n_classes or not is_class_prior(encoded):
        raise ValueError(
            f"Cannot save class_prior_={encoded[:10]}: a model file holds one "
            f"positive, finite frequency for each of the {n_classes} classes."
        )
    return encoded


def encode_params(params):
    """JSON-ready parameters (without those a file never sets)."""
    encoded = {}
    for name, value in params.items():
        if name in NEVER_FROM_FILE:
            continue
        domain = SAFE_PARAMS.get(name)
        if domain is None:
            # A subclass's own parameter: no domain says what load may accept.
            raise ValueError(
                f"Cannot save parameter {name}={value!r}: a model file holds "
                "only AssociativeClassifier's own parameters, each within the "
                "values load accepts, and this one has no such domain. Pickle "
                "the estimator instead (trusted files only)."
            )
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
        if not domain(encoded[name]):
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
    """The network's description, as JSON."""
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
    """``classes_`` as its dtype and values; ValueError if load would refuse them.

    Numbers and booleans are written little-endian, whatever the byte order
    of the labels fit was given (the values are the same). Strings keep the
    width that fit gave them (``np.unique`` of the labels), unless the
    array would exceed the limits: then the width of the longest label.
    """
    classes = np.asarray(classes)
    kind = classes.dtype.kind
    if classes.ndim != 1 or kind not in CLASS_VALUE_CHECKS:
        raise ValueError(_unsupported_classes(classes))
    if kind not in "UO":
        dtype = classes.dtype.newbyteorder("<")
        if dtype.str not in CLASS_DTYPES:
            raise ValueError(_unsupported_classes(classes))
        # .tolist() gives Python bools, ints, floats: exact in JSON (floats
        # are written with repr, which round-trips).
        return {"dtype": dtype.str, "values": classes.tolist()}
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
    if kind == "O":
        return {"dtype": classes.dtype.str, "values": values}
    width = classes.dtype.itemsize // 4
    if not _fits_label_array(len(values), width):
        width = max(len(longest), 1)
    if not _fits_label_array(len(values), width):
        raise ValueError(
            f"Cannot save {len(values)} string classes of up to {width} "
            f"characters: a model file holds string labels of at most "
            f"{MAX_LABEL_ARRAY_CHARS} characters in all (classes x the "
            "longest label; load refuses more, which bounds the memory of "
            "classes_). Map the labels to shorter ones, or to integers, "
            "before fitting."
        )
    return {"dtype": f"<U{width}", "values": values}


def _fits_label_array(n_classes, width):
    """Whether an array of ``n_classes`` strings of ``width`` is within limits."""
    return width <= MAX_LABEL_CHARS and n_classes * width <= MAX_LABEL_ARRAY_CHARS


def _unsupported_classes(classes):
    return (
        f"Cannot save classes_ of dtype {classes.dtype} "
        f"({classes[:5].tolist()!r}...): a model file stores labels as JSON, "
        "so they must be booleans, integers, floats or strings."
    )


# ----------------------------------------------------------------- decoding


def check_format(metadata, path, weights_member, has_training_state=False):
    """The file's format version, once its name, version and members agree."""
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
            f"skassoc ({__version__}) reads format versions up to "
            f"{FORMAT_VERSION}. Upgrade skassoc to load it."
        )
    expected = WEIGHTS_MEMBER if version == FORMAT_VERSION else LEGACY_WEIGHTS_MEMBER
    if weights_member != expected:
        raise InvalidModelFile(
            f"format version {version} keeps its weights in {expected}, not "
            f"{weights_member}."
        )
    if has_training_state and version != FORMAT_VERSION:
        raise InvalidModelFile(
            f"format version {version} holds no {TRAINING_STATE_MEMBER}."
        )
    return version


def decode_params(params):
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
    # The domains bound each value alone; fit's own constraints must hold too,
    # or the file would load and its refit fail.
    try:
        validate_parameter_constraints(
            PARAMETER_CONSTRAINTS, decoded, caller_name="the model file"
        )
    except InvalidParameterError as error:
        raise InvalidModelFile(str(error)) from None
    if ignored:
        warnings.warn(
            f"The model file sets {', '.join(ignored)}, which model files may "
            "not configure: compile stays off, device is load's argument, and "
            "devices, callbacks and resume_from are None. Set them with "
            "set_params if you trust them.",
            UserWarning,
            stacklevel=user_stacklevel(),
        )
    return decoded


def decode_output_config(config):
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


def check_checksum(metadata, data, member, key="weights_sha256"):
    """Refuse a member whose SHA-256 is not the one of the metadata.

    Parameters
    ----------
    metadata : dict
        The entry of ``metadata.json`` that holds the checksum.
    data : bytes
        The member's content.
    member : str
        Its name, for the message.
    key : str, default="weights_sha256"
        The checksum's field in ``metadata``.
    """
    expected = field(metadata, key, str)
    if hashlib.sha256(data).hexdigest() != expected:
        raise InvalidModelFile(
            f"the SHA-256 of {member} does not match the one in "
            f"{METADATA_MEMBER}; the file was corrupted or altered."
        )


def decode_spec(entry, n_classes):
    """The network's description, checked against the limits."""
    name = field(entry, "name", str)
    if name not in NETWORKS:
        raise InvalidModelFile(f"unknown network {name[:40]!r}.")
    shape = entry.get("input_shape")
    if not sizes(3, 3, allow_none=True)(shape):
        raise InvalidModelFile(f"bad input_shape {str(shape)[:60]}.")
    n_features = field(entry, "n_features", int)
    if not 1 <= n_features <= MAX_FEATURES:
        raise InvalidModelFile(f"n_features {n_features} is out of bounds.")
    if shape is not None and math.prod(shape) != n_features:
        raise InvalidModelFile(
            f"input_shape {shape} does not hold n_features={n_features} values."
        )
    hidden = entry.get("hidden_layer_sizes")
    image_size = entry.get("image_size")
    channels = entry.get("image_channels")
    checks = {
        "embedding_dim": int_in(1, MAX_WIDTH)(entry.get("embedding_dim")),
        "hidden_layer_sizes": sizes(0, MAX_LAYERS)(hidden),
        "image_size": sizes(2, 2, allow_none=True)(image_size),
        "image_channels": one_of(None, 1, 3)(channels),
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


def field(mapping, key, kind):
    """``mapping[key]``, refused unless of type ``kind``."""
    value = mapping.get(key)
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if not ok:
        raise InvalidModelFile(f"metadata field {key!r} is missing or malformed.")
    return value


def decode_classes(entry, n_classes=None):
    """``classes_``, refused unless its values fit a bounded dtype.

    Parameters
    ----------
    entry : dict
        The ``classes`` field: a dtype and a list of values.
    n_classes : int or None
        The width of the network's logit layer, as the weights' header
        declares it; the number of classes must match it before an array
        is built.

    Returns
    -------
    classes : ndarray
        Sorted, distinct labels, as ``np.unique`` gives them to ``fit``.
    """
    values = field(entry, "values", list)
    if not 2 <= len(values) <= MAX_WIDTH:
        raise InvalidModelFile(
            f"{len(values)} classes; a model file holds 2 to {MAX_WIDTH}."
        )
    if n_classes is not None and len(values) != n_classes:
        raise InvalidModelFile(
            f"its weights do not fit the network it describes: {len(values)} "
            f"classes, a logit layer of {str(n_classes)[:20]}."
        )
    dtype = _class_dtype(field(entry, "dtype", str), len(values))
    if not all(CLASS_VALUE_CHECKS[dtype.kind](value) for value in values):
        raise InvalidModelFile(f"bad classes values for dtype {dtype}.")
    try:
        classes = np.asarray(values, dtype=dtype)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidModelFile(f"bad classes values: {exc}") from None
    # A too-short string dtype would silently truncate labels.
    if classes.tolist() != values:
        raise InvalidModelFile(f"classes do not fit their dtype {dtype}.")
    # fit's labels are np.unique's: sorted and distinct (a warm start
    # matches new labels against them), never the unlabeled marker.
    unique = np.unique(classes)
    if len(unique) != len(classes) or not np.array_equal(unique, classes):
        raise InvalidModelFile(
            "classes are not sorted and distinct, as fit gives them."
        )
    if unlabeled_mask(classes).any():
        raise InvalidModelFile(
            "classes hold -1, which marks unlabeled samples and is never a class."
        )
    return classes


def _class_dtype(name, n_classes):
    """The dtype named ``name``, if one that save writes and within bounds."""
    if name.startswith("<U") and name[2:].isascii() and name[2:].isdigit():
        # Thousands of digits would be slow to read as a number.
        width = int(name[2:]) if len(name) <= 12 else MAX_LABEL_CHARS + 1
        if not 1 <= width <= MAX_LABEL_CHARS:
            raise InvalidModelFile(
                f"classes dtype {name[:20]} is not 1 to {MAX_LABEL_CHARS} "
                "characters wide, as labels are."
            )
        if not _fits_label_array(n_classes, width):
            raise InvalidModelFile(
                f"{n_classes} classes of dtype {name} exceed the "
                f"{MAX_LABEL_ARRAY_CHARS} characters that string labels may "
                "take in all."
            )
        return np.dtype(name)
    if name not in CLASS_DTYPES:
        raise InvalidModelFile(
            f"unsupported classes dtype {name[:20]!r} (save writes little-endian "
            "booleans, integers and floats, str and object)."
        )
    return np.dtype(name)


def decode_class_prior(metadata, n_classes):
    """The fitted class frequencies."""
    prior = field(metadata, "class_prior", list)
    if not is_class_prior(prior):
        raise InvalidModelFile("class_prior is malformed.")
    try:
        return check_class_prior(prior, n_classes)
    except ValueError as exc:
        raise InvalidModelFile(str(exc)) from None


def decode_n_iter(metadata):
    """The steps of the last fit: at most as many as a file may ask for."""
    n_iter = field(metadata, "n_iter", int)
    if not 0 <= n_iter <= MAX_STEPS:
        raise InvalidModelFile(
            f"n_iter {str(n_iter)[:20]} is outside 0 to {MAX_STEPS} steps."
        )
    return n_iter


def decode_feature_names(names, n_features):
    """``feature_names_in_``: one distinct string a feature, or None."""
    if names is None:
        return None
    if (
        not isinstance(names, list)
        or len(names) != n_features
        or not all(isinstance(name, str) for name in names)
    ):
        raise InvalidModelFile("feature_names_in does not match n_features.")
    if len(set(names)) != len(names):
        # fit refuses columns of one name: a column could not be told apart.
        raise InvalidModelFile("feature_names_in holds a name twice.")
    # scikit-learn keeps feature names as an object array of str.
    return np.asarray(names, dtype=object)


def decode_history(history):
    """The training history: lists of numbers."""
    for key, values in history.items():
        if not isinstance(values, list) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in values
        ):
            raise InvalidModelFile(f"bad history entry {key[:40]!r}.")
    return {key: list(values) for key, values in history.items()}
