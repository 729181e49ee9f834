"""Build the association model from a description: one builder for fit and load.

A :class:`ModelSpec` says which network to build for which inputs; ``fit``
resolves one from its parameters and the data, and ``load`` reads one from a
model file. :func:`build_model` turns it into an
:class:`~skassoc._nn._networks.AssociationModel` either way, so a loaded model is
the fitted one, built the same way.
"""

import copy
import math
from dataclasses import dataclass

import torch

from ._image_format import ImageFormat, format_settings, formatted_shape
from ._networks import NETWORKS, AssociationModel, MLPNet, build_network, place_model
from ._sparse import SparseMLPNet

__all__ = [
    "ModelSpec",
    "build_model",
    "spec_of_model",
    "check_custom_module",
    "probe_embedder",
]


@dataclass(frozen=True)
class ModelSpec:
    """What network to build, for which inputs.

    Attributes
    ----------
    network : str
        A built-in network's name, or ``"custom"`` for a user's module.
    input_shape : tuple of int or None
        ``(channels, height, width)`` of one input image; None for rows.
    n_features : int
        Values in one input sample.
    n_classes : int
        Outputs of the logit layer.
    embedding_dim : int
        Width of the embedding.
    hidden_layer_sizes : tuple of int
        Hidden layers of the MLP (empty for other networks).
    image_size : tuple of (int, int) or None
        Size the images are resized to in front of the network.
    image_channels : {1, 3} or None
        Channels the images are converted to in front of the network.
    """

    network: str
    input_shape: tuple | None
    n_features: int
    n_classes: int
    embedding_dim: int
    hidden_layer_sizes: tuple = ()
    image_size: tuple | None = None
    image_channels: int | None = None

    @property
    def network_shape(self):
        """The ``(channels, height, width)`` the network sees (None for rows)."""
        if self.input_shape is None:
            return None
        return formatted_shape(self.input_shape, self.image_size, self.image_channels)

    def input_format(self):
        """The conversion in front of the network, or None."""
        if self.image_size is None and self.image_channels is None:
            return None
        return ImageFormat(self.image_size, self.image_channels)


def build_model(spec, embedder=None):
    """An untrained model (on the CPU, or on torch's default device) for ``spec``.

    Parameters
    ----------
    spec : ModelSpec
        The network to build. For ``"custom"``, ``embedder`` is it.
    embedder : torch.nn.Module, default=None
        The user's module (already copied and checked), for ``"custom"``.

    Returns
    -------
    model : AssociationModel
    """
    if spec.network == "custom":
        if embedder is None:
            raise ValueError("A custom network needs its module.")
    else:
        embedder = build_network(
            spec.network,
            spec.network_shape,
            spec.n_features,
            spec.embedding_dim,
            tuple(spec.hidden_layer_sizes),
        )
    return AssociationModel(
        embedder, spec.embedding_dim, spec.n_classes, spec.input_format()
    )


def spec_of_model(model, network, input_shape, n_features):
    """The :class:`ModelSpec` of a built ``model`` (read from the model itself).

    The current parameters may describe another network (``set_params``
    after fit), so saving and warm starts read the architecture here.
    """
    image_size, image_channels = format_settings(model.input_format)
    embedder = model.embedder
    return ModelSpec(
        network=network,
        input_shape=input_shape,
        n_features=n_features,
        n_classes=model.logits.out_features,
        embedding_dim=model.logits.in_features,
        hidden_layer_sizes=(
            embedder.hidden_layer_sizes
            if isinstance(embedder, (MLPNet, SparseMLPNet))
            else ()
        ),
        image_size=image_size,
        image_channels=image_channels,
    )


def check_custom_module(module):
    """A private copy of a user's embedding module, after checks torch would not make.

    Raises
    ------
    ValueError
        If the module's parameters are on the meta device (not materialised)
        or of another floating type than float32.
    """
    tensors = list(module.parameters()) + list(module.buffers())
    if any(tensor.is_meta for tensor in tensors):
        raise ValueError(
            "The network's parameters are on the meta device (no values yet). "
            "Materialise them first, e.g. module.to_empty(device='cpu') and "
            "then initialise its weights."
        )
    dtypes = {t.dtype for t in tensors if t.is_floating_point()} - {torch.float32}
    if dtypes:
        raise ValueError(
            f"The network holds {sorted(map(str, dtypes))} parameters; skassoc "
            "trains in float32 (and bf16 under autocast). Pass module.float()."
        )
    return copy.deepcopy(module)


def probe_embedder(embedder, sample):
    """Run two samples through ``embedder``: its embedding width and activations.

    Parameters
    ----------
    embedder : torch.nn.Module
        On the device of ``sample``.
    sample : torch.Tensor
        Two formatted input samples.

    Returns
    -------
    embedding_dim : int
        Width of the embedding.
    activation_bytes : int
        Bytes of the intermediate outputs of one sample, to estimate a
        step's memory.

    Raises
    ------
    ValueError
        If the module fails on ``sample`` (a first layer of another width),
        or its output is not an ``(n, embedding_dim)`` float tensor with
        ``embedding_dim >= 1``.
    """
    total = [0]

    def count(module, inputs, output):
        if isinstance(output, torch.Tensor) and not list(module.children()):
            total[0] += output.numel() * output.element_size()

    hooks = [module.register_forward_hook(count) for module in embedder.modules()]
    was_training = embedder.training
    try:
        with torch.no_grad():
            embedder.eval()
            out = embedder(sample)
    except torch.OutOfMemoryError:
        raise
    except RuntimeError as exc:
        # Only a user's module fails here; torch names the layer's shapes
        # but not what the module was given.
        raise ValueError(
            f"The network cannot embed the training inputs, batches of shape "
            f"(n, {', '.join(map(str, sample.shape[1:]))}) as it receives "
            f"them: {exc}. Make its first layer take that shape (a Linear "
            f"that takes them flattened needs in_features="
            f"{math.prod(sample.shape[1:])}), or reshape X."
        ) from exc
    finally:
        embedder.train(was_training)
        for hook in hooks:
            hook.remove()
    n = sample.shape[0]
    if (
        not isinstance(out, torch.Tensor)
        or out.ndim != 2
        or out.shape[0] != n
        or out.shape[1] < 1
        or not out.is_floating_point()
    ):
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out)
        raise ValueError(
            "The network must map a batch of n inputs to an (n, embedding_dim) "
            f"float tensor with embedding_dim >= 1; for a batch of {n} it "
            f"returned {shape}. Add a flatten or linear layer at its end."
        )
    return int(out.shape[1]), math.ceil(total[0] / n)


def is_builtin(network):
    """Whether ``network`` names a built-in network."""
    return isinstance(network, str) and network in NETWORKS


def placed(model, device, spec):
    """``model`` on ``device`` in the memory layout its inputs want."""
    return place_model(model, device, images=spec.input_shape is not None)
