"""The weights member: a network's tensors in safetensors, read only once matched.

The header of ``weights.safetensors`` (names, dtypes, shapes) is parsed on
its own and matched against the network built on torch's meta device, which
allocates nothing; only then are the tensors read, and refused unless
finite.
"""

import json
import math
import struct

import safetensors.torch
import torch

from .._nn._model import build_model
from .._utils import is_integer
from ._format import WEIGHTS_MEMBER, InvalidModelFile
from ._limits import MAX_DEFAULTED_VALUES, MAX_HEADER_BYTES

__all__ = [
    "weights_bytes",
    "meta_model",
    "expected_weights",
    "safetensors_header",
    "check_weights_fit",
    "logit_width",
    "read_weights",
    "build_loaded",
    "shortened",
]

# The dtypes of built-in networks' weights and of training states (uint8:
# torch's generator states), as safetensors names them.
_SAFETENSORS_DTYPES = {"F32": torch.float32, "I64": torch.int64, "U8": torch.uint8}
# How many items of a long shape or list a message quotes.
_QUOTED_ITEMS = 8


def weights_bytes(model):
    """The ``state_dict`` of ``model`` as a safetensors buffer."""
    # Contiguous CPU copies: a model trained on a GPU is channels-last there,
    # and the file must not depend on where or how it was trained.
    state = {
        name: tensor.detach().to("cpu").contiguous()
        for name, tensor in model.state_dict().items()
    }
    return safetensors.torch.save(state)


def meta_model(spec):
    """``spec``'s model on torch's meta device: shapes only, no memory.

    Initialising meta tensors draws no random numbers, so no generator is
    touched (a fit in another thread keeps its stream).
    """
    with torch.device("meta"):
        return build_model(spec)


def expected_weights(spec):
    """Name, shape and dtype of each tensor of ``spec``'s ``state_dict``."""
    try:
        skeleton = meta_model(spec)
    except (ValueError, RuntimeError, TypeError) as exc:
        # A description that passed the checks but builds no network (e.g.
        # an image smaller than the network needs).
        raise InvalidModelFile(f"cannot rebuild its network: {exc}") from None
    return {key: (tuple(t.shape), t.dtype) for key, t in skeleton.state_dict().items()}


def read_weights(weights, present, member=WEIGHTS_MEMBER):
    """The weights as a dict of CPU tensors, refused unless finite.

    ``present`` is what the safetensors header declares, already matched
    against the network: no tensor is read, copied or checked before its
    shape and dtype are known to be the network's. ``member`` names the
    buffer in messages (the training state is read the same way).
    """
    try:
        state = safetensors.torch.load(weights)
    except Exception as exc:  # any failure to read it means a bad file
        # SafetensorError: offsets outside the buffer, gaps, overlaps, a
        # torn file.
        raise InvalidModelFile(
            f"{member} is not a valid safetensors buffer: "
            f"{type(exc).__name__}: {str(exc)[:200]}"
        ) from None
    if {key: (tuple(t.shape), t.dtype) for key, t in state.items()} != present:
        raise InvalidModelFile(f"{member} holds other tensors than its header.")
    what = "weight" if member == WEIGHTS_MEMBER else f"{member} tensor"
    for key, tensor in state.items():
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise InvalidModelFile(f"{what} {key[:60]!r} holds NaN or infinity.")
    return state


def safetensors_header(weights, member=WEIGHTS_MEMBER):
    """Name, shape and dtype of each tensor that the safetensors header declares.

    ``member`` names the buffer in messages.
    """
    if len(weights) < 8:
        raise InvalidModelFile(f"{member} is too short for a header.")
    (size,) = struct.unpack("<Q", weights[:8])
    if size > min(MAX_HEADER_BYTES, len(weights) - 8):
        raise InvalidModelFile(
            f"{member} declares a header of {size} bytes; it holds at "
            f"most {MAX_HEADER_BYTES}, within the member."
        )
    try:
        header = json.loads(weights[8 : 8 + size], object_pairs_hook=_unique_keys)
    except (ValueError, RecursionError) as exc:
        raise InvalidModelFile(
            f"the header of {member} is not valid JSON: {exc}"
        ) from None
    if not isinstance(header, dict):
        raise InvalidModelFile(f"the header of {member} is not a JSON object.")
    present = {}
    for key, entry in header.items():
        if key == "__metadata__":
            # safetensors' free-form strings, which save never writes.
            raise InvalidModelFile(f"{member} holds a __metadata__ entry.")
        shape = entry.get("shape") if isinstance(entry, dict) else None
        dtype = entry.get("dtype") if isinstance(entry, dict) else None
        if not (
            isinstance(shape, list)
            and all(is_integer(size) and size >= 0 for size in shape)
            and isinstance(dtype, str)
        ):
            raise InvalidModelFile(f"bad header entry {key[:60]!r} in {member}.")
        # Other dtypes stay names, which no network's tensor matches.
        present[key] = (tuple(shape), _SAFETENSORS_DTYPES.get(dtype, dtype[:10]))
    return present


def logit_width(present):
    """The classes of the network that the header ``present`` describes.

    Every built-in network ends in the linear layer ``logits``; None if
    the header declares no one-dimensional ``logits.bias`` (the weights
    are then refused as not fitting the network).
    """
    shape = present.get("logits.bias", ((),))[0]
    return shape[0] if len(shape) == 1 else None


def _unique_keys(pairs):
    # Two entries of one name: this parser and safetensors' might keep
    # different ones, and the one checked would not be the one read.
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError("a name appears twice")
    return dict(pairs)


def build_loaded(spec, state_dict):
    """``spec``'s model with the checked weights of the file."""
    try:
        with torch.random.fork_rng(devices=[]):
            model = build_model(spec)
        model.load_state_dict(state_dict, strict=True)
    except (ValueError, RuntimeError, TypeError) as exc:
        # A small tensor missing that the network cannot fill.
        raise InvalidModelFile(f"cannot rebuild its network: {exc}") from None
    return model.eval()


def check_weights_fit(expected, present):
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
    return "its weights do not fit the network it describes: " + mismatch_details(
        expected, present
    )


def mismatch_details(expected, present):
    """What differs between two ``{name: (shape, dtype)}`` tables, for a message:
    the first names missing or unexpected and the first that differs."""
    missing = sorted(set(expected) - set(present))
    extra = sorted(set(present) - set(expected))
    differ = sorted(
        key for key in set(expected) & set(present) if expected[key] != present[key]
    )
    details = []
    if missing:
        details.append(f"missing {shortened(missing[:3])}")
    if extra:
        details.append(f"unexpected {shortened(extra[:3])}")
    if differ:
        key = differ[0]
        details.append(
            f"{key[:60]} is {shortened(present[key][0])} {present[key][1]}, the "
            f"network needs {expected[key][0]} {expected[key][1]}"
        )
    return "; ".join(details)


def shortened(value, limit=80):
    """``repr(value)``, cut to about ``limit`` characters for a message.

    A file's shapes and names may be of any length; a message quotes only
    their beginning (and converts only the first items of a long list to
    text, which takes long for huge integers).
    """
    if isinstance(value, (tuple, list)) and len(value) > _QUOTED_ITEMS:
        text = repr(value[:_QUOTED_ITEMS])
        text = f"{text[:-1]}, ...{text[-1]}"
    else:
        text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
