"""Bad values of the options of fedprox, fedprox_ft, fedavg_ft, ditto and fedrep:
one line naming the key and what is allowed (exit 2 through ``mpifl.main``, see
tests/test_bad_inputs.py)."""

import pytest

from mpifl import config
from mpifl.errors import ConfigError

CASES = [
    (["fedprox.mu=-0.1"], "fedprox.mu", "must be a finite number >= 0"),
    (["fedprox.mu=inf"], "fedprox.mu", "must be a finite number >= 0"),
    (["fedprox.mu=.nan"], "fedprox.mu", "must be a finite number >= 0"),
    (["fedprox.mu=abc"], "fedprox.mu", "must be a number"),
    (["fedavg_ft.ft_epochs=-1"], "fedavg_ft.ft_epochs", "must be >= 0 (0 = 2 * train.local_epochs)"),
    (["fedavg_ft.ft_epochs=1.5"], "fedavg_ft.ft_epochs", "must be an integer"),
    (["fedprox_ft.ft_epochs=-1"], "fedprox_ft.ft_epochs", "must be >= 0 (0 = 2 * train.local_epochs)"),
    (["fedprox_ft.start=best"], "fedprox_ft.start", "choose one of: best_val, last"),
    (["algorithm.name=fedprox_ft", "data.val_frac=0"], "fedprox_ft.start", "set data.val_frac > 0 or use last"),
    (["fedavg_ft.start=first"], "fedavg_ft.start", "choose one of: last, best_val"),
    (["algorithm.name=fedavg_ft", "fedavg_ft.start=best_val", "data.val_frac=0"], "fedavg_ft.start",
     "set data.val_frac > 0 or use last"),
    (["ditto.lam=-1"], "ditto.lam", "must be a finite number >= 0"),
    (["ditto.lam=inf"], "ditto.lam", "must be a finite number >= 0"),
    (["ditto.personal_epochs=-2"], "ditto.personal_epochs", "must be >= 0 (0 = train.local_epochs)"),
    (["fedrep.head_epochs=-1"], "fedrep.head_epochs", "must be >= 0"),
    (["fedrep.head_epochs=ten"], "fedrep.head_epochs", "must be an integer"),
]


@pytest.mark.parametrize(("overrides", "key", "allowed"), CASES, ids=[" ".join(c[0]) for c in CASES])
def test_bad_value_is_one_line_naming_key_and_range(overrides, key, allowed):
    with pytest.raises(ConfigError, match=f"^{key}=") as e:
        config.load(None, overrides)
    assert allowed in str(e.value) and "\n" not in str(e.value)


def test_ft_epochs_is_each_finetuning_algorithms_own_key():
    assert config.load(None, ["fedavg_ft.ft_epochs=3"]).fedprox_ft.ft_epochs == 0
    with pytest.raises(ConfigError, match="^unknown key 'algorithm.ft_epochs' in section 'algorithm'"):
        config.load(None, ["algorithm.ft_epochs=1"])


def test_best_val_without_validation_is_refused_only_when_chosen():
    config.load(None, ["algorithm.name=fedavg", "data.val_frac=0"])  # fedprox_ft's default start is not read
    config.load(None, ["algorithm.name=fedprox_ft", "fedprox_ft.start=last", "data.val_frac=0"])
