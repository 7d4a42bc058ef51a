"""FedALA against a plain single-process torch reference of its equations (5
clients, or one per rank, 3 sampled a round, 3 rounds: the start phase in round 2,
one epoch of W in round 3), with W's gradient taken by autograd through
theta^ = theta + (Theta - theta) (.) W; its reductions to FedAvg bit for bit (eta = 0:
W stays at ones; no layer adapted); the same bits on any number of ranks as in one
process; and a resume from a checkpoint after the start phase bit for bit.

Bits: the bit-for-bit comparisons are of runs in one process or one job on one CPU
with one thread count: across rank counts client by client (``train.batched=off``),
where the ranks make the same torch calls on the same rows as one process, so it holds
on AVX2 and AVX-512 alike; the reductions and the resume compare two runs of one path
on the same CPU; batched, the stacked products of different client counts round apart
and those comparisons use a tolerance (docs/reliability.md)."""

import numpy as np
import pytest
import serial_ref
import torch
from plain_ref import fedavg as average
from serial_ref import bn_ctx, loss_of, make_ctx

from mpifl.algorithms import fedala
from mpifl.comm import solo
from mpifl.paths import RunDir
from mpifl.rng import rng
from mpifl.run import checkpoint

ROUNDS = 3
# synthetic data with model.hidden=[5]: Linear "1" (in -> 5), Linear "3" (5 -> C), counted from the output
LAYER_PARAMS = {1: ["3.weight", "3.bias"], 2: ["3.weight", "3.bias", "1.weight", "1.bias"]}
# W learns fast enough to move (eta), the start phase stops on its criterion before start_limit
ALA = {"fedala.eta": 5.0, "fedala.num_pre_loss": 3, "fedala.threshold": 0.002, "fedala.start_limit": 12}


def make_cfg(mpi, **over):
    return serial_ref.baseline_cfg(mpi, **{"algorithm.name": "fedala", **ALA, **over})


def run(cfg, mpi, rounds=ROUNDS):
    return serial_ref.run_rounds(cfg, mpi, rounds)


def plain_ala(ref, model, theta, W, k, t, cols, started, purpose="fedala"):
    """Client k's theta^ and W after its ALA in round t (batches of ``purpose``'s
    streams), and the epochs it took."""
    c, f = ref.clients, ref.cfg.fedala
    lo, n = int(c.offsets[k, 0]), int(c.sizes[k, 0])
    sub = lo + np.sort(rng(ref.cfg.run.seed, t, k, f"{purpose}/sample").choice(n, max(1, n * f.rand_percent // 100),
                                                                                replace=False))
    losses = []
    for e in range(f.start_limit):
        plan = c.plan(np.array([k]), 1, t, f"{purpose}/{e}", subsets=[sub])
        total = seen = 0.0
        for s in range(plan.steps):
            idx = plan.idx[0, s]
            idx = idx[idx >= 0]
            leaf = W.clone().requires_grad_(True)
            hat = model.clone()
            hat[cols] = theta[cols] + (model[cols] - theta[cols]) * leaf
            loss = loss_of(c, hat, idx)
            (g,) = torch.autograd.grad(loss, leaf)
            W = (W - f.eta * g).clamp(0, 1).detach()
            total, seen = total + loss.item() * len(idx), seen + len(idx)
        losses.append(total / seen)
        if started or (len(losses) >= f.num_pre_loss and np.std(losses[-f.num_pre_loss:]) < f.threshold):
            break
    hat = model.clone()
    hat[cols] = theta[cols] + (model[cols] - theta[cols]) * W
    return hat, W, len(losses)


def columns(c, layers):
    """The adapted columns, the output layer's first (W_i's order)."""
    return torch.cat([torch.arange(s.start, s.stop) for n in LAYER_PARAMS[layers] for s in c.layout.slices([n])])


def plain_fedala(cfg, rounds):
    ref = make_ctx(cfg, solo())
    c = ref.clients
    cols = columns(c, cfg.fedala.layers)
    model = c.init.clone()
    theta = {k: model.clone() for k in range(ref.N)}
    W = {k: torch.ones(len(cols)) for k in range(ref.N)}
    started, epochs = set(), {}
    for t in range(rounds):
        sampled = [int(k) for k in ref.sample(t, cfg.algorithm.fraction)]
        epochs = {}
        for k in sampled:
            start = model
            if t > 0:
                start, W[k], epochs[k] = plain_ala(ref, model, theta[k], W[k], k, t, cols, k in started)
                started.add(k)
            theta[k] = serial_ref.sgd(c, start, k, t, cfg.train.local_epochs, cfg.train.lr)
        model = average(ref, {k: theta[k] for k in sampled})
    return model, theta, W, epochs, started


@pytest.mark.parametrize(("batched", "layers"), [("on", 1), ("off", 1), ("on", 2)])
def test_fedala_matches_plain_torch(mpi, batched, layers):
    cfg = make_cfg(mpi, **{"train.batched": batched, "fedala.layers": layers})
    ctx, _, state, outs = run(cfg, mpi)
    model, theta, W, epochs, _ = plain_fedala(cfg, ROUNDS)
    torch.testing.assert_close(state.model, model, rtol=1e-4, atol=1e-5)
    for r, i in enumerate(ctx.comm.local_ids):
        torch.testing.assert_close(ctx.clients.params[r], theta[int(i)], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(state.W[r], W[int(i)], rtol=1e-4, atol=1e-5)
        assert outs[-1].extras["ala_epochs"][r] == epochs.get(int(i), 0)
        # the logged per-layer means, the output layer first
        top = W[int(i)][:len(columns(ctx.clients, 1))]
        assert np.isclose(outs[-1].extras["weight_mean"][r, 0], float(top.mean()), rtol=1e-4)
    assert outs[-1].extras["weight_mean"].shape == (ctx.comm.n_local, layers)
    # W learned (the check would pass with W at ones otherwise) and the start phase ended on its criterion
    every = torch.cat([W[k] for k in range(len(W))])
    assert every.min() < 0.9 and every.max() == 1.0
    first = serial_ref.gathered(ctx, outs[1].extras["ala_epochs"])
    f = cfg.fedala
    assert first.max() <= f.start_limit and any(f.num_pre_loss <= e < f.start_limit for e in first)
    # round 3: one epoch for a client past its start phase (a client first sampled now starts it)
    assert 1 in serial_ref.gathered(ctx, outs[2].extras["ala_epochs"])


@pytest.mark.parametrize("batched", ["on", "off"])
def test_the_adapted_evaluation_is_alas_model_from_the_new_global_model_and_keeps_nothing(mpi, batched):
    """``fedala.evaluate=adapted``: every client's theta^ from Theta^{t+1} (a start
    phase for those never sampled), on copies: W, the flags and the rows stay."""
    cfg = make_cfg(mpi, **{"train.batched": batched, "fedala.evaluate": "adapted"})
    ctx, algo, state, _ = run(cfg, mpi)
    before = (ctx.clients.params.clone(), state.W.clone(), state.started.copy())
    got = algo.evaluate(ctx, state, ROUNDS - 1)
    assert torch.equal(ctx.clients.params, before[0]) and torch.equal(state.W, before[1])
    assert np.array_equal(state.started, before[2])
    model, theta, W, _, started = plain_fedala(cfg, ROUNDS)
    ref = make_ctx(cfg, solo())
    cols = columns(ref.clients, cfg.fedala.layers)
    hats = torch.stack([plain_ala(ref, model, theta[k], W[k], k, ROUNDS - 1, cols, k in started, "fedala-eval")[0]
                        for k in range(ref.N)])
    loss, acc = ref.clients.evaluate("test", hats)
    ids = ctx.comm.local_ids
    np.testing.assert_allclose(got["test_loss"], loss[ids], rtol=1e-4)
    np.testing.assert_allclose(got["test_acc"], acc[ids], atol=1e-6)
    ctx.cfg.fedala.evaluate = "trained"  # the default: theta_i, another model
    assert not np.allclose(algo.evaluate(ctx, state, ROUNDS - 1)["test_loss"], got["test_loss"])


@pytest.mark.parametrize("batched", ["on", "off"])
def test_alas_passes_leave_batchnorm_statistics_alone(mpi, batched):
    """On an MLP with BatchNorm, W's epochs (a round's start phase, the adapted
    evaluation) change no running statistic; local training does."""
    cfg = make_cfg(mpi, **{"train.batched": batched, "fedala.evaluate": "adapted"})
    ctx = bn_ctx(cfg, mpi)
    state = fedala.init(ctx)
    fedala.round(ctx, state, 0)
    for t in (1, 2):
        before = ctx.clients.buffers.clone()
        mine = ctx.local_of(ctx.sample(t, cfg.algorithm.fraction))
        fedala.adapt(ctx, state, mine, t)
        assert torch.equal(ctx.clients.buffers, before)
        fedala.evaluate(ctx, state, t)
        assert torch.equal(ctx.clients.buffers, before)
    assert serial_ref.gathered(ctx, state.started).any()
    fedala.round(ctx, state, 3)
    moved = ~torch.isclose(ctx.clients.buffers, before).all(1)
    assert moved.any() == bool(len(ctx.local_of(ctx.sample(3, cfg.algorithm.fraction))))


@pytest.mark.parametrize("batched", ["on", "off"])
@pytest.mark.parametrize("over", [{"fedala.eta": 0}, {"fedala.layers": 0}])
def test_fedala_without_adaptation_is_fedavg_bit_for_bit(mpi, over, batched):
    ctx, _, got, outs = run(make_cfg(mpi, **{"train.batched": batched, **over}), mpi)
    avg_ctx, _, avg, _ = run(make_cfg(mpi, **{"algorithm.name": "fedavg", "train.batched": batched}), mpi)
    assert torch.equal(got.model, avg.model) and torch.equal(ctx.clients.params, avg_ctx.clients.params)
    adapted = serial_ref.gathered(ctx, outs[-1].extras["ala_epochs"])
    assert (adapted.max() > 0) == ("fedala.eta" in over)  # eta = 0 still ran ALA, with W at ones
    assert not torch.equal(got.model, ctx.clients.init)


@pytest.mark.parametrize("batched", ["off", "on"])
def test_the_same_bits_on_any_number_of_ranks_as_in_one_process(mpi, batched):
    cfg = make_cfg(mpi, **{"train.batched": batched})
    ctx, algo, state, outs = run(cfg, mpi)
    one, alone, last = serial_ref.in_one_process(cfg, algo, ROUNDS)
    ids = torch.as_tensor(ctx.comm.local_ids)
    same = torch.equal if batched == "off" else (lambda a, b: torch.allclose(a, b, rtol=1e-5, atol=1e-6))
    pairs = [("model", state.model, alone.model), ("rows", ctx.clients.params, one.clients.params[ids]),
             ("W", state.W, alone.W[ids]), ("started", torch.as_tensor(state.started),
                                             torch.as_tensor(alone.started[ctx.comm.local_ids]))]
    pairs += [(k, torch.as_tensor(v), torch.as_tensor(last.extras[k][ctx.comm.local_ids]))
              for k, v in outs[-1].extras.items()]
    bad = [k for k, a, b in pairs if not same(a.double(), b.double())]
    assert not bad, bad
    got, want = algo.evaluate(ctx, state, ROUNDS - 1), algo.evaluate(one, alone, ROUNDS - 1)
    for k, v in got.items():
        np.testing.assert_allclose(v, want[k][ctx.comm.local_ids], rtol=1e-5, err_msg=k)


@pytest.mark.parametrize("batched", ["off", "on"])
def test_resumes_bit_for_bit_after_the_start_phase(mpi, shared_tmp, batched):
    """A checkpoint after round 2 (W learned, start phases done) resumed into a
    fresh process state runs rounds 3-4 to the same bits as the run never stopped."""
    cfg = make_cfg(mpi, **{"train.batched": batched})
    ctx, algo, state, _ = run(cfg, mpi, rounds=ROUNDS + 1)
    cut_ctx, _, cut, _ = run(cfg, mpi, rounds=2)
    path = checkpoint.save(RunDir(shared_tmp), cut_ctx, cut, 1)
    fresh_ctx = make_ctx(cfg, mpi)
    fresh = fedala.init(fresh_ctx)
    assert checkpoint.load(path, fresh_ctx, fresh) == 1
    assert serial_ref.gathered(fresh_ctx, fresh.started).any()
    assert (serial_ref.gathered(fresh_ctx, fresh.W) < 1).any()  # W was learned before the cut
    for t in range(2, ROUNDS + 1):
        algo.round(fresh_ctx, fresh, t)
    assert torch.equal(fresh.model, state.model) and torch.equal(fresh_ctx.clients.params, ctx.clients.params)
    assert torch.equal(fresh.W, state.W) and np.array_equal(fresh.started, state.started)
