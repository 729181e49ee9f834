"""The batch norms of a data-parallel fit, in one process: a group of one
(its gather returns the row it is given) must train as the plain norm does.
``tests/test_data_parallel.py`` checks two processes against one."""

import pytest
import torch
from torch import nn

from skassoc._engine._sync_batch_norm import WholeBatchNorms, check_batch_norms

CPU = torch.device("cpu")


def alone(row):
    """The gather of a group of one process."""
    return row


@pytest.mark.parametrize(
    ("norm", "shape"),
    [
        (nn.BatchNorm1d, (9, 4)),
        (nn.BatchNorm2d, (9, 4, 5, 3)),
        (nn.BatchNorm3d, (9, 4, 2, 3, 2)),
    ],
)
@pytest.mark.parametrize("momentum", [0.1, None])
def test_a_group_of_one_trains_as_the_plain_norm(norm, shape, momentum):
    torch.manual_seed(0)
    # A mean far from zero next to the spread: the variance must stay exact.
    x = torch.randn(shape, dtype=torch.float64) * 0.5 + 30
    weights = torch.randn(shape, dtype=torch.float64)
    plain = nn.Sequential(norm(4, momentum=momentum).double())
    nn.init.uniform_(plain[0].weight)
    nn.init.uniform_(plain[0].bias)
    synced = nn.Sequential(norm(4, momentum=momentum).double())
    synced.load_state_dict(plain.state_dict())
    inputs = [x.clone().requires_grad_(), x.clone().requires_grad_()]
    own = synced[0]
    seen, backward = [], []  # the network's hooks run in the steps too
    own.register_forward_hook(lambda module, args, out: seen.append(module))
    own.register_full_backward_hook(lambda *args: backward.append(1))
    norms = WholeBatchNorms([synced], CPU, None, alone)
    for _ in range(2):  # the running statistics' update, twice
        (plain(inputs[0]) * weights).sum().backward()
        with norms.installed():
            assert type(synced[0]).__name__ == "GroupBatchNorm"
            (synced(inputs[1]) * weights).sum().backward()
    assert synced[0] is own
    assert [type(module).__name__ for module in seen] == ["GroupBatchNorm"] * 2
    assert backward == [1, 1]
    torch.testing.assert_close(inputs[1].grad, inputs[0].grad)
    for name, param in plain[0].named_parameters():
        torch.testing.assert_close(getattr(synced[0], name).grad, param.grad)
    for name, buffer in plain[0].named_buffers():
        torch.testing.assert_close(getattr(synced[0], name), buffer)
    # Out of training (the model's mode when the step runs) the stand-in
    # normalises with the running statistics.
    synced.eval()
    with norms.installed(), torch.no_grad():
        torch.testing.assert_close(synced(x), plain.eval()(x))


@pytest.mark.parametrize(
    ("device", "stand_in"), [("cpu", "GroupBatchNorm"), ("cuda", "SyncBatchNorm")]
)
def test_the_networks_own_norms_are_back_however_a_step_ends(device, stand_in):
    """On GPUs torch's SyncBatchNorm stands in (built here, never run)."""
    model = nn.Sequential(nn.Conv2d(1, 2, 1), nn.BatchNorm3d(2))
    own = model[1]
    norms = WholeBatchNorms([model], torch.device(device), None, alone)
    with pytest.raises(RuntimeError, match="a step failed"):
        with norms.installed():
            assert type(model[1]).__name__ == stand_in
            # The same tensors, not copies.
            assert model[1].weight is own.weight
            assert model[1].running_mean is own.running_mean
            raise RuntimeError("a step failed")
    assert model[1] is own


@pytest.mark.parametrize(
    "odd",
    [
        nn.LazyBatchNorm2d(),
        nn.SyncBatchNorm(2),
        type("MyNorm", (nn.BatchNorm2d,), {})(2),
    ],
)
def test_batch_norms_the_group_cannot_synchronise_are_refused(odd):
    check_batch_norms(nn.Sequential(nn.BatchNorm1d(2), nn.BatchNorm2d(2)))
    with pytest.raises(ValueError, match=r"Layer '1\.0' .*plain nn\.BatchNorm1d"):
        check_batch_norms(nn.Sequential(nn.ReLU(), nn.Sequential(odd)))
