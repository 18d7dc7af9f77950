"""Benchmark: ``posenc bench train_step`` (see posenc.benchmarks.train_step for what is measured)."""

import sys

from _harness import main_for

if __name__ == "__main__":
    sys.exit(main_for("train_step"))
