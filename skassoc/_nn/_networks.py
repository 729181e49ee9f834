"""Embedding networks of the paper, a small-image network, an MLP, and the head.

(The 1-D network for signals is in ``_signal`` and registered here.)

Every embedding network maps *raw* inputs (pixel values on any scale, or
features as the user passed them) to an embedding and owns its input
normalisation, so callers never pre-process: ``fit_normalization`` learns it
from the training inputs and stores it as buffers (so ``state_dict`` carries
it). :class:`AssociationModel` puts the paper's linear logit layer on top of
any embedding network.
"""

import math
from typing import NamedTuple

import torch
from torch import nn

from .._inputs import as_tensor
from .._utils import varies
from ._init import mlp_layers, xavier_init_
from ._signal import SignalNet
from ._sparse import SparseMLPNet

__all__ = [
    "MNISTNet",
    "SVHNNet",
    "STL10Net",
    "SmallImageNet",
    "MLPNet",
    "SignalNet",
    "SparseMLPNet",
    "InputScale",
    "AssociationModel",
    "build_network",
    "network_class",
    "place_model",
    "NETWORKS",
]


#: Every convolution is 3x3 with "SAME" padding, as in the authors'
#: TensorFlow code (stride 1 keeps the image size).
KERNEL_SIZE = 3


class Conv(NamedTuple):
    """A convolution of a layer plan: ``channels`` outputs, 3x3, padding 1."""

    channels: int
    stride: int = 1


class Pool(NamedTuple):
    """A max-pool of a layer plan (the default: 2x2, halving the image)."""

    kernel: int = 2
    stride: int = 2
    padding: int = 0


def _conv(in_channels, out_channels, stride=1):
    return nn.Conv2d(
        in_channels, out_channels, KERNEL_SIZE, stride=stride, padding=KERNEL_SIZE // 2
    )


def _pooled_blocks(blocks):
    """The plan of ``(n_convs, channels)`` blocks, each closed by a 2x2 max-pool."""
    plan = []
    for n_convs, channels in blocks:
        plan += [Conv(channels)] * n_convs + [Pool()]
    return tuple(plan)


def _build_layers(in_channels, plan, batch_norm=False):
    """The modules of a layer plan: ELU after every convolution, batch norm
    between them with ``batch_norm``."""
    layers = []
    for layer in plan:
        if isinstance(layer, Pool):
            layers.append(nn.MaxPool2d(layer.kernel, layer.stride, layer.padding))
            continue
        layers.append(_conv(in_channels, layer.channels, layer.stride))
        if batch_norm:
            layers.append(nn.BatchNorm2d(layer.channels))
        layers.append(nn.ELU())
        in_channels = layer.channels
    return nn.Sequential(*layers)


def _plan_cost(plan, channels, height, width):
    """Multiply-adds of one image through a layer plan's convolutions, and
    the ``(channels, height, width)`` it comes out as.

    The sizes follow torch's rule for a window of ``k`` pixels, stride ``s``
    and padding ``p``: ``(size + 2 p - k) // s + 1``. The constructors size
    their linear layer by the same walk, so the cost and the network agree.
    """
    macs = 0
    for layer in plan:
        if isinstance(layer, Pool):
            kernel, stride, padding = layer.kernel, layer.stride, layer.padding
        else:
            kernel, stride, padding = KERNEL_SIZE, layer.stride, KERNEL_SIZE // 2
        height, width = (
            (size + 2 * padding - kernel) // stride + 1 for size in (height, width)
        )
        if isinstance(layer, Conv):
            macs += KERNEL_SIZE**2 * channels * layer.channels * height * width
            channels = layer.channels
    return macs, (channels, height, width)


def _chunks(x, input_format, values_per_chunk=2**18):
    """Rows of ``x`` as float64 ``(rows, values)`` tensors, a few MiB at a time.

    A memory-mapped ``x`` is read chunk by chunk, never loaded whole;
    ``input_format`` (e.g. an :class:`~skassoc._nn._image_format.ImageFormat`) is
    applied to each chunk first.
    """
    n = x.shape[0]
    chunk_size = max(1, values_per_chunk // max(1, math.prod(x.shape[1:])))
    for start in range(0, n, chunk_size):
        chunk = as_tensor(x[start : start + chunk_size])
        if input_format is not None:
            chunk = input_format(chunk.float())
        yield chunk.flatten(1).double()


#: Encodings of pixel values that :func:`pixel_range` recognises.
USUAL_PIXEL_RANGES = ((0.0, 1.0), (-1.0, 1.0), (0.0, 255.0))


def pixel_range(x, input_format=None):
    """The range of pixel values of images ``x``, snapped to a usual encoding.

    The data's minimum and maximum, except that data that lie inside a
    usual encoding and span more than half of it get that encoding's whole
    range: ``(0, 1)``, ``(-1, 1)`` or 8-bit ``(0, 255)``. So a set of dark
    images is not stretched, and 8-bit images map exactly as the paper's
    networks expect. Any other data (0..16 counts, 16-bit pixels,
    standardised values) keeps its own minimum and maximum. Read in chunks
    (see :func:`_chunks`).
    """
    low, high = math.inf, -math.inf
    for rows in _chunks(x, input_format):
        if rows.numel():
            low = min(low, float(rows.min()))
            high = max(high, float(rows.max()))
    if not math.isfinite(low) or not math.isfinite(high):
        raise ValueError("Cannot learn the pixel range of empty or non-finite images.")
    for lo, hi in USUAL_PIXEL_RANGES:
        if lo <= low and high <= hi and high - low > (hi - lo) / 2:
            return lo, hi
    return low, high


class InputScale(nn.Module):
    """``(x - offset) / scale`` with scalar ``offset`` and ``scale`` buffers.

    An image network computes ``(x - reference_offset) / reference_scale`` on
    8-bit pixels (0..255), as in the paper. :meth:`fit` maps another pixel
    range onto 0..255 first, folded into the same two numbers, so the
    network sees the same values whatever the scale of its inputs: the pixel
    range ``(low, high)`` gives ``offset = low + (high - low) *
    reference_offset / 255`` and ``scale = (high - low) * reference_scale /
    255``. For 8-bit data these are exactly the reference numbers, so the
    paper's networks compute bit for bit what they computed before
    (``(x - 0) / 255`` is ``x / 255``).

    The buffers start at the reference numbers; a ``state_dict`` without
    them (saved before the scale was learned) loads as 8-bit data.

    Parameters
    ----------
    reference_offset, reference_scale : float
        The network's normalisation of 8-bit pixels.
    """

    def __init__(self, reference_offset, reference_scale):
        super().__init__()
        self.reference_offset = float(reference_offset)
        self.reference_scale = float(reference_scale)
        self.register_buffer("offset", torch.tensor(self.reference_offset))
        self.register_buffer("scale", torch.tensor(self.reference_scale))

    @torch.no_grad()
    def fit(self, x, input_format=None):
        """Learn the pixel range of training images ``x`` (see :func:`pixel_range`)."""
        low, high = pixel_range(x, input_format)
        span = high - low
        if span <= 0:
            # Constant images: only subtract the value.
            span = 255.0
        self.offset.fill_(low + span * self.reference_offset / 255.0)
        self.scale.fill_(span * self.reference_scale / 255.0)
        return self

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # Models saved before the input scale existed were trained on the
        # reference normalisation: keep it for them.
        reference = {"offset": self.reference_offset, "scale": self.reference_scale}
        for name, value in reference.items():
            state_dict.setdefault(prefix + name, torch.tensor(value))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, x):
        return (x - self.offset) / self.scale

    def extra_repr(self):
        return f"offset={float(self.offset):g}, scale={float(self.scale):g}"


class _ImageNet(nn.Module):
    """A convolutional embedding network built from its layer plan.

    Subclasses set ``layers`` (a plan of :class:`Conv` and :class:`Pool`
    layers, read by both the constructor and :meth:`forward_macs`, so the
    cost cannot drift from the architecture), ``batch_norm``,
    ``embedding_elu`` (an ELU after the embedding layer), ``min_size`` (the
    smallest image side) and ``reference_offset`` and ``reference_scale``:
    their normalisation ``(x - reference_offset) / reference_scale`` of 8-bit
    pixels.
    """

    layers = ()
    batch_norm = False
    embedding_elu = True
    min_size = 8
    reference_offset = 0.0
    reference_scale = 255.0
    #: Takes ``(channels, height, width)`` images, never feature rows.
    image_input = True
    #: Whether ``hidden_layer_sizes`` shapes it.
    takes_hidden_layer_sizes = False
    #: Its CPU work runs at the convolutions' rate (see ``_defaults``).
    cpu_rate = "conv"

    def _build(self, input_shape, embedding_dim):
        """Build the input scale, the plan's layers and the embedding layer."""
        self._check_shape(input_shape, self.min_size)
        self.input_scale = InputScale(self.reference_offset, self.reference_scale)
        self.features = _build_layers(input_shape[0], self.layers, self.batch_norm)
        _, out_shape = _plan_cost(self.layers, *input_shape)
        embedding = [nn.Flatten(), nn.Linear(math.prod(out_shape), embedding_dim)]
        if self.embedding_elu:
            embedding.append(nn.ELU())
        self.embedding = nn.Sequential(*embedding)
        xavier_init_(self)

    @classmethod
    def from_inputs(cls, input_shape, n_features, embedding_dim, hidden_layer_sizes):
        """The network for images of ``input_shape`` (the other sizes unused).

        ``n_features`` and ``hidden_layer_sizes`` are there for the
        registry's common signature (see ``NETWORKS``).
        """
        return cls(tuple(input_shape), embedding_dim)

    @classmethod
    def forward_macs(cls, input_shape, n_features, embedding_dim, hidden_layer_sizes):
        """Multiply-adds of one image's forward pass, from the layer plan.

        The convolutions' and the embedding layer's, which dominate the time
        (biases, activations, pools and batch norms are left out). Arguments
        as for :meth:`from_inputs`.
        """
        macs, out_shape = _plan_cost(cls.layers, *input_shape)
        return macs + math.prod(out_shape) * embedding_dim

    @torch.no_grad()
    def fit_normalization(self, x, input_format=None):
        """Learn the scale of the pixel values from training images ``x``.

        Parameters
        ----------
        x : array or tensor of shape (n, c, h, w)
            Training images, read a few MiB at a time, so a memory-mapped
            ``x`` is never loaded whole.
        input_format : torch.nn.Module, default=None
            Conversion applied to the images before the network sees them;
            the range is that of its output.
        """
        self.input_scale.fit(x, input_format)
        return self

    def _check_shape(self, input_shape, min_size):
        if len(input_shape) != 3:
            raise ValueError(
                f"{type(self).__name__} needs input_shape (channels, height, "
                f"width); got {tuple(input_shape)}."
            )
        if min(input_shape[1:]) < min_size:
            raise ValueError(
                f"{type(self).__name__} needs images of at least {min_size}x"
                f"{min_size} pixels; got {input_shape[1]}x{input_shape[2]}. "
                "Use network='mlp' or a custom module for smaller inputs."
            )


class MNISTNet(_ImageNet):
    """The paper's MNIST embedding network.

    ``x / 255`` (for 8-bit pixels; other pixel ranges are mapped onto 0..1 by
    the scale that :meth:`fit_normalization` learns) -> C32 C32 P C64 C64 P
    C128 C128 P -> FC(embedding_dim), ELU everywhere (the embedding included),
    no batch norm, no dropout.

    Parameters
    ----------
    input_shape : tuple of int, default=(1, 28, 28)
        ``(channels, height, width)`` of one raw image.
    embedding_dim : int, default=128
        Width of the embedding.
    """

    default_l2_scale = 1e-3
    layers = _pooled_blocks([(2, 32), (2, 64), (2, 128)])

    def __init__(self, input_shape=(1, 28, 28), embedding_dim=128):
        super().__init__()
        self._build(input_shape, embedding_dim)

    def forward(self, x):
        return self.embedding(self.features(self.input_scale(x)))


class SVHNNet(_ImageNet):
    """The paper's SVHN (and domain adaptation) embedding network.

    Per-image, per-channel standardisation (of pixels brought to the 0..255
    range by the scale that :meth:`fit_normalization` learns, so that its
    ``1e-5`` means the same at any scale) -> 3x C32, P, 3x C64, P, 3x C128,
    P -> FC(embedding_dim), ELU everywhere.

    Parameters
    ----------
    input_shape : tuple of int, default=(3, 32, 32)
        ``(channels, height, width)`` of one raw image.
    embedding_dim : int, default=128
        Width of the embedding.

    Notes
    -----
    The authors' code divides by the variance plus ``1e-5``; this network
    divides by the standard deviation, the scale-invariant version.
    """

    default_l2_scale = 1e-4
    reference_scale = 1.0
    layers = _pooled_blocks([(3, 32), (3, 64), (3, 128)])

    def __init__(self, input_shape=(3, 32, 32), embedding_dim=128):
        super().__init__()
        self._build(input_shape, embedding_dim)

    def forward(self, x):
        x = self.input_scale(x)
        mean = x.mean(dim=(2, 3), keepdim=True)
        std = x.std(dim=(2, 3), keepdim=True)
        return self.embedding(self.features((x - mean) / (std + 1e-5)))


class STL10Net(_ImageNet):
    """The paper's STL-10 embedding network.

    ``(x - 128) / 128`` (for 8-bit pixels; other ranges are mapped alike by
    the scale that :meth:`fit_normalization` learns) -> C32, C64/2, maxpool
    3x3/2, C64, C128, P, C128, C256, P, C128 (batch norm and ELU after every
    convolution) -> linear FC(embedding_dim).

    Parameters
    ----------
    input_shape : tuple of int, default=(3, 96, 96)
        ``(channels, height, width)`` of one raw image.
    embedding_dim : int, default=128
        Width of the embedding.
    """

    default_l2_scale = 5e-3
    reference_offset = 128.0
    reference_scale = 128.0
    min_size = 32
    batch_norm = True
    embedding_elu = False
    layers = (
        Conv(32),
        Conv(64, stride=2),
        Pool(3, 2, padding=1),
        Conv(64),
        Conv(128),
        Pool(),
        Conv(128),
        Conv(256),
        Pool(),
        Conv(128),
    )

    def __init__(self, input_shape=(3, 96, 96), embedding_dim=128):
        super().__init__()
        self._build(input_shape, embedding_dim)

    def forward(self, x):
        return self.embedding(self.features(self.input_scale(x)))


class SmallImageNet(_ImageNet):
    """A convolutional embedding network for small images (8x8 to 27x27).

    Pixels mapped onto 0..1 (``x / 255`` for 8-bit pixels; the scale is
    learned by :meth:`fit_normalization`) -> C32 C32 P C64 C64 P C128 ->
    FC(embedding_dim), ELU everywhere, Xavier initialisation, no batch norm.

    The paper's MNIST network pools three times, which leaves a single pixel
    of an 8x8 image (and 2x2 of 16x16); this one pools twice, so an 8x8
    image keeps 2x2 positions and a 16x16 one 4x4, and its layers cost a
    fraction of the MNIST network's on such images.

    Parameters
    ----------
    input_shape : tuple of int, default=(1, 16, 16)
        ``(channels, height, width)`` of one raw image, at least 4x4.
    embedding_dim : int, default=128
        Width of the embedding.
    """

    default_l2_scale = 1e-3
    min_size = 4
    layers = (*_pooled_blocks([(2, 32), (2, 64)]), Conv(128))

    def __init__(self, input_shape=(1, 16, 16), embedding_dim=128):
        super().__init__()
        self._build(input_shape, embedding_dim)

    def forward(self, x):
        return self.embedding(self.features(self.input_scale(x)))


class MLPNet(nn.Module):
    """A fully connected embedding network for plain feature vectors.

    Standardises its input with a mean and scale stored as buffers (set them
    with :meth:`fit_normalization` on the training data), softly bounds the
    standardised values to about ``input_clip`` (see Notes), then applies
    ELU layers; the last one is the embedding.

    Parameters
    ----------
    n_features : int
        Number of input features.
    hidden_layer_sizes : tuple of int, default=(256, 256)
        Widths of the hidden layers before the embedding layer.
    embedding_dim : int, default=128
        Width of the embedding.
    input_clip : float or None, default=3.0
        Standardised values ``z`` become ``input_clip * tanh(z / input_clip)``:
        unchanged near 0, never beyond ``input_clip``. None leaves them
        unbounded.

    Notes
    -----
    A rare feature that is nearly constant (a border pixel of a digit that
    ink reaches once in a hundred images) has a tiny standard deviation, so
    its rare values standardise to tens of standard deviations and dominate
    the first layer. Bounding them keeps the feature's order and its sign
    but not its outsized weight.
    """

    default_l2_scale = 1e-4
    #: Takes feature rows (or images, flattened).
    takes_hidden_layer_sizes = True
    image_input = False
    #: Its CPU work runs at the dense layers' rate (see ``_defaults``).
    cpu_rate = "dense"

    def __init__(
        self,
        n_features,
        hidden_layer_sizes=(256, 256),
        embedding_dim=128,
        input_clip=3.0,
    ):
        super().__init__()
        layers = []
        for width_in, width_out in mlp_layers(
            n_features, hidden_layer_sizes, embedding_dim
        ):
            layers += [nn.Linear(width_in, width_out), nn.ELU()]
        self.layers = nn.Sequential(*layers)
        self.input_clip = None if input_clip is None else float(input_clip)
        if self.input_clip is not None and not self.input_clip > 0:
            raise ValueError(f"input_clip must be > 0 or None; got {input_clip!r}.")
        self.register_buffer("mean", torch.zeros(n_features))
        self.register_buffer("scale", torch.ones(n_features))
        # A buffer too, so that a saved model keeps its bound (0: none).
        self.register_buffer("clip", torch.tensor(self.input_clip or 0.0))
        xavier_init_(self)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # Models saved before the bound existed had none.
        clip = state_dict.setdefault(prefix + "clip", torch.tensor(0.0))
        value = float(clip)
        self.input_clip = value if value > 0 else None
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    @classmethod
    def from_inputs(cls, input_shape, n_features, embedding_dim, hidden_layer_sizes):
        """The network for rows of ``n_features`` values, or flattened images.

        Parameters
        ----------
        input_shape : tuple of int or None
            ``(channels, height, width)`` of the images the network sees
            (after any resize or colour conversion), whose pixels are its
            features; None for feature rows.
        n_features : int
            Values in one row (used when ``input_shape`` is None).
        embedding_dim : int
            Width of the embedding.
        hidden_layer_sizes : tuple of int
            Widths of the hidden layers.
        """
        n_inputs = n_features if input_shape is None else math.prod(input_shape)
        return cls(n_inputs, tuple(hidden_layer_sizes), embedding_dim)

    @classmethod
    def forward_macs(cls, input_shape, n_features, embedding_dim, hidden_layer_sizes):
        """Multiply-adds of one sample's forward pass (its linear layers').

        Arguments as for :meth:`from_inputs`.
        """
        n_inputs = n_features if input_shape is None else math.prod(input_shape)
        layers = mlp_layers(n_inputs, hidden_layer_sizes, embedding_dim)
        return sum(width_in * width_out for width_in, width_out in layers)

    @property
    def hidden_layer_sizes(self):
        """Widths of the hidden layers, as built (the last Linear is the embedding)."""
        widths = [
            layer.out_features for layer in self.layers if isinstance(layer, nn.Linear)
        ]
        return tuple(widths[:-1])

    @torch.no_grad()
    def fit_normalization(self, x, input_format=None):
        """Learn the standardisation from training inputs ``x``.

        Parameters
        ----------
        x : array or tensor of shape (n, ...)
            Training inputs, read a few MiB at a time in float64, so a
            memory-mapped ``x`` is never loaded whole.
        input_format : torch.nn.Module, default=None
            Conversion applied to the inputs before the network sees them
            (e.g. an :class:`~skassoc._nn._image_format.ImageFormat`); the
            statistics are those of its output.
        """
        n = x.shape[0]
        total = torch.zeros(self.mean.shape, dtype=torch.float64)
        for rows in _chunks(x, input_format):
            total += rows.sum(dim=0)
        mean = total / n
        # A second pass around the mean: exact, unlike sum(x**2) - n mean**2.
        squares = torch.zeros_like(total)
        for rows in _chunks(x, input_format):
            squares += ((rows - mean) ** 2).sum(dim=0)
        self.mean.copy_(mean)
        std = (squares / n).sqrt()
        # Constant features would divide by zero (or, from rounding, by
        # almost zero); leave them unscaled.
        self.scale.copy_(torch.where(varies(std, mean), std, torch.ones_like(std)))

    def forward(self, x):
        z = (x.flatten(1) - self.mean) / self.scale
        if self.input_clip is not None:
            z = self.input_clip * torch.tanh(z / self.input_clip)
        return self.layers(z)

    def extra_repr(self):
        return f"input_clip={self.input_clip}"


#: The built-in networks, by the name that ``network`` takes. A network
#: class here describes itself to the rest of the package: ``from_inputs``
#: and ``forward_macs`` (classmethods of ``(input_shape, n_features,
#: embedding_dim, hidden_layer_sizes)``: the network, and its multiply-adds
#: for one sample, which ``max_iter="auto"`` budgets), ``image_input``,
#: ``cpu_rate`` (``"conv"``, ``"conv1d"`` or ``"dense"``, see ``_defaults``),
#: ``default_l2_scale`` and ``fit_normalization``; an ``image_input`` class
#: may name the inputs it needs in ``shape_hint``. The 1-D network for
#: signals lives in ``_signal``.
NETWORKS = {
    "mnist": MNISTNet,
    "svhn": SVHNNet,
    "stl10": STL10Net,
    "small": SmallImageNet,
    "mlp": MLPNet,
    "signal": SignalNet,
    # Sparse rows (and dense ones); network="auto" picks it for sparse X.
    "sparse_mlp": SparseMLPNet,
}

#: Images whose height and width both lie in this range get the small network.
SMALL_IMAGE_SIZES = (8, 27)
#: Inputs one value high and at least this long are signals (the 1-D network).
SIGNAL_MIN_LENGTH = 8


def auto_network_name(input_shape):
    """The built-in network for inputs of ``input_shape`` (None: feature vectors).

    Inputs one value high, ``(channels, 1, length)``, are signals: those of
    at least ``SIGNAL_MIN_LENGTH`` values get the 1-D convolutional network.
    Images of 8x8 up to 27x27 pixels (both sides) get the small-image network,
    32x32 images the SVHN network, 96x96 the STL-10 one, any other image size
    of at least 8x8 the MNIST one, smaller images and feature vectors the MLP.
    """
    if input_shape is None:
        return "mlp"
    _, height, width = input_shape
    if height == 1 and width >= SIGNAL_MIN_LENGTH:
        return "signal"
    if (height, width) == (32, 32):
        return "svhn"
    if (height, width) == (96, 96):
        return "stl10"
    low, high = SMALL_IMAGE_SIZES
    if low <= min(height, width) and max(height, width) <= high:
        return "small"
    if min(height, width) >= 8:
        return "mnist"
    return "mlp"


def network_class(name, input_shape):
    """The registered class of network ``name``, checked against its inputs.

    Parameters
    ----------
    name : str
        A key of :data:`NETWORKS`.
    input_shape : tuple of int or None
        ``(channels, height, width)`` of the images the network sees, None
        for feature rows.

    Returns
    -------
    cls : type
        ``NETWORKS[name]``.
    """
    if name not in NETWORKS:
        raise ValueError(
            f"Unknown network {name!r}; the built-in ones are {sorted(NETWORKS)}."
        )
    cls = NETWORKS[name]
    if cls.image_input and input_shape is None:
        hint = getattr(cls, "shape_hint", None) or (
            "image inputs: pass X of shape (n, h, w) or (n, c, h, w), or 2-D "
            "rows together with input_shape=(c, h, w)"
        )
        raise ValueError(f"network={name!r} needs {hint}.")
    return cls


def takes_hidden_layer_sizes(name):
    """Whether the built-in network ``name`` is shaped by ``hidden_layer_sizes``."""
    return name in NETWORKS and NETWORKS[name].takes_hidden_layer_sizes


def embeds_rows(name):
    """Whether the built-in network ``name`` embeds feature rows (not images)."""
    return name in NETWORKS and not NETWORKS[name].image_input


def build_network(name, input_shape, n_features, embedding_dim, hidden_layer_sizes):
    """Build the built-in embedding network ``name`` for the given inputs.

    ``input_shape`` is the shape of one image as the network sees it (after
    any resize or colour conversion), None for feature rows of
    ``n_features`` values.
    """
    return network_class(name, input_shape).from_inputs(
        None if input_shape is None else tuple(input_shape),
        n_features,
        embedding_dim,
        tuple(hidden_layer_sizes),
    )


class AssociationModel(nn.Module):
    """An embedding network with the paper's linear logit layer on top.

    Parameters
    ----------
    embedder : torch.nn.Module
        Maps a batch of raw inputs to ``(batch, embedding_dim)`` embeddings.
    embedding_dim : int
        Width of the embedding.
    n_classes : int
        Number of classes of the logit layer.
    input_format : torch.nn.Module, default=None
        Parameter-free conversion of raw inputs before the embedder (e.g. an
        :class:`~skassoc._nn._image_format.ImageFormat`); None passes them as
        they are.
    """

    def __init__(self, embedder, embedding_dim, n_classes, input_format=None):
        super().__init__()
        # Parameter-free, so the weights (state_dict) are the same with it or
        # without it.
        self.input_format = input_format if input_format is not None else nn.Identity()
        self.embedder = embedder
        self.logits = xavier_init_(nn.Linear(embedding_dim, n_classes))

    def embed(self, x, memory_format=torch.contiguous_format):
        """Embeddings of a float batch of raw inputs.

        The batch is first brought to the network's input format (see
        :class:`~skassoc._nn._image_format.ImageFormat`), then to
        ``memory_format`` (channels-last image batches convolve faster).
        """
        x = self.input_format(x).contiguous(memory_format=memory_format)
        return self.embedder(x)

    def forward(self, x):
        """Return ``(embeddings, logits)`` for a batch of raw inputs."""
        embeddings = self.embed(x)
        return embeddings, self.logits(embeddings)


def weight_tensors(model, embedder_scale, logit_scale):
    """Weights (not biases or norm parameters) to decay and their L2 scales.

    A weight is any parameter with more than one dimension, so the rule holds
    for a user's own module too.
    """
    weights, scales = [], []
    for name, param in model.named_parameters():
        if param.ndim > 1 and param.requires_grad:
            weights.append(param)
            scales.append(logit_scale if name.startswith("logits.") else embedder_scale)
    return weights, scales


def place_model(model, device, images):
    """Move ``model`` to ``device``; image models go channels-last.

    Convolutions run faster on channels-last tensors on GPUs and CPUs alike,
    and ``fit`` and ``load`` must place a model the same way for their
    predictions to agree to the last bit.
    """
    model = model.to(device)
    if images:
        model = model.to(memory_format=torch.channels_last)
    return model
