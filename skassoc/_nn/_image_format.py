"""Bring images to one size and colour format, on whatever device they are.

Two domains of digits rarely share a format: MNIST is 28x28 grey, SVHN and
synthetic digits are 32x32 colour. :class:`ImageFormat` converts a batch of
raw pixel images (any float values, channels first) to a fixed size and
number of channels, so one network takes both; the estimator runs it on the
training device in front of the network, and
:func:`skassoc.datasets.format_images` runs it on NumPy arrays.
"""

import torch.nn.functional as F
from torch import nn

from .._utils import is_integer

__all__ = ["ImageFormat", "check_image_size", "format_settings", "formatted_shape"]

# ITU-R BT.601 luma weights, the usual colour -> grey conversion (Pillow's too).
LUMA = (0.299, 0.587, 0.114)


def check_image_size(size, name="image_size"):
    """``size`` as a ``(height, width)`` tuple of positive ints, or None.

    Raises
    ------
    ValueError
        If ``size`` is neither None, a positive int, nor two positive ints.
    """
    if size is None:
        return None
    given = size
    if is_integer(size):
        size = (size, size)
    try:
        size = tuple(size)
    except TypeError:
        size = None
    if (
        size is None
        or len(size) != 2
        or not all(is_integer(s) for s in size)
        or min(size) < 1
    ):
        raise ValueError(
            f"{name} must be None, a positive int or a (height, width) pair of "
            f"positive ints; got {given!r}."
        )
    return (int(size[0]), int(size[1]))


def format_settings(module):
    """``(size, channels)`` that ``module`` applies: (None, None) for no format.

    ``module`` is a model's ``input_format``: an :class:`ImageFormat`, or an
    identity module when the inputs go to the network as they are.
    """
    if isinstance(module, ImageFormat):
        return module.size, module.channels
    return None, None


def formatted_shape(image_shape, size, channels):
    """The ``(channels, height, width)`` an image of ``image_shape`` becomes."""
    c, h, w = image_shape
    if size is not None:
        h, w = size
    return (channels or c, h, w)


class ImageFormat(nn.Module):
    """Resize images bilinearly and convert between grey and colour.

    Parameters
    ----------
    size : tuple of (int, int) or None
        ``(height, width)`` of the output; None keeps the input's size.
    channels : {1, 3} or None
        Channels of the output; None keeps the input's. Grey becomes colour
        by repeating the channel, colour becomes grey by its luma
        ``0.299 R + 0.587 G + 0.114 B``.

    Notes
    -----
    The resize is bilinear with antialiasing (which matters when shrinking,
    e.g. 96x96 STL-10 images to 32x32) and keeps the value range of the input,
    so raw 0..255 pixels stay 0..255 and the network's own normalisation
    still applies. The module has no parameters; an identity format costs
    nothing.
    """

    def __init__(self, size=None, channels=None):
        super().__init__()
        self.size = check_image_size(size, "size")
        if channels not in (None, 1, 3):
            raise ValueError(f"channels must be None, 1 or 3; got {channels!r}.")
        self.channels = channels

    def extra_repr(self):
        return f"size={self.size}, channels={self.channels}"

    def forward(self, images):
        """Format a float batch of shape ``(n, c, h, w)``."""
        n_channels = images.shape[1]
        if self.channels is not None and self.channels != n_channels:
            if self.channels == 3 and n_channels == 1:
                images = images.expand(-1, 3, -1, -1)
            elif self.channels == 1 and n_channels == 3:
                # Python scalars, not a tensor of weights: creating a tensor
                # copies it from the host, which a CUDA graph cannot capture.
                red, green, blue = LUMA
                images = (
                    images[:, 0:1] * red
                    + images[:, 1:2] * green
                    + images[:, 2:3] * blue
                )
            else:
                raise ValueError(
                    f"Cannot convert images of {n_channels} channels to "
                    f"{self.channels}; only grey (1) <-> colour (3) is supported."
                )
        if self.size is not None and tuple(images.shape[-2:]) != self.size:
            images = F.interpolate(
                images,
                size=self.size,
                mode="bilinear",
                align_corners=False,
                antialias=True,
            )
        return images
