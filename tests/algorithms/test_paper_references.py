"""FedeRiCo, pFedLIA and FedC2I against small dense references written from the
papers' equations alone (none of the three has public code).

Each reference below is plain torch in float64 on the clients' data, with its own
MLP forward pass (``mlp_logits``); it imports nothing from ``mpifl.algorithms``.
mpifl's side runs one or two rounds in this process (``runtime.setup`` on a
one-rank communicator, then the algorithm's ``init`` and ``round``), and the test
compares what those rounds hand the log (``Round.extras``, ``Round.once``,
``Round.mixing``) with the reference to float tolerance. Two settings make the
reference independent of mpifl's batch plans: ``train.batch_size`` exceeds every
client's training split, so "a local batch" and "a local epoch" are the whole
split and one full-batch step, and SGD without momentum, so restarting the
optimizer changes nothing. The papers' equations that were lost in extraction
are read as docs/algorithms.md reads them; each reference names its section and
equation.

Bits: the exact comparisons are of partitions and collaborator sets (booleans);
values are compared with the references within float tolerances.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mpifl import config
from mpifl.comm import solo
from mpifl.rng import rng
from mpifl.run import runtime

HIDDEN = 6
PARAM_NAMES = ["1.weight", "1.bias", "3.weight", "3.bias"]  # Flatten, Linear, ReLU, Linear


# --------------------------------------------------------------------------- shared pieces


def make_ctx(algo: str, n: int, **over):
    """A one-rank run of ``algo`` on ``n`` clients of blob data with 2 or 3 label
    groups; every client's training split fits in one batch."""
    args = {"algorithm.name": algo, "data.name": "synthetic", "data.n_samples": 60 * n, "data.n_clients": n,
            "data.partition": "clusters", "data.n_clusters": 2, "data.synthetic_dim": 5,
            "model.hidden": f"[{HIDDEN}]", "train.optimizer": "sgd", "train.lr": 0.3, "train.batch_size": 512,
            "train.local_epochs": 1, "run.threads": 1, "run.seed": 3, **over}
    ctx = runtime.setup(config.load(None, [f"{k}={v}" for k, v in args.items()]), solo()).ctx
    assert ctx.clients.layout.names == PARAM_NAMES  # the order mlp_logits reads a row in
    assert int(ctx.clients.sizes[:, 0].max()) <= 512
    return ctx


def client_data(ctx, split: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every client's ``split`` as (x float64 [n, d], y [n])."""
    c = ctx.clients
    out = []
    for k in range(c.n):
        lo, hi = c.split_range(k, split)
        out.append((c.x[lo:hi].double().reshape(hi - lo, -1).cpu(), c.y[lo:hi].cpu()))
    return out


def mlp_logits(theta: torch.Tensor, x: torch.Tensor, n_classes: int) -> torch.Tensor:
    """One hidden ReLU layer from a flat row [W1, b1, W2, b2] (torch's parameter order)."""
    return classifier(theta, features(theta, x), n_classes)


def features(theta: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    d = x.shape[1]
    w1 = theta[:HIDDEN * d].view(HIDDEN, d)
    b1 = theta[HIDDEN * d:HIDDEN * (d + 1)]
    return torch.relu(x @ w1.T + b1)


def head_slice(d: int, n_classes: int) -> slice:
    """Where the classifier [W2, b2] sits in a row."""
    start = HIDDEN * (d + 1)
    return slice(start, start + n_classes * (HIDDEN + 1))


def classifier(theta: torch.Tensor, h: torch.Tensor, n_classes: int) -> torch.Tensor:
    w2, b2 = class_rows(theta[-n_classes * (HIDDEN + 1):], n_classes)
    return h @ w2.T + b2


def class_rows(head: torch.Tensor, n_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    return head[:n_classes * HIDDEN].view(n_classes, HIDDEN), head[n_classes * HIDDEN:]


def mean_ce(theta: torch.Tensor, data: tuple[torch.Tensor, torch.Tensor], n_classes: int) -> torch.Tensor:
    x, y = data
    return F.cross_entropy(mlp_logits(theta, x, n_classes), y)


def grad_ce(theta: torch.Tensor, data, n_classes: int) -> torch.Tensor:
    leaf = theta.detach().clone().requires_grad_(True)
    (g,) = torch.autograd.grad(mean_ce(leaf, data, n_classes), leaf)
    return g


def distinct_rows(ctx, scale: float = 0.5) -> torch.Tensor:
    """Fixed, different starting rows per client (the run's init plus seeded noise)."""
    g = np.random.default_rng(11)
    init = ctx.clients.init.double().cpu()
    return torch.stack([init + torch.from_numpy(g.normal(0, scale, init.shape)) for _ in range(ctx.N)])


# --------------------------------------------------------------------------- FedeRiCo (Sui et al. 2022)


class FedericoReference:
    """Section 3 of the paper, with the practical choices of Section 3.3.

    E-step (Eq. 3, with Section 3.3's tracking): the posterior w_i over the N
    models is the softmax of the negative tracked loss; the loss of the sampled
    models and of the own model is measured, Lhat_ij <- (1-beta) Lhat_ij + beta
    L_i(theta_j), the others keep their value. Lhat starts at the first loss a
    client measures for its own model (docs/algorithms.md: "init 0 or the first
    measured loss"). M-step (Eq. 4-6, 8): theta_j moves along
    sum_i w_ij grad L_i(theta_j) over the clients i that hold theta_j this round
    (its own included); one plain SGD step here. Prediction weights (Section 3.2's
    mixture, Eq. 1, and Section 4.3: "a mixture of predictions" weighted by w_i),
    restricted to the models held: w_i over S_i + {i}, renormalised.
    """

    def __init__(self, theta: torch.Tensor, train, n_classes: int, beta: float, temperature: float, lr: float):
        self.theta, self.train, self.C = theta.clone(), train, n_classes
        self.beta, self.T, self.lr = beta, temperature, lr
        self.N = len(theta)
        self.tracked: np.ndarray | None = None

    def round(self, S: np.ndarray) -> dict[str, np.ndarray]:
        N = self.N
        held = [list(S[i]) + [i] for i in range(N)]
        loss = np.full((N, N), np.nan)
        for i in range(N):
            for j in held[i]:
                loss[i, j] = float(mean_ce(self.theta[j], self.train[i], self.C))
        if self.tracked is None:
            self.tracked = np.repeat(np.diag(loss)[:, None], N, axis=1)
        for i in range(N):
            for j in held[i]:
                self.tracked[i, j] = (1 - self.beta) * self.tracked[i, j] + self.beta * loss[i, j]
        z = -self.tracked / self.T
        w = np.exp(z - z.max(1, keepdims=True))
        w /= w.sum(1, keepdims=True)
        G = torch.zeros_like(self.theta)
        for i in range(N):
            for j in held[i]:
                G[j] += w[i, j] * grad_ce(self.theta[j], self.train[i], self.C)
        self.theta = self.theta - self.lr * G
        mixing = np.zeros((N, N))
        for i in range(N):
            mixing[i, held[i]] = w[i, held[i]] / w[i, held[i]].sum()
        return {"tracked_loss": self.tracked.copy(), "client_weights": w, "mixing": mixing}


def neighbour_probabilities(w: np.ndarray, i: int, k: int, eps: float) -> np.ndarray:
    """Section 3.3's eps-greedy sampling: with probability eps k clients drawn
    uniformly among the N-1 others, else the k highest posteriors (ties drawn
    uniformly). Returns P(j in S_i) for every j."""
    N = len(w)
    others = [j for j in range(N) if j != i]
    greedy = np.zeros(N)
    order = sorted(others, key=lambda j: -w[j])
    cut = w[order[k - 1]]
    above = [j for j in others if w[j] > cut]
    tied = [j for j in others if w[j] == cut]
    greedy[above] = 1.0
    greedy[tied] = (k - len(above)) / len(tied)
    uniform = np.zeros(N)
    uniform[others] = k / (N - 1)
    return eps * uniform + (1 - eps) * greedy


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [1.0, 0.2])
def test_federico_matches_the_paper(temperature):
    from mpifl.algorithms import federico

    N, k, beta, lr = 5, 2, 0.6, 0.3
    ctx = make_ctx("federico", N, **{"federico.k": k, "federico.eps": 0.3, "federico.beta": beta,
                                     "federico.temperature": temperature})
    state = federico.init(ctx)  # per-client initial models: the reference starts from the same rows
    ref = FedericoReference(ctx.clients.params.double().cpu(), client_data(ctx, "train"), ctx.data.n_classes,
                            beta, temperature, lr)
    for t in range(2):
        out = federico.round(ctx, state, t)
        S = out.extras["neighbours"]
        assert all(i not in S[i] and len(set(S[i])) == k for i in range(N))
        want = ref.round(S)
        for name in ("tracked_loss", "client_weights"):
            np.testing.assert_allclose(out.extras[name], want[name], rtol=2e-5, atol=1e-6, err_msg=f"{name}, t={t}")
        np.testing.assert_allclose(out.mixing.densify(), want["mixing"], rtol=2e-5, atol=1e-6, err_msg=f"t={t}")
        assert np.ptp(want["client_weights"]) > 0.01  # the weights differ: the comparison has teeth
    # the models after the M-steps: the next round's losses would otherwise drift apart
    torch.testing.assert_close(ctx.clients.params.double().cpu(), ref.theta, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("w", [
    np.array([0.30, 0.25, 0.20, 0.15, 0.10]),  # client 0 (self) the largest
    np.array([0.10, 0.20, 0.20, 0.20, 0.30]),  # a three-way tie for the second slot
    np.full(5, 0.2),  # all tied (round 0 with a shared init)
])
def test_federico_neighbour_sampling_probabilities(w):
    """mpifl's draws, over many seeded rounds, against Section 3.3's inclusion
    probabilities: within 5 binomial standard deviations for each client."""
    from mpifl.algorithms import federico

    i, k, eps, draws = 0, 2, 0.3, 4000
    p = neighbour_probabilities(w, i, k, eps)
    assert p.sum() == pytest.approx(k)
    seen = np.zeros(len(w))
    for t in range(draws):
        seen[federico.sample_neighbours(w, i, k, eps, rng(5, t, i, federico.PURPOSE))] += 1
    sd = np.sqrt(draws * p * (1 - p))
    assert np.all(np.abs(seen - draws * p) <= 5 * sd + 1e-9), (seen / draws, p)


# --------------------------------------------------------------------------- pFedLIA (Rokvic et al.)


def fedavg_round(theta: torch.Tensor, train, sizes: np.ndarray, n_classes: int, lr: float, epochs: int):
    """McMahan et al.'s FedAvg with every client sampled and full-batch local steps:
    theta_0, "trained, e.g., by the center" (Section III-D; docs/algorithms.md: a
    FedAvg warm-up)."""
    p = sizes / sizes.sum()
    rows = []
    for data in train:
        w = theta.clone()
        for _ in range(epochs):
            w = w - lr * grad_ce(w, data, n_classes)
        rows.append(w)
    return sum(float(pk) * r for pk, r in zip(p, rows))


def lazy_influence(theta0: torch.Tensor, lia_data, val, n_classes: int, lr: float, epochs: int) -> np.ndarray:
    """Section III-D: client j takes ``epochs`` epochs from theta_0 on a batch of
    its data (here the whole split, one step an epoch) -> thetahat_j; client i
    scores I(i, j) = sum_{z in Z_i^val} L(z, theta_0) - L(z, thetahat_j) (Eq. 1)."""
    hats = []
    for data in lia_data:
        w = theta0.clone()
        for _ in range(epochs):
            w = w - lr * grad_ce(w, data, n_classes)
        hats.append(w)
    N = len(lia_data)
    out = np.zeros((N, N))
    for i, (x, y) in enumerate(val):
        base = F.cross_entropy(mlp_logits(theta0, x, n_classes), y, reduction="sum")
        for j, hat in enumerate(hats):
            out[i, j] = float(base - F.cross_entropy(mlp_logits(hat, x, n_classes), y, reduction="sum"))
    return out


def same_partition(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(np.array_equal(a[:, None] == a[None, :], b[:, None] == b[None, :]))


def optics_partition(I: np.ndarray, min_samples: int, xi: float) -> np.ndarray:
    """Section III-F a): OPTICS on the rows of I; its noise points stay alone
    (docs/algorithms.md)."""
    from sklearn.cluster import OPTICS

    raw = OPTICS(min_samples=min_samples, xi=xi).fit(I).labels_
    return np.where(raw < 0, raw.max() + 1 + np.arange(len(raw)), raw)


def kmeans_collaborators(I: np.ndarray) -> np.ndarray:
    """Section III-F b): per client, 2-means on its row; the cluster of higher mean
    influence is "beneficial" (and holds the client, docs/algorithms.md)."""
    from sklearn.cluster import KMeans

    out = np.zeros(I.shape, bool)
    for i, row in enumerate(I):
        km = KMeans(n_clusters=2, n_init=10, random_state=0).fit(row[:, None])
        out[i] = km.labels_ == np.argmax(km.cluster_centers_[:, 0])
        out[i, i] = True
    return out


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["central", "p2p"])
def test_pfedlia_matches_the_paper(mode):
    from mpifl.algorithms import pfedlia

    N, lr, warm, lia_epochs = 6, 0.3, 2, 5
    ctx = make_ctx("pfedlia", N, **{"data.n_clusters": 3, "run.rounds": warm + 2, "pfedlia.mode": mode,
                                    "pfedlia.warmup_rounds": warm, "pfedlia.fraction": 1.0,
                                    "pfedlia.lia_epochs": lia_epochs, "pfedlia.lia_batch": 512,
                                    "pfedlia.min_samples": 2})
    C, train = ctx.data.n_classes, client_data(ctx, "train")
    state = pfedlia.init(ctx)
    theta = ctx.clients.init.double().cpu()
    for t in range(warm):
        pfedlia.round(ctx, state, t)
        theta = fedavg_round(theta, train, ctx.clients.sizes[:, 0].astype(np.float64), C, lr, 1)
    torch.testing.assert_close(state.model.double().cpu(), theta, rtol=1e-5, atol=1e-6)  # theta_0

    out = pfedlia.round(ctx, state, warm)
    I_ref = lazy_influence(theta, train, client_data(ctx, "val"), C, lr, lia_epochs)
    np.testing.assert_allclose(out.once["lia/influence"], I_ref, rtol=1e-4, atol=1e-4)
    truth = ctx.data.cluster
    if mode == "central":
        want = optics_partition(I_ref, 2, ctx.cfg.pfedlia.xi)
        assert same_partition(out.once["lia/cluster"], want)
        assert same_partition(want, truth)  # the setting is one where the clusters are found
    else:
        want = kmeans_collaborators(I_ref)
        np.testing.assert_array_equal(out.once["lia/collaborators"], want)
        np.testing.assert_array_equal(want, truth[:, None] == truth[None, :])


@pytest.mark.slow
def test_pfedlia_lazy_influence_ranks_clients_as_the_exact_influence():
    """Section III-B's exact influence of client j's batch Z_j on client i:
    retrain from the same start on Z_0 + Z_j (Z_0 = the warm-up data) to
    convergence, R(theta_0) - R(theta_{+j}) on i's validation data (the paper's
    Fig. 3a protocol). The paper claims only that LIA gets the direction "accurate
    enough" to cluster (Section III-D). Here, for every client i, the two clients
    of highest lazy influence (mpifl's Eq. 1) are the two of highest exact
    influence, and they are i's true cluster. (The exact values are not clean
    enough for 2-means on this non-convex model: retraining from the start takes
    a different path per j, and other labels' data still lowers i's validation
    loss a little.)"""

    from mpifl.algorithms import pfedlia

    N, lr, warm = 6, 0.3, 2
    ctx = make_ctx("pfedlia", N, **{"data.n_clusters": 3, "run.rounds": warm + 2, "pfedlia.mode": "p2p",
                                    "pfedlia.warmup_rounds": warm, "pfedlia.fraction": 1.0,
                                    "pfedlia.lia_epochs": 5, "pfedlia.lia_batch": 512})
    C, train, val = ctx.data.n_classes, client_data(ctx, "train"), client_data(ctx, "val")
    state = pfedlia.init(ctx)
    for t in range(warm):
        pfedlia.round(ctx, state, t)
    theta0 = state.model.double().cpu()
    lia = pfedlia.round(ctx, state, warm).once["lia/influence"]

    # Z_0: a balanced tenth of every client's training data, theta_0 trained on it to convergence
    z0 = [(x[: len(x) // 10], y[: len(y) // 10]) for x, y in train]
    pooled = (torch.cat([x for x, _ in z0]), torch.cat([y for _, y in z0]))

    def converged(data, start):
        w = start.clone()
        for _ in range(400):
            w = w - lr * grad_ce(w, data, C)
        return w

    m0 = converged(pooled, theta0)
    exact = np.zeros((N, N))
    for j in range(N):
        m1 = converged((torch.cat([pooled[0], train[j][0]]), torch.cat([pooled[1], train[j][1]])), theta0)
        for i, (x, y) in enumerate(val):
            exact[i, j] = float(F.cross_entropy(mlp_logits(m0, x, C), y, reduction="sum")
                                - F.cross_entropy(mlp_logits(m1, x, C), y, reduction="sum"))
    truth = ctx.data.cluster
    assert np.all(np.bincount(truth) == 2)
    for i in range(N):
        top_lia, top_exact = set(np.argsort(-lia[i])[:2]), set(np.argsort(-exact[i])[:2])
        assert top_lia == top_exact == set(np.flatnonzero(truth == truth[i])), (i, lia[i], exact[i])


# --------------------------------------------------------------------------- FedC2I


class FedC2IReference:
    """The paper's Section "FedC2I", for client i (models theta_m as uploaded, one
    random batch of D_i^train, here the whole split):

    - Eq. 4: theta^{-j} = 1/(N-1) sum_{m != j} theta_m; l_i^{-j} its loss;
      Eq. 5: a_i[j] = exp(alpha l_i^{-j}) / sum_m exp(alpha l_i^{-m});
      Eq. 6: phi_i = sum_j a_i[j] phi_j.
    - Eq. 7: v_c^{-j} = 1/(N-1) sum_{m != j} v_{m,c}, put in row c of the classifier
      (docs/algorithms.md's reading: the classifier averaged over the N clients)
      and scored on the features of the model being built, phi_i;
      Eq. 8-9: M_i[j, c] = softmax over j of alpha l_i^{-j,c};
      Eq. 10: v_{i,c} = sum_j M_i[j, c] v_{j,c}.
    - Then E local epochs (Algorithm 1), full-batch SGD steps here.
    """

    def __init__(self, theta: torch.Tensor, train, n_classes: int, alpha: float, lr: float, epochs: int):
        self.theta, self.train, self.C = theta.clone(), train, n_classes
        self.alpha, self.lr, self.epochs = alpha, lr, epochs
        d = train[0][0].shape[1]
        self.head = head_slice(d, n_classes)

    def round(self) -> dict[str, np.ndarray]:
        theta, C, N = self.theta, self.C, len(self.theta)
        loo = torch.stack([(theta.sum(0) - theta[j]) / (N - 1) for j in range(N)])  # Eq. 4
        heads = theta[:, self.head]
        v = torch.stack([torch.cat([class_rows(h, C)[0], class_rows(h, C)[1][:, None]], 1) for h in heads])
        vbar = v.mean(0)  # [C, HIDDEN + 1]
        v_loo = (v.sum(0)[None] - v) / (N - 1)  # Eq. 7, [N, C, HIDDEN + 1]
        a = np.zeros((N, N))
        M = np.zeros((N, N, C))
        new, built = [], []
        for i, (x, y) in enumerate(self.train):
            losses = torch.stack([F.cross_entropy(mlp_logits(loo[j], x, C), y) for j in range(N)])
            a_i = torch.softmax(self.alpha * losses, 0)  # Eq. 5
            row = (a_i[:, None] * theta).sum(0)  # Eq. 6 (the head is replaced below)
            h1 = torch.cat([features(row, x), torch.ones(len(x), 1, dtype=x.dtype)], 1)
            lc = torch.zeros(N, C, dtype=x.dtype)
            for j, c in itertools.product(range(N), range(C)):
                vc = vbar.clone()
                vc[c] = v_loo[j, c]
                lc[j, c] = F.cross_entropy(h1 @ vc.T, y)
            M_i = torch.softmax(self.alpha * lc, 0)  # Eq. 9, over j
            v_i = torch.einsum("jc,jcd->cd", M_i, v)  # Eq. 10
            row = row.clone()
            row[self.head] = torch.cat([v_i[:, :HIDDEN].reshape(-1), v_i[:, HIDDEN]])
            built.append(row)
            for _ in range(self.epochs):
                row = row - self.lr * grad_ce(row, (x, y), C)
            new.append(row)
            a[i], M[i] = a_i.numpy(), M_i.numpy()
        self.theta = torch.stack(new)
        return {"influence": a, "class_influence": M, "built": torch.stack(built)}


@pytest.mark.slow
@pytest.mark.parametrize("alpha", [5.0, 50.0])
def test_fedc2i_matches_the_paper(alpha):
    from mpifl.algorithms import fedc2i

    N, lr, epochs = 4, 0.3, 2
    ctx = make_ctx("fedc2i", N, **{"fedc2i.alpha": alpha, "train.local_epochs": epochs})
    c = ctx.clients
    start = distinct_rows(ctx)
    c.params[:] = start.to(c.params)
    ref = FedC2IReference(c.params.double().cpu(), client_data(ctx, "train"), ctx.data.n_classes, alpha, lr, epochs)
    state = fedc2i.init(ctx)
    for t in range(2):
        built = fedc2i.aggregate(ctx, state, t).rows  # what round t trains from (no side effects)
        out = fedc2i.round(ctx, state, t)
        want = ref.round()
        torch.testing.assert_close(built.double().cpu(), want["built"], rtol=1e-4, atol=5e-5)
        np.testing.assert_allclose(out.extras["influence"], want["influence"], rtol=1e-4, atol=1e-6,
                                   err_msg=f"a, t={t}")
        np.testing.assert_allclose(out.extras["class_influence"], want["class_influence"], rtol=1e-4, atol=1e-6,
                                   err_msg=f"M, t={t}")
        np.testing.assert_allclose(out.mixing.densify(), want["influence"], rtol=1e-4, atol=1e-6)
        # and after local training
        torch.testing.assert_close(c.params.double().cpu(), ref.theta, rtol=1e-4, atol=5e-5)
        assert np.ptp(want["influence"]) > 1e-3 and np.ptp(want["class_influence"]) > 1e-4
    assert not math.isnan(float(out.train_loss.sum()))
