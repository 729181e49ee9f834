"""A 1-D convolutional embedding network for signals (time series, spectra).

A signal reaches the network as an image one value high, ``(channels, 1,
length)`` (see ``skassoc._inputs``); the network reads every axis but the
last as channels, so it also takes ``(n, channels, length)`` arrays read as
one-channel images when named explicitly (``network="signal"``). Its
convolutions run along the last axis only, so a pattern is recognised
wherever it lies in time, which an MLP, seeing each time step as a column of
its own, cannot do.
"""

import math
from typing import NamedTuple

import torch
from torch import nn

from .._utils import varies
from ._init import xavier_init_

__all__ = ["SignalNet", "signal_plan", "signal_dims"]

#: The first convolution strides so that at most this many positions come
#: out of it: the cost of a fit stays bounded whatever the length, and
#: long signals are first summarised by a learned filter bank.
STEM_POSITIONS = 256
#: Width of the first convolution's filters (at least; see :func:`signal_plan`).
STEM_KERNEL = 7
#: The channels of the first convolution, doubled at every stage up to
#: WIDEST.
STEM_CHANNELS = 32
WIDEST = 128
#: Kernel of the stride-2 convolutions that follow: 3 taps, as in the image
#: networks; each halving widens the receptive field, and the first
#: convolution's stride scales it with the length.
STAGE_KERNEL = 3
#: Stages halve the length until at most this many positions are left for
#: the pooling over time.
LAST_POSITIONS = 8


class Conv1d(NamedTuple):
    """A convolution of the plan: ``channels`` outputs, ``kernel`` taps,
    ``stride``, padding ``kernel // 2``."""

    channels: int
    kernel: int
    stride: int


def signal_dims(input_shape):
    """``(channels, length)`` of inputs of ``input_shape`` ``(c, h, w)``:
    time runs along the last axis, every other axis holds channels."""
    *channels, length = input_shape
    return math.prod(channels), length


def _out_length(length, layer):
    """torch's output length for padding ``kernel // 2``."""
    padding = layer.kernel // 2
    return (length + 2 * padding - layer.kernel) // layer.stride + 1


def signal_plan(length):
    """The convolutions of :class:`SignalNet` for signals of ``length`` values.

    A first convolution with ``STEM_CHANNELS`` filters, strided by
    ``ceil(length / STEM_POSITIONS)`` (its filters at least twice as wide as
    the stride, so no value is skipped), then stride-2 convolutions of
    ``STAGE_KERNEL`` taps, their channels doubled up to ``WIDEST``, until
    at most ``LAST_POSITIONS`` positions are left. A signal of 100 values
    gets five convolutions, one of 2,000 six (its first strided by 8), and
    the work after the first convolution stays that of 256 positions at
    most, whatever the length.
    """
    stride = max(1, math.ceil(length / STEM_POSITIONS))
    kernel = max(STEM_KERNEL, 2 * stride + 1)
    plan = [Conv1d(STEM_CHANNELS, kernel, stride)]
    length = _out_length(length, plan[0])
    channels = STEM_CHANNELS
    while length > LAST_POSITIONS:
        channels = min(2 * channels, WIDEST)
        plan.append(Conv1d(channels, STAGE_KERNEL, 2))
        length = _out_length(length, plan[-1])
    return tuple(plan)


def _plan_macs(plan, in_channels, length):
    """Multiply-adds of one signal through ``plan`` and its last channels."""
    macs = 0
    for layer in plan:
        length = _out_length(length, layer)
        macs += length * in_channels * layer.channels * layer.kernel
        in_channels = layer.channels
    return macs, in_channels


class SignalNet(nn.Module):
    """A 1-D convolutional embedding network for signals of one length.

    Each channel standardised by its mean and standard deviation over the
    training signals (learned by :meth:`fit_normalization`) -> the
    convolutions of :func:`signal_plan` (ELU after each, no batch norm) ->
    the mean and the maximum of every channel over time -> FC(embedding_dim),
    ELU; Xavier initialisation. The pooling over time makes the embedding
    of a pattern the same wherever it lies, and lets the network take any
    length.

    Parameters
    ----------
    input_shape : tuple of int, default=(1, 1, 128)
        ``(channels, height, width)`` of one input; time runs along the last
        axis and ``channels * height`` channels are read (a signal is one
        value high: ``(channels, 1, length)``).
    embedding_dim : int, default=128
        Width of the embedding.
    """

    default_l2_scale = 1e-3
    #: Takes shaped inputs, never feature rows.
    image_input = True
    #: What to pass when it gets feature rows (see ``network_class``).
    shape_hint = (
        "signals: 2-D rows with input_shape=(length,), or X of shape "
        "(n, channels, 1, length) (or (n, channels, length) when network="
        "'signal' is named)"
    )
    takes_hidden_layer_sizes = False
    #: Its CPU work runs at the 1-D convolutions' rate (see ``_defaults``).
    cpu_rate = "conv1d"

    def __init__(self, input_shape=(1, 1, 128), embedding_dim=128):
        super().__init__()
        channels, length = self._check_shape(input_shape)
        layers = []
        width = channels
        for layer in signal_plan(length):
            conv = nn.Conv1d(
                width, layer.channels, layer.kernel, layer.stride, layer.kernel // 2
            )
            layers += [conv, nn.ELU()]
            width = layer.channels
        self.features = nn.Sequential(*layers)
        self.embedding = nn.Sequential(nn.Linear(2 * width, embedding_dim), nn.ELU())
        self.register_buffer("mean", torch.zeros(channels, 1))
        self.register_buffer("scale", torch.ones(channels, 1))
        xavier_init_(self)

    @staticmethod
    def _check_shape(input_shape):
        if len(input_shape) != 3 or min(input_shape) < 1:
            raise ValueError(
                "SignalNet needs input_shape (channels, height, width), a "
                f"signal being (channels, 1, length); got {tuple(input_shape)}."
            )
        return signal_dims(input_shape)

    @classmethod
    def from_inputs(cls, input_shape, n_features, embedding_dim, hidden_layer_sizes):
        """The network for signals of ``input_shape`` (the other sizes unused).

        ``n_features`` and ``hidden_layer_sizes`` are there for the
        registry's common signature (see ``NETWORKS``).
        """
        return cls(tuple(input_shape), embedding_dim)

    @classmethod
    def forward_macs(cls, input_shape, n_features, embedding_dim, hidden_layer_sizes):
        """Multiply-adds of one signal's forward pass, from the plan.

        The convolutions' and the embedding layer's (biases, activations and
        the pooling are left out). Arguments as for :meth:`from_inputs`.
        """
        channels, length = signal_dims(input_shape)
        macs, width = _plan_macs(signal_plan(length), channels, length)
        return macs + 2 * width * embedding_dim

    @torch.no_grad()
    def fit_normalization(self, x, input_format=None):
        """Learn each channel's mean and standard deviation from training inputs.

        Parameters
        ----------
        x : array or tensor of shape (n, c, h, w)
            Training inputs, read a few MiB at a time in float64, so a
            memory-mapped ``x`` is never loaded whole.
        input_format : torch.nn.Module, default=None
            Conversion applied to the inputs before the network sees them;
            the statistics are those of its output.
        """
        from ._networks import _chunks  # here: _networks imports this module

        channels = self.mean.shape[0]
        count, total = 0, torch.zeros(channels, dtype=torch.float64)
        for rows in _chunks(x, input_format):
            values = rows.reshape(len(rows), channels, -1)
            count += values.shape[0] * values.shape[2]
            total += values.sum(dim=(0, 2))
        mean = total / max(count, 1)
        # A second pass around the mean: exact, unlike sum(x**2) - n mean**2.
        squares = torch.zeros_like(total)
        for rows in _chunks(x, input_format):
            values = rows.reshape(len(rows), channels, -1)
            squares += ((values - mean[:, None]) ** 2).sum(dim=(0, 2))
        std = (squares / max(count, 1)).sqrt()
        # A constant channel would divide by zero: it is only centred.
        std = torch.where(varies(std, mean), std, torch.ones_like(std))
        self.mean.copy_(mean[:, None])
        self.scale.copy_(std[:, None])
        return self

    def forward(self, x):
        signals = x.flatten(1, -2) if x.ndim > 3 else x
        h = self.features((signals - self.mean) / self.scale)
        pooled = torch.cat([h.mean(dim=2), h.amax(dim=2)], dim=1)
        return self.embedding(pooled)
