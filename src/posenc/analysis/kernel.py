"""The positional kernel: what a scheme adds to the attention logit between positions m and n.

Every scheme acts through its hooks (docs/architecture.md). For fixed content, the part of the
scaled attention logit that depends on the query position ``m`` and key position ``n`` is

==============  ===================================================================================
hook            kernel ``K(m, n)`` (one value per head ``h``)
==============  ===================================================================================
``embed``       ``(PE(m) W_q) . (PE(n) W_k) / sqrt(d')``; projections default to identity (``d' = d``)
``rotate``      ``(R_m q) . (R_n k) / sqrt(d_h)`` for content ``q``, ``k``
``queries``     what the query transform ``Q_m`` adds: ``(Q_m(q') - q') . k' / sqrt(d_h)``, with
                ``q'``, ``k'`` the (rotated, if the scheme rotates) content
``score_bias``  the bias itself, ``bias[h, m, n]`` (already on the scaled-logit scale)
==============  ===================================================================================

and a scheme with several hooks gets the sum. Which hooks run is read from ``scheme.hooks``, the
position form from ``position_dims`` (and ``sequence_positions``) and the head count a hook takes
from the scheme's ``num_heads`` (1 when it declares none): the analysis never calls a scheme with
trial shapes. Content is chosen by ``content``:

* ``"mean"`` (default): the expectation over isotropic unit-variance content shared by query
  and key (``q = k = c``, ``E[c c^T] = I``). For a rotation this is exact and deterministic:
  ``E[(R_m c).(R_n c)] = trace(R_m^T R_n)``, computed by rotating the ``d_h`` basis vectors. A
  query transform is affine per position (``Q_m(c) = A_m c + b_m``), so its mean is
  ``trace(A_m) - d_h`` (Transformer-XL's ``u``: 0; Llama 4's temperature: ``(f(m) - 1) d_h``).
  Biases that depend on content (Shaw, Transformer-XL) are affine in ``q``, so their mean is the
  bias at ``q = 0``.
* ``"random"``: one seeded draw ``q, k ~ N(0, I)``, independent (RoFormer's setting).

Positions are arbitrary integer tensors, including positions past a scheme's nominal or
trained length; a scheme that cannot encode them (a learned table) raises its own ``ValueError``.

Legend: ``h`` heads, ``m`` query positions, ``n`` key positions, ``s`` positions, ``d`` model
width, ``d_h`` head width, ``r`` relative distance ``m - n``.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .._validate import check_choice, check_int
from ..base import PositionalScheme
from ..registry import build_with_context
from .context import DEFAULT_CONTEXT

__all__ = [
    "CONTENT_MODES",
    "DEFAULT_CONTEXT",
    "Probe",
    "display_kernel",
    "encodings",
    "kernel_curve",
    "make_probe",
    "positional_kernel",
    "query_rows",
    "rotate_rows",
    "rotation_frequencies",
]


CONTENT_MODES = ("mean", "random")


@dataclass
class Probe:
    """A built scheme plus the sizes the analysis needs to feed its hooks.

    Attributes:
        name: registry name (or the class name for an unregistered instance).
        scheme: the module.
        d_model: ``d``, width of ``embed`` inputs.
        head_dim: ``d_h``, width of ``rotate``/``score_bias`` query inputs.
        num_heads: ``h`` for content-dependent biases.
        nominal_len: the scheme's ``max_len``, or the context's ``max_len`` when it has none.
        causal: whether the context is a causal decoder.
        options: the scheme's own options when it was built by name (``{}``: its defaults), so
            an analysis can rebuild it with more (a scaling); None for a module given as it is.
        cache: results computed once per probe (frequencies, fits), shared by checks and plots.
    """

    name: str
    scheme: PositionalScheme
    d_model: int
    head_dim: int
    num_heads: int
    nominal_len: int
    causal: bool
    options: dict[str, Any] | None = None
    cache: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def hooks(self) -> tuple[str, ...]:
        return tuple(self.scheme.hooks)

    @property
    def bounded_length(self) -> bool:
        """True when the scheme has a finite position table (``max_len`` set)."""
        return self.scheme.max_len is not None

    @property
    def trainable(self) -> bool:
        """True when the scheme has trainable parameters (its values are not fixed by a formula)."""
        return any(p.requires_grad for p in self.scheme.parameters())

    @property
    def rotates(self) -> bool:
        """True when the scheme declares a ``rotate`` hook (a rotation of queries and keys by their
        positions; a transform of the queries alone is the ``queries`` hook)."""
        return "rotate" in self.hooks

    @property
    def has_vectors(self) -> bool:
        """True when each position has its own vector (``embed``, or a positional ``rotate``)."""
        return "embed" in self.hooks or self.rotates


def _first_int_attr(obj: object, names: Sequence[str]) -> int | None:
    for n in names:
        v = getattr(obj, n, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def make_probe(
    scheme: str | PositionalScheme,
    context: dict[str, Any] | None = None,
    config: dict[str, Any] | None = None,
) -> Probe:
    """Build (or wrap) a scheme for analysis.

    Args:
        scheme: a registry name (built with :func:`posenc.registry.build_with_context`) or a module.
        context: what a model would offer (``d_model``, ``num_heads``, ``head_dim``, ``max_len``,
            ``causal``); missing keys come from :data:`DEFAULT_CONTEXT`.
        config: the scheme's own options (e.g. ``{"scaling": {...}}`` for a rotary scheme).

    A named scheme is built under ``torch.manual_seed(0)`` (the global RNG state is restored), so
    checks and plots of trainable schemes at init are reproducible.

    The widths are read from the scheme's public attributes (``d_model``, ``head_dim``,
    ``num_heads``) when it has them, else from the context.
    """
    ctx = {**DEFAULT_CONTEXT, **(context or {})}
    if isinstance(scheme, str):
        name = scheme
        with torch.random.fork_rng(devices=[]):  # trainable schemes start from the same init every time
            torch.manual_seed(0)
            module = build_with_context(name, ctx, config)
    elif isinstance(scheme, PositionalScheme):
        if config:
            raise ValueError("config applies only when scheme is given by name; got a module and config")
        name, module = scheme.name, scheme
    else:
        raise TypeError(f"scheme must be a registry name or a PositionalScheme, got {type(scheme).__name__}")
    d_model = _first_int_attr(module, ("d_model",)) or check_int(ctx["d_model"], "context['d_model']")
    head_dim = _first_int_attr(module, ("head_dim", "dim")) or check_int(
        ctx["head_dim"], "context['head_dim']"
    )
    num_heads = _first_int_attr(module, ("num_heads", "heads")) or check_int(
        ctx["num_heads"], "context['num_heads']"
    )
    nominal = (
        module.max_len if module.max_len is not None else check_int(ctx["max_len"], "context['max_len']")
    )
    causal = bool(ctx.get("causal", False))
    options = dict(config or {}) if isinstance(scheme, str) else None
    return Probe(name, module, d_model, head_dim, num_heads, int(nominal), causal, options)


def _as_probe(scheme: str | PositionalScheme | Probe, context: dict[str, Any] | None = None) -> Probe:
    return scheme if isinstance(scheme, Probe) else make_probe(scheme, context)


def _positions(positions: int | Sequence[int] | torch.Tensor, name: str, dims: int = 1) -> torch.Tensor:
    """An int ``s`` -> ``arange(s)``; a list or 1-D integer tensor -> int64 ``[s]``; for a scheme of
    ``dims`` > 1 position axes, grid coordinates ``[s, dims]`` are taken as they are."""
    if isinstance(positions, bool):
        raise TypeError(f"{name} must be an int or integer positions, got bool")
    if isinstance(positions, int):
        return torch.arange(check_int(positions, name, minimum=1))
    t = torch.as_tensor(positions)
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise TypeError(f"{name} must be integer positions, got dtype {t.dtype}; pass e.g. torch.arange(s)")
    if dims > 1 and t.dim() == 2 and t.shape[1] == dims and t.shape[0] > 0:
        return t.long()  # grid coordinates [s, dims]
    if t.dim() != 1 or t.numel() == 0:
        grid = f" or grid coordinates [s, {dims}]" if dims > 1 else ""
        raise ValueError(f"{name} must be a non-empty 1-D tensor [s]{grid}, got shape {tuple(t.shape)}")
    return t.long()


def _cast(probe: Probe, dtype: torch.dtype | None) -> PositionalScheme:
    """The scheme, or a cast copy of it (``module.to`` casts in place, the probe keeps float32)."""
    if dtype is None:
        return probe.scheme
    return copy.deepcopy(probe.scheme).to(dtype)


def _embed_table(probe: Probe, pos: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """``PE(p)`` rows ``[s, d]`` through ``embed`` on zero input (in ``dtype``, float32 by default).

    A grid scheme (``position_dims`` > 1, e.g. 2-D sinusoidal) takes coordinates ``[s, n]``, or
    positions ``[s]`` along its first axis, the other coordinates 0.
    """
    module = _cast(probe, dtype)
    dt = dtype or torch.float32
    s, d = pos.shape[0], probe.d_model
    ndim = probe.scheme.position_dims
    with torch.no_grad():
        if ndim > 1:
            x = torch.zeros((1, s) + (1,) * (ndim - 1) + (d,), dtype=dt)  # [1, s, 1.., d]
            coords = _lift(pos, ndim).view((s,) + (1,) * (ndim - 1) + (ndim,))  # [s, 1.., n]
            return module.embed(x, coords).reshape(s, d)  # [1, s, 1.., d] -> [s, d]
        return module.embed(torch.zeros(1, s, d, dtype=dt), pos)[0]  # [1, s, d] -> [s, d]


def _lift(pos: torch.Tensor, axes: int) -> torch.Tensor:
    """Positions ``[s]`` as coordinates along the first of ``axes`` axes: ``[s]`` or ``[s, axes]``;
    coordinates ``[s, axes]`` unchanged."""
    if axes == 1 or pos.dim() == 2:
        return pos
    coords = torch.zeros(pos.numel(), axes, dtype=torch.long)  # [s, n]: (p, 0, ..)
    coords[:, 0] = pos
    return coords


def _hook_heads(probe: Probe) -> int:
    """Heads to feed ``rotate``/``queries``: the scheme's own ``num_heads`` when it declares one (a
    module built for ``h`` heads checks them; Transformer-XL's ``u`` is one vector per head), else 1."""
    heads = getattr(probe.scheme, "num_heads", None)
    return heads if isinstance(heads, int) and not isinstance(heads, bool) and heads > 0 else 1


def _hook_positions(probe: Probe, pos: torch.Tensor) -> torch.Tensor:
    """Positions in the form the scheme's attention hooks take, read from its declarations: ``[s]``
    for a 1-D scheme, or a grid scheme that declares ``sequence_positions``; coordinates ``[s, D]``
    (``[s]`` as ``(p, 0, ..)``) for another grid scheme of ``D = position_dims`` axes."""
    dims = probe.scheme.position_dims
    if dims == 1 or (pos.dim() == 1 and probe.scheme.sequence_positions):
        return pos
    return _lift(pos, dims)


def rotate_rows(
    probe: Probe, content: torch.Tensor, pos: torch.Tensor, dtype: torch.dtype | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate each content vector at every position through the scheme's ``rotate`` hook, as query
    and as key (head 0): ``content [c, d_h]``, positions ``[s]`` (or grid coordinates ``[s, D]``)
    -> ``(R q, R k)``, each ``[c, s, d_h]``, in ``dtype`` (float32 by default)."""
    heads = _hook_heads(probe)
    coords = _hook_positions(probe, pos)  # [s] or [s, D]
    module = _cast(probe, dtype)
    dt = dtype or torch.float32
    c = content.shape[0]
    x = content.to(dt)[:, None, None, :].expand(c, heads, pos.shape[0], content.shape[-1])  # [c, h, s, d_h]
    with torch.no_grad():
        q, k = module.rotate(x.contiguous(), x.contiguous(), coords, coords)
    return q[:, 0], k[:, 0]  # head 0: [c, h, s, d_h] -> [c, s, d_h]


def query_rows(probe: Probe, rows: torch.Tensor, pos: torch.Tensor, *, linear: bool = False) -> torch.Tensor:
    """The scheme's ``queries`` hook on query rows at their positions, for every head it takes.

    Args:
        probe: the scheme (its ``queries`` hook; the identity for a scheme without one).
        rows: ``[c, s, d_h]`` query vectors, row ``j`` of each at position ``pos[j]``.
        pos: ``[s]`` positions (or grid coordinates ``[s, D]``).
        linear: return the linear part ``A_p q`` only (the hook minus its value at ``q = 0``).

    Returns:
        ``[c, h, s, d_h]`` in ``rows``' dtype (float32 at least), ``h`` = the scheme's ``num_heads``
        (1 when it declares none).
    """
    heads = _hook_heads(probe)
    c, s, d_h = rows.shape
    wide = torch.promote_types(rows.dtype, torch.float32)
    x = rows.to(wide)[:, None].expand(c, heads, s, d_h).contiguous()  # [c, h, s, d_h]
    coords = _hook_positions(probe, pos)
    with torch.no_grad():
        out = probe.scheme.queries(x, coords, qk_layout="bhsd")
        if linear:
            out = out - probe.scheme.queries(torch.zeros_like(x[:1]), coords, qk_layout="bhsd")  # - b_p
    return out


def encodings(
    scheme: str | PositionalScheme | Probe,
    positions: int | Sequence[int] | torch.Tensor,
    *,
    dtype: torch.dtype | None = None,
    context: dict[str, Any] | None = None,
) -> torch.Tensor:
    """The vector each position gets, for schemes that have one.

    ``embed`` schemes: ``PE(p)``. ``rotate`` schemes: ``R_p u`` for the fixed unit content
    ``u = (1, ..., 1) / sqrt(d_h)`` (the query side), so the rows show the rotation itself.

    Args:
        scheme: a name, a module or a :class:`Probe`.
        positions: an int ``s`` (``0..s-1``) or integer positions ``[s]``.
        dtype: cast a copy of the module (and the input) to this dtype first (bf16/fp16 checks).

    Returns:
        float tensor ``[s, d]`` (``embed``) or ``[s, d_h]`` (``rotate``), in ``dtype`` (float32 default).

    Raises:
        ValueError: the scheme has neither hook (biases have no per-position vector).
    """
    probe = _as_probe(scheme, context)
    pos = _positions(positions, "positions")
    if "embed" in probe.hooks:
        return _embed_table(probe, pos, dtype)
    if probe.rotates:
        u = torch.full((1, probe.head_dim), probe.head_dim**-0.5)  # [1, d_h]
        return rotate_rows(probe, u, pos, dtype)[0][0]  # [1, s, d_h] -> [s, d_h]
    raise ValueError(
        f"scheme {probe.name!r} has no per-position vector (hooks: {list(probe.hooks) or 'none'}); "
        "encodings need an 'embed' or 'rotate' hook. Use positional_kernel for biases."
    )


def rotation_frequencies(
    scheme: str | PositionalScheme | Probe, context: dict[str, Any] | None = None
) -> torch.Tensor:
    """Angular frequencies (radians per position) of a ``rotate`` scheme, read off its rotation.

    The map ``q -> R_1 q`` (one position step) is built by rotating the ``d_h`` basis vectors; its
    eigenvalues are ``r_i e^{+-i theta_i}`` whatever the layout (half, interleaved, partial), so
    the angles are the frequencies. Unrotated dimensions give ``theta = 0``.

    Returns:
        float64 ``[d_h / 2]``, sorted from highest to lowest frequency.
    """
    probe = _as_probe(scheme, context)
    if not probe.rotates:
        raise ValueError(f"scheme {probe.name!r} has no 'rotate' hook (hooks: {list(probe.hooks) or 'none'})")
    eye = torch.eye(probe.head_dim)  # [d_h, d_h]: one basis vector per row
    q, _ = rotate_rows(probe, eye, torch.tensor([1]), None)  # [d_h, 1, d_h]
    r1 = q[:, 0, :].double().T  # column j = R_1 e_j -> [d_h, d_h]
    angles = torch.linalg.eigvals(r1).angle().abs()  # [d_h]: +-theta pairs
    return torch.sort(angles, descending=True).values[0::2].contiguous()  # one per pair -> [d_h/2]


def _content(probe: Probe, mode: str, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Query/key contents for ``rotate`` (``[c, d_h]`` each) and the per-head query fed to
    ``score_bias`` (``[h, d_h]``, the same at every position)."""
    d_h = probe.head_dim
    if mode == "mean":
        eye = torch.eye(d_h)  # trace(R_m^T R_n) = sum_j (R_m e_j).(R_n e_j)
        return eye, eye, torch.zeros(probe.num_heads, d_h)
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, 1, d_h, generator=g)  # [1, d_h] each
    qh = torch.cat([q, torch.randn(probe.num_heads - 1, d_h, generator=g)])  # [h, d_h]: head 0 uses q
    return q, k, qh


def _embed_kernel(probe: Probe, qp: torch.Tensor, kp: torch.Tensor, projection: Any) -> torch.Tensor:
    pe_q, pe_k = (
        _embed_table(probe, qp, None).double(),
        _embed_table(probe, kp, None).double(),
    )  # [m, d], [n, d]
    if projection is not None:
        wq, wk = projection if isinstance(projection, (tuple, list)) else (projection, projection)
        for w, nm in ((wq, "projection[0]"), (wk, "projection[1]")):
            if not isinstance(w, torch.Tensor) or w.dim() != 2 or w.shape[0] != probe.d_model:
                raise ValueError(
                    f"{nm} must be a tensor [d={probe.d_model}, d'], got "
                    f"{tuple(w.shape) if isinstance(w, torch.Tensor) else type(w).__name__}"
                )
        pe_q, pe_k = pe_q @ wq.double(), pe_k @ wk.double()  # [m, d] @ [d, d'] -> [m, d']
    return (pe_q @ pe_k.T / math.sqrt(pe_q.shape[-1]))[None]  # [m, n] -> [1, m, n]


def _rotate_kernel(probe: Probe, qp: torch.Tensor, kp: torch.Tensor, mode: str, seed: int) -> torch.Tensor:
    cq, ck, _ = _content(probe, mode, seed)
    rq = rotate_rows(probe, cq, qp, None)[0].double()  # [c, m, d_h]
    rk = rotate_rows(probe, ck, kp, None)[1].double()  # [c, n, d_h]
    kern = torch.einsum("cmd,cnd->mn", rq, rk)  # sum over contents and dims -> [m, n]
    return (kern / math.sqrt(probe.head_dim))[None]  # [1, m, n]


def _queries_kernel(probe: Probe, qp: torch.Tensor, kp: torch.Tensor, mode: str, seed: int) -> torch.Tensor:
    """``(Q_m(q') - q') . k' / sqrt(d_h)`` per head: what the query transform adds to the logit, for
    the content (rotated first when the scheme rotates): ``[h, m, n]`` float64."""
    cq, ck, _ = _content(probe, mode, seed)  # [c, d_h] each
    if probe.rotates:
        rq, rk = rotate_rows(probe, cq, qp, None)[0], rotate_rows(probe, ck, kp, None)[1]  # [c, m|n, d_h]
    else:
        rq = cq[:, None].expand(-1, qp.shape[0], -1)  # [c, m, d_h]
        rk = ck[:, None].expand(-1, kp.shape[0], -1)  # [c, n, d_h]
    moved = query_rows(probe, rq.double(), qp, linear=mode == "mean")  # [c, h, m, d_h] float64
    scale = math.sqrt(probe.head_dim)
    if mode == "mean" and not probe.rotates:
        # c runs over the basis (E[c c^T] = I, q = k = c): E[(A_m c - c).c] = trace(A_m) - d_h, any key
        diag = torch.diagonal(moved, dim1=0, dim2=-1)  # [c, h, m, d_h] -> [h, m, d_h]: (A_m)_jj
        trace = diag.sum(-1) - probe.head_dim  # [h, m]
        return (trace / scale)[:, :, None].expand(-1, -1, kp.shape[0])  # [h, m, n]
    delta = moved - rq.double()[:, None]  # [c, h, m, d_h]
    return torch.einsum("chmd,cnd->hmn", delta, rk.double()) / scale  # sum over contents and dims


def _bias_kernel(probe: Probe, qp: torch.Tensor, kp: torch.Tensor, mode: str, seed: int) -> torch.Tensor:
    _, _, qc = _content(probe, mode, seed)
    q = (
        qc[None, :, None, :].expand(1, probe.num_heads, qp.shape[0], probe.head_dim).contiguous()
    )  # [1, h, m, d_h]
    with torch.no_grad():
        bias = probe.scheme.score_bias(_hook_positions(probe, qp), _hook_positions(probe, kp), q)
    if bias is None:
        return torch.zeros(1, qp.shape[0], kp.shape[0], dtype=torch.float64)
    return bias.double().reshape(-1, *bias.shape[-3:])[0]  # [b | 1, h, m, n] -> [h, m, n]


def positional_kernel(
    scheme: str | PositionalScheme | Probe,
    q_positions: int | Sequence[int] | torch.Tensor,
    k_positions: int | Sequence[int] | torch.Tensor | None = None,
    *,
    content: str = "mean",
    seed: int = 0,
    projection: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None = None,
    context: dict[str, Any] | None = None,
) -> torch.Tensor:
    """The positional kernel ``K[h, m, n]`` of any scheme (see the module docstring).

    Args:
        scheme: a registry name, a module, or a :class:`Probe` from :func:`make_probe`.
        q_positions: query positions: an int ``m`` (``0..m-1``) or integer positions ``[m]``; any
            values, including past the nominal length. A grid scheme (``position_dims`` = ``D`` > 1)
            also takes coordinates ``[m, D]``; positions ``[m]`` run along its first axis.
        k_positions: key positions ``[n]`` or ``[n, D]`` (default: the query positions).
        content: ``"mean"`` (expectation over shared isotropic content) or ``"random"`` (a seeded
            independent ``q, k``; biases get one random query per head, the same at every
            position); only ``rotate``, ``queries`` and content-dependent biases use it.
        seed: the random content's seed.
        projection: for ``embed``: ``W [d, d']`` applied to both sides, or ``(W_q, W_k)``.
        context: sizes used when ``scheme`` is a name (see :func:`make_probe`).

    Returns:
        float64 ``[h, m, n]``: ``h = 1`` for ``embed``/``rotate`` alone, the scheme's heads when it
        has a bias or a per-head query transform. All zeros for a scheme without hooks (NoPE).
    """
    probe = _as_probe(scheme, context)
    check_choice(content, "content", CONTENT_MODES)
    dims = probe.scheme.position_dims
    qp = _positions(q_positions, "q_positions", dims)
    kp = qp if k_positions is None else _positions(k_positions, "k_positions", dims)
    total = torch.zeros(1, qp.shape[0], kp.shape[0], dtype=torch.float64)  # [1, m, n]
    if "embed" in probe.hooks:
        total = total + _embed_kernel(probe, qp, kp, projection)
    if probe.rotates:
        total = total + _rotate_kernel(probe, qp, kp, content, seed)
    if "queries" in probe.hooks:
        total = total + _queries_kernel(probe, qp, kp, content, seed)  # [1, m, n] + [h, m, n]
    if "score_bias" in probe.hooks:
        total = total + _bias_kernel(probe, qp, kp, content, seed)  # [1, m, n] + [h, m, n] -> [h, m, n]
    return total


def display_kernel(
    probe: Probe,
    q_positions: int | Sequence[int] | torch.Tensor,
    k_positions: int | Sequence[int] | torch.Tensor | None = None,
) -> tuple[torch.Tensor, str]:
    """The kernel that plots and the decay/symmetry checks look at, and which content it used.

    The mean-content kernel, except where it is identically zero while the scheme has a bias: a
    bias that is linear in the query (Shaw et al. at init) averages to zero, so one seeded random
    query shows what it does instead.

    Returns:
        (float64 ``[h, m, n]``, ``"mean"`` or ``"random"``). For ``q_positions`` an int and no
        ``k_positions`` (the square ``[n, n]`` kernel every figure and caption of a scheme reads), the
        result is kept in ``probe.cache`` and shared; do not modify it in place.
    """
    if isinstance(q_positions, int) and k_positions is None:
        key = ("display_kernel", q_positions)
        if key not in probe.cache:
            probe.cache[key] = _display_kernel(probe, q_positions, None)
        return probe.cache[key]
    return _display_kernel(probe, q_positions, k_positions)


def _display_kernel(probe: Probe, q_positions: Any, k_positions: Any) -> tuple[torch.Tensor, str]:
    k = positional_kernel(probe, q_positions, k_positions)
    if "score_bias" in probe.hooks and not bool(k.abs().max() > 0):
        return positional_kernel(probe, q_positions, k_positions, content="random"), "random"
    return k, "mean"


def kernel_curve(kernel: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel as a function of relative distance: the mean of each diagonal.

    Args:
        kernel: ``[h, s, s]`` for positions ``0..s-1`` on both sides.

    Returns:
        ``(r, curve)``: distances ``r = m - n`` ``[2s - 1]`` from ``-(s-1)`` to ``s-1`` and the mean
        of ``K[h, m, m - r]`` over ``m`` per head, ``[h, 2s - 1]``. Positive ``r`` = key before query.
    """
    if kernel.dim() != 3 or kernel.shape[-1] != kernel.shape[-2]:
        raise ValueError(f"kernel must be square [h, s, s], got {tuple(kernel.shape)}")
    s = kernel.shape[-1]
    r = torch.arange(-(s - 1), s)  # [2s - 1]
    m = torch.arange(s)
    n = m[None, :] - r[:, None]  # [2s-1, s]: key index for each (distance, query)
    valid = (n >= 0) & (n < s)
    vals = kernel[:, m[None, :].expand_as(n), n.clamp(0, s - 1)]  # [h, 2s-1, s]
    vals = torch.where(valid, vals, torch.zeros((), dtype=kernel.dtype))
    return r, vals.sum(-1) / valid.sum(-1)  # [h, 2s-1]
