"""Reference formulas for the analysis tests, written plainly from the papers (float64, loops)."""

from __future__ import annotations

import cmath


def roformer_bound_ref(d: int, r: int, base: float = 10000.0) -> float:
    """RoFormer section 3.4.3, written plainly:
    (1/(d/2)) sum_{j=1}^{d/2} |sum_{i=0}^{j-1} e^{i r theta_i}|."""
    theta = [base ** (-2 * i / d) for i in range(d // 2)]
    total, s = 0.0, 0j
    for t in theta:
        s += cmath.exp(1j * r * t)
        total += abs(s)
    return total / (d // 2)
