"""The config's sections: one dataclass per concern, each key with its default
and a comment saying what it means (``python -m mpifl.config`` prints them, the
README's reference is generated from them), and :class:`ConfigBase`, what every
Config has. A leaf: it imports nothing of mpifl (importing it loads no other
mpifl module), so every module may name these types. Algorithm sections are each
algorithm's ``Params`` (in ``mpifl/algorithms/<name>_params.py``), joined to these
by :mod:`mpifl.config.compose` (which consults the registry, ``mpifl.algorithms``)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import yaml


@dataclass
class RunConfig:
    name: str = "run"  # run directory is <out_dir>/<name>
    out_dir: str = "results"
    seed: int = 0  # drives partition, init, sampling, neighbour draws
    rounds: int = 30
    device: Literal["auto", "cpu", "cuda"] = "auto"  # auto: node-local GPU if any
    eval_every: int = 1  # evaluate val/test every k rounds (and always the last)
    threads: int = 0  # torch threads per rank; 0 = cores this rank owns
    checkpoint_every: int = 10  # rounds between checkpoints (0: only at the end and on a signal)
    # auto: continue a run directory that has a checkpoint; never: start over; require: fail without one;
    # previous: continue from the checkpoint before the latest (when the latest is damaged)
    resume: Literal["auto", "never", "require", "previous"] = "auto"
    keep_checkpoints: int = 2  # checkpoints a running run keeps, the newest (run.resume=previous needs 2)
    # a finished run keeps its final checkpoint only (to be extended with a larger run.rounds);
    # false: none (the run can then not be extended, only started over)
    keep_final_checkpoint: bool = True


@dataclass
class DataConfig:
    # built-in: digits, mnist1d, synthetic; from data.root: the rest (docs/data.md)
    name: Literal["digits", "mnist1d", "synthetic", "mnist", "fashionmnist", "emnist", "cifar10", "cifar100",
                  "cinic10", "digit5", "office10", "features"] = "mnist1d"
    root: str = ""  # folder of on-disk datasets (layouts: docs/data.md); features: the .npz (or its folder)
    partition: Literal["iid", "clusters", "noisy_clusters", "permuted_clusters", "patho", "dirichlet",
                       "domains", "feature_shift", "label_flip"] = "clusters"
    n_clients: int = 20
    n_clusters: int = 4  # clusters: label groups (disjoint label sets); feature_shift: domains
    # clusters/noisy_clusters: which labels form a group. random = a seeded shuffle of the labels
    # (or CIFAR-100 super-classes) cut into n_clusters groups; ordered = consecutive labels in
    # order, {0,1}, {2,3}, ... (pFedLIA's even split): with random, look-alike classes can share a
    # group (Fashion-MNIST's T-shirt and Shirt), which caps every method's accuracy
    cluster_labels: Literal["random", "ordered"] = "random"
    n_samples: int = 5000  # size of generated datasets (mnist1d, synthetic)
    # split: every client's samples -> train/val/test by val_frac/test_frac; test_set: the
    # dataset's own test set is shared out following each client's label mix (DPFL), val_frac of the rest
    test_source: Literal["split", "test_set"] = "split"
    val_frac: float = 0.2  # of each client's samples (test_set: of its training samples)
    test_frac: float = 0.2  # of each client's samples (split only)
    subsample: float = 1.0  # fraction kept of every class (per domain, per train/test part), seeded
    per_class: int = 0  # at most this many samples per class (per domain and part); 0 = all
    # every client's training set is exactly this many samples, drawn (seeded per client) from
    # the training part of its share; val and test are what train_per_client=0 gives (split:
    # val_frac/test_frac of the whole share; test_set: val_frac of the share, the test set shared
    # by the share's label mix), so they do not change with it. Smaller sizes are subsets of larger
    # ones. 0 = the whole training part
    train_per_client: int = 0
    synthetic_dim: int = 20  # input dimension of `synthetic`
    synthetic_classes: int = 10
    emnist_split: Literal["byclass", "bymerge", "balanced", "letters", "digits", "mnist"] = "byclass"
    cifar100_labels: Literal["fine", "coarse"] = "fine"  # coarse: the 20 super-classes
    image_size: int = 0  # cinic10/digit5/office10 images are resized to this; 0 = 32 (office10: 64)
    dirichlet_alpha: float = 0.1  # dirichlet: concentration (DPFL Dir(0.1))
    min_client_size: int = 10  # dirichlet: redraw until every client has this many samples
    classes_per_client: int = 3  # patho: classes per client (DPFL Patho(3))
    noisy_prob: float = 0.5  # noisy_clusters: chance a client gets extra labels outside its cluster
    noisy_labels: int = 0  # noisy_clusters: how many extra labels; 0 = 1 (5 for cifar100 fine, pFedLIA)
    flip_frac: float = 0.2  # label_flip: fraction of clients whose labels are permuted
    flip_base: Literal["iid", "clusters", "noisy_clusters", "patho", "dirichlet", "domains",
                       "feature_shift"] = "iid"  # label_flip: the partition flipped clients come from


@dataclass
class ModelConfig:
    name: Literal["mlp", "lenet", "cnn_dpfl", "cnn2", "resnet18"] = "mlp"
    hidden: list[int] = field(default_factory=lambda: [128, 128])  # mlp hidden widths
    # mlp only: a BatchNorm1d between each hidden layer and its ReLU (running
    # statistics per client; FedBN keeps them and the BatchNorm parameters local)
    batchnorm: bool = False
    weights: str = ""  # optional state_dict (.pt) on disk; tensors whose name and shape match are loaded


@dataclass
class TrainConfig:
    # adam: torch.optim.Adam(fused=True)'s update (betas 0.9, 0.999, eps 1e-8; weight_decay as L2)
    optimizer: Literal["sgd", "adam"] = "sgd"
    lr: float = 0.05
    momentum: float = 0.0  # sgd only
    weight_decay: float = 0.0
    batch_size: int = 32
    local_epochs: int = 1
    # at most this many optimizer steps per client in each local training call (the
    # first batches of its epochs; 0 = no cap): matches the steps of a method that takes
    # fewer (FedeRiCo's one step a round) without changing the batch size
    max_steps: int = 0
    # train all of a rank's clients at once (stacked bmm for MLPs, grouped convs for
    # conv nets, else vmap) or client by client; auto = plain MLPs batched, other models
    # (an MLP with BatchNorm among them) whichever path a timing of both at the start of
    # the run finds faster (logged as the run's train_path; a resume keeps its checkpoint's path)
    batched: Literal["auto", "on", "off"] = "auto"
    # batched conv nets on the CPU: a first convolution (1 or 3 input channels, 3x3 or
    # 5x5, at most 8 outputs) that a 2x2 max-pooling and ReLU follow, as cnn_dpfl's, in
    # one C++ kernel compiled on first use (mpifl/train/fused.py; needs a C++ compiler
    # and ninja): auto = where it builds and is not over 1.1x slower than torch's
    # kernels on this CPU (timed once per build and shapes, cached beside the build),
    # on = stop at start where it does not build, off = torch's kernels. Its sums are
    # not torch's: the run logs its conv_kernel
    fused_conv: Literal["auto", "on", "off"] = "auto"
    # a NaN/inf loss or parameter: stop with an error naming client and round, or drop
    # that client's update for the round (counted in /metrics/skipped)
    on_nonfinite: Literal["error", "skip"] = "error"

    @property
    def state_rows(self) -> int:
        """Rows of optimizer state a row of parameters carries: Adam's two moments,
        SGD's momentum buffer, none for plain SGD (``mpifl.run.memory`` counts them)."""
        return 2 if self.optimizer == "adam" else (1 if self.momentum > 0 else 0)


def sampled_count(fraction: float, n_clients: int) -> int:
    """How many clients ``algorithm.fraction`` samples a round: C * N rounded half
    up, at least one."""
    return max(1, int(math.floor(fraction * n_clients + 0.5)))


@dataclass
class AlgorithmConfig:
    name: str = "fedavg"  # every module of mpifl/algorithms
    fraction: float = 1.0  # participation fraction C per round (fedavg-like)


@dataclass
class LogConfig:
    every: int = 1  # log the per-client rows every k rounds (and always the last round)
    dense_max: int = 1024  # above this many clients N x N logs are stored compactly
    # write buffered rounds into run.h5 at least this often (seconds); meanwhile each round is
    # appended to run.h5.rounds, so a crash loses no finished round either way; 0 = every round
    flush_s: float = 1.0
    # write each logged round's scalars and a histogram of the clients' test accuracy as
    # TensorBoard events under <run>/tb/ (rank 0; needs the extra: pip install -e '.[tb]')
    tensorboard: bool = False


# the core sections, in the order they are printed; algorithm sections come from
# mpifl.algorithms (each algorithm's Params) and sit between ``algorithm`` and ``log``
CORE_SECTIONS = {"run": RunConfig, "data": DataConfig, "model": ModelConfig, "train": TrainConfig,
                 "algorithm": AlgorithmConfig}
TAIL_SECTIONS = {"log": LogConfig}


class ConfigBase:
    """What every Config has besides its algorithm sections: the core sections
    (typed here for whoever reads a Config) and the methods. The Config itself
    (:func:`mpifl.config.compose.config_class`) adds one field per section."""

    if TYPE_CHECKING:  # not at run time: typing.get_type_hints would list them before the Config's own fields
        run: RunConfig
        data: DataConfig
        model: ModelConfig
        train: TrainConfig
        algorithm: AlgorithmConfig
        log: LogConfig

    @property
    def run_dir(self) -> Path:
        return Path(self.run.out_dir) / self.run.name

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)
