"""Networks describe their own cost: ``max_iter="auto"`` asks the registry."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from skassoc import _defaults
from skassoc._defaults import auto_max_iter, cpu_step_seconds, network_macs
from skassoc._nn import _networks
from skassoc._nn._model import ModelSpec
from skassoc._nn._networks import NETWORKS, build_network
from skassoc._nn._sparse import SparseLinear
from skassoc._settings import _resolve_batching


def counted_macs(net, shape, batch=2):
    """Multiply-adds per sample of a real forward pass, counted by hooks.

    Independent of the networks' own description: each convolution's and
    linear layer's work is read off its actual output.
    """
    total = []

    def hook(module, inputs, output):
        per_output = module.weight[0].numel()  # in_channels / groups * kh * kw
        if isinstance(module, SparseLinear):  # its weight is (in, out)
            per_output = module.in_features
        total.append(output.numel() * per_output)

    handles = [
        module.register_forward_hook(hook)
        for module in net.modules()
        if isinstance(module, (nn.Conv1d, nn.Conv2d, nn.Linear, SparseLinear))
    ]
    with torch.no_grad():
        net.eval()(torch.rand(batch, *shape) * 255)
    for handle in handles:
        handle.remove()
    assert sum(total) % batch == 0
    return sum(total) // batch


#: Built-in networks on inputs of several shapes: odd sizes, strides, rows.
CASES = [
    ("small", (1, 8, 8)),
    ("small", (3, 13, 27)),
    ("small", (1, 4, 5)),
    ("mnist", (1, 28, 28)),
    ("mnist", (3, 9, 41)),
    ("svhn", (3, 32, 32)),
    ("svhn", (1, 21, 50)),
    ("stl10", (3, 96, 96)),
    ("stl10", (3, 32, 45)),
    ("stl10", (1, 33, 97)),
    ("mlp", (37,)),
    ("mlp", (1, 6, 7)),
    ("sparse_mlp", (37,)),
    ("sparse_mlp", (1, 6, 7)),
    ("signal", (1, 1, 100)),
    ("signal", (6, 1, 37)),
    ("signal", (1, 1, 2001)),
    ("signal", (1, 3, 40)),
]


@pytest.mark.parametrize("name, shape", CASES)
@pytest.mark.parametrize("embedding_dim", [8, 128])
def test_builtin_costs_match_a_count_of_the_built_network(name, shape, embedding_dim):
    # The MLP takes rows (shape (37,)) or flattened images, whatever
    # n_features says: the built network's first layer decides.
    image_shape = None if len(shape) == 1 else shape
    n_features = math.prod(shape) if image_shape is None else 5
    args = (image_shape, n_features, embedding_dim, (50, 40))
    net = build_network(name, *args)
    assert network_macs(name, *args) == counted_macs(net, shape)


def test_every_builtin_network_is_costed_against_its_modules():
    # A network added to the registry needs a case in CASES.
    assert {name for name, _ in CASES} == set(NETWORKS)


@pytest.mark.parametrize("name", sorted(NETWORKS))
def test_every_builtin_network_describes_itself(name):
    cls = NETWORKS[name]
    assert cls.cpu_rate in {"dense", "conv", "conv1d"}
    assert isinstance(cls.image_input, bool)
    assert callable(cls.from_inputs) and callable(cls.forward_macs)


def test_strided_stl10_costs_less_than_the_svhn_network_on_its_images():
    # The STL-10 network strides and pools early: on 96x96 images it does
    # far less work than the SVHN network, which it was once costed as.
    args = ((3, 96, 96), 27648, 128, ())
    assert network_macs("stl10", *args) < network_macs("svhn", *args) / 2


class ToyNet(nn.Module):
    """A network the package has never seen: one linear layer, costed at
    ``work`` times its multiply-adds."""

    default_l2_scale = 1e-4
    image_input = False
    cpu_rate = "dense"
    work = 1

    def __init__(self, n_features, embedding_dim):
        super().__init__()
        self.linear = nn.Linear(n_features, embedding_dim)

    @classmethod
    def from_inputs(cls, input_shape, n_features, embedding_dim, hidden_layer_sizes):
        n_inputs = n_features if input_shape is None else math.prod(input_shape)
        return cls(n_inputs, embedding_dim)

    @classmethod
    def forward_macs(cls, input_shape, n_features, embedding_dim, hidden_layer_sizes):
        n_inputs = n_features if input_shape is None else math.prod(input_shape)
        return cls.work * n_inputs * embedding_dim

    def fit_normalization(self, x, input_format=None):
        return self

    def forward(self, x):
        return self.linear(x.flatten(1))


def toy_class(**attributes):
    return type("Toy", (ToyNet,), attributes)


def auto_steps(name, n_features=500, n_unlabeled=100_000, device="cpu"):
    """``max_iter="auto"`` as a fit resolves it, for ``network=name``."""
    estimator = SimpleNamespace(
        unlabeled_pool="unlabeled",
        labeled_per_class="auto",
        unlabeled_batch_size="auto",
        max_iter="auto",
    )
    encoded = np.r_[np.repeat(np.arange(4), 20), np.full(n_unlabeled, -1)]
    inputs = SimpleNamespace(encoded=encoded, classes=np.arange(4), sparse=False)
    spec = ModelSpec(
        network=name,
        input_shape=None,
        n_features=n_features,
        n_classes=4,
        embedding_dim=64,
    )
    return _resolve_batching(
        estimator, inputs, spec, torch.device(device), "float32", second_view=False
    )[2]


def test_a_registered_network_gets_max_iter_auto_from_its_own_cost(monkeypatch):
    monkeypatch.setitem(NETWORKS, "toy", toy_class())
    assert network_macs("toy", None, 500, 64, ()) == 500 * 64
    light = auto_steps("toy")
    # Its cost, not its name, sets the CPU budget: 5000 times the work
    # trains fewer steps, and a GPU ignores the budget.
    monkeypatch.setitem(NETWORKS, "toy", toy_class(work=5000))
    assert network_macs("toy", None, 500, 64, ()) == 5000 * 500 * 64
    heavy = auto_steps("toy")
    assert 1 <= heavy < light
    assert auto_steps("toy", device="cuda") == auto_max_iter(100_000, 100, None, "cuda")
    # The same chain of _defaults, step by step.
    step = cpu_step_seconds("toy", None, 5000 * 500 * 64, 4 * 10 + 100, bf16=False)
    assert heavy == auto_max_iter(100_000, 100, step)


def test_the_cpu_rate_is_the_one_the_network_declares(monkeypatch):
    shape = (1, 12, 12)
    macs = 10**8
    monkeypatch.setitem(NETWORKS, "dense", toy_class(cpu_rate="dense"))
    monkeypatch.setitem(NETWORKS, "conv", toy_class(cpu_rate="conv"))
    dense = [cpu_step_seconds("dense", shape, macs, 100, bf16) for bf16 in (1, 0)]
    conv = [cpu_step_seconds("conv", shape, macs, 100, bf16) for bf16 in (1, 0)]
    # Dense layers run at one rate whatever the precision, convolutions at
    # half speed without bf16: the rates of the MLP and of the image networks.
    assert dense[0] == dense[1]
    assert conv[1] - _defaults.STEP_SECONDS == pytest.approx(
        2 * (conv[0] - _defaults.STEP_SECONDS)
    )
    assert dense[0] == cpu_step_seconds("mlp", shape, macs, 100, True)
    assert conv[0] == cpu_step_seconds("mnist", shape, macs, 100, True)
    monkeypatch.setitem(NETWORKS, "odd", toy_class(cpu_rate="sparse"))
    with pytest.raises(ValueError, match="cpu_rate='sparse'"):
        cpu_step_seconds("odd", shape, macs, 100, True)


def test_unknown_names_and_missing_images_are_refused():
    with pytest.raises(ValueError, match="Unknown network 'nope'"):
        network_macs("nope", None, 10)
    with pytest.raises(ValueError, match="network='svhn' needs image inputs"):
        network_macs("svhn", None, 3072)
    with pytest.raises(ValueError, match="needs image inputs"):
        _networks.network_class("stl10", None)
