"""Random augmentation of signals on the training device.

The augmentations of wearable-sensor and time-series classification (Um et
al., ICMI 2017; Iwana and Uchida, PLOS ONE 2021), each a small change that
leaves a signal's class as it is: a shift in time, a time warp (the signal
played at a speed that varies smoothly, its ends kept in place), a scaling
of each channel about its mean and Gaussian noise ("jittering"). The sizes
are relative to each signal (its length, its spread), so they mean the same
whatever the units. As the image augmentation, everything is drawn with
device random numbers and fixed shapes and reads no value back to the host,
so it is captured inside the training step's CUDA graph.
"""

import math
import numbers

import numpy as np
import torch
import torch.nn.functional as F

__all__ = [
    "SIGNAL_AUGMENTATION",
    "SignalAugmentation",
    "is_signal_settings",
    "resolve_signal_augmentation",
]

#: augmentation="auto" for signals (the built-in 1-D network); a dict with
#: any of these keys sets the signal augmentation, the others keeping these
#: values. The sizes are those of the literature above, halved where the
#: literature's were chosen for one kind of data (its warp of 0.2 for
#: accelerometers; spectra keep their peaks in place).
SIGNAL_AUGMENTATION = {
    # Standard deviation of a shift of the whole signal, as a fraction of
    # its length (the values beyond its ends repeat the end values).
    "shift_std": 0.03,
    # Standard deviation of the speed of a smooth time warp (1: none), whose
    # speed curve passes through WARP_KNOTS random knots.
    "warp_std": 0.1,
    # Standard deviation of the logarithm of each channel's scale factor.
    "scale_std": 0.1,
    # Standard deviation of the added noise, as a fraction of each
    # channel's standard deviation in the signal.
    "noise_std": 0.05,
    # Whether the unlabeled batch is augmented too (the labeled one always is).
    "unlabeled": True,
}
#: Knots of the warp's speed curve, evenly spaced over the signal.
WARP_KNOTS = 4
#: Slowest speed of the warp, so that time never runs backwards.
MIN_SPEED = 0.1
#: The keys that make a dict signal settings ("unlabeled" is shared).
SIGNAL_KEYS = frozenset(SIGNAL_AUGMENTATION) - {"unlabeled"}


def is_signal_settings(settings):
    """Whether the augmentation dict ``settings`` sets the signal augmentation."""
    return isinstance(settings, dict) and bool(SIGNAL_KEYS & set(settings))


def resolve_signal_augmentation(augmentation):
    """The full settings of the ``augmentation`` parameter for signals.

    ``"auto"`` is :data:`SIGNAL_AUGMENTATION`; a dict sets some of its
    values. The image augmentation (``"paper"`` or its settings) and the
    feature noise are refused: they would warp the channels into each other
    or ignore time.

    Raises
    ------
    ValueError
        If ``augmentation`` holds other settings than the signal ones, or
        values that are not finite numbers >= 0.
    """
    if augmentation == "auto":
        return dict(SIGNAL_AUGMENTATION)
    known = sorted(SIGNAL_AUGMENTATION)
    if isinstance(augmentation, str) or set(augmentation) - set(known):
        given = (
            repr(augmentation)
            if isinstance(augmentation, str)
            else f"the setting(s) {sorted(set(augmentation) - set(known))}"
        )
        raise ValueError(
            f"The inputs are signals (network 'signal'), whose augmentation "
            f"takes only the settings {known}; got {given}, which warps images "
            "or adds feature noise. Pass augmentation='auto', None or a dict "
            "of signal settings, e.g. {'warp_std': 0.2}."
        )
    settings = {**SIGNAL_AUGMENTATION, **augmentation}
    if not isinstance(settings["unlabeled"], (bool, np.bool_)):
        raise ValueError(
            "augmentation['unlabeled'] must be True (augment both batches) or "
            f"False (the labeled batch only); got {settings['unlabeled']!r}."
        )
    settings["unlabeled"] = bool(settings["unlabeled"])
    for name in SIGNAL_KEYS:
        value = settings[name]
        number = isinstance(value, numbers.Real) and not isinstance(
            value, (bool, np.bool_)
        )
        if not (number and math.isfinite(value) and value >= 0):
            raise ValueError(
                f"augmentation[{name!r}] must be a finite number >= 0; got {value!r}."
            )
        settings[name] = float(value)
    return settings


class SignalAugmentation(torch.nn.Module):
    """Random shift, time warp, channel scaling and noise of raw signals.

    Time runs along the last axis of a batch ``(n, c, h, w)``; every other
    axis holds channels (a signal is ``(n, channels, 1, length)``), and all
    channels of a signal share its shift and warp.

    Parameters
    ----------
    shift_std : float
        Standard deviation of the shift, as a fraction of the length.
    warp_std : float
        Standard deviation of the warp's speed at its knots (1 is the
        signal's own speed).
    scale_std : float
        Standard deviation of the logarithm of each channel's scale factor,
        applied about the channel's mean.
    noise_std : float
        Standard deviation of the Gaussian noise, in units of each channel's
        standard deviation over the signal.
    """

    def __init__(self, shift_std=0.03, warp_std=0.1, scale_std=0.1, noise_std=0.05):
        super().__init__()
        self.shift_std = float(shift_std)
        self.warp_std = float(warp_std)
        self.scale_std = float(scale_std)
        self.noise_std = float(noise_std)

    def forward(self, x):
        """Augment a float batch ``x`` of shape (n, ..., length)."""
        shape = x.shape
        # (n, channels, length): every axis between the first and the last
        # holds channels.
        x = x.reshape(shape[0], -1, shape[-1])
        if self.shift_std > 0 or self.warp_std > 0:
            x = self._resample(x)
        if self.scale_std > 0 or self.noise_std > 0:
            mean = x.mean(dim=2, keepdim=True)
            if self.scale_std > 0:
                factor = torch.exp(self.scale_std * torch.randn_like(mean))
                x = mean + factor * (x - mean)
            if self.noise_std > 0:
                spread = x.std(dim=2, keepdim=True, correction=0)
                x = x + self.noise_std * spread * torch.randn_like(x)
        return x.reshape(shape)

    def _resample(self, x):
        """Read every signal at warped and shifted times (linear interpolation)."""
        n, _, length = x.shape
        times = self._warped_times(n, length, x.device)
        if self.shift_std > 0:
            times = times + self.shift_std * length * torch.randn(n, 1, device=x.device)
        # grid_sample's coordinates: -1 and 1 are the outer edges of the
        # first and last values (align_corners=False), value i's centre is
        # (2 i + 1) / length - 1.
        grid_x = (2 * times + 1) / length - 1
        grid = torch.stack([grid_x, torch.zeros_like(grid_x)], dim=-1)
        out = F.grid_sample(
            x.unsqueeze(2),
            grid.unsqueeze(1).to(x.dtype),
            mode="bilinear",
            padding_mode="border",
            align_corners=False,
        )
        return out.squeeze(2)

    def _warped_times(self, n, length, device):
        """Times ``(n, length)`` at which to read each signal: 0 .. length - 1
        at a smoothly varying random speed (or evenly, without warp)."""
        steps = torch.arange(length, device=device, dtype=torch.float32)
        if self.warp_std == 0 or length < 2:
            return steps.expand(n, length)
        knots = 1 + self.warp_std * torch.randn(n, 1, WARP_KNOTS + 2, device=device)
        speed = F.interpolate(knots, size=length, mode="linear", align_corners=True)
        speed = speed.squeeze(1).clamp(min=MIN_SPEED)
        # The time reached after each step, from 0, stretched so that the
        # last value is read at the end: the warp keeps both ends in place.
        elapsed = torch.cumsum(speed, dim=1) - speed[:, :1]
        return elapsed * ((length - 1) / elapsed[:, -1:])
