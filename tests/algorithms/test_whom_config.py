"""Bad values of the options of cfl, fesem, pfedgraph and fedfomo: one line
naming the key, its value and what is allowed (``main`` exits 2 with it)."""

import pytest

from mpifl import config
from mpifl.errors import ConfigError

CASES = [
    (["cfl.eps1=0"], "cfl.eps1", "finite number > 0"),
    (["cfl.eps1=inf"], "cfl.eps1", "finite number > 0"),
    (["cfl.eps2=-1"], "cfl.eps2", "finite number > 0"),
    (["cfl.warmup_rounds=-1"], "cfl.warmup_rounds", ">= 0"),
    (["cfl.min_size=0"], "cfl.min_size", ">= 1"),
    (["cfl.linkage=average"], "cfl.linkage", "choose one of"),
    (["fesem.k=-1"], "fesem.k", ">= 1, or 0"),
    (["algorithm.name=fesem", "data.partition=dirichlet"], "fesem.k", "records no true clusters"),
    (["algorithm.name=fesem", "fesem.k=3", "data.n_clients=10", "algorithm.fraction=0.2"], "fesem.k",
     "clients sampled per round (2)"),
    (["pfedgraph.alpha=0"], "pfedgraph.alpha", "finite number > 0"),
    (["pfedgraph.alpha=nan"], "pfedgraph.alpha", "finite number > 0"),
    (["pfedgraph.lam=-0.1"], "pfedgraph.lam", "finite number >= 0"),
    (["fedfomo.m=0"], "fedfomo.m", ">= 1"),
    (["algorithm.name=fedfomo", "fedfomo.m=10", "data.n_clients=10"], "fedfomo.m", "data.n_clients - 1 (9)"),
    (["fedfomo.eps=1.5"], "fedfomo.eps", "[0, 1]"),
    (["fedfomo.eps_decay=-0.1"], "fedfomo.eps_decay", "[0, 1]"),
    (["fedfomo.val_frac=0"], "fedfomo.val_frac", "(0, 1)"),
    (["fedfomo.val_frac=1"], "fedfomo.val_frac", "(0, 1)"),
]


@pytest.mark.parametrize(("over", "key", "allowed"), CASES, ids=[" ".join(c[0]) for c in CASES])
def test_bad_value_one_line_naming_the_key(over, key, allowed):
    with pytest.raises(ConfigError, match=f"^{key}=") as e:
        config.load(None, over)
    assert "\n" not in str(e.value) and allowed in str(e.value)


def test_defaults_load():
    for name in ("cfl", "fesem", "pfedgraph", "fedfomo"):
        config.load(None, [f"algorithm.name={name}", "data.partition=clusters"])
