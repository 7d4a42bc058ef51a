"""``python -m mpifl.data CONFIG.yaml [section.key=value ...] [--png PATH]``

Prints the partition a run would use (rank 0 only when launched under MPI):
one line per client with its train/val/test sizes, true cluster and training
label histogram, and optionally saves the label histogram as a PNG heatmap.
Loads the dataset but converts no sample to float (no client is local here).
User errors print one line and exit 2, as ``mpifl.main`` does.

``python -m mpifl.data fetch NAME --root DIR [--mirror URL|FOLDER]`` downloads
one of the torchvision-hosted datasets into the layout ``data.root`` reads
(:mod:`mpifl.data.fetch`); ``python -m mpifl.data verify --root DIR [NAME ...]``
says, per dataset, whether DIR holds it complete and intact
(:mod:`mpifl.data.verify`). See docs/data.md.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from mpifl.data import FederatedData


def summary(data: FederatedData, max_classes: int = 20) -> str:
    """clients x (n_train, n_val, n_test, cluster, label histogram) as text."""
    C = data.n_classes
    full = C <= max_classes
    head = "labels" if full else f"labels held (of {C}), top 5 as class:count"
    lines = [f"{data.n_clients} clients, {C} classes, input shape {tuple(data.in_shape)}",
             f"{'client':>6} {'train':>6} {'val':>5} {'test':>5} {'cluster':>7}  {head}"]
    for c in range(data.n_clients):
        h = data.label_hist[c]
        if full:
            hist = " ".join(f"{v:>4d}" for v in h)
        else:
            top = np.argsort(-h, kind="stable")[:5]
            hist = f"{int((h > 0).sum()):>3d}  " + " ".join(f"{t}:{h[t]}" for t in top if h[t] > 0)
        n = data.sizes[c]
        lines.append(f"{c:>6} {n[0]:>6} {n[1]:>5} {n[2]:>5} {data.cluster[c]:>7}  {hist}")
    tot = data.sizes.sum(0)
    lines.append(f"{'total':>6} {tot[0]:>6} {tot[1]:>5} {tot[2]:>5}")
    return "\n".join(lines)


def heatmap(data: FederatedData, path: str, title: str = "") -> None:
    """Clients x classes training-label counts, clients ordered by true cluster
    (the figure ``mpifl.analyze`` draws from a log's /clients/label_hist)."""
    from pathlib import Path

    from mpifl.analysis.plots import plot_label_hist

    plot_label_hist(data.label_hist, data.cluster, Path(path), title)


STORE_EPILOG = """\
fetch:   python -m mpifl.data fetch cifar10 --root /project/me/data
verify:  python -m mpifl.data verify --root /project/me/data
then:    data.root=/project/me/data in the job's config (docs/data.md)
"""


def store(argv: list[str]) -> int:
    """The ``fetch`` and ``verify`` subcommands."""
    from mpifl.data import datasets, fetch, sources, verify
    from mpifl.errors import ConfigError

    ap = argparse.ArgumentParser(prog="python -m mpifl.data", epilog=STORE_EPILOG,
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 description="Put datasets onto disk, or check what a data.root holds.")
    sub = ap.add_subparsers(dest="command", required=True)
    f = sub.add_parser("fetch", help="download a torchvision-hosted dataset into DIR (md5-checked)",
                       description=fetch.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    f.add_argument("name", help=f"one of {', '.join(sources.NAMES)}")
    f.add_argument("--root", required=True, help="the folder data.root will name")
    f.add_argument("--mirror", help="base URL (or local folder) serving the same file names")
    v = sub.add_parser("verify", help="per dataset: present, missing files or bad checksum "
                                      "(exit 1 if any found incomplete or damaged)",
                       description=verify.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    v.add_argument("names", nargs="*", metavar="NAME",
                   help=f"only these, each required ({', '.join(verify.ALL)}); default: all, absent ones fine")
    v.add_argument("--root", help="the folder data.root names; default: Debian's Fashion-MNIST folder "
                                  f"{datasets.DEBIAN_FASHION_MNIST} where it exists")
    a = ap.parse_args(argv)
    if a.command == "verify" and a.root is None:
        if not datasets.DEBIAN_FASHION_MNIST.is_dir():
            ap.error(f"verify needs --root DIR (no {datasets.DEBIAN_FASHION_MNIST} here, the folder it checks "
                     f"without one)")
        a.root = str(datasets.DEBIAN_FASHION_MNIST)
    try:
        if a.command == "fetch":
            fetch.fetch(a.name, a.root, a.mirror)
            return 0
        return verify.report(a.root, a.names)
    except (ConfigError, fetch.FetchError) as e:
        print(f"mpifl.data: error: {e}", file=sys.stderr, flush=True)
        return 2


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in ("fetch", "verify"):
        return store(args)
    from mpifl import config
    from mpifl.comm import world
    from mpifl.data import build
    from mpifl.errors import ConfigError

    ap = argparse.ArgumentParser(prog="python -m mpifl.data", description=__doc__.splitlines()[2],
                                 epilog="datasets onto disk: python -m mpifl.data fetch --help; "
                                        "checking a data.root: python -m mpifl.data verify --help")
    ap.add_argument("config", nargs="?", help="YAML config (defaults apply when omitted)")
    ap.add_argument("overrides", nargs="*", help="section.key=value")
    ap.add_argument("--png", help="save the clients x classes heatmap here")
    a = ap.parse_args(args)
    path, overrides = a.config, a.overrides
    if path and "=" in path:
        path, overrides = None, [path, *overrides]
    rank = world().Get_rank()
    if rank != 0:
        return 0
    try:
        cfg = config.load(path, overrides)
        data = build(cfg.data, cfg.run.seed, np.arange(0))
    except ConfigError as e:
        print(f"mpifl: error: {e}", file=sys.stderr, flush=True)
        return 2
    d = cfg.data
    print(f"data.name={d.name} data.partition={d.partition} data.test_source={d.test_source} seed={cfg.run.seed}")
    print(summary(data), flush=True)
    if a.png:
        heatmap(data, a.png, f"{d.name} / {d.partition} / seed {cfg.run.seed}")
        print(f"heatmap: {a.png}")
    return 0


if __name__ == "__main__":
    from mpifl.cli import quiet_pipe

    sys.exit(quiet_pipe(main))
