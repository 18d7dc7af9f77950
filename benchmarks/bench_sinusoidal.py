"""Benchmark: ``posenc bench sinusoidal`` (see posenc.benchmarks.sinusoidal for what is measured)."""

import sys

from _harness import main_for

if __name__ == "__main__":
    sys.exit(main_for("sinusoidal"))
