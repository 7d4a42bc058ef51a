"""A corpus of malformed inputs: each gives one line `mpifl: error: ...`, exit
status 2, no traceback and nothing written. Every case goes through ``main()`` in
this process (one rank); a few, one per stage where an error can arise (config,
data, checkpoint), also under mpiexec -n 2, where every rank must exit 2 and none
may hang."""

import hashlib
import json

import pytest
import torch
from helpers import launch

from mpifl import config
from mpifl.errors import ConfigError
from mpifl.main import main


def write(path, text_or_bytes):
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text_or_bytes, bytes):
        path.write_bytes(text_or_bytes)
    else:
        path.write_text(text_or_bytes)
    return path


def fake_checkpoint(tmp, name: str, cfg_args: list[str], meta: bytes | None = None, part: bytes = b"\x00junk"):
    """A run directory whose checkpoint is damaged in a chosen way: garbage that its
    manifest vouches for (as a forger would write it), so reading it is what fails."""
    ck = tmp / name / "checkpoint"
    write(ck / "latest", "round-000001")
    d = ck / "round-000001"
    if meta is None:
        cfg = config.load(None, cfg_args)
        d.mkdir(parents=True, exist_ok=True)
        torch.save({"round": 1, "config": cfg.to_dict(), "n_ranks": 2, "starts": torch.tensor([0, 10, 20]),
                    "algo": {"model": torch.zeros(3)}}, d / "meta.pt")
    else:
        write(d / "meta.pt", meta)
    write(d / "part-0000.pt", part)
    write(d / "part-0001.pt", part)
    files = {p.name: [len(p.read_bytes()), hashlib.sha256(p.read_bytes()).hexdigest()] for p in d.iterdir()}
    write(d / "manifest.json", json.dumps({"round": 1, "files": files}))


# name -> (config text or bytes, "" for no config file, or None when the first override is the
# config path; overrides; expected fragment)
CASES = {
    "unknown section": ("bogus: {x: 1}\n", [], "unknown key 'bogus'"),
    "unknown key": ("run: {roundz: 3}\n", [], "unknown key 'run.roundz'"),
    "unknown override key": ("", ["train.learning_rate=0.1"], "unknown key 'train.learning_rate'"),
    "wrong type": ("data: {n_clients: three}\n", [], "data.n_clients='three' must be an integer"),
    "float for int": ("", ["run.rounds=2.5"], "run.rounds=2.5 must be an integer"),
    "bool for int": ("", ["run.seed=true"], "run.seed=True must be an integer"),
    "bad choice": ("algorithm: {name: fedsgd}\n", [], "choose one of"),
    "bad batched choice": ("", ["train.batched=maybe"], "train.batched='maybe'"),
    "fraction out of range": ("", ["algorithm.fraction=1.5"], "algorithm.fraction=1.5"),
    "zero fraction": ("", ["algorithm.fraction=0"], "must be in (0, 1]"),
    "negative lr": ("", ["train.lr=-0.1"], "train.lr=-0.1"),
    "zero rounds": ("", ["run.rounds=0"], "run.rounds=0"),
    "more ranks than clients": ("", ["data.n_clients=1"], "number of MPI ranks"),
    "too many clusters": ("", ["data.n_clusters=11"], "at most 10 clusters"),
    "fesem without clusters": ("", ["algorithm.name=fesem", "data.partition=dirichlet"], "fesem.k=0"),
    "oracle on iid": ("", ["algorithm.name=oracle", "data.partition=iid"], "oracle needs true clusters"),
    "fedprox negative mu": ("", ["algorithm.name=fedprox", "fedprox.mu=-1"], "fedprox.mu=-1.0"),
    "ditto negative lam": ("ditto: {lam: -0.5}\n", ["algorithm.name=ditto"], "ditto.lam=-0.5"),
    "fedrep negative head epochs": ("", ["algorithm.name=fedrep", "fedrep.head_epochs=-3"], "fedrep.head_epochs=-3"),
    "fedprox_ft best_val without val": ("", ["algorithm.name=fedprox_ft", "data.val_frac=0"],
                                        "fedprox_ft.start='best_val'"),
    "val+test too big": ("", ["data.val_frac=0.5", "data.test_frac=0.5"], "must be < 1"),
    "tiny dataset": ("", ["data.n_samples=5"], "data.n_samples=5"),
    "hidden not ints": ("model: {hidden: [a, b]}\n", [], "model.hidden"),
    "run name with slash": ("", ["run.name=a/b"], "run.name='a/b'"),
    "section not a mapping": ("model: 5\n", [], "model must be a mapping"),
    "not yaml": ("run: [rounds: 3\n", [], "not valid YAML"),
    "empty config file": ("\n# only a comment\n", [], "is empty; to run on the defaults give no config file"),
    "not a mapping": ("- 1\n- 2\n", [], "must hold a mapping"),
    "binary file": (b"\x89HDF\r\n\x1a\n\x00\xff\xfe" * 20, [], "is not a YAML text file"),
    "malformed override": ("", ["rounds5"], "must look like section.key=value"),
    "missing config file": (None, ["missing.yaml"], "not found"),
    "config is a directory": (None, ["DIR"], "is not a file"),
    "cuda without gpu": ("", ["run.device=cuda"], "run.device='cuda'"),
    "out_dir is a file": ("", ["run.out_dir=FILE"], "cannot create"),
    "resume required, none": ("", ["run.resume=require"], "no checkpoint"),
    "resume other config": ("", ["run.name=other", "train.lr=0.2"], "different config: train.lr"),
    "checkpoint meta garbage": ("", ["run.name=badmeta"], "is unreadable"),
    "checkpoint part garbage": ("", ["run.name=badpart"], "is unreadable"),
    "data root missing": ("", ["data.name=cifar10", "data.root=/nonexistent/data"], "/nonexistent/data"),
    # not fashionmnist: it is read from Debian's dataset-fashion-mnist where that is installed
    "data root not given": ("", ["data.name=mnist"], "set data.root"),
    "data root is a file": ("", ["data.name=mnist", "data.root=FILE"], "mnist"),
    "features file not npz": ("", ["data.name=features", "data.root=FILE"], "features"),
}


# checked only under mpiexec: one rank cannot be more ranks than clients
MPI_ONLY = {"more ranks than clients"}
# one case per stage, under mpiexec -n 2 (config, data on every rank, checkpoint agreed by all)
UNDER_MPIEXEC = ["unknown key", "more ranks than clients", "data root missing", "checkpoint part garbage"]


def prepare(tmp_path, case: str) -> tuple[list[str], str, object]:
    """The command-line arguments of a case (its files written), its expected
    fragment and the run directory that must not be created."""
    text, over, needle = CASES[case]
    over = [o.replace("DIR", str(tmp_path)).replace("FILE", str(write(tmp_path / "afile", "x"))) for o in over]
    out = tmp_path / "out"
    common = [f"run.out_dir={out}", "data.name=synthetic", "data.n_samples=200", "run.rounds=2", "run.threads=1"]
    if case == "resume other config":
        fake_checkpoint(out, "other", [*common, "run.name=other"])
    if case == "checkpoint meta garbage":
        fake_checkpoint(out, "badmeta", [], meta=b"not a pickle")
    if case == "checkpoint part garbage":
        fake_checkpoint(out, "badpart", [*common, "run.name=badpart"])
    # overrides after the common ones: the later value of a key wins
    if text is None:
        args = [over[0], *common, *over[1:]]
    elif text == "":
        args = [*common, *over]
    else:
        args = [str(write(tmp_path / "bad.yaml", text)), *common, *over]
    if case == "cuda without gpu" and torch.cuda.is_available():
        pytest.skip("a GPU is visible here")
    return args, needle, out


def check_one_line(code: int, stderr: str, needle: str) -> None:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert code == 2, stderr
    assert len(lines) == 1 and lines[0].startswith("mpifl: error:"), stderr
    assert needle in lines[0], lines[0]
    assert "Traceback" not in stderr


@pytest.mark.parametrize("case", sorted(set(CASES) - MPI_ONLY))
def test_bad_input_one_line_exit_2(tmp_path, capsys, case):
    args, needle, out = prepare(tmp_path, case)
    code = main(args)
    std = capsys.readouterr()
    check_one_line(code, std.err, needle)
    assert "Traceback" not in std.out
    assert not (out / "run" / "run.h5").exists()


@pytest.mark.slow
@pytest.mark.parametrize("case", UNDER_MPIEXEC)
def test_bad_input_every_rank_exits_2_under_mpiexec(tmp_path, case):
    args, needle, out = prepare(tmp_path, case)
    res = launch(args, n=2, timeout=90)
    check_one_line(res.returncode, res.stderr, needle)
    assert "Traceback" not in res.stdout
    assert not (out / "run" / "run.h5").exists()


# every option of apfl, perfedavg: one line naming the key, the value and what is allowed
BASELINE_B_CASES = {
    "apfl.alpha=-0.1": "apfl.alpha=-0.1 is not allowed; must be in [0, 1]",
    "apfl.alpha=1.5": "apfl.alpha=1.5 is not allowed; must be in [0, 1]",
    "apfl.adaptive=maybe": "apfl.adaptive='maybe'",
    "perfedavg.variant=so": "perfedavg.variant='so'",
    "perfedavg.alpha=0": "perfedavg.alpha=0.0 is not allowed; must be a finite number > 0",
    "perfedavg.beta=-0.1": "perfedavg.beta=-0.1 is not allowed; must be a finite number >= 0 (0 = train.lr)",
    "perfedavg.delta=0": "perfedavg.delta=0.0 is not allowed; must be a finite number > 0",
}


@pytest.mark.parametrize("override", sorted(BASELINE_B_CASES))
def test_baseline_b_option_out_of_range_is_one_line(override):
    with pytest.raises(ConfigError) as e:
        config.load(None, [f"algorithm.name={override.split('.')[0]}", override])
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(override.split("=")[0] + "=")
    assert BASELINE_B_CASES[override] in msg


@pytest.mark.slow
def test_baseline_b_bad_option_exits_2_under_mpiexec(tmp_path):
    res = launch(["algorithm.name=perfedavg", "perfedavg.alpha=-1", "data.name=synthetic", "data.n_samples=200",
                  f"run.out_dir={tmp_path}"], n=2, timeout=90)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    assert lines[0] == "mpifl: error: perfedavg.alpha=-1.0 is not allowed; must be a finite number > 0"


@pytest.mark.parametrize("args,hint", [
    (["--rounds", "5"], "(did you mean run.rounds=5?)"),
    (["--lr=0.1"], "(did you mean train.lr=0.1 or fedadam.lr=0.1 or fedavgm.lr=0.1?)"),
    (["--roundz", "3"], "(did you mean run.rounds=3?)"),
    (["--verbose"], "(every key: python -m mpifl.config)")])
def test_an_option_for_a_config_key_names_the_override(args, hint, capsys):
    """``--rounds 5`` is argparse's "unrecognized arguments" plus the key=value it meant."""
    with pytest.raises(SystemExit) as e:
        main(["jobs/quickstart.yaml", *args])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 2 and err == (f"python -m mpifl.main: error: unrecognized arguments: {' '.join(args)}; "
                                         f"config keys are set as section.key=value {hint}")
