"""Bring image data sets to one size and colour format, so they can be mixed."""

import numpy as np
import torch

from .._nn._image_format import ImageFormat, check_image_size

__all__ = ["format_images"]

# Images converted at a time: bounds the float32 working memory.
_CHUNK = 4096


def format_images(images, *, size=None, channels=None):
    """Resize images and convert between grey and colour, in batches.

    Two domains must share one array to be passed to ``fit`` (source samples
    labeled, target samples ``-1``); this brings, e.g., 28x28 grey MNIST
    digits and 32x32 colour synthetic digits to one format. It is the
    conversion the estimator applies itself with ``image_size`` and
    ``image_channels`` (bilinear, antialiased; grey repeated into three
    channels, colour to its luma), done once on the CPU.

    Parameters
    ----------
    images : array-like of shape (n_samples, height, width) or \
            (n_samples, channels, height, width)
        Images, channels first; 3-D input is grey.
    size : int or tuple of (int, int), default=None
        ``(height, width)`` of the output; None keeps the input's.
    channels : {1, 3}, default=None
        Channels of the output; None keeps the input's.

    Returns
    -------
    formatted : ndarray of shape (n_samples, channels, height, width)
        The images, as uint8 (rounded and clipped to 0..255) for uint8
        input and as float32 for any other input.

    Raises
    ------
    ValueError
        If ``images`` is not 3-D or 4-D, ``size`` is not a valid size, or
        ``channels`` is not 1 or 3, or the images have neither 1 nor 3
        channels when ``channels`` is set.

    Examples
    --------
    >>> import numpy as np
    >>> from skassoc.datasets import format_images
    >>> grey = np.zeros((5, 28, 28), dtype=np.uint8)
    >>> format_images(grey, size=32, channels=3).shape
    (5, 3, 32, 32)
    """
    images = np.asarray(images)
    if images.ndim == 3:
        images = images[:, None]
    if images.ndim != 4:
        raise ValueError(
            "images must be (n_samples, height, width) or (n_samples, channels, "
            f"height, width); got an array of shape {images.shape}."
        )
    if channels is not None and channels not in (1, 3):
        raise ValueError(f"channels must be None, 1 or 3; got {channels!r}.")
    if channels is not None and images.shape[1] not in (1, 3):
        raise ValueError(
            f"channels={channels} converts between grey (1 channel) and colour "
            f"(3); the images have {images.shape[1]} channels."
        )
    formatter = ImageFormat(check_image_size(size, "size"), channels)
    as_uint8 = images.dtype == np.uint8
    chunks = []
    with torch.inference_mode():
        for start in range(0, len(images), _CHUNK):
            batch = torch.from_numpy(
                np.ascontiguousarray(images[start : start + _CHUNK], dtype=np.float32)
            )
            batch = formatter(batch)
            if as_uint8:
                batch = batch.round().clamp(0, 255).to(torch.uint8)
            chunks.append(batch.numpy())
    if not chunks:
        out_shape = formatter(torch.zeros((1, *images.shape[1:]))).shape[1:]
        return np.empty((0, *out_shape), dtype=np.uint8 if as_uint8 else np.float32)
    return np.concatenate(chunks)
