"""The built-in embedding networks, the logit head and the network helpers."""

import math

import numpy as np
import pytest
import torch
from torch import nn

from skassoc._nn._networks import (
    NETWORKS,
    AssociationModel,
    MLPNet,
    MNISTNet,
    SmallImageNet,
    STL10Net,
    SVHNNet,
    auto_network_name,
    build_network,
    pixel_range,
    weight_tensors,
)

# (network class, input_shape, embedding_dim, batch size)
IMAGE_CASES = [
    (MNISTNet, (1, 28, 28), 128, 3),
    (MNISTNet, (1, 8, 8), 16, 3),
    (MNISTNet, (3, 9, 13), 8, 2),  # odd sizes: the flatten width must match
    (SVHNNet, (3, 32, 32), 128, 3),
    (SVHNNet, (1, 32, 32), 32, 3),
    (SVHNNet, (2, 11, 20), 8, 2),
    (STL10Net, (3, 96, 96), 128, 2),
    (STL10Net, (1, 33, 40), 8, 2),
]
ELU_EMBEDDING = [MNISTNet, SVHNNet]


@pytest.fixture(autouse=True, scope="module")
def single_thread():
    """Tiny convolutions run far faster on one thread than on a busy pool."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def raw_images(n, shape, seed=0):
    """Float images with pixel values in 0..255, as the estimator passes them."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, *shape), generator=generator).float()


def final_linear(net):
    return [m for m in net.embedding.modules() if isinstance(m, nn.Linear)][-1]


@pytest.mark.parametrize("cls, shape, dim, n", IMAGE_CASES)
def test_image_network_maps_raw_images_to_embeddings(cls, shape, dim, n):
    torch.manual_seed(0)
    net = cls(shape, embedding_dim=dim)
    out = net(raw_images(n, shape))
    assert out.shape == (n, dim)
    assert out.dtype == torch.float32
    assert torch.isfinite(out).all()
    # Different images give different embeddings (the input is actually used).
    assert not torch.allclose(out[0], out[1])


@pytest.mark.parametrize("cls, shape, dim, n", IMAGE_CASES)
def test_embedding_nonlinearity(cls, shape, dim, n):
    torch.manual_seed(0)
    net = cls(shape, embedding_dim=dim).eval()
    # Blow up the last linear layer: an ELU embedding saturates at -1, a
    # linear one goes far below it.
    with torch.no_grad():
        final_linear(net).weight.mul_(1000.0)
        out = net(raw_images(n, shape))
    if cls in ELU_EMBEDDING:
        assert out.min() >= -1.0
        assert out.min() < -0.99  # saturated ELU, not a ReLU
    else:
        assert out.min() < -5.0


def test_mnist_embedding_is_elu_of_linear():
    torch.manual_seed(0)
    net = MNISTNet((1, 12, 12), embedding_dim=16)
    x = raw_images(4, (1, 12, 12))
    with torch.no_grad():
        flat = net.features(x / 255.0).flatten(1)
        pre = final_linear(net)(flat)
        torch.testing.assert_close(net(x), nn.functional.elu(pre))


@pytest.mark.parametrize(
    "net",
    [
        pytest.param(lambda: MNISTNet((1, 28, 28)), id="mnist"),
        pytest.param(lambda: SVHNNet((3, 32, 32)), id="svhn"),
        pytest.param(lambda: STL10Net((3, 96, 96)), id="stl10"),
        pytest.param(lambda: MLPNet(20, (64, 32), 16), id="mlp"),
        pytest.param(
            lambda: AssociationModel(MLPNet(20, (64,), 16), 16, 10), id="model"
        ),
    ],
)
def test_xavier_uniform_weights_and_zero_biases(net):
    torch.manual_seed(0)
    net = net()
    layers = [m for m in net.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    assert layers
    for layer in layers:
        weight = layer.weight.detach()
        receptive = weight[0, 0].numel() if weight.ndim > 2 else 1
        fan_in = weight.shape[1] * receptive
        fan_out = weight.shape[0] * receptive
        bound = math.sqrt(6.0 / (fan_in + fan_out))
        assert weight.abs().max() <= bound + 1e-7
        # A uniform draw on [-bound, bound] fills the interval (PyTorch's
        # default init would stay well inside it for these layers).
        assert weight.abs().max() > 0.9 * bound
        assert weight.min() < 0 < weight.max()
        assert layer.bias is not None
        assert torch.count_nonzero(layer.bias) == 0


def test_xavier_bound_excludes_pytorch_default_init():
    # The bound check above must be able to fail: PyTorch's default init of
    # the first MNIST convolution (1 -> 32, 3x3) exceeds the Xavier bound.
    torch.manual_seed(0)
    conv = nn.Conv2d(1, 32, 3)
    bound = math.sqrt(6.0 / (9 + 32 * 9))
    assert conv.weight.abs().max() > bound


def test_mnist_net_divides_by_255():
    torch.manual_seed(0)
    net = MNISTNet((1, 28, 28), embedding_dim=32)
    x = raw_images(3, (1, 28, 28))
    with torch.no_grad():
        expected = net.embedding(net.features(x / 255.0))
        torch.testing.assert_close(net(x), expected)
        # ... and is not invariant to the raw scale (no per-image normalisation).
        assert not torch.allclose(net(x), net(0.5 * x), atol=1e-4)


def test_svhn_net_is_invariant_to_per_image_affine_brightness():
    torch.manual_seed(0)
    net = SVHNNet((3, 32, 32), embedding_dim=32)
    x = raw_images(4, (3, 32, 32))
    generator = torch.Generator().manual_seed(1)
    gain = 0.2 + 2.0 * torch.rand(4, 3, 1, 1, generator=generator)
    offset = 100.0 * torch.randn(4, 3, 1, 1, generator=generator)
    with torch.no_grad():
        reference = net(x)
        torch.testing.assert_close(
            net(x * gain + offset), reference, atol=1e-4, rtol=1e-4
        )
        torch.testing.assert_close(net(x / 255.0), reference, atol=1e-4, rtol=1e-4)
        # A negative gain (inverted image) is a different image.
        assert not torch.allclose(net(255.0 - x), reference, atol=1e-3)


def test_svhn_net_handles_constant_images():
    torch.manual_seed(0)
    net = SVHNNet((1, 16, 16), embedding_dim=8)
    x = torch.full((2, 1, 16, 16), 37.0)
    out = net(x)
    assert torch.isfinite(out).all()


def test_stl10_net_batch_norms_start_untouched():
    # Building the network probes its output size; that must not count as a
    # batch for the batch norms' running statistics.
    net = STL10Net((3, 32, 32), embedding_dim=8)
    norms = [m for m in net.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert norms
    for norm in norms:
        assert int(norm.num_batches_tracked) == 0
        assert torch.equal(norm.running_mean, torch.zeros_like(norm.running_mean))
        assert torch.equal(norm.running_var, torch.ones_like(norm.running_var))
    assert net.training


def test_stl10_net_uses_centred_inputs():
    torch.manual_seed(0)
    net = STL10Net((3, 32, 32), embedding_dim=8).eval()
    x = raw_images(2, (3, 32, 32))
    with torch.no_grad():
        expected = net.embedding(net.features((x - 128.0) / 128.0))
        torch.testing.assert_close(net(x), expected)


@pytest.mark.parametrize("shape", [(5,), (2, 3)])
def test_mlp_net_maps_features_to_embeddings(shape):
    torch.manual_seed(0)
    n_features = math.prod(shape)
    net = MLPNet(n_features, (16, 8), embedding_dim=4)
    x = torch.randn(7, *shape)
    out = net(x)
    assert out.shape == (7, 4)
    assert out.min() >= -1.0  # ELU embedding
    linear = [m for m in net.modules() if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linear] == [
        (n_features, 16),
        (16, 8),
        (8, 4),
    ]


def test_mlp_fit_normalization_standardizes_first_layer_input():
    torch.manual_seed(0)
    n, n_features = 500, 5
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(n, n_features, generator=generator, dtype=torch.float64)
    x = x * torch.tensor([1.0, 10.0, 1e-3, 1.0, 50.0], dtype=torch.float64)
    x = x + torch.tensor([0.0, -40.0, 5.0, 1e4, 255.0], dtype=torch.float64)
    x[:, 3] = 7.0  # a constant feature
    net = MLPNet(n_features, (8,), embedding_dim=4, input_clip=None)
    net.fit_normalization(x)

    seen = []
    net.layers[0].register_forward_hook(lambda m, inputs, out: seen.append(inputs[0]))
    with torch.no_grad():
        out = net(x.float())
    standardized = seen[0].double()
    assert torch.isfinite(out).all()
    assert torch.isfinite(standardized).all()
    varying = [0, 1, 2, 4]
    torch.testing.assert_close(
        standardized[:, varying].mean(0),
        torch.zeros(4, dtype=torch.float64),
        atol=1e-3,
        rtol=0,
    )
    torch.testing.assert_close(
        standardized[:, varying].std(0, unbiased=False),
        torch.ones(4, dtype=torch.float64),
        atol=1e-3,
        rtol=0,
    )
    # The constant feature becomes exactly zero, not NaN.
    assert torch.count_nonzero(standardized[:, 3]) == 0


def test_mlp_normalization_is_saved_in_state_dict():
    net = MLPNet(3, (4,), embedding_dim=2)
    net.fit_normalization(torch.tensor([[1.0, 2.0, 3.0], [3.0, 2.0, 5.0]]))
    state = net.state_dict()
    torch.testing.assert_close(state["mean"], torch.tensor([2.0, 2.0, 4.0]))
    torch.testing.assert_close(state["scale"], torch.tensor([1.0, 1.0, 1.0]))
    clone = MLPNet(3, (4,), embedding_dim=2)
    clone.load_state_dict(state)
    x = torch.randn(5, 3)
    torch.testing.assert_close(clone(x), net(x))


@pytest.mark.parametrize(
    "cls, shape, min_size",
    [
        (MNISTNet, (1, 7, 7), 8),
        (MNISTNet, (1, 28, 5), 8),
        (SVHNNet, (3, 4, 32), 8),
        (STL10Net, (3, 31, 96), 32),
        (STL10Net, (3, 28, 28), 32),
    ],
)
def test_too_small_images_raise_helpful_error(cls, shape, min_size):
    with pytest.raises(ValueError, match=f"at least {min_size}x{min_size}") as info:
        cls(shape)
    message = str(info.value)
    assert cls.__name__ in message
    assert f"{shape[1]}x{shape[2]}" in message
    assert "mlp" in message


@pytest.mark.parametrize("cls", [MNISTNet, SVHNNet, STL10Net])
@pytest.mark.parametrize("shape", [(28, 28), (1, 1, 28, 28)])
def test_image_network_needs_three_dimensional_shape(cls, shape):
    with pytest.raises(ValueError, match="input_shape"):
        cls(shape)


@pytest.mark.parametrize(
    "shape, name",
    [
        (None, "mlp"),
        ((3, 32, 32), "svhn"),
        ((1, 32, 32), "svhn"),
        ((3, 96, 96), "stl10"),
        ((1, 28, 28), "mnist"),
        ((3, 64, 64), "mnist"),
        ((1, 8, 8), "small"),
        ((1, 16, 16), "small"),
        ((3, 27, 27), "small"),
        ((1, 16, 28), "mnist"),
        ((1, 32, 96), "mnist"),
        ((1, 7, 7), "mlp"),
        ((1, 8, 7), "mlp"),
        ((3, 2, 100), "mlp"),
    ],
)
def test_auto_network_name(shape, name):
    assert auto_network_name(shape) == name
    if shape is not None and name != "mlp":
        # The chosen network accepts the shape.
        NETWORKS[name](shape, embedding_dim=4)


@pytest.mark.parametrize("name", ["mnist", "svhn", "stl10"])
def test_build_network_image_networks_need_input_shape(name):
    with pytest.raises(ValueError, match=f"network={name!r} needs image inputs"):
        build_network(name, None, 784, 16, (32,))


def test_build_network_builds_the_named_network():
    torch.manual_seed(0)
    mnist = build_network("mnist", [1, 12, 12], 144, 16, (32,))
    assert type(mnist) is MNISTNet
    assert mnist(raw_images(2, (1, 12, 12))).shape == (2, 16)
    svhn = build_network("svhn", (3, 32, 32), 3072, 8, ())
    assert type(svhn) is SVHNNet
    assert svhn(raw_images(2, (3, 32, 32))).shape == (2, 8)
    mlp = build_network("mlp", None, 10, 6, [32, 16])
    assert type(mlp) is MLPNet
    widths = [m.out_features for m in mlp.modules() if isinstance(m, nn.Linear)]
    assert widths == [32, 16, 6]
    # The MLP ignores an image shape: it works on flattened rows.
    mlp_image = build_network("mlp", (1, 2, 5), 10, 6, [4])
    assert mlp_image(torch.randn(3, 1, 2, 5)).shape == (3, 6)


def test_weight_tensors_selects_weights_with_their_scales():
    torch.manual_seed(0)
    model = AssociationModel(STL10Net((3, 32, 32), embedding_dim=8), 8, 5)
    weights, scales = weight_tensors(model, 1e-3, 1e-4)
    assert len(weights) == len(scales)
    expected = {id(p) for p in model.parameters() if p.ndim > 1}
    assert {id(w) for w in weights} == expected
    assert len(weights) == len(expected)  # no duplicates
    # Biases and batch-norm parameters are not decayed.
    assert all(w.ndim > 1 for w in weights)
    excluded = [p for p in model.parameters() if id(p) not in expected]
    assert excluded and all(p.ndim == 1 for p in excluded)
    by_id = {id(w): s for w, s in zip(weights, scales)}
    assert by_id[id(model.logits.weight)] == 1e-4
    others = [s for w, s in zip(weights, scales) if w is not model.logits.weight]
    assert others and all(s == 1e-3 for s in others)


def test_weight_tensors_only_the_head_gets_the_logit_scale():
    class Custom(nn.Module):
        def __init__(self):
            super().__init__()
            # A submodule named like the head must still get the embedder scale.
            self.logits = nn.Linear(4, 3)
            self.frozen = nn.Linear(3, 3)
            self.frozen.weight.requires_grad_(False)

        def forward(self, x):
            return self.frozen(self.logits(x))

    model = AssociationModel(Custom(), 3, 2)
    weights, scales = weight_tensors(model, 0.5, 0.25)
    pairs = {id(w): s for w, s in zip(weights, scales)}
    assert pairs == {
        id(model.embedder.logits.weight): 0.5,
        id(model.logits.weight): 0.25,
    }


@pytest.mark.parametrize(
    "embedder, shape, dim",
    [
        (lambda: MLPNet(6, (8,), embedding_dim=5), (6,), 5),
        (lambda: MNISTNet((1, 8, 8), embedding_dim=12), (1, 8, 8), 12),
    ],
)
def test_association_model_returns_embeddings_and_logits(embedder, shape, dim):
    torch.manual_seed(0)
    embedder = embedder()
    model = AssociationModel(embedder, dim, n_classes=7)
    x = raw_images(4, shape)
    embeddings, logits = model(x)
    assert embeddings.shape == (4, dim)
    assert logits.shape == (4, 7)
    with torch.no_grad():
        torch.testing.assert_close(embeddings, embedder(x))
        torch.testing.assert_close(logits, model.logits(embeddings))
    # Gradients reach the embedder through the logits.
    logits.sum().backward()
    assert all(p.grad is not None for p in embedder.parameters())


# ------------------------------------------------ small images, input scale


@pytest.mark.parametrize("shape", [(1, 8, 8), (1, 16, 16), (3, 16, 16), (1, 9, 27)])
def test_small_image_net_maps_small_images_to_embeddings(shape):
    torch.manual_seed(0)
    net = SmallImageNet(shape, embedding_dim=16)
    out = net(raw_images(3, shape))
    assert out.shape == (3, 16)
    assert torch.isfinite(out).all()
    assert not torch.allclose(out[0], out[1])
    # Two poolings, not three: an 8x8 image keeps 2x2 positions.
    pools = [m for m in net.features if isinstance(m, nn.MaxPool2d)]
    assert len(pools) == 2


def test_build_network_builds_the_small_net():
    net = build_network("small", (1, 8, 8), 64, 32, (256,))
    assert type(net) is SmallImageNet


def conv_input(net, x):
    """What the first convolution of an image network sees for ``x``."""
    seen = []
    first = next(m for m in net.modules() if isinstance(m, nn.Conv2d))
    handle = first.register_forward_hook(lambda m, i, o: seen.append(i[0]))
    with torch.no_grad():
        net.eval()(x)
    handle.remove()
    return seen[0]


@pytest.mark.parametrize(
    "cls, shape",
    [
        (MNISTNet, (1, 8, 8)),
        (SmallImageNet, (1, 8, 8)),
        (STL10Net, (1, 32, 32)),
        (SVHNNet, (1, 8, 8)),
    ],
)
def test_learned_scale_makes_pixel_ranges_equivalent(cls, shape):
    # The same images as 0..255, 0..16, 0..1 and -1..1 values.
    generator = torch.Generator().manual_seed(0)
    levels = torch.randint(0, 17, (6, *shape), generator=generator).double()
    levels[0].view(-1)[:2] = torch.tensor([0.0, 16.0])  # the full range occurs
    encodings = [levels * 255 / 16, levels, levels / 16, levels / 8 - 1]
    seen = []
    for x in encodings:
        torch.manual_seed(0)
        net = cls(shape, embedding_dim=8)
        net.fit_normalization(x.numpy())
        seen.append(conv_input(net, x.float()))
    for other in seen[1:]:
        torch.testing.assert_close(other, seen[0], atol=1e-5, rtol=1e-5)


def test_mnist_net_on_8bit_data_computes_exactly_x_over_255():
    torch.manual_seed(0)
    x = raw_images(4, (1, 28, 28))
    net = MNISTNet().eval()
    net.fit_normalization(x.to(torch.uint8).numpy())
    assert float(net.input_scale.offset) == 0.0
    assert float(net.input_scale.scale) == 255.0
    with torch.no_grad():
        assert torch.equal(conv_input(net, x), x / 255.0)
        assert torch.equal(net(x), net.embedding(net.features(x / 255.0)))


def test_stl10_net_on_8bit_data_is_unchanged():
    torch.manual_seed(0)
    x = raw_images(2, (3, 40, 40))
    net = STL10Net((3, 40, 40), embedding_dim=8).eval()
    net.fit_normalization(x)
    with torch.no_grad():
        assert torch.equal(conv_input(net, x), (x - 128.0) / 128.0)


def test_dark_8bit_images_keep_the_8bit_scale():
    # Values up to 200 are still 8-bit pixels, not a range to stretch.
    x = torch.full((2, 1, 8, 8), 200.0)
    x[0, 0, 0, 0] = 3.0
    net = MNISTNet((1, 8, 8))
    net.fit_normalization(x)
    assert (float(net.input_scale.offset), float(net.input_scale.scale)) == (0.0, 255.0)


def test_learned_scale_survives_a_state_dict_round_trip():
    net = SmallImageNet((1, 8, 8))
    net.fit_normalization(torch.rand(5, 1, 8, 8) * 16)
    state = net.state_dict()
    assert "input_scale.offset" in state and "input_scale.scale" in state
    clone = SmallImageNet((1, 8, 8))
    clone.load_state_dict(state)
    assert torch.equal(clone.input_scale.offset, net.input_scale.offset)
    assert torch.equal(clone.input_scale.scale, net.input_scale.scale)


def test_state_dict_without_the_scale_loads_as_8bit_data():
    # Models saved before the scale existed were trained on x / 255.
    net = MNISTNet((1, 8, 8))
    net.fit_normalization(torch.rand(3, 1, 8, 8))
    state = {k: v for k, v in MNISTNet((1, 8, 8)).state_dict().items()}
    del state["input_scale.offset"], state["input_scale.scale"]
    net.load_state_dict(state)
    assert float(net.input_scale.scale) == 255.0


def test_scale_is_learned_from_a_memory_map_in_chunks(tmp_path):
    values = np.arange(3 * 1 * 100 * 100, dtype=np.float32).reshape(3, 1, 100, 100)
    values = values / values.max() * 2 - 1  # -1..1
    path = tmp_path / "x.npy"
    np.save(path, values)
    x = np.load(path, mmap_mode="r")
    assert pixel_range(x) == (-1.0, 1.0)
    net = MNISTNet((1, 100, 100))
    net.fit_normalization(x)
    assert (float(net.input_scale.offset), float(net.input_scale.scale)) == (-1.0, 2.0)


@pytest.mark.parametrize(
    "low, high, expected",
    [
        (0.0, 1.0, (0.0, 1.0)),
        (0.25, 0.875, (0.0, 1.0)),
        (-0.5, 1.0, (-1.0, 1.0)),
        (0.0, 16.0, (0.0, 16.0)),
        (0.0, 0.25, (0.0, 0.25)),
        (0.0, 200.0, (0.0, 255.0)),
        (0.0, 255.0, (0.0, 255.0)),
        (10.0, 1000.0, (10.0, 1000.0)),
        (-3.0, 5.0, (-3.0, 5.0)),
    ],
)
def test_pixel_range_snaps_to_usual_encodings(low, high, expected):
    x = torch.tensor([[low, high]])
    assert pixel_range(x) == expected


def test_mlp_bounds_outlying_standardised_values():
    # A rare, nearly constant feature: its one outlier standardises to ~30.
    x = torch.zeros(1000, 2)
    x[0, 0] = 16.0
    x[:, 1] = torch.randn(1000)
    net = MLPNet(2, (4,), embedding_dim=2, input_clip=3.0)
    net.fit_normalization(x)
    seen = []
    net.layers[0].register_forward_hook(lambda m, i, o: seen.append(i[0]))
    with torch.no_grad():
        net(x)
    assert seen[0].abs().max() <= 3.0
    # Values near the mean pass almost unchanged, and the order is kept.
    assert torch.equal(seen[0][:, 1].argsort(), x[:, 1].argsort())


def test_mlp_input_clip_is_saved_and_old_state_dicts_load_unbounded():
    net = MLPNet(3, (4,), embedding_dim=2, input_clip=2.0)
    clone = MLPNet(3, (4,), embedding_dim=2, input_clip=None)
    clone.load_state_dict(net.state_dict())
    assert clone.input_clip == 2.0
    state = net.state_dict()
    del state["clip"]
    clone.load_state_dict(state)
    assert clone.input_clip is None
