"""One fit over two GPUs: from a plain fit (``devices``) and under torchrun.

Skipped without at least two GPUs.
"""

import numpy as np
import pytest
import torch
from conftest import TWO_GPUS
from sklearn.datasets import load_digits

from skassoc import SemiSupervisedAssociationClassifier
from skassoc.callbacks import Checkpoint

pytestmark = pytest.mark.skipif(not TWO_GPUS, reason="needs two or more GPUs")


def digit_images():
    """8x8 digit images, their labels, and the labels with 4 of 5 hidden."""
    X, y = load_digits(return_X_y=True)
    X = (X * 15).astype(np.uint8).reshape(-1, 8, 8)
    return X, y, np.where(np.arange(len(y)) % 5 == 0, y, -1)


def test_one_fit_on_two_gpus_trains_the_model_of_one_gpu():
    """devices=[0, 1]: a process a GPU, NCCL, each embeds half of every batch."""
    X, y, y_semi = digit_images()
    params = dict(max_iter=300, random_state=0, labeled_per_class=5, precision="fp32")
    two = SemiSupervisedAssociationClassifier(**params, devices=[0, 1]).fit(X, y_semi)
    one = SemiSupervisedAssociationClassifier(**params, device="cuda:0").fit(X, y_semi)
    assert two.n_iter_ == 300
    np.testing.assert_allclose(two.history_["total"], one.history_["total"], rtol=0.05)
    assert abs(two.score(X, y) - one.score(X, y)) < 0.02


def test_batch_norm_on_two_gpus_ends_near_one_gpu(tmp_path):
    """The STL-10 network on two GPUs (torch's SyncBatchNorm, also in the
    captured CUDA graph of every step) ends near the fit of one GPU, and a
    checkpoint (a copy of the model between steps) holds plain batch norms.
    The exact comparison with one process is tests/test_data_parallel.py's."""
    X, y, y_semi = digit_images()
    params = dict(
        network="stl10",
        image_size=32,
        image_channels=3,
        max_iter=100,
        random_state=0,
        labeled_per_class=5,
        precision="fp32",
    )
    checkpoint = Checkpoint(tmp_path / "ckpt-{step}.skassoc", every=50)
    two = SemiSupervisedAssociationClassifier(
        **params, devices=[0, 1], callbacks=[checkpoint]
    ).fit(X, y_semi)
    one = SemiSupervisedAssociationClassifier(**params, device="cuda:0").fit(X, y_semi)
    assert type(two.model_.embedder.features[1]) is torch.nn.BatchNorm2d
    saved = SemiSupervisedAssociationClassifier.load(tmp_path / "ckpt-100.skassoc")
    assert type(saved.model_.embedder.features[1]) is torch.nn.BatchNorm2d
    np.testing.assert_allclose(two.history_["total"], one.history_["total"], rtol=0.05)
    assert abs(two.score(X, y) - one.score(X, y)) < 0.03


def test_torchrun_fits_one_model_over_its_processes(tmp_path):
    """Every rank calls fit on the same data; all end with the same model."""
    import subprocess
    import sys

    script = tmp_path / "fit.py"
    script.write_text(
        "import os, numpy as np, torch, torch.distributed as dist\n"
        "from sklearn.datasets import load_digits\n"
        "from skassoc import SemiSupervisedAssociationClassifier\n"
        "rank = int(os.environ['LOCAL_RANK'])\n"
        "torch.cuda.set_device(rank)\n"
        "dist.init_process_group('nccl')\n"
        "X, y = load_digits(return_X_y=True)\n"
        "X = (X * 15).astype(np.uint8).reshape(-1, 8, 8)\n"
        "y = np.where(np.arange(len(y)) % 5 == 0, y, -1)\n"
        "clf = SemiSupervisedAssociationClassifier(\n"
        "    max_iter=200, device='cuda', random_state=0, labeled_per_class=5)\n"
        "clf.fit(X, y)\n"
        f"torch.save(clf.model_.state_dict(), r'{tmp_path}' + f'/w{{rank}}.pt')\n"
        "dist.destroy_process_group()\n"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=2",
            str(script),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    weights = [torch.load(tmp_path / f"w{rank}.pt") for rank in range(2)]
    for name, tensor in weights[0].items():
        assert torch.equal(tensor.cpu(), weights[1][name].cpu()), name
