"""Random augmentation on the training device: image warps and feature noise.

(Signals have their own, in ``_signal_augmentation``; this module
dispatches to it.)

The paper's augmentation (as in its authors' code): a random affine map per
image, whose 2x2 part is ``I + 0.15 * N(0, 1)`` and whose translation is
``2 * N(0, 1)`` pixels about the centre, with reflected borders, then a 7x7
Gaussian blur with probability 0.5, applied to both batches; later work added random
inversion ``|x - 255 b|``. The training step can leave the unlabeled batch
as it is (setting ``unlabeled=False``). Beyond the paper, an elastic
distortion (Simard et al., ICDAR 2003: a random displacement field, uniform
noise smoothed by a Gaussian) can bend the strokes; it is off by default.
Feature vectors get Gaussian noise instead, scaled to each feature's
standard deviation (input noise, the oldest regulariser of small networks).
Everything is drawn with device random numbers and fixed shapes, so the
augmentation is captured inside the training step's CUDA graph.
"""

import math
import numbers

import numpy as np
import torch
import torch.nn.functional as F

from ._signal_augmentation import (
    SignalAugmentation,
    is_signal_settings,
    resolve_signal_augmentation,
)
from ._sparse_augmentation import FeatureDropout, is_dropout_settings

__all__ = [
    "FEATURE_NOISE",
    "FeatureNoise",
    "ImageAugmentation",
    "PAPER_AUGMENTATION",
    "resolve_augmentation",
    "gaussian_kernel",
    "separable_conv",
]

#: The paper's settings.
PAPER_AUGMENTATION = {
    "affine_std": 0.15,
    "translate_std": 2.0,
    "blur_probability": 0.5,
    "blur_sigma": 1.0,
    "invert_probability": 0.0,
    # Elastic distortion (not in the paper, so off): uniform noise in [-1, 1]
    # smoothed by a normalised Gaussian of elastic_sigma pixels and multiplied
    # by elastic_alpha, a displacement of standard deviation about
    # 0.16 * elastic_alpha / elastic_sigma pixels per axis away from the
    # border (less near it). Simard et al. used alpha 34 and sigma 4 on
    # MNIST: about 1.4 pixels per axis.
    "elastic_alpha": 0.0,
    "elastic_sigma": 4.0,
    # Whether the unlabeled batch is augmented too (the labeled one always is).
    "unlabeled": True,
}


#: The augmentation of feature vectors, and augmentation="auto"'s for them:
#: noise on the labeled batch (and on the consistency loss's second copy of
#: the unlabeled batch) whose size "auto" follows the data's spacing
#: (``_defaults.auto_feature_noise``).
FEATURE_NOISE = {"feature_noise": "auto", "unlabeled": False}


def resolve_augmentation(augmentation, feature_vectors, signals=False):
    """Turn the ``augmentation`` parameter into a full settings dict (or None).

    ``feature_vectors`` says whether the built-in MLP embeds feature vectors,
    the inputs for which ``"auto"`` means :data:`FEATURE_NOISE`; ``signals``
    whether the built-in 1-D network embeds signals, for which everything
    but None is the signal augmentation (``_signal_augmentation``). For all
    other inputs ``"auto"`` means no augmentation. A dict with the key
    ``"feature_noise"`` sets the feature noise; any other dict, the image
    augmentation.
    """
    if augmentation is None:
        return None
    if signals:
        return resolve_signal_augmentation(augmentation)
    if augmentation == "auto":
        return dict(FEATURE_NOISE) if feature_vectors else None
    if augmentation == "paper":
        return dict(PAPER_AUGMENTATION)
    if "feature_noise" in augmentation:
        return _resolve_feature_noise(augmentation)
    if is_signal_settings(augmentation):
        raise ValueError(
            f"augmentation={augmentation!r} sets the signal augmentation, which "
            "needs signals embedded by network='signal' (inputs one value "
            "high, such as input_shape=(length,), pick it by default)."
        )
    unknown = set(augmentation) - set(PAPER_AUGMENTATION)
    if unknown:
        raise ValueError(
            f"Unknown augmentation setting(s) {sorted(unknown)}; the settings are "
            f"{sorted(PAPER_AUGMENTATION)}."
        )
    settings = {**PAPER_AUGMENTATION, **augmentation}
    _check_settings(settings)
    if settings["blur_sigma"] == 0 and settings["blur_probability"] > 0:
        raise ValueError(
            "augmentation['blur_sigma'] must be > 0 (the width of the blur); to "
            "switch the blur off, set augmentation['blur_probability'] = 0."
        )
    if settings["elastic_sigma"] == 0 and settings["elastic_alpha"] > 0:
        raise ValueError(
            "augmentation['elastic_sigma'] must be > 0 (the smoothness of the "
            "displacement field); to switch the elastic distortion off, set "
            "augmentation['elastic_alpha'] = 0."
        )
    for name in ("blur_probability", "invert_probability"):
        if settings[name] > 1:
            raise ValueError(
                f"augmentation[{name!r}] is a probability; got {settings[name]!r}."
            )
    return settings


def _resolve_feature_noise(augmentation):
    """The full feature-noise settings of an ``augmentation`` dict."""
    unknown = set(augmentation) - set(FEATURE_NOISE)
    if unknown:
        raise ValueError(
            f"Unknown augmentation setting(s) {sorted(unknown)} with "
            f"'feature_noise': feature vectors take only {sorted(FEATURE_NOISE)} "
            "(the other settings warp images)."
        )
    settings = {**FEATURE_NOISE, **augmentation}
    _check_settings(settings)
    return settings


def _check_settings(settings):
    """Refuse settings that are not finite numbers >= 0 (``unlabeled``: a
    bool; ``feature_noise`` may also be ``"auto"``).

    Turns ``settings["unlabeled"]`` into a Python bool, in place.
    """
    if not isinstance(settings["unlabeled"], (bool, np.bool_)):
        raise ValueError(
            "augmentation['unlabeled'] must be True (augment both batches) or "
            f"False (the labeled batch only); got {settings['unlabeled']!r}."
        )
    settings["unlabeled"] = bool(settings["unlabeled"])
    for name, value in settings.items():
        auto = name == "feature_noise" and isinstance(value, str) and value == "auto"
        if name == "unlabeled" or auto:
            continue
        number = isinstance(value, numbers.Real) and not isinstance(
            value, (bool, np.bool_)
        )
        if not (number and math.isfinite(value) and value >= 0):
            also = " or 'auto'" if name == "feature_noise" else ""
            raise ValueError(
                f"augmentation[{name!r}] must be a finite number >= 0{also}; "
                f"got {value!r}."
            )


def augmentation_module(settings, embedder):
    """The module that augments a batch with ``settings`` (see
    :func:`resolve_augmentation`), and whether it augments the unlabeled
    batch too. ``embedder`` is the network, whose learned feature scale the
    feature noise uses."""
    settings = dict(settings)
    unlabeled = settings.pop("unlabeled")
    if "feature_noise" in settings:
        # In the units the MLP standardises by. It leaves constant features
        # unscaled (scale 1), so they get noise of feature_noise itself, as
        # much as the others once standardised.
        return FeatureNoise(settings["feature_noise"], embedder.scale), unlabeled
    if is_signal_settings(settings):
        return SignalAugmentation(**settings), unlabeled
    if is_dropout_settings(settings):
        return FeatureDropout(settings["feature_dropout"]), unlabeled
    return ImageAugmentation(**settings), unlabeled


class FeatureNoise(torch.nn.Module):
    """Gaussian noise on feature vectors, in units of each feature's spread.

    Parameters
    ----------
    std : float
        Standard deviation of the noise, in units of ``feature_scale``.
    feature_scale : torch.Tensor of shape (n_features,)
        Each feature's standard deviation (the MLP's standardisation scale).
    """

    def __init__(self, std, feature_scale):
        super().__init__()
        self.std = float(std)
        self.register_buffer("feature_scale", feature_scale.detach().clone())

    def forward(self, x):
        """``x`` (n, n_features) plus ``std * feature_scale * N(0, 1)``."""
        if self.std == 0:
            return x
        noise = torch.randn_like(x) * self.feature_scale.to(x.dtype)
        return x + self.std * noise


def gaussian_kernel(sigma, size=7):
    """Normalised 1-D Gaussians of ``size`` taps.

    ``sigma`` is a number (one kernel, shape ``(size,)``) or a tensor of
    shape ``(n,)`` (one kernel per value, shape ``(n, size)``).
    """
    coords = torch.arange(size, dtype=torch.float32) - (size - 1) / 2
    sigma = torch.as_tensor(sigma, dtype=torch.float32).unsqueeze(-1)
    kernel = torch.exp(-(coords**2) / (2 * sigma**2))
    return (kernel / kernel.sum(dim=-1, keepdim=True)).squeeze(0)


class ImageAugmentation(torch.nn.Module):
    """Random affine warp, elastic distortion, blur and inversion of raw images.

    Parameters
    ----------
    affine_std : float
        Standard deviation of the noise added to the identity 2x2 matrix.
    translate_std : float
        Standard deviation of the translation, in pixels.
    blur_probability : float
        Probability that an image is blurred by a 7x7 Gaussian.
    blur_sigma : float
        Standard deviation of that Gaussian, in pixels.
    invert_probability : float
        Probability that an image is inverted as ``|x - 255|`` (for raw pixel
        values 0..255).
    elastic_alpha : float
        Multiplier of the smoothed noise that displaces every pixel (the
        displacement's standard deviation is about
        ``0.16 * elastic_alpha / elastic_sigma`` pixels per axis); 0 switches
        the elastic distortion off.
    elastic_sigma : float
        Standard deviation, in pixels, of the Gaussian that smooths the
        field's uniform noise (larger: smoother, smaller displacements).
    """

    def __init__(
        self,
        affine_std=0.15,
        translate_std=2.0,
        blur_probability=0.5,
        blur_sigma=1.0,
        invert_probability=0.0,
        elastic_alpha=0.0,
        elastic_sigma=4.0,
    ):
        super().__init__()
        self.affine_std = affine_std
        self.translate_std = translate_std
        self.blur_probability = blur_probability
        self.invert_probability = invert_probability
        self.elastic_alpha = elastic_alpha
        self.register_buffer(
            "blur_kernel", gaussian_kernel(blur_sigma) if blur_sigma > 0 else None
        )
        # Three standard deviations hold 99.7 % of the Gaussian: a longer
        # kernel would cost time and change nothing visible.
        self.register_buffer(
            "elastic_kernel",
            gaussian_kernel(elastic_sigma, 2 * math.ceil(3 * elastic_sigma) + 1)
            if elastic_alpha > 0
            else None,
        )

    def forward(self, x):
        """Augment a float batch ``x`` of shape (n, c, h, w), image by image."""
        n, channels, height, width = x.shape
        if self.affine_std > 0 or self.translate_std > 0 or self.elastic_alpha > 0:
            x = self._warp(x, height, width)
        if self.blur_probability > 0 and self.blur_kernel is not None:
            blurred = self._blur(x, channels)
            chosen = torch.rand(n, 1, 1, 1, device=x.device) < self.blur_probability
            x = torch.where(chosen, blurred, x)
        if self.invert_probability > 0:
            chosen = torch.rand(n, 1, 1, 1, device=x.device) < self.invert_probability
            x = torch.where(chosen, (x - 255.0).abs(), x)
        return x

    def _warp(self, x, height, width):
        """Resample ``x`` through a random affine map and elastic field."""
        n = x.shape[0]
        eye = torch.eye(2, device=x.device)
        matrix = eye + self.affine_std * torch.randn(n, 2, 2, device=x.device)
        pixels = self.translate_std * torch.randn(n, 2, device=x.device)
        shift = _pixels_to_grid(pixels[:, 0], pixels[:, 1], height, width)
        theta = torch.cat([matrix, shift[:, :, None]], dim=2)
        grid = F.affine_grid(theta, list(x.shape), align_corners=False)
        if self.elastic_alpha > 0:
            # One resampling for both maps (two would blur the image twice):
            # the field displaces the points at which the affine map reads.
            grid = grid + self._elastic_field(n, height, width, x.device)
        return F.grid_sample(
            x, grid, mode="bilinear", padding_mode="reflection", align_corners=False
        )

    def _elastic_field(self, n, height, width, device):
        """Displacements (n, h, w, 2) in grid coordinates (Simard et al.)."""
        noise = 2 * torch.rand(n, 2, height, width, device=device) - 1
        # Zero padding, as Simard et al. and scipy's gaussian_filter with
        # mode="constant": the field fades towards the border instead of
        # mirroring displacements that push ink out of the image.
        size = self.elastic_kernel.numel()
        field = separable_conv(noise, self.elastic_kernel, padding=size // 2)
        return _pixels_to_grid(
            field[:, 0], field[:, 1], height, width, scale=self.elastic_alpha
        )

    def _blur(self, x, channels):
        kernel = self.blur_kernel.to(x.dtype)
        pad = kernel.numel() // 2
        x = F.pad(x, (pad, pad, pad, pad), mode="reflect")
        return separable_conv(x, kernel, padding=0)


def separable_conv(x, kernel, padding):
    """Filter every channel of ``x`` with the 2-D kernel ``outer(kernel, kernel)``.

    One horizontal and one vertical depthwise pass; ``padding`` zero pixels
    on each side (0 for an input padded beforehand). ``kernel`` is one
    ``(size,)`` kernel for every channel or ``(channels, size)``, one each.
    """
    channels, size = x.shape[1], kernel.shape[-1]
    kernel = kernel.expand(channels, size)
    horizontal = kernel.reshape(channels, 1, 1, size)
    vertical = kernel.reshape(channels, 1, size, 1)
    x = F.conv2d(x, horizontal, padding=(0, padding), groups=channels)
    return F.conv2d(x, vertical, padding=(padding, 0), groups=channels)


def _pixels_to_grid(dx, dy, height, width, scale=1.0):
    """Stack displacements of ``scale`` times (dx, dy) pixels in grid units.

    ``affine_grid``'s grid spans [-1, 1] over the image, so a pixel is
    ``2 / size``; the last dimension is (x, y). (Python scalars only: a host
    tensor cannot be copied inside a CUDA graph.)
    """
    return torch.stack(
        [dx * (2.0 * scale / width), dy * (2.0 * scale / height)], dim=-1
    )
