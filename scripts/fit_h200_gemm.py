"""Fit the twin's GEMM model for the H200 to GLM-5's measured expert GEMMs, and check it on Llama's dense ones: the
fit itself is tools/calibrate.py (`pivot calibrate --from-json` runs the same on files of your own).

    python scripts/fit_h200_gemm.py            # fit, print the fitted scalars and the tables
    python scripts/fit_h200_gemm.py --write    # ... and write them into tools/profiles/hardware/h200.toml
    python scripts/fit_h200_gemm.py --check    # only the current profile against the measurements
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools.calibrate import main

if __name__ == "__main__":
    main()
