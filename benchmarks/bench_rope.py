"""Benchmark: ``posenc bench rope`` (see posenc.benchmarks.rope for what is measured)."""

import sys

from _harness import main_for

if __name__ == "__main__":
    sys.exit(main_for("rope"))
