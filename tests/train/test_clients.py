"""Clients: batched (vmap) and per-client training agree; evaluation is right.

Bits: bitwise comparisons here are of two paths or two calls in one process, on one
CPU with one thread count (the ``threads`` fixture: one in the fast tier, two in the
slow one, or the test's own); they pass under torch's AVX-512 and AVX2 kernels
(``ATEN_CPU_CAPABILITY=avx2``), and other CPUs are not promised (docs/reliability.md,
"Not guaranteed")."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import DEVICE
from torch.func import functional_call

from mpifl import config, models
from mpifl.data import build
from mpifl.rng import rng
from mpifl.train import Clients, Layout, mlp
from mpifl.train import batched as batched_path


def make(batched: str, **over) -> Clients:
    args = {"data.name": "synthetic", "data.n_samples": 600, "data.n_clients": 6, "data.partition": "iid",
            "model.hidden": "[16, 8]", "train.batched": batched, "train.batch_size": 16, **over}
    cfg = config.load(None, [f"{k}={v}" for k, v in args.items()])
    data = build(cfg.data, 0, np.arange(cfg.data.n_clients))
    model = models.build(cfg.model, data.in_shape, data.n_classes, 0)
    return Clients(model, data, cfg.train, DEVICE, 0)


# two threads take the other kernels (no fused SGD): every case again, in the slow tier
@pytest.fixture(params=[1, pytest.param(2, marks=pytest.mark.slow)], ids=["1thread", "2threads"])
def threads(request, monkeypatch):
    """torch's thread count, and the SGD-fusion flags of the stacked step's calls:
    plain SGD is fused into the weight-gradient kernel on one CPU thread only."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    fused: list[bool] = []
    inner = mlp.stacked_grads

    def spy(*a, **k):
        fused.append(len(a) > 6 and a[6] is not None)
        return inner(*a, **k)

    monkeypatch.setattr(mlp, "stacked_grads", spy)
    yield request.param, fused
    torch.set_num_threads(before)


@pytest.mark.parametrize("opt", [
    {"train.optimizer": "sgd"},
    {"train.optimizer": "sgd", "train.weight_decay": 1e-2},
    {"train.optimizer": "sgd", "train.momentum": 0.9, "train.weight_decay": 1e-3},
    {"train.optimizer": "adam", "train.lr": 1e-3, "train.weight_decay": 1e-4},
])
def test_batched_and_sequential_training_agree(opt, threads):
    n_threads, fused = threads
    a, b = make("on", **opt), make("off", **opt)
    assert a.batched and not b.batched
    local = np.array([0, 2, 3, 5])  # not contiguous: exercises the gather/scatter path
    for t in range(3):
        la = a.train(local, 2, t)
        lb = b.train(local, 2, t)
        np.testing.assert_allclose(la, lb, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(a.params, b.params, rtol=1e-4, atol=1e-5)
    assert torch.equal(a.params[1], a.init)  # untouched clients stay put
    assert not torch.equal(a.params[0], a.init)
    plain_sgd = opt["train.optimizer"] == "sgd" and "train.momentum" not in opt
    # the fused SGD step is the CPU's one-thread path (batched._step)
    assert fused and all(f == (plain_sgd and n_threads == 1 and DEVICE.type == "cpu") for f in fused)


def test_training_matches_plain_torch_loop():
    """One client, SGD: the flat-row machinery equals nn.Module + torch.optim."""
    c = make("on", **{"train.momentum": 0.5})
    plan = c.plan(np.array([1]), 1, 0)
    c.train(np.array([1]), 1, 0)
    model = models.build(config.ModelConfig(hidden=[16, 8]), c.data.in_shape, c.n_classes, 0).to(c.device)
    opt = torch.optim.SGD(model.parameters(), lr=c.cfg.lr, momentum=0.5)
    for s in range(plan.steps):
        idx = plan.idx[0, s]
        idx = idx[idx >= 0]
        opt.zero_grad()
        F.cross_entropy(model(c.x[idx]), c.y[idx]).backward()
        opt.step()
    torch.testing.assert_close(c.params[1], Layout(model).flatten(model), rtol=1e-5, atol=1e-6)


def test_evaluate_shared_and_rows_agree_with_direct_forward():
    a, b = make("on"), make("off")
    a.train(np.arange(6), 1, 0)
    b.params[:] = a.params
    la, aa = a.evaluate("test")
    lb, ab = b.evaluate("test")
    np.testing.assert_allclose(la, lb, rtol=1e-5)
    np.testing.assert_array_equal(aa, ab)
    # direct reference for client 4 with a plain forward
    lo, hi = a.split_range(4, "test")
    out = functional_call(a.model, a.layout.unflatten(a.params[4]), (a.x[lo:hi],))
    assert np.isclose(la[4], F.cross_entropy(out, a.y[lo:hi]).item(), rtol=1e-5)
    assert np.isclose(aa[4], (out.argmax(1) == a.y[lo:hi]).float().mean().item())
    # one shared model evaluated for everyone equals rows all set to it
    ls, acs = a.evaluate("val", a.params[2])
    a.params[:] = a.params[2]
    lr_, ar = a.evaluate("val")
    np.testing.assert_allclose(ls, lr_, rtol=1e-5)
    np.testing.assert_array_equal(acs, ar)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_chunked_training_equals_sequential(monkeypatch, threads, momentum):
    """Clients trained a few at a time, each chunk taking all its steps before the
    next, end where one-by-one training does: unequal client sizes (so clients drop
    out at different steps), non-contiguous rows, chunks of two clients; fused SGD
    (one thread, no momentum) and the optimizer's own update."""
    if DEVICE.type != "cpu":
        pytest.skip("chunks are the CPU's: a GPU trains every client at once (batched.chunks)")
    opt = {"data.partition": "dirichlet", "data.dirichlet_alpha": 0.3, "data.n_clients": 7, "train.momentum": momentum}
    a, b = make("on", **opt), make("off", **opt)
    monkeypatch.setattr(batched_path, "CHUNK_BYTES", 2 * 4 * a.P)
    assert len(batched_path.chunks(a, 5)) == 3
    has = (a.plan(np.arange(7), 2, 0).idx >= 0).any(2)  # [client, step]
    assert has[:, 0].all() and not has.all()  # some clients stop early
    local = np.array([0, 1, 3, 4, 6])
    for t in range(3):
        np.testing.assert_allclose(a.train(local, 2, t), b.train(local, 2, t), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(a.params, b.params, rtol=1e-4, atol=1e-5)


def reference_plan(c: Clients, local, epochs, round, bs, max_batches=None, subsets=None) -> np.ndarray:
    """The batch plan written out the plain way: per client, its own ``rng`` stream,
    one permutation per epoch, batches of ``bs``, the last one short."""
    rows = []
    for i, k in enumerate(local):
        pool = np.arange(*c.split_range(int(k), "train")) if subsets is None else np.asarray(subsets[i])
        n = len(pool)
        g = rng(c.seed, round, int(c.ids[k]), "train")
        batches = []
        for _ in range(epochs):
            perm = pool[g.permutation(n)]
            if c.bn and n % bs == 1 and n > bs:
                perm = perm[:-1]  # BatchNorm: no batch of one sample
            batches += [perm[j:j + bs] for j in range(0, len(perm), bs)]
        rows.append(batches[:max_batches] if max_batches else batches)
    idx = np.full((len(rows), max((len(r) for r in rows), default=0), bs), -1, np.int64)
    for i, r in enumerate(rows):
        for s, batch in enumerate(r):
            idx[i, s, :len(batch)] = batch
    return idx


@pytest.mark.parametrize("bn", [False, True])
def test_plan_matches_plain_construction(bn):
    c = make("off", **{"data.partition": "dirichlet", "data.dirichlet_alpha": 0.5})
    c.bn = bn
    g = np.random.default_rng(0)
    for t in range(40):
        local = g.choice(c.n, size=int(g.integers(1, c.n + 1)), replace=False)
        bs, ep, mb = int(g.integers(1, 40)), int(g.integers(0, 4)), [None, 1, 3][t % 3]
        subsets = None
        if t % 4 == 0:
            subsets = [g.choice(len(c.x), size=int(g.integers(0, 50)), replace=False) for _ in local]
        got = c.plan(local, ep, t, batch_size=bs, max_batches=mb, subsets=subsets).idx
        np.testing.assert_array_equal(got, reference_plan(c, local, ep, t, bs, mb, subsets))


def test_batches_depend_on_client_not_position():
    a = make("on")
    p1 = a.plan(np.array([1, 4]), 1, 3).idx
    p2 = a.plan(np.array([4]), 1, 3).idx
    assert np.array_equal(p1[1, :p2.shape[1]], p2[0])
    assert not np.array_equal(a.plan(np.array([4]), 1, 4).idx, p2)


@pytest.mark.parametrize("job", [["jobs/quickstart.yaml"],  # plain SGD: the fused step on one thread
                                 # momentum and weight decay; client 0's last batch of an epoch holds 1 sample
                                 ["jobs/dpfl-mnist1d-patho.yaml", "data.n_clients=8"]], ids=["sgd", "momentum"])
def test_a_clients_results_do_not_depend_on_the_clients_sharing_its_rank(threads, job):
    """Client 0 hosted alone, with one neighbour or with five (as one client per
    rank, or a few, place it) trains and evaluates to the same bits: the clients
    stepping together have batches of other lengths, padded, and padding changes
    no sum."""
    cfg = config.load(job[0], job[1:])

    def hosted_with(ids: list[int]):
        data = build(cfg.data, 0, np.asarray(ids))
        c = Clients(models.build(cfg.model, data.in_shape, data.n_classes, 0), data, cfg.train,
                    torch.device("cpu"), 0)
        train_loss = c.train(np.arange(len(ids)), 2, 0)[0]
        loss, acc = c.evaluate("test")
        return data.sizes, train_loss, c.params[0].clone(), loss[0], acc[0]

    sizes, *ref = hosted_with(list(range(6)))
    assert len(set(sizes[:6, 0] % cfg.train.batch_size)) > 1 and len(set(sizes[:6, 2])) > 1  # padding happens
    # alone on several threads, a client's matrix products would be single GEMMs that
    # MKL splits along the summed dimension (StackedMLP runs it beside a zero client);
    # with a smaller neighbour client 0 takes its last steps of an epoch alone
    smaller = int(np.flatnonzero(sizes[:6, 0] < sizes[0, 0])[0]) if (sizes[:6, 0] < sizes[0, 0]).any() else 1
    for ids in ([0], [0, 1], [0, smaller]):
        _, train_loss, params, loss, acc = hosted_with(ids)
        assert train_loss == ref[0] and torch.equal(params, ref[1]) and loss == ref[2] and acc == ref[3], ids


def make_conv(batched: str, bn: bool = False, **over) -> Clients:
    """A small conv net (conv, pool, optionally BatchNorm) on digits: trained through
    vmap, not the stacked-MLP path."""
    args = {"data.name": "digits", "data.n_clients": 5, "data.partition": "iid", "train.batched": batched,
            "train.batch_size": 16, "train.momentum": 0.9, "train.weight_decay": 1e-3, **over}
    cfg = config.load(None, [f"{k}={v}" for k, v in args.items()])
    data = build(cfg.data, 0, np.arange(cfg.data.n_clients))
    torch.manual_seed(0)
    nn = torch.nn
    model = nn.Sequential(nn.Conv2d(1, 4, 3), *([nn.BatchNorm2d(4)] if bn else []), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(4 * 3 * 3, 10))
    return Clients(model, data, cfg.train, DEVICE, 0)


@pytest.mark.parametrize("bn", [False, True], ids=["conv", "conv+batchnorm"])
@pytest.mark.parametrize("opt", [{"train.optimizer": "sgd"},
                                 {"train.optimizer": "adam", "train.lr": 1e-3, "train.momentum": 0.0}])
def test_conv_model_batched_and_sequential_agree(bn, opt, threads):
    a, b = make_conv("on", bn, **opt), make_conv("off", bn, **opt)
    assert a.stacked is None and a.batched and not b.batched  # vmap path against the loop
    local = np.array([0, 1, 3])  # not contiguous: BatchNorm buffers gathered and written back
    for t in range(2):
        np.testing.assert_allclose(a.train(local, 2, t), b.train(local, 2, t), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(a.params, b.params, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(a.buffers, b.buffers, rtol=1e-4, atol=1e-5)  # running statistics, per client
    assert not torch.equal(a.params[0], a.init)
    if bn:
        assert not torch.equal(a.buffers[0], a.buffers[2])  # client 2 did not train: its statistics stayed
    for split in ("val", "test"):
        for x, y in zip(a.evaluate(split), b.evaluate(split)):
            np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5)


def test_auto_times_both_paths_without_touching_training_state():
    c = make_conv("auto", True)
    assert c.needs_measuring and not make("auto").needs_measuring  # an MLP is batched without timing
    c.train(np.arange(c.n), 1, 0)
    before = (c.params.clone(), c.buffers.clone(), {k: v.clone() for k, v in c.opt.state.items()}, c.batched)
    tb, tl = c.measure_paths(steps=2, reps=1)
    assert tb > 0 and tl > 0
    assert torch.equal(c.params, before[0]) and torch.equal(c.buffers, before[1]) and c.batched == before[3]
    assert all(torch.equal(v, before[2][k]) for k, v in c.opt.state.items())
    d = make_conv("off", True)  # the same training afterwards as a client that never timed anything
    d.train(np.arange(d.n), 1, 0)
    np.testing.assert_array_equal(c.train(np.arange(c.n), 1, 1), d.train(np.arange(d.n), 1, 1))
    assert torch.equal(c.params, d.params)


@pytest.mark.parametrize("opt", [{"train.optimizer": "sgd", "train.weight_decay": 1e-2},
                                 {"train.optimizer": "sgd", "train.momentum": 0.9},
                                 {"train.optimizer": "adam", "train.lr": 1e-3, "train.weight_decay": 1e-4}])
def test_stacked_mlp_path_equals_vmap_path(opt, threads):
    a, b = make("on", **opt), make("on", **opt)
    assert a.stacked is not None
    b.stacked = None  # force vmap over functional_call
    local = np.arange(6)
    for t in range(3):
        np.testing.assert_allclose(a.train(local, 2, t), b.train(local, 2, t), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(a.params, b.params, rtol=1e-5, atol=1e-6)
    for k in a.opt.state:
        torch.testing.assert_close(a.opt.state[k], b.opt.state[k], rtol=1e-5, atol=1e-6)


def test_grads_api_returns_flat_rows_on_both_paths():
    a, b = make("on"), make("off")
    plan = a.plan(np.arange(3), 1, 0)
    x, y, w = a.batch(plan.idx[:, 0])
    ga, la = a.grads(a.params[:3], x, y, w, np.arange(3))
    gb, lb = b.grads(b.params[:3], x, y, w, np.arange(3))
    assert ga.shape == (3, a.P)
    torch.testing.assert_close(ga, gb, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(la, lb, rtol=1e-5, atol=1e-6)
    # the step API returns new rows and leaves the input rows alone
    before = a.params[:3].clone()
    new = a.opt.step(slice(0, 3), a.params[:3], ga)
    torch.testing.assert_close(a.params[:3], before)
    torch.testing.assert_close(new, before - a.cfg.lr * ga)


@pytest.mark.parametrize("stacked", [True, False], ids=["stacked", "vmap"])
@pytest.mark.parametrize("frozen", [("1.weight", "1.bias", "3.weight", "3.bias"), ("5.weight", "5.bias"),
                                    ("1.weight",)], ids=["body", "head", "first-weight"])
def test_frozen_blocks_are_skipped_and_the_others_keep_their_bits(stacked, frozen):
    """FedRep's head and body epochs ask for part of the gradient: the skipped
    blocks come back None and every other block (and the loss) is bit for bit the
    full gradient's."""
    c = make("on")
    if not stacked:
        c.stacked = None
    names = list(c.layout.names)
    assert set(frozen) <= set(names) and names[-1] == "5.bias"
    plan = c.plan(np.arange(4), 1, 0)
    x, y, w = c.batch(plan.idx[:, 0])
    full, lf = c.engine.grads(c.params[:4], x, y, w, c.buffers, np.arange(4))
    full = [g.clone() for g in full]  # the stacked path reuses its output blocks
    part, lp = c.engine.grads(c.params[:4], x, y, w, c.buffers, np.arange(4), frozen=frozen)
    assert torch.equal(lf, lp)
    for name, gf, gp in zip(names, full, part):
        if name in frozen:
            assert gp is None, name
        else:
            assert gp is not None and torch.equal(gf, gp), name


@pytest.mark.parametrize("weight_decay", [0.0, 1e-2])
def test_adam_rows_are_torch_fused_adam_bit_for_bit_whoever_steps_with_them(weight_decay):
    """Each row's Adam update equals ``torch.optim.Adam(fused=True)`` on that client's
    own nn.Module, bit for bit, whether the row steps alone, with others, or after
    others have taken more steps (per-row step counts), and with the gradient given
    flat or as per-parameter blocks."""
    from mpifl.train.optimizer import RowOptimizer
    c = make("on", **{"train.optimizer": "adam", "train.lr": 1e-2, "train.weight_decay": weight_decay})
    gen = torch.Generator().manual_seed(0)
    n = 4
    refs, opts = [], []
    for i in range(n):
        model = models.build(config.ModelConfig(hidden=[16, 8]), c.data.in_shape, c.n_classes, i)
        refs.append(model)
        opts.append(torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=weight_decay, fused=True))
    rows = torch.stack([Layout(m).flatten(m) for m in refs])
    ro = RowOptimizer(c.cfg, n, c.P, torch.device("cpu"), c.layout.cols)
    # who steps together at each step, and whether the gradient comes flat or in blocks
    schedule = [([0, 1, 2, 3], "flat"), ([1], "blocks"), ([1, 2], "flat"), ([0, 1, 2, 3], "blocks"), ([3], "flat")]
    for who, form in schedule:
        g = torch.randn(len(who), c.P, generator=gen)
        for j, i in enumerate(who):
            for prm, blk in zip(refs[i].parameters(), c.layout.parts(g[j:j + 1]).values()):
                prm.grad = blk[0].clone()
            opts[i].step()
        sel = slice(who[0], who[-1] + 1)
        p = rows[sel]
        gg = g.clone() if form == "flat" else [b.clone() for b in c.layout.parts(g).values()]
        ro.step_(sel, p, gg)
    for i in range(n):
        assert torch.equal(rows[i], Layout(refs[i]).flatten(refs[i])), i


@pytest.mark.parametrize("batched", ["on", "off"])
def test_max_steps_caps_every_training_call_at_the_first_batches(batched):
    """train.max_steps=2 trains exactly as an explicit two-batch cap does (the first
    batches of the client's plan), and not as the uncapped epochs do."""
    capped = make(batched, **{"train.max_steps": 2, "train.local_epochs": 3})
    explicit, whole = make(batched), make(batched)
    local = np.array([0, 3, 5])
    for t in range(2):
        capped.train(local, 3, t)
        explicit.train(local, 3, t, max_batches=2)
        whole.train(local, 3, t)
    assert torch.equal(capped.params, explicit.params)
    assert not torch.equal(capped.params, whole.params)
    # a smaller explicit cap still wins over the config's
    a, b = make(batched, **{"train.max_steps": 2}), make(batched)
    a.train(local, 1, 0, max_batches=1)
    b.train(local, 1, 0, max_batches=1)
    assert torch.equal(a.params, b.params)


@pytest.mark.parametrize("batched", ["on", "off"])
@pytest.mark.parametrize("bn", [False, True], ids=["mlp", "mlp+batchnorm"])
def test_a_scorer_gives_evaluates_losses_bit_for_bit(batched, bn, threads):
    """``scorer`` gathers a split once and then scores any model rows as
    ``evaluate`` would (DPFL scores two a decision, a client listed twice):
    the same losses, to the bit, after training has moved the rows on."""
    c = make(batched, **({"model.batchnorm": "true"} if bn else {}))
    local = np.array([2, 2, 5, 0])
    score = c.scorer("val", local)
    for t in range(2):
        rows = c.params[torch.as_tensor([3, 1, 4, 4])].clone()
        np.testing.assert_array_equal(score(rows), c.evaluate("val", rows, local)[0])
        c.train(np.arange(c.n), 1, t)


def test_scratch_is_kept_between_calls_and_grads_can_write_into_it():
    """``Clients.scratch``: the same storage under one key from call to call (a
    round's temporaries are not faulted in again), a larger one when more rows are
    asked, another under another key; ``grads(out=)`` writes the gradient there with
    the bits of a fresh one."""
    c = make("on")
    a = c.scratch("x", 5)
    assert a.shape == (5, c.P) and a.dtype == c.params.dtype
    assert c.scratch("x", 3).data_ptr() == a.data_ptr() and c.scratch("x", 3).shape == (3, c.P)
    assert c.scratch("y", 3).data_ptr() != a.data_ptr()
    assert c.scratch("x", 9).shape == (9, c.P)  # grown
    local = np.arange(c.n)
    rows = c.params + 0.01 * torch.arange(c.n, dtype=c.params.dtype)[:, None]
    x, y, w = c.batch(c.plan(local, 1, 0).idx[:, 0])
    fresh, loss = c.grads(rows, x, y, w, local)
    out = c.scratch("g", c.n)
    out.fill_(float("nan"))
    into, loss2 = c.grads(rows, x, y, w, local, out=out)
    assert into.data_ptr() == out.data_ptr()
    assert torch.equal(into, fresh) and torch.equal(loss, loss2)
