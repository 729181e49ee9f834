import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from skassoc import SemiSupervisedAssociationClassifier
from skassoc._engine._augmentation import ImageAugmentation, resolve_augmentation
from skassoc._engine._batches import DeviceBatches
from skassoc._nn._networks import MNISTNet


@pytest.fixture
def images():
    torch.manual_seed(0)
    return torch.rand(6, 3, 12, 10) * 255


def test_no_op_settings_return_the_input(images):
    augment = ImageAugmentation(
        affine_std=0, translate_std=0, blur_probability=0, invert_probability=0
    )
    torch.testing.assert_close(augment(images), images)


def test_identity_affine_warp_keeps_pixels(images):
    # Zero noise is the identity map; bilinear sampling at pixel centres must
    # then reproduce the image.
    augment = ImageAugmentation(
        affine_std=0, translate_std=0, blur_probability=0, invert_probability=0
    )
    out = augment._warp(images, 12, 10)
    torch.testing.assert_close(out, images, atol=1e-3, rtol=0)


def test_whole_pixel_translation_shifts_the_image():
    image = torch.zeros(1, 1, 9, 9)
    image[0, 0, 4, 4] = 255
    augment = ImageAugmentation(affine_std=0, translate_std=1.0, blur_probability=0)
    torch.manual_seed(0)
    out = augment(image)
    # The bright pixel moved, and a bilinear warp keeps the total mass
    # approximately (reflection keeps it inside).
    assert out[0, 0, 4, 4] < 255
    assert out.sum().item() == pytest.approx(255, rel=0.05)


def test_inversion_with_probability_one(images):
    augment = ImageAugmentation(
        affine_std=0, translate_std=0, blur_probability=0, invert_probability=1
    )
    torch.testing.assert_close(augment(images), (images - 255).abs())


def test_blur_smooths_and_keeps_the_mean():
    torch.manual_seed(0)
    noise = torch.rand(4, 1, 16, 16) * 255
    augment = ImageAugmentation(affine_std=0, translate_std=0, blur_probability=1)
    out = augment(noise)
    assert out.std() < 0.5 * noise.std()
    assert out.mean().item() == pytest.approx(noise.mean().item(), rel=0.05)


def test_blur_probability_is_per_image():
    torch.manual_seed(0)
    noise = torch.rand(400, 1, 8, 8) * 255
    augment = ImageAugmentation(affine_std=0, translate_std=0, blur_probability=0.5)
    out = augment(noise)
    changed = (out - noise).abs().flatten(1).amax(1) > 1e-3
    assert 0.35 < changed.float().mean().item() < 0.65


@pytest.mark.parametrize("alpha, sigma", [(34.0, 4.0), (10.0, 2.0)])
def test_elastic_field_is_smooth_and_of_the_documented_size(alpha, sigma):
    # Uniform noise in [-1, 1] smoothed by a normalised Gaussian has standard
    # deviation about 0.163 / sigma; PAPER_AUGMENTATION's comment says so.
    torch.manual_seed(0)
    augment = ImageAugmentation(elastic_alpha=alpha, elastic_sigma=sigma)
    height, width = 40, 30
    field = augment._elastic_field(500, height, width, "cpu")
    assert field.shape == (500, height, width, 2)
    # Back to pixels; the centre, away from the zero padding at the border.
    pixels_x = field[..., 0] * width / 2
    pixels_y = field[..., 1] * height / 2
    margin = int(3 * sigma)
    for pixels in (pixels_x, pixels_y):
        centre = pixels[:, margin:-margin, margin:-margin]
        assert centre.std().item() == pytest.approx(0.163 * alpha / sigma, rel=0.15)
    # Smooth: a pixel moves almost like its neighbour, and images differ.
    neighbours = torch.corrcoef(
        torch.stack([pixels_x[:, :, 10:-10].flatten(), pixels_x[:, :, 11:-9].flatten()])
    )[0, 1]
    assert neighbours > 0.9
    assert (pixels_x[0] - pixels_x[1]).abs().max() > 0.5


def _stroke_centres(images):
    """Ink centroid (column) of every row of every image, NaN on empty rows."""
    columns = torch.arange(images.shape[-1], dtype=images.dtype)
    ink = images.sum(-1).squeeze(1)
    return (images.squeeze(1) * columns).sum(-1) / ink


def test_elastic_distortion_bends_the_stroke_in_place():
    image = torch.zeros(8, 1, 28, 28)
    image[:, :, 4:24, 13:15] = 255  # a vertical stroke, centred on 13.5
    elastic = ImageAugmentation(
        affine_std=0,
        translate_std=0,
        blur_probability=0,
        elastic_alpha=34.0,
        elastic_sigma=4.0,
    )
    shift = ImageAugmentation(affine_std=0, translate_std=1.0, blur_probability=0)
    torch.manual_seed(0)
    bent, shifted = elastic(image), shift(image)
    assert torch.isfinite(bent).all()
    assert (bent[0] - bent[1]).abs().max() > 50  # a field per image
    # Bent: the stroke's centre moves from row to row, where a rigid shift
    # moves every row alike. Rows 8-19 hold ink in every warped image.
    bent_centres = _stroke_centres(bent)[:, 8:20]
    shifted_centres = _stroke_centres(shifted)[:, 8:20]
    assert (bent_centres.std(1) > 0.1).all()
    assert bent_centres.std(1).median() > 0.3
    assert (shifted_centres.std(1) < 0.01).all()
    # In place: displacements of about 1.4 pixels keep the ink near the
    # original columns, and none reaches the left third of the image.
    assert ((bent_centres - 13.5).abs() < 4).all()
    assert (bent[:, :, :, :8].amax((1, 2, 3)) < 1).all()


def test_elastic_off_leaves_the_random_stream_alone(images):
    # Results of earlier runs stay reproducible: with elastic_alpha=0 the
    # warp draws the same random numbers as before the option existed (the
    # affine noise, the shifts and the blur choice), and nothing more.
    torch.manual_seed(0)
    ImageAugmentation()(images)
    next_draw = torch.rand(1)
    torch.manual_seed(0)
    torch.randn(6, 2, 2)
    torch.randn(6, 2)
    torch.rand(6, 1, 1, 1)
    assert torch.equal(torch.rand(1), next_draw)


def resolve_images(augmentation):
    """The settings of ``augmentation`` for image inputs."""
    return resolve_augmentation(augmentation, feature_vectors=False)


def test_resolve_augmentation():
    assert resolve_images(None) is None
    assert resolve_images("auto") is None
    assert resolve_images("paper")["affine_std"] == 0.15
    assert resolve_images({"invert_probability": 0.5})["blur_probability"] == 0.5
    with pytest.raises(ValueError, match="Unknown augmentation"):
        resolve_images({"rotate": 1})
    with pytest.raises(ValueError, match="probability"):
        resolve_images({"blur_probability": 2})
    assert resolve_images("paper")["unlabeled"] is True
    # A zero blur width is fine when the blur is off.
    off = resolve_images({"blur_probability": 0, "blur_sigma": 0})
    assert off["blur_sigma"] == 0
    assert resolve_images({"unlabeled": np.False_})["unlabeled"] is False
    assert resolve_images("paper")["elastic_alpha"] == 0
    with pytest.raises(ValueError, match="elastic_sigma'\\] must be > 0"):
        resolve_images({"elastic_alpha": 34, "elastic_sigma": 0})
    with pytest.raises(ValueError, match="elastic_alpha'\\] must be a finite"):
        resolve_images({"elastic_alpha": -1})
    with pytest.raises(ValueError, match="unlabeled.*True.*False"):
        resolve_images({"unlabeled": "labeled"})


def _all_digit_images():
    X, y = load_digits(return_X_y=True)
    return (X * 15).astype(np.uint8).reshape(-1, 8, 8), y


# Neither affine warp nor blur: each test below switches on one thing only.
NO_WARP = {"affine_std": 0.0, "translate_std": 0.0, "blur_probability": 0.0}


def _fit_on_digit_images(images, augmentation):
    X, y = images
    return SemiSupervisedAssociationClassifier(
        augmentation=augmentation,
        labeled_per_class=5,
        max_iter=150,
        device="cpu",
        random_state=0,
        # Frequencies estimated on the raw images would describe a model
        # trained on other ones (inverted, for one test); these tests are
        # about the network.
        class_prior="uniform",
    ).fit(X, y)


def test_the_network_learns_from_the_augmented_images(
    bright_digit_images, torch_single_thread
):
    # Inversion of every image (and nothing else): trained only on inverted
    # digits, the model must recognise inverted digits far better than the
    # originals it never saw.
    clf = _fit_on_digit_images(
        bright_digit_images, {**NO_WARP, "invert_probability": 1.0}
    )
    X_all, y_all = _all_digit_images()
    on_inverted = clf.score(255 - X_all, y_all)
    assert on_inverted > 0.8
    assert on_inverted - clf.score(X_all, y_all) > 0.3


def test_fit_with_elastic_labeled_augmentation(
    bright_digit_images, torch_single_thread
):
    # Elastic distortion alone (the paper's warp is too strong for 8x8 digits
    # in 150 steps), of about half a pixel per axis. Displacements ten times
    # too large bring the score near 0.2.
    clf = _fit_on_digit_images(
        bright_digit_images,
        {**NO_WARP, "elastic_alpha": 3.0, "elastic_sigma": 1.0, "unlabeled": False},
    )
    assert np.isfinite(clf.history_["total"]).all()
    assert clf.score(*_all_digit_images()) > 0.75


@pytest.mark.parametrize("consistency_weight", [0.0, 1.0])
@pytest.mark.parametrize("unlabeled", [True, False])
def test_unlabeled_setting_chooses_the_augmented_rows(
    monkeypatch, bright_digit_images, unlabeled, consistency_weight
):
    # A stand-in augmentation that adds 1000 to every pixel it gets: the
    # network must see each batch row as drawn, plus 1000 exactly where the
    # setting asks for augmentation. The consistency loss appends the drawn
    # unlabeled rows warped once (never the first view warped again); without
    # it, the step augments once and embeds nothing more.
    X, y = bright_digit_images
    drawn, seen, augmented = [], [], []
    draw_batch = DeviceBatches.batch
    network_forward = MNISTNet.forward

    def record_draw(self):
        batch = draw_batch(self)
        drawn.append(batch.clone())
        return batch

    def record_input(self, x):
        if self.training:
            seen.append(x.clone())
        return network_forward(self, x)

    def stand_in(self, x):
        augmented.append(x.shape[0])
        return x + 1000.0

    monkeypatch.setattr(DeviceBatches, "batch", record_draw)
    monkeypatch.setattr(ImageAugmentation, "forward", stand_in)
    monkeypatch.setattr(MNISTNet, "forward", record_input)
    clf = SemiSupervisedAssociationClassifier(
        network="mnist",
        augmentation={"unlabeled": unlabeled},
        consistency_weight=consistency_weight,
        labeled_per_class=2,
        unlabeled_batch_size=7,
        max_iter=3,
        device="cpu",
        random_state=0,
    ).fit(X, y)
    n_labeled = 2 * len(clf.classes_)
    calls = [n_labeled + 7] if unlabeled else [n_labeled]
    if consistency_weight:
        calls.append(7)
    assert augmented == calls * 3
    assert len(seen) == len(drawn) == 3
    for batch, network_input in zip(drawn, seen, strict=True):
        # The batch is the labeled rows, then the unlabeled ones.
        unlabeled_rows = batch[n_labeled:]
        views = [batch[:n_labeled] + 1000.0, unlabeled_rows + 1000.0 * unlabeled]
        if consistency_weight:
            views.append(unlabeled_rows + 1000.0)
        torch.testing.assert_close(network_input, torch.cat(views), rtol=0, atol=0)


def test_augmentation_needs_images(bright_digit_images):
    X, y = bright_digit_images
    clf = SemiSupervisedAssociationClassifier(
        augmentation="paper", max_iter=5, device="cpu"
    )
    with pytest.raises(ValueError, match="needs image inputs"):
        clf.fit(X.reshape(len(X), -1), y)


def test_ema_decay_zero_is_the_last_step_and_high_decay_stays_at_init(
    bright_digit_images,
):
    X, y = bright_digit_images
    params = dict(network="mlp", hidden_layer_sizes=(16,), max_iter=30, device="cpu")
    plain = SemiSupervisedAssociationClassifier(**params, random_state=0).fit(X, y)
    ema0 = SemiSupervisedAssociationClassifier(
        **params, ema_decay=0.0, random_state=0
    ).fit(X, y)
    np.testing.assert_allclose(ema0.predict_proba(X), plain.predict_proba(X))

    def weights(**extra):
        clf = SemiSupervisedAssociationClassifier(**{**params, **extra}).fit(X, y)
        return torch.cat([p.detach().flatten() for p in clf.model_.parameters()])

    # An average that barely moves stays at the initial weights, which are
    # the same for every fit with the same seed.
    start = weights(max_iter=1, ema_decay=0.999999, random_state=0)
    averaged = weights(ema_decay=0.999999, random_state=0)
    trained = weights(random_state=0)
    assert (averaged - start).abs().max() < 1e-4
    assert (trained - start).abs().max() > 1e-2
