"""Run a bench script as on an AVX2 machine kind: mpifl's fused conv kernel built
for Haswell's instruction set (``-march=haswell``, a build of its own, named by its
flags), to be started with torch's and MKL's dispatch held at AVX2 too:

    ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 python bench/as_avx2.py bench/roofline.py --models cnn_dpfl

The same core, fewer instructions: not another CPU's caches or ports.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mpifl.train import fused  # noqa: E402

fused.FLAGS = ("-O3", "-march=haswell", "-ffp-contract=fast", "-fopenmp")

if __name__ == "__main__":
    script, sys.argv = sys.argv[1], sys.argv[1:]
    built = fused._build()
    if isinstance(built, str):
        sys.exit(f"the fused kernel does not build for haswell: {built}")
    runpy.run_path(script, run_name="__main__")
