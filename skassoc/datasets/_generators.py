"""Seeded generators of digit images for domain-adaptation experiments.

:func:`make_synthetic_digits` renders printed digits in the spirit of the
"Synthetic Digits" set of Ganin & Lempitsky (2015), and
:func:`make_mnist_m_like` blends grey digits with colour textures as MNIST-M
does. Both take their textures from one procedural generator, and both work
on whole batches of images at once with torch on the CPU.
"""

import functools
import importlib.util
import math
import numbers
import os

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.utils import Bunch, check_random_state

from .._engine._augmentation import gaussian_kernel, separable_conv
from .._nn._image_format import LUMA

__all__ = ["make_mnist_m_like", "make_synthetic_digits"]

#: Entry of ``fonts`` that stands for Pillow's bundled font.
DEFAULT_FONT = "default"

_FONT_EXTENSIONS = (".ttf", ".otf", ".ttc")

# Images are made in chunks of this many, which bounds the memory used. The
# random numbers are drawn chunk by chunk, so changing it changes the output.
_CHUNK_SIZE = 1024

# Rec. 601 luma weights: the brightness of an RGB colour as one number.
_LUMA = torch.tensor(LUMA).view(1, 3, 1, 1)

# Lattice sizes of the octaves of value noise, coarse to fine.
_NOISE_LATTICES = (2, 3, 5, 8, 13)

# Parameters of make_synthetic_digits.
_MIN_IMAGE_SIZE = 8
_SUPERSAMPLING = 2  # the digit mask is drawn at twice the size, then averaged
_GLYPH_HEIGHT = 0.8  # ink height of a digit in its atlas cell, at most
_MAX_ROTATION = 15.0  # degrees
_MAX_SHEAR = 0.15
_HEIGHT_RANGE = (0.5, 0.8)  # digit height as a fraction of the image height
_ASPECT_RANGE = (0.8, 1.2)
_MAX_SHIFT = (0.15, 0.1)  # x, y, in units of half the image size
_NEIGHBOUR_PROBABILITY = 0.4  # per side
_BOLD_PROBABILITY = 0.25
_FLAT_PROBABILITY = 0.35
_MAX_BACKGROUND_SPREAD = 0.4  # luma range of a textured background, at most
_MIN_CONTRAST = 0.25  # luma gap between stroke and every background pixel
_MAX_BLUR = 1.2  # Gaussian sigma in pixels of a 32 x 32 image
_MAX_NOISE = 0.05  # standard deviation of the pixel noise, on a 0-1 scale
# Mean correlation with Pillow's font that a found font must reach to count
# as one with ordinary digits (see _looks_like_digits).
_MIN_RESEMBLANCE = 0.7

_SYNTHETIC_DESCR = """\
Synthetic printed digits
------------------------

Colour images of the digits 0-9, each rendered with a random font at a
random position, size, rotation, shear and aspect ratio, in a random stroke
colour on a flat or procedurally textured background, with random
neighbouring digits on either side, then blurred and noised by a random
amount. In the spirit of "Synthetic Digits" (SynNumbers) of Y. Ganin and
V. Lempitsky, "Unsupervised Domain Adaptation by Backpropagation", ICML
2015, a source domain for street-view house numbers (SVHN).
"""


# --------------------------------------------------------------------------
# Procedural colour textures, shared by both generators


def _as_tensor(values, *shape):
    """Float32 tensor of ``values`` viewed as ``shape``."""
    return torch.from_numpy(np.asarray(values, dtype=np.float32)).view(*shape)


def _stretch(x):
    """Rescale each image and channel of ``x`` to the range [0, 1]."""
    low = x.amin(dim=(-2, -1), keepdim=True)
    high = x.amax(dim=(-2, -1), keepdim=True)
    return (x - low) / (high - low).clamp_min(1e-6)


@functools.lru_cache(maxsize=64)
def _upsampling_matrix(cells, size):
    """Matrix (size, cells) of bicubic upsampling from ``cells`` to ``size``.

    ``W_y @ lattice @ W_x.T`` equals ``F.interpolate(lattice, mode="bicubic")``
    with ``align_corners=False``, and is several times faster.
    """
    identity = torch.eye(cells).view(cells, 1, cells, 1)
    columns = F.interpolate(
        identity, size=(size, 1), mode="bicubic", align_corners=False
    )
    return columns[:, 0, :, 0].T.contiguous()


def _value_noise(rng, n, channels, height, width):
    """Multi-octave value noise of shape (n, channels, height, width) in [0, 1].

    Random values on coarse lattices are upsampled smoothly and summed with
    weights ``persistence ** octave``, ``persistence`` drawn per image: low
    values give smooth clouds, high ones a rough grain.
    """
    persistence = _as_tensor(rng.uniform(0.3, 0.9, n), n, 1, 1, 1)
    total = torch.zeros(n, channels, height, width)
    for octave, cells in enumerate(_NOISE_LATTICES):
        lattice = _as_tensor(
            rng.random_sample((n, channels, cells, cells)), n, channels, cells, cells
        )
        lattice *= persistence**octave
        # Two large matrix products rather than many small ones.
        columns = lattice.permute(2, 0, 1, 3).reshape(cells, -1)
        rows = (_upsampling_matrix(cells, height) @ columns).view(
            height, n, channels, cells
        )
        total += rows.permute(1, 2, 0, 3) @ _upsampling_matrix(cells, width).T
    # The weights need no normalising: the result is stretched anyway.
    return _stretch(total)


def _procedural_textures(n, height, width, rng, *, flat_probability=0.0):
    """Random colour textures, a float32 tensor (n, 3, height, width) in [0, 1].

    A scalar field mixes, with random weights, multi-octave value noise, a
    linear ramp in a random direction and a sum of three sinusoids of random
    frequency, direction and phase (plasma, or stripes once sharpened). A
    sigmoid of random steepness then turns it anywhere from smooth shading
    into hard-edged blobs or stripes. The field is mapped through a palette
    of three colours, drawn around a random base colour with a random spread
    (from nearly one hue to anything) and desaturated by a random amount,
    and blended with a random share (up to 50%) of multi-octave colour
    noise. With probability ``flat_probability`` a texture is the first
    colour of its palette instead, flat.

    All randomness comes from ``rng`` (a ``numpy.random.RandomState``) in a
    fixed order, so the textures depend only on its state and on ``n``,
    ``height``, ``width`` and ``flat_probability``.
    """
    ys = torch.linspace(-1, 1, height).view(1, 1, height, 1)
    xs = torch.linspace(-1, 1, width).view(1, 1, 1, width)

    base = rng.random_sample((n, 1, 3))
    spread = rng.uniform(0.1, 0.6, (n, 1, 1))
    palette = np.clip(base + spread * rng.uniform(-1, 1, (n, 3, 3)), 0, 1)
    # Move the colours towards their grey by a random amount: photographs
    # are seldom as saturated as uniformly random colours.
    grey = palette.mean(axis=2, keepdims=True)
    palette = grey + rng.uniform(0.2, 1.0, (n, 1, 1)) * (palette - grey)
    colours = [_as_tensor(palette[:, k], n, 3, 1, 1) for k in range(3)]

    noise = _value_noise(rng, n, 1, height, width)

    angle = rng.uniform(0, 2 * np.pi, n)
    ramp = (
        xs * _as_tensor(np.cos(angle), n, 1, 1, 1)
        + ys * _as_tensor(np.sin(angle), n, 1, 1, 1)
    ) / math.sqrt(2) * 0.5 + 0.5

    # Frequencies in cycles per image side (which spans 2 units).
    frequency = np.pi * rng.uniform(0.5, 6.0, (n, 3))
    direction = rng.uniform(0, 2 * np.pi, (n, 3))
    phase = rng.uniform(0, 2 * np.pi, (n, 3))
    plasma = torch.zeros(n, 1, height, width)
    for k in range(3):
        kx = _as_tensor(frequency[:, k] * np.cos(direction[:, k]), n, 1, 1, 1)
        ky = _as_tensor(frequency[:, k] * np.sin(direction[:, k]), n, 1, 1, 1)
        plasma += torch.sin(kx * xs + ky * ys + _as_tensor(phase[:, k], n, 1, 1, 1))
    plasma = plasma / 6 + 0.5

    mix = rng.dirichlet(np.ones(3), n)
    field = _stretch(
        _as_tensor(mix[:, 0], n, 1, 1, 1) * noise
        + _as_tensor(mix[:, 1], n, 1, 1, 1) * ramp
        + _as_tensor(mix[:, 2], n, 1, 1, 1) * plasma
    )
    steepness = _as_tensor(np.exp(rng.uniform(0, np.log(30), n)), n, 1, 1, 1)
    centre = _as_tensor(rng.uniform(0.3, 0.7, n), n, 1, 1, 1)
    field = _stretch(torch.sigmoid(steepness * (field - centre)))

    t = 2 * field
    texture = torch.where(
        t <= 1,
        colours[0] + (colours[1] - colours[0]) * t,
        colours[1] + (colours[2] - colours[1]) * (t - 1),
    )
    colour_noise = _value_noise(rng, n, 3, height, width)
    share = _as_tensor(rng.uniform(0, 0.5, n), n, 1, 1, 1)
    texture = (1 - share) * texture + share * colour_noise

    flat = _as_tensor(rng.random_sample(n) < flat_probability, n, 1, 1, 1)
    texture = flat * colours[0] + (1 - flat) * texture
    return texture.clamp_(0, 1)


# --------------------------------------------------------------------------
# Fonts and the glyph atlas


def _import_pillow():
    try:
        from PIL import Image, ImageDraw, ImageFont
    except ImportError as exc:
        raise ImportError(
            "make_synthetic_digits needs Pillow to render the digits of the "
            "fonts; install it with `pip install pillow` (or with skassoc's "
            'extra: `pip install "skassoc[datasets]"`).'
        ) from exc
    return Image, ImageDraw, ImageFont


def _font_folders():
    """Folders searched for fonts when ``fonts`` is None, in order."""
    folders = []
    spec = importlib.util.find_spec("matplotlib")
    if spec is not None and spec.origin is not None:
        folders.append(
            os.path.join(os.path.dirname(spec.origin), "mpl-data", "fonts", "ttf")
        )
    home = os.path.expanduser("~")
    folders += [
        "/usr/share/fonts",
        "/usr/local/share/fonts",
        os.path.join(home, ".fonts"),
        os.path.join(home, ".local", "share", "fonts"),
        "/System/Library/Fonts",
        "/Library/Fonts",
        os.path.join(home, "Library", "Fonts"),
    ]
    if os.environ.get("WINDIR"):
        folders.append(os.path.join(os.environ["WINDIR"], "Fonts"))
    return folders


@functools.lru_cache(maxsize=1)
def _find_font_files():
    """Sorted font files in each of :func:`_font_folders`, duplicates dropped.

    Looked for once per process: fonts installed later are not seen.
    """
    found, seen, visited = [], set(), set()
    for folder in _font_folders():
        paths = []
        for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
            # Following links may lead in a circle.
            real = os.path.realpath(dirpath)
            if real in visited:
                dirnames.clear()
                continue
            visited.add(real)
            paths += [
                os.path.join(dirpath, name)
                for name in filenames
                if name.lower().endswith(_FONT_EXTENSIONS)
            ]
        for path in sorted(paths):
            real = os.path.realpath(path)
            if real not in seen and os.path.isfile(real):
                seen.add(real)
                found.append(path)
    return tuple(found)


def _render_digits(font, Image, ImageDraw):
    """The ten digits drawn with ``font``, each cropped to its ink.

    Returns a list of float32 arrays in [0, 1], or None for a digit that
    leaves no ink.
    """
    glyphs = []
    for digit in "0123456789":
        left, top, right, bottom = font.getbbox(digit)
        margin = 4
        canvas = Image.new(
            "L", (right - left + 2 * margin, bottom - top + 2 * margin), 0
        )
        ImageDraw.Draw(canvas).text(
            (margin - left, margin - top), digit, font=font, fill=255
        )
        ink = np.asarray(canvas, dtype=np.float32) / 255
        rows = np.flatnonzero(ink.max(axis=1) > 0)
        cols = np.flatnonzero(ink.max(axis=0) > 0)
        if rows.size == 0:
            glyphs.append(None)
        else:
            glyphs.append(ink[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1])
    return glyphs


def _descriptor(glyph, size=20):
    """Unit vector describing the shape of a glyph, for comparing fonts.

    The glyph is scaled to a height of ``size`` pixels (keeping its aspect
    ratio), centred in a ``size`` x ``2 * size`` box and blurred, so that
    small differences of style count for little.
    """
    height, width = glyph.shape
    new_width = max(1, min(2 * size, round(width * size / height)))
    scaled = F.interpolate(
        torch.from_numpy(glyph)[None, None], size=(size, new_width), mode="area"
    )[0, 0]
    box = torch.zeros(size, 2 * size)
    left = (2 * size - new_width) // 2
    box[:, left : left + new_width] = scaled
    box = F.avg_pool2d(box[None, None], 5, 1, 2, count_include_pad=False).flatten()
    box = box - box.mean()
    return box / box.norm().clamp_min(1e-8)


def _looks_like_digits(glyphs, reference):
    """Whether ``glyphs`` resemble the reference font's digits.

    Symbol fonts (such as matplotlib's cmsy10 and cmex10) map the code
    points of the digits to other shapes. Their glyphs correlate poorly with
    the digits of an ordinary font, while the fonts with real digits on
    which this was tuned (DejaVu, Liberation, STIX, Computer Modern, both
    upright and italic) reach a mean correlation of 0.8 or more.
    """
    if reference is None:
        return True
    ours = torch.stack([_descriptor(glyph) for glyph in glyphs])
    return float((ours * reference).sum(dim=1).mean()) >= _MIN_RESEMBLANCE


def _check_glyphs(glyphs):
    """Why the ten glyphs cannot be used, or None if they can."""
    missing = [str(d) for d, glyph in enumerate(glyphs) if glyph is None]
    if missing:
        return f"it draws nothing for the digit(s) {', '.join(missing)}"
    for i in range(10):
        for j in range(i + 1, 10):
            if glyphs[i].shape == glyphs[j].shape and np.array_equal(
                glyphs[i], glyphs[j]
            ):
                return (
                    f"it draws the same glyph for the digits {i} and {j}, so it "
                    "probably lacks digits"
                )
    return None


def _load_font(spec, size, ImageFont):
    """The font named by ``spec`` (a path or DEFAULT_FONT) at ``size`` pixels.

    Returns the font and its name; raises OSError if it cannot be loaded.
    """
    if spec == DEFAULT_FONT:
        try:
            font = ImageFont.load_default(size=size)
        except (TypeError, ImportError, OSError):
            # Pillow < 10.1 has no scalable default font, nor has a Pillow
            # built without FreeType: use the small bitmap font, upscaled.
            font = ImageFont.load_default()
        if isinstance(font, ImageFont.FreeTypeFont):
            family, style = font.getname()
            return font, f"Pillow's default font ({family} {style})"
        return font, "Pillow's default bitmap font"
    font = ImageFont.truetype(spec, size)
    return font, spec


@functools.lru_cache(maxsize=8)
def _glyph_atlas(specs, resolution, check_resemblance):
    """Render the ten digits of each font once, as masks.

    Parameters
    ----------
    specs : tuple of str
        Font file paths, or DEFAULT_FONT.
    resolution : int
        Side of each glyph's square cell, in pixels.
    check_resemblance : bool
        If True, the fonts are ones found on the machine: unusable ones are
        left out, as are those whose digits do not resemble Pillow's, and
        fonts with the same family and style as an earlier one. If False,
        they are the user's: an unusable one raises ValueError.

    Returns
    -------
    atlas : uint8 tensor of shape (n_fonts * 10, 1, resolution, resolution)
        Glyph ``10 * f + d`` is the digit ``d`` of font ``f``, its ink
        centred in the cell and scaled by one factor per font so that the
        median digit height is ``_GLYPH_HEIGHT * resolution`` (less if the
        widest digit would not fit otherwise).
    widths : float32 ndarray of shape (n_fonts, 10)
        Width of the ink of each glyph, in units of half the cell.
    heights : float32 ndarray of shape (n_fonts,)
        Median height of the ink of each font's digits, in the same units.
    names : list of str
        Name of each font: its path, or a description of Pillow's font.
    """
    Image, ImageDraw, ImageFont = _import_pillow()
    # Draw large, then scale down: the glyphs come out smooth.
    size = 2 * resolution
    reference = _reference_descriptors(size) if check_resemblance else None
    cells, widths, heights, names, seen = [], [], [], [], set()
    for spec in specs:
        loaded = _usable_glyphs(spec, size, check_resemblance, reference, seen)
        if loaded is None:
            continue
        glyphs, name = loaded
        font_cells, font_widths, font_height = _glyph_cells(glyphs, resolution)
        cells.append(font_cells)
        widths.append(font_widths)
        heights.append(font_height)
        names.append(name)
    if not cells:
        return None
    atlas = torch.from_numpy(np.concatenate(cells)).unsqueeze(1)
    return (
        atlas,
        np.asarray(widths, dtype=np.float32),
        np.asarray(heights, dtype=np.float32),
        names,
    )


def _reference_descriptors(size):
    """Descriptors of Pillow's own digits, to compare found fonts with (or None)."""
    Image, ImageDraw, ImageFont = _import_pillow()
    try:
        font, _ = _load_font(DEFAULT_FONT, size, ImageFont)
        if isinstance(font, ImageFont.FreeTypeFont):
            glyphs = _render_digits(font, Image, ImageDraw)
            return torch.stack([_descriptor(glyph) for glyph in glyphs])
    except (OSError, ImportError):
        pass
    return None


def _usable_glyphs(spec, size, check_resemblance, reference, seen):
    """The ten glyphs of font ``spec`` and its name, or None to skip it.

    Found fonts (``check_resemblance``) that are unusable, not scalable,
    already ``seen`` (same family and style) or unlike ``reference`` are
    skipped; the user's own fonts raise instead.
    """
    Image, ImageDraw, ImageFont = _import_pillow()
    try:
        font, name = _load_font(spec, size, ImageFont)
    except ImportError as exc:
        # Pillow built without FreeType cannot load font files.
        if check_resemblance:
            return None
        raise ImportError(
            f"Pillow cannot load the font file {spec!r} ({exc}); install a "
            "Pillow built with FreeType (`pip install pillow` provides one), "
            'or pass fonts=["default"] for its bitmap font.'
        ) from exc
    except OSError as exc:
        if check_resemblance:
            return None
        raise ValueError(
            f"The font file {spec!r} could not be loaded as a TrueType or "
            f"OpenType font ({exc}); pass the path of a .ttf, .otf or .ttc "
            "file."
        ) from exc
    scalable = isinstance(font, ImageFont.FreeTypeFont)
    key = font.getname() if scalable else name
    # Pillow's small bitmap font is a last resort (see _resolve_fonts).
    if check_resemblance and (key in seen or not scalable):
        return None
    glyphs = _render_digits(font, Image, ImageDraw)
    problem = _check_glyphs(glyphs)
    if problem is not None:
        if check_resemblance:
            return None
        raise ValueError(
            f"The font {name!r} cannot be used: {problem}. Pass fonts that "
            "have the digits 0-9."
        )
    if check_resemblance and not _looks_like_digits(glyphs, reference):
        return None
    seen.add(key)
    return glyphs, name


def _glyph_cells(glyphs, resolution):
    """One font's glyphs scaled by one factor and centred in square cells.

    Returns the uint8 cells ``(10, resolution, resolution)``, the ink width
    of each glyph and the font's median ink height, in units of half a cell.
    """
    median_height = float(np.median([glyph.shape[0] for glyph in glyphs]))
    max_width = max(glyph.shape[1] for glyph in glyphs)
    scale = min(
        _GLYPH_HEIGHT * resolution / median_height, 0.95 * resolution / max_width
    )
    cells = np.zeros((10, resolution, resolution), dtype=np.uint8)
    for digit, glyph in enumerate(glyphs):
        height = min(resolution, max(1, round(glyph.shape[0] * scale)))
        width = min(resolution, max(1, round(glyph.shape[1] * scale)))
        scaled = F.interpolate(
            torch.from_numpy(glyph)[None, None],
            size=(height, width),
            mode="bilinear",
            align_corners=False,
            antialias=True,
        )[0, 0]
        top = (resolution - height) // 2
        left = (resolution - width) // 2
        cells[digit, top : top + height, left : left + width] = (
            (scaled.clamp(0, 1) * 255).round().to(torch.uint8).numpy()
        )
    widths = [2 * glyph.shape[1] * scale / resolution for glyph in glyphs]
    return cells, widths, 2 * median_height * scale / resolution


def _resolve_fonts(fonts, resolution):
    """The glyph atlas of the fonts asked for (see :func:`_glyph_atlas`)."""
    if fonts is None:
        # Pillow's font comes first and matters most: it is there on every
        # machine with Pillow >= 10.1.
        atlas = _glyph_atlas(
            (DEFAULT_FONT, *_find_font_files()), resolution, check_resemblance=True
        )
        if atlas is None:
            # Pillow < 10.1 without fonts on the machine: its bitmap font,
            # enlarged, is better than nothing.
            try:
                atlas = _glyph_atlas(
                    (DEFAULT_FONT,), resolution, check_resemblance=False
                )
            except ValueError:
                atlas = None
        if atlas is None:
            raise ValueError(
                "No usable font was found on this machine; pass the paths of "
                "TrueType or OpenType font files as `fonts`."
            )
        return atlas

    if isinstance(fonts, str | os.PathLike):
        fonts = [fonts]
    try:
        specs = [
            spec if spec == DEFAULT_FONT else os.fspath(spec) for spec in list(fonts)
        ]
    except TypeError as exc:
        raise ValueError(
            "fonts must be None or a list of font file paths (or "
            f"{DEFAULT_FONT!r} for Pillow's font), got {fonts!r} instead."
        ) from exc
    if not specs:
        raise ValueError(
            "fonts is an empty list; pass at least one font file path, or None "
            "to use the fonts found on this machine."
        )
    for spec in specs:
        if spec != DEFAULT_FONT and not os.path.isfile(spec):
            problem = "is a folder" if os.path.isdir(spec) else "does not exist"
            raise ValueError(
                f"The font file {spec!r} {problem}; pass the paths of "
                "existing .ttf, .otf or .ttc files, or None to use the fonts "
                "found on this machine."
            )
    specs = [spec if spec == DEFAULT_FONT else os.path.abspath(spec) for spec in specs]
    return _glyph_atlas(tuple(specs), resolution, check_resemblance=False)


# --------------------------------------------------------------------------
# make_synthetic_digits


def _check_positive_int(value, name, minimum=1):
    if (
        not isinstance(value, numbers.Integral)
        or isinstance(value, bool)
        or value < minimum
    ):
        raise ValueError(
            f"{name} must be an integer >= {minimum}, got {value!r} instead."
        )
    return int(value)


def _affine_thetas(rng, n, font_heights):
    """Random affine maps of the glyphs, as inputs of ``F.affine_grid``.

    Each maps output coordinates to glyph coordinates: the inverse of a
    scaling (to a random height and aspect ratio), a shear, a rotation and a
    shift, in this order.
    """
    height = rng.uniform(*_HEIGHT_RANGE, n)
    aspect = rng.uniform(*_ASPECT_RANGE, n)
    shear = rng.uniform(-_MAX_SHEAR, _MAX_SHEAR, n)
    angle = np.deg2rad(rng.uniform(-_MAX_ROTATION, _MAX_ROTATION, n))
    shift = rng.uniform(-1, 1, (n, 2)) * np.asarray(_MAX_SHIFT)

    # The output spans 2 units, so a digit of height h spans 2 h.
    zoom = 2 * height / font_heights
    scaling = np.zeros((n, 2, 2))
    scaling[:, 0, 0] = zoom * aspect
    scaling[:, 1, 1] = zoom
    shearing = np.tile(np.eye(2), (n, 1, 1))
    shearing[:, 0, 1] = shear
    cos, sin = np.cos(angle), np.sin(angle)
    rotation = np.stack([np.stack([cos, -sin], -1), np.stack([sin, cos], -1)], 1)
    inverse = np.linalg.inv(rotation @ shearing @ scaling)
    theta = np.concatenate([inverse, -inverse @ shift[:, :, None]], axis=2)
    return torch.from_numpy(theta.astype(np.float32))


def _sample_glyphs(atlas, index, theta, size):
    """Glyphs ``atlas[index]`` mapped by ``theta`` onto (n, 1, size, size)."""
    # The sampling grid of F.affine_grid (align_corners=False), computed
    # with broadcasting, which is faster.
    # grid[k, i, j] = theta[k] @ (x_j, y_i, 1)
    coords = (2 * torch.arange(size, dtype=torch.float32) + 1) / size - 1
    from_x = (theta[:, :, 0, None] * coords).transpose(1, 2)
    from_y = (theta[:, :, 1, None] * coords + theta[:, :, 2, None]).transpose(1, 2)
    grid = from_x[:, None, :, :] + from_y[:, :, None, :]
    glyphs = atlas[torch.from_numpy(index)].float() / 255
    return F.grid_sample(
        glyphs, grid, mode="bilinear", padding_mode="zeros", align_corners=False
    )


def _dilate(mask):
    """Grey-level dilation of ``mask`` by a 3 x 3 square."""
    padded = F.pad(mask, (1, 1, 1, 1))
    rows = torch.maximum(
        torch.maximum(padded[:, :, :-2], padded[:, :, 1:-1]), padded[:, :, 2:]
    )
    return torch.maximum(torch.maximum(rows[..., :-2], rows[..., 1:-1]), rows[..., 2:])


def _digit_masks(rng, glyphs, font, target, image_size):
    """Coverage masks (n, 1, image_size, image_size) in [0, 1] of the digits.

    ``glyphs`` is ``(atlas, widths, heights)`` of :func:`_glyph_atlas`.
    """
    atlas, widths, heights = glyphs
    n = len(target)
    size = _SUPERSAMPLING * image_size
    theta = _affine_thetas(rng, n, heights[font])
    mask = _sample_glyphs(atlas, 10 * font + target, theta, size)

    # Neighbouring digits of the same font, as in house numbers: the same
    # map, shifted by half the width of both digits plus a small gap.
    for side in (-1, 1):
        present = np.flatnonzero(rng.random_sample(n) < _NEIGHBOUR_PROBABILITY)
        digits = rng.randint(10, size=n)[present]
        gap = rng.uniform(0.05, 0.25, n)[present] * heights[font[present]]
        if present.size == 0:
            continue
        fonts = font[present]
        offset = 0.5 * (widths[fonts, target[present]] + widths[fonts, digits]) + gap
        shifted = theta[torch.from_numpy(present)].clone()
        shifted[:, 0, 2] -= side * torch.from_numpy(offset.astype(np.float32))
        neighbours = _sample_glyphs(atlas, 10 * fonts + digits, shifted, size)
        mask[torch.from_numpy(present)] = torch.maximum(
            mask[torch.from_numpy(present)], neighbours
        )

    # Bolder strokes for some images: a dilation by one supersampled pixel.
    bold = torch.from_numpy(np.flatnonzero(rng.random_sample(n) < _BOLD_PROBABILITY))
    mask[bold] = _dilate(mask[bold])
    return F.avg_pool2d(mask, _SUPERSAMPLING)


def _backgrounds_and_strokes(rng, n, image_size):
    """Backgrounds (n, 3, s, s) and stroke colours (n, 3, 1, 1) in [0, 1].

    The luma range of a textured background is narrowed to a random width
    of at most ``_MAX_BACKGROUND_SPREAD``, and the stroke luma is drawn from
    the values at least ``_MIN_CONTRAST`` darker or brighter than every
    background pixel, so the digit always stands out.
    """
    background = _procedural_textures(
        n, image_size, image_size, rng, flat_probability=_FLAT_PROBABILITY
    )
    luma = (background * _LUMA).sum(dim=1, keepdim=True)
    low = luma.amin(dim=(2, 3), keepdim=True)
    high = luma.amax(dim=(2, 3), keepdim=True)
    spread = _as_tensor(rng.uniform(0.05, _MAX_BACKGROUND_SPREAD, n), n, 1, 1, 1)
    factor = (spread / (high - low).clamp_min(1e-6)).clamp(max=1)
    mean = background.mean(dim=(2, 3), keepdim=True)
    background = mean + (background - mean) * factor
    mean_luma = luma.mean(dim=(2, 3), keepdim=True)
    low = mean_luma + (low - mean_luma) * factor
    high = mean_luma + (high - mean_luma) * factor

    # Since spread + 2 * contrast < 1, dark or bright strokes always fit.
    dark = (low - _MIN_CONTRAST).clamp(min=0)
    bright = (1 - _MIN_CONTRAST - high).clamp(min=0)
    u = _as_tensor(rng.random_sample(n), n, 1, 1, 1) * (dark + bright)
    stroke_luma = torch.where(u < dark, u, high + _MIN_CONTRAST + (u - dark))

    # A random colour, moved towards black or white to reach that luma.
    colour = _as_tensor(rng.random_sample((n, 3)), n, 3, 1, 1)
    colour_luma = (colour * _LUMA).sum(dim=1, keepdim=True)
    darker = colour * stroke_luma / colour_luma.clamp_min(1e-6)
    brighter = 1 - (1 - colour) * (1 - stroke_luma) / (1 - colour_luma).clamp_min(1e-6)
    stroke = torch.where(colour_luma > stroke_luma, darker, brighter).clamp(0, 1)
    return background, stroke


def _gaussian_blur(images, sigma, radius):
    """Blur each image with its own Gaussian, ``sigma`` (n,) in pixels."""
    n, channels, height, width = images.shape
    kernels = gaussian_kernel(sigma.clamp_min(1e-3), 2 * radius + 1)
    x = images.reshape(1, n * channels, height, width)
    x = F.pad(x, (radius, radius, radius, radius), mode="replicate")
    x = separable_conv(x, kernels.repeat_interleave(channels, dim=0), padding=0)
    return x.view(n, channels, height, width)


def _gaussian_noise(rng, shape):
    """Standard normal float32 noise from ``rng``, by the Box-Muller method.

    Several times faster than ``rng.standard_normal`` for large arrays.
    """
    size = math.prod(shape)
    half = (size + 1) // 2
    uniform = rng.random_sample(2 * half)
    # 1 - u lies in (0, 1], so its logarithm is finite.
    radius = torch.from_numpy((1 - uniform[:half]).astype(np.float32))
    radius = radius.log_().mul_(-2).sqrt_()
    angle = torch.from_numpy(uniform[half:].astype(np.float32)).mul_(2 * math.pi)
    normal = torch.empty(2 * half)
    torch.mul(radius, torch.cos(angle), out=normal[:half])
    torch.mul(radius, torch.sin(angle), out=normal[half:])
    return normal[:size].view(shape)


def make_synthetic_digits(
    n_samples=10000, *, image_size=32, fonts=None, random_state=None, return_X_y=True
):
    """Generate colour images of printed digits, like "Synthetic Digits".

    =================   ==========================================
    Classes                                                     10
    Samples per class   ``n_samples // 10`` or one more
    Image shape         3 x ``image_size`` x ``image_size``
    Pixel values                                     integer 0-255
    =================   ==========================================

    In the spirit of the "Synthetic Digits" (SynNumbers) set of Ganin &
    Lempitsky, a source domain for street-view house numbers (SVHN, see
    :func:`load_svhn`): each image shows one digit, the label, rendered in a
    random font at a random position, size and angle, with a random colour
    on a flat or textured background, often between neighbouring digits of
    the same font, blurred and noised by a random amount.

    The ten digits of each font are drawn once with Pillow, as masks; the
    images are then made from these masks in batches with torch, so 10,000
    images take a few seconds on one CPU core.

    Parameters
    ----------
    n_samples : int, default=10000
        Number of images.

    image_size : int, default=32
        Height and width of the images in pixels, at least 8.

    fonts : list of str or path-like, default=None
        Paths of the TrueType or OpenType font files (``.ttf``, ``.otf``,
        ``.ttc``) to draw the digits with; the entry ``"default"`` stands
        for Pillow's bundled font. These fonts are used as given, so they
        must have the digits 0-9. If None, Pillow's bundled font (on Pillow
        >= 10.1) is used with the fonts found in matplotlib's ``mpl-data``
        folder, if matplotlib is installed, and in the usual system font
        folders (``/usr/share/fonts``, ``~/.fonts``, ``/Library/Fonts``,
        ``%WINDIR%\\Fonts`` and the like). Found fonts that cannot be loaded,
        lack digits or draw other symbols in their place (such as math
        symbol fonts), and repeats of a family and style already found, are
        left out.

    random_state : int, RandomState instance or None, default=None
        Controls every random choice, listed in the Notes. Pass an int for
        reproducible output across multiple function calls.

    return_X_y : bool, default=True
        If True, return ``(X, y)``; if False, a Bunch that also tells which
        font drew each image.

    Returns
    -------
    X : ndarray of shape (n_samples, 3, image_size, image_size), dtype=uint8
        The RGB images, channels first like :func:`load_svhn`.

    y : ndarray of shape (n_samples,), dtype=int64
        The digit shown at the centre of each image, 0-9.

    data : :class:`~sklearn.utils.Bunch`
        If ``return_X_y`` is False, a dictionary-like object with the
        attributes ``data`` and ``target`` (``X`` and ``y`` above),
        ``font`` (int64 array of shape (n_samples,), the index in
        ``font_names`` of the font of each image), ``font_names`` (list of
        str, the fonts used: their paths, or a description of Pillow's font)
        and ``DESCR``.

    Raises
    ------
    ValueError
        If ``n_samples`` or ``image_size`` is not an integer of at least 1
        or 8, if a font file of ``fonts`` does not exist, cannot be loaded
        or lacks digits, or if ``fonts`` is None and no usable font is found.
    ImportError
        If Pillow is not installed, or was built without FreeType and
        ``fonts`` names font files.

    See Also
    --------
    make_mnist_m_like : Colour-textured versions of grey digits.

    Notes
    -----
    The classes are balanced (their counts differ by at most one) and come
    in random order. For each image, these are random: the font (uniformly
    among the fonts used); the digit height (50-80% of the image), aspect
    ratio (0.8-1.2), shear (up to 0.15), rotation (up to 15 degrees either
    way) and shift from the centre (up to 7.5% of the width and 5% of the
    height); a neighbouring digit on each side (probability 0.4 each, a
    random digit, spaced by a random gap); bolder strokes (probability
    0.25); the background, flat (probability 0.35) or a procedural texture
    (see :func:`make_mnist_m_like`) whose luma range is narrowed to at
    most 0.4; the stroke colour, whose luma differs from that of every
    background pixel by at least 0.25 (on a 0-1 scale) so the digit stays
    readable; a Gaussian blur of sigma up to ``1.2 * image_size / 32``
    pixels; and Gaussian pixel noise of standard deviation up to 0.05.

    The output depends on ``random_state``, ``n_samples``, ``image_size``
    and the fonts, and slightly on the versions of Pillow, FreeType and
    torch. With ``fonts=None`` the fonts are those of the machine, so the
    same seed can give other images elsewhere; pass ``fonts`` (for example
    ``["default"]``) to fix them.

    The original set was drawn with Windows fonts, which are not available
    here. As there (and in SVHN), parts of neighbouring digits may show; the
    label is always that of the digit nearest the centre.

    Y. Ganin and V. Lempitsky, "Unsupervised Domain Adaptation by
    Backpropagation", ICML 2015.

    Examples
    --------
    >>> from skassoc.datasets import make_synthetic_digits
    >>> X, y = make_synthetic_digits(20, fonts=["default"], random_state=0)
    >>> X.shape, X.dtype, y.dtype
    ((20, 3, 32, 32), dtype('uint8'), dtype('int64'))
    >>> sorted(set(y.tolist()))
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    """
    n_samples = _check_positive_int(n_samples, "n_samples")
    image_size = _check_positive_int(image_size, "image_size", _MIN_IMAGE_SIZE)
    _import_pillow()
    rng = check_random_state(random_state)

    # A cell a little larger than the supersampled digits, so that the
    # glyphs are seldom enlarged; capped to bound the memory of the atlas.
    resolution = min(256, 8 * math.ceil(1.1 * _SUPERSAMPLING * image_size / 8))
    *glyphs, names = _resolve_fonts(fonts, resolution)

    target = rng.permutation(np.arange(n_samples) % 10).astype(np.int64)
    font = rng.randint(len(names), size=n_samples).astype(np.int64)
    max_blur = _MAX_BLUR * image_size / 32
    radius = max(1, math.ceil(3 * max_blur))

    X = np.empty((n_samples, 3, image_size, image_size), dtype=np.uint8)
    with torch.no_grad():
        for start in range(0, n_samples, _CHUNK_SIZE):
            stop = min(start + _CHUNK_SIZE, n_samples)
            n = stop - start
            chunk = slice(start, stop)
            mask = _digit_masks(rng, glyphs, font[chunk], target[chunk], image_size)
            background, stroke = _backgrounds_and_strokes(rng, n, image_size)
            images = background + (stroke - background) * mask
            sigma = _as_tensor(rng.uniform(0, max_blur, n), n)
            images = _gaussian_blur(images, sigma, radius)
            noise_std = _as_tensor(rng.uniform(0, _MAX_NOISE, n), n, 1, 1, 1)
            images += noise_std * _gaussian_noise(rng, tuple(images.shape))
            X[start:stop] = (images.clamp_(0, 1) * 255).round_().to(torch.uint8).numpy()

    if return_X_y:
        return X, target
    return Bunch(
        data=X,
        target=target,
        font=font,
        font_names=list(names),
        DESCR=_SYNTHETIC_DESCR,
    )


# --------------------------------------------------------------------------
# make_mnist_m_like


def _check_grey_images(images):
    """``images`` as a uint8 array of shape (n, height, width)."""
    images = np.asarray(images)
    if images.ndim == 4 and images.shape[1] == 1:
        images = images[:, 0]
    if images.ndim != 3:
        raise ValueError(
            "images must be grey images of shape (n_images, height, width) or "
            f"(n_images, 1, height, width), got an array of shape {images.shape} "
            "instead; convert colour images to grey first."
        )
    if 0 in images.shape:
        raise ValueError(
            "images must hold at least one image of at least one pixel, got "
            f"an array of shape {images.shape}."
        )
    if images.dtype.kind not in "ui":
        hint = ""
        if images.dtype.kind == "f":
            hint = (
                "; for images scaled to [0, 1], pass "
                "(images * 255).round().astype(np.uint8)"
            )
        raise ValueError(
            "images must hold integer pixel values 0-255 (uint8), got "
            f"{images.dtype} data instead{hint}."
        )
    low, high = images.min(), images.max()
    if low < 0 or high > 255:
        raise ValueError(
            "images must hold pixel values 0-255, got values from "
            f"{low} to {high} instead."
        )
    return images.astype(np.uint8, copy=False)


def _check_textures(textures, height, width):
    """``textures`` as a list of uint8 arrays (3, H, W), H >= height, W >= width."""
    if isinstance(textures, np.ndarray) and textures.ndim == 4:
        textures = list(textures)
    elif isinstance(textures, np.ndarray):
        raise ValueError(
            "textures must be an array of shape (n_textures, 3, height, width) "
            "or a list of arrays of shape (3, height, width), got an array of "
            f"shape {textures.shape} instead."
        )
    textures = [np.asarray(texture) for texture in textures]
    if not textures:
        raise ValueError("textures is empty; pass at least one texture, or None.")
    for k, texture in enumerate(textures):
        if texture.ndim != 3 or texture.shape[0] != 3:
            hint = ""
            if texture.ndim == 3 and texture.shape[-1] == 3:
                hint = "; move the channels first with np.moveaxis(texture, -1, 0)"
            raise ValueError(
                f"textures[{k}] must be an RGB image of shape (3, height, width), "
                f"channels first, got shape {texture.shape} instead{hint}."
            )
        if texture.shape[1] < height or texture.shape[2] < width:
            raise ValueError(
                f"textures[{k}] of shape {texture.shape} is smaller than the "
                f"images ({height} x {width}); each texture must be at least as "
                "large as the images, since patches of their size are cut out "
                "of it."
            )
        if texture.dtype.kind not in "ui":
            raise ValueError(
                f"textures[{k}] must hold integer pixel values 0-255 (uint8), "
                f"got {texture.dtype} data instead."
            )
        if texture.size and (texture.min() < 0 or texture.max() > 255):
            raise ValueError(
                f"textures[{k}] must hold pixel values 0-255, got values from "
                f"{texture.min()} to {texture.max()}."
            )
    return [texture.astype(np.uint8, copy=False) for texture in textures]


def make_mnist_m_like(images, *, textures=None, random_state=None):
    """Blend grey digit images with colour textures, in the manner of MNIST-M.

    Each image gets a colour texture patch of its size, and the output is
    ``|texture - digit|`` per channel and pixel: the texture itself where the
    digit is black, its negative where the digit is white. MNIST-M (Ganin &
    Lempitsky) makes MNIST a target domain for models trained on plain
    MNIST this way.

    MNIST-M cuts its patches out of the colour photographs of the BSDS500
    data set, which is not available here; by default the textures are
    therefore generated procedurally (smooth and rough colour noise,
    gradients, plasma, stripes and blobs), which is why this function is
    named "like". Pass photographs as ``textures`` to follow the original
    recipe.

    Parameters
    ----------
    images : array-like of shape (n_images, height, width) or \
            (n_images, 1, height, width)
        Grey digit images with pixel values 0-255 (uint8, or another integer
        type), such as those of :func:`load_mnist`.

    textures : ndarray of shape (n_textures, 3, H, W), list of ndarrays of \
            shape (3, H_i, W_i), or None, default=None
        RGB images (channels first, pixel values 0-255) to cut the texture
        patches out of, each at least as large as ``images``. If None, the
        textures are generated procedurally.

    random_state : int, RandomState instance or None, default=None
        Controls the textures: pass an int for reproducible output across
        multiple function calls.

    Returns
    -------
    X : ndarray of shape (n_images, 3, height, width), dtype=uint8
        The textured RGB images, channels first, in the order of ``images``.

    Raises
    ------
    ValueError
        If ``images`` is not an array of grey images with pixel values
        0-255, or if ``textures`` is not a set of RGB images at least as large
        as ``images``.

    See Also
    --------
    load_mnist : The MNIST digits, the usual input.
    make_synthetic_digits : Printed digits, which use the same textures.

    Notes
    -----
    With ``textures=None``, each image gets its own procedural texture. A
    random scalar field mixes, with random weights, multi-octave value
    noise, a linear ramp in a random direction and a sum of three sinusoids
    of random frequency, direction and phase; a sigmoid of random steepness
    turns it from smooth shading into hard-edged blobs or stripes, and a
    palette of three random colours (around a random base colour, with a
    random spread) maps it to colours, which are blended with a random
    share of multi-octave colour noise. With ``textures`` given, each image
    gets a patch of a texture drawn at random, at a random position.

    The textures depend only on ``random_state`` and the shape of
    ``images``, not on their pixel values: for the same seed, images of the
    same shape get the same textures.

    Y. Ganin and V. Lempitsky, "Unsupervised Domain Adaptation by
    Backpropagation", ICML 2015.

    Examples
    --------
    >>> import numpy as np
    >>> from skassoc.datasets import make_mnist_m_like
    >>> digits = np.zeros((5, 28, 28), dtype=np.uint8)
    >>> digits[:, 8:20, 12:16] = 255  # a white bar, like a "1"
    >>> X = make_mnist_m_like(digits, random_state=0)
    >>> X.shape, X.dtype
    ((5, 3, 28, 28), dtype('uint8'))
    >>> textures = make_mnist_m_like(np.zeros_like(digits), random_state=0)
    >>> bool(np.all(X == np.abs(textures.astype(int) - digits[:, None])))
    True
    """
    images = _check_grey_images(images)
    n, height, width = images.shape
    if textures is not None:
        textures = _check_textures(textures, height, width)
    rng = check_random_state(random_state)

    X = np.empty((n, 3, height, width), dtype=np.uint8)
    if textures is None:
        with torch.no_grad():
            for start in range(0, n, _CHUNK_SIZE):
                stop = min(start + _CHUNK_SIZE, n)
                patches = _procedural_textures(stop - start, height, width, rng)
                X[start:stop] = (patches * 255).round_().to(torch.uint8).numpy()
    else:
        choice = rng.randint(len(textures), size=n)
        sizes = np.array([texture.shape[1:] for texture in textures])[choice]
        top = (rng.random_sample(n) * (sizes[:, 0] - height + 1)).astype(np.intp)
        left = (rng.random_sample(n) * (sizes[:, 1] - width + 1)).astype(np.intp)
        for i in range(n):
            X[i] = textures[choice[i]][
                :, top[i] : top[i] + height, left[i] : left[i] + width
            ]
    # |texture - digit| in uint8 arithmetic, without a wider temporary.
    digits = images[:, None]
    return np.maximum(X, digits) - np.minimum(X, digits)
