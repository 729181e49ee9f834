"""The training-state member: a run's state in safetensors, read only once matched.

``training_state.safetensors`` holds the tensors of a
:class:`~skassoc._engine._state.TrainingState`, each under its group and
parameter name (``exp_avg/<name>``, ``exp_avg_sq/<name>``, ``average/<name>``
and ``weights/<name>``, ``class_mass``, ``rng/cpu``, ``rng/cuda``,
``sampler/generator`` and ``sampler/order``); its scalars and SHA-256 are
the ``training_state`` entry of ``metadata.json``. The entry says which
tensors the member must hold; every name, dtype and shape of its header is
matched against them (the parameters' of the network built on torch's meta
device, the classes', the fixed lengths of torch's generator states) before
any tensor is read, the one tensor of variable length (the sampler's order)
within a bound. Only then are the tensors read, and refused unless finite,
with non-negative second moments and class mass, generator states that
torch accepts, and an order of distinct row indices.
"""

import hashlib

import safetensors.torch
import torch

from .._engine._state import TrainingState
from ._format import TRAINING_STATE_MEMBER, InvalidModelFile
from ._limits import MAX_STEPS, MAX_TRAINING_ROWS, float_in, int_in
from ._metadata import check_checksum
from ._weights import (
    meta_model,
    mismatch_details,
    read_weights,
    safetensors_header,
    shortened,
)

__all__ = [
    "CPU_RNG_BYTES",
    "CUDA_RNG_BYTES",
    "encode_training_state",
    "check_training_state",
    "read_training_state",
]

#: Bytes of torch's CPU generator state (an mt19937 state and its
#: bookkeeping), the same for the global generator and a torch.Generator.
CPU_RNG_BYTES = len(torch.get_rng_state())
#: Bytes of a CUDA generator's state: Philox's seed and offset, two 64-bit
#: integers. Written down rather than asked of torch, which needs a GPU for
#: it: a file written on a GPU machine loads on one without.
CUDA_RNG_BYTES = 16
_RNG_BYTES = {"cpu": CPU_RNG_BYTES, "cuda": CUDA_RNG_BYTES}
# The tensors kept for every parameter: Adam's moments, then (with a moving
# average of the weights) the average and the trained weights.
_MOMENTS = ("exp_avg", "exp_avg_sq")
_AVERAGED = ("average", "weights")
_ENTRY_KEYS = frozenset(
    {
        "n_iter",
        "adam_step",
        "has_average",
        "has_class_mass",
        "rng",
        "sampler_position",
        "sha256",
    }
)


# ----------------------------------------------------------------- encoding


def encode_training_state(state, spec, n_iter):
    """The metadata entry and member bytes of ``state``.

    Parameters
    ----------
    state : TrainingState
        The estimator's ``training_state_``.
    spec : ModelSpec
        The description of its network.
    n_iter : int
        The estimator's ``n_iter_``, which the state's step must equal.

    Returns
    -------
    entry : dict
        The ``training_state`` entry of ``metadata.json``.
    data : bytes
        The content of ``training_state.safetensors``.

    Raises
    ------
    ValueError
        If :func:`check_training_state` or :func:`read_training_state`
        would refuse them: a file that load refuses is never written.
    """
    sampler = dict(state.sampler)
    tensors = _named_tensors(state, sampler)
    try:
        tensors = {k: t.detach().to("cpu").contiguous() for k, t in tensors.items()}
        data = safetensors.torch.save(tensors)
    except (AttributeError, TypeError, ValueError, RuntimeError) as exc:
        raise ValueError(_unsavable(f"its tensors cannot be stored: {exc}")) from None
    position = sampler.get("position")
    entry = {
        "n_iter": state.n_iter,
        "adam_step": float(state.adam_step),
        "has_average": state.average is not None,
        "has_class_mass": state.class_mass is not None,
        "rng": list(state.rng),
        "sampler_position": None if position is None else int(position),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    try:
        read_training_state(check_training_state(entry, data, spec, n_iter))
    except InvalidModelFile as exc:
        raise ValueError(_unsavable(str(exc))) from None
    return entry, data


def _named_tensors(state, sampler):
    """The tensors of ``state`` under their names in the member."""
    tensors = {}
    for group in _MOMENTS + _AVERAGED:
        for name, tensor in (getattr(state, group) or {}).items():
            tensors[f"{group}/{name}"] = tensor
    if state.class_mass is not None:
        tensors["class_mass"] = state.class_mass
    for device, rng in state.rng.items():
        tensors[f"rng/{device}"] = rng
    if sampler:
        tensors["sampler/generator"] = sampler.get("generator")
        tensors["sampler/order"] = sampler.get("order")
    return tensors


def _unsavable(reason):
    return (
        f"Cannot save the training state: {reason} (load would refuse the "
        "file). Save the model without it (training_state=False)."
    )


# ----------------------------------------------------------------- decoding


def check_training_state(entry, data, spec, n_iter):
    """Match the member against its metadata entry and the network; read nothing.

    Parameters
    ----------
    entry : dict or None
        The ``training_state`` entry of ``metadata.json``.
    data : bytes or None
        The content of ``training_state.safetensors``.
    spec : ModelSpec
        The network the file describes, already checked.
    n_iter : int
        The file's ``n_iter``, already checked.

    Returns
    -------
    checked : tuple or None
        What :func:`read_training_state` reads; None for a file without a
        training state.

    Raises
    ------
    InvalidModelFile
        If only one of the entry and the member is there, the checksum
        differs, a scalar is out of bounds, or the header's tensors are not
        exactly those the entry and the network call for.
    """
    if entry is None and data is None:
        return None
    if data is None:
        raise InvalidModelFile(
            f"metadata.json describes a training state but the archive has no "
            f"{TRAINING_STATE_MEMBER}."
        )
    if entry is None:
        raise InvalidModelFile(
            f"the archive holds {TRAINING_STATE_MEMBER} but metadata.json has "
            "no training_state entry."
        )
    if not isinstance(entry, dict):
        raise InvalidModelFile("the training_state entry is not a JSON object.")
    check_checksum(entry, data, TRAINING_STATE_MEMBER, key="sha256")
    scalars = _decode_scalars(entry, n_iter)
    present = safetensors_header(data, TRAINING_STATE_MEMBER)
    expected = _expected_tensors(spec, scalars, present)
    if present != expected:
        raise InvalidModelFile(_mismatch(expected, present))
    return scalars, present, data


def _decode_scalars(entry, n_iter):
    """The entry's scalars, each within its bounds."""
    if set(entry) != _ENTRY_KEYS:
        raise InvalidModelFile(
            f"bad training_state entry (keys {shortened(sorted(entry)[:8])}); it "
            f"has the keys {sorted(_ENTRY_KEYS)}."
        )
    rng = entry["rng"]
    checks = {
        "n_iter": int_in(1, MAX_STEPS)(entry["n_iter"]) and entry["n_iter"] == n_iter,
        "adam_step": float_in(1, MAX_STEPS)(entry["adam_step"]),
        "has_average": isinstance(entry["has_average"], bool),
        "has_class_mass": isinstance(entry["has_class_mass"], bool),
        "rng": isinstance(rng, list)
        and "cpu" in rng
        and all(isinstance(d, str) and d in _RNG_BYTES for d in rng)
        and len(set(rng)) == len(rng),
        "sampler_position": entry["sampler_position"] is None
        or int_in(0, MAX_TRAINING_ROWS)(entry["sampler_position"]),
    }
    bad = [key for key, ok in checks.items() if not ok]
    if bad:
        raise InvalidModelFile(
            f"bad training_state {', '.join(bad)} (steps from 1 to {MAX_STEPS}, "
            f"the file's n_iter {n_iter}; generator states of {list(_RNG_BYTES)}, "
            "cpu's included)."
        )
    return entry


def _expected_tensors(spec, scalars, present):
    """Name, shape and dtype of each tensor the member must hold."""
    try:
        parameters = {
            name: (tuple(p.shape), p.dtype)
            for name, p in meta_model(spec).named_parameters()
        }
    except (ValueError, RuntimeError, TypeError) as exc:
        raise InvalidModelFile(f"cannot rebuild its network: {exc}") from None
    groups = _MOMENTS + (_AVERAGED if scalars["has_average"] else ())
    expected = {
        f"{g}/{name}": entry for g in groups for name, entry in parameters.items()
    }
    if scalars["has_class_mass"]:
        expected["class_mass"] = ((spec.n_classes,), torch.float32)
    for device in scalars["rng"]:
        expected[f"rng/{device}"] = ((_RNG_BYTES[device],), torch.uint8)
    if scalars["sampler_position"] is not None:
        expected["sampler/generator"] = ((CPU_RNG_BYTES,), torch.uint8)
        expected["sampler/order"] = _order_entry(
            present.get("sampler/order"), scalars["sampler_position"]
        )
    return expected


def _order_entry(declared, position):
    """The sampler's order as declared, if a bounded int64 vector reaching
    ``position``: its length is the one size the network does not fix."""
    if declared is None:
        raise InvalidModelFile(
            f"its training state lacks sampler/order, which a sampler position "
            f"needs ({TRAINING_STATE_MEMBER})."
        )
    shape, dtype = declared
    if not (
        len(shape) == 1
        and dtype == torch.int64
        and position <= shape[0] <= MAX_TRAINING_ROWS
    ):
        raise InvalidModelFile(
            f"its sampler/order is {shortened(shape)} {str(dtype)[:20]}; it is an "
            f"int64 vector of at most {MAX_TRAINING_ROWS} rows, at least its "
            f"position {position}."
        )
    return declared


def _mismatch(expected, present):
    return (
        f"its training state ({TRAINING_STATE_MEMBER}) does not fit the network "
        "it describes: " + mismatch_details(expected, present)
    )


def read_training_state(checked):
    """The :class:`TrainingState` that :func:`check_training_state` matched.

    Returns None for a file without one. Raises InvalidModelFile if a tensor
    holds values a run cannot continue from.
    """
    if checked is None:
        return None
    scalars, present, data = checked
    tensors = read_weights(data, present, TRAINING_STATE_MEMBER)
    _check_values(tensors, scalars)

    def group(name):
        prefix = f"{name}/"
        return {k[len(prefix) :]: t for k, t in tensors.items() if k.startswith(prefix)}

    sampler = {}
    if scalars["sampler_position"] is not None:
        sampler = {
            "generator": tensors["sampler/generator"],
            "order": tensors["sampler/order"],
            "position": scalars["sampler_position"],
        }
    averaged = scalars["has_average"]
    return TrainingState(
        n_iter=scalars["n_iter"],
        adam_step=float(scalars["adam_step"]),
        exp_avg=group("exp_avg"),
        exp_avg_sq=group("exp_avg_sq"),
        average=group("average") if averaged else None,
        weights=group("weights") if averaged else None,
        class_mass=tensors.get("class_mass"),
        rng={device: tensors[f"rng/{device}"] for device in scalars["rng"]},
        sampler=sampler,
    )


def _check_values(tensors, scalars):
    """Refuse values that a run cannot continue from (all are finite by now)."""
    for key, tensor in tensors.items():
        nonnegative = key.startswith("exp_avg_sq/") or key == "class_mass"
        if nonnegative and (tensor < 0).any():
            # Adam divides by the root of its second moment.
            raise InvalidModelFile(f"training state {key[:60]!r} is negative.")
    for key in ("rng/cpu", "sampler/generator"):
        if key in tensors:
            _check_cpu_generator(key, tensors[key])
    order = tensors.get("sampler/order")
    if order is not None and len(order):
        # The shuffled pool: distinct row indices, as the sampler deals them.
        in_bounds = bool(order.min() >= 0) and bool(order.max() < MAX_TRAINING_ROWS)
        if not in_bounds or len(torch.unique(order)) != len(order):
            raise InvalidModelFile(
                f"training state sampler/order is not distinct row indices from "
                f"0 to {MAX_TRAINING_ROWS}."
            )


def _check_cpu_generator(key, state):
    """Refuse what torch would refuse as a CPU generator's state, on a
    generator of its own (the process's streams are left alone)."""
    try:
        torch.Generator(device="cpu").set_state(state)
    except (RuntimeError, ValueError, TypeError) as exc:
        raise InvalidModelFile(
            f"training state {key} is not a CPU generator state: {exc}"
        ) from None
