"""Compiled window step of the incremental scorer (numba): one new transaction through every
layer of every member against one window's cache, in one call.

:class:`engine.model.incremental.IncrementalScorer` in NumPy issued ~70 operations per window
step on arrays of a few hundred numbers (``[M, 1, D]``: the amount-vs-history and
recent-activity fields, the input LayerNorm, the row feed-forward, ~22 per block, the head), so a
step cost per-call overhead (~1-3 us each) rather than arithmetic. :func:`window_step` computes
the same function in one compiled call: matrix-vector products through BLAS (``np.dot``),
everything else as loops. Same float32 weights; sums accumulated in float32 or wider, so scores
agree with whole-file scoring by the torch model to float32 rounding (tested:
tests/engine/test_incremental.py and the field tests that compare incremental with batch scores).

numba (https://numba.pydata.org) is installed with shap, which requires it. The kernel is
compiled once per process (a few seconds, :func:`compile_kernel`, called when an
:class:`~engine.model.incremental.IncrementalScorer` is built, so no request pays it); never cached
on disk (numba's cache index is pickled).
"""

from __future__ import annotations

import math
import threading

import numpy as np
from numba import njit


@njit(cache=False, nogil=True)
def _layer_norm(x, w, b, eps):  # [D] float32 -> [D] float32, as torch.nn.LayerNorm (biased variance)
    D = x.shape[0]
    mean = 0.0
    for i in range(D):
        mean += x[i]
    mean /= D
    var = 0.0
    for i in range(D):
        d = x[i] - mean
        var += d * d
    inv = 1.0 / math.sqrt(var / D + eps)
    out = np.empty(D, np.float32)
    for i in range(D):
        out[i] = (x[i] - mean) * inv * w[i] + b[i]
    return out


@njit(cache=False, nogil=True)
def _gelu(f):  # exact GELU (nn.GELU default), in place on [F] float32
    c = 1.0 / math.sqrt(2.0)
    for i in range(f.shape[0]):
        v = f[i]
        f[i] = 0.5 * v * (1.0 + math.erf(v * c))
    return f


@njit(cache=False, nogil=True)
def _activity_inputs(times, zs, wcats, n, t, z, cats, windows):
    """``(r [A] float32, seen [C + 1] float32)``: the recent-activity inputs and first-seen flags
    of a new row against the window's ``n`` cached rows, as
    :func:`engine.model.activity.activity_inputs` computes them for the window's last position."""
    nw = windows.shape[0]
    r = np.zeros(2 * nw + 3, np.float32)
    for k in range(nw):  # rows within windows[k] seconds: a suffix of the time-ordered window
        c = 0
        s = 0.0
        for i in range(n - 1, -1, -1):
            if t - times[i] <= windows[k]:
                c += 1
                s += np.float64(zs[i])
            else:
                break
        r[2 * k] = math.log1p(c) / 3.0
        r[2 * k + 1] = (z - s / c) if c > 0 else 0.0
    if n >= 2:
        mean = 0.0
        for i in range(n):
            mean += np.float64(zs[i])
        mean /= n
        ss = 0.0
        for i in range(n):
            d = np.float64(zs[i]) - mean
            ss += d * d
        r[2 * nw] = min(max((z - mean) / math.sqrt(ss / n + 0.25), -6.0), 6.0)
        r[2 * nw + 1] = math.log1p(max(t - times[n - 2], 0.0) / 60.0) / 5.0
        r[2 * nw + 2] = 1.0
    C = cats.shape[0]
    seen = np.zeros(C + 1, np.float32)
    if n > 0:
        for j in range(C):
            new = True
            for i in range(n):
                if wcats[i, j] == cats[j]:
                    new = False
                    break
            seen[j] = 1.0 if new else 0.0
        seen[C] = 1.0
    return r, seen


@njit(cache=False, nogil=True, fastmath={"reassoc", "contract"})
def window_step(base, keys, values, times, zs, wcats, n, z_sum, t, z, cats, need_output,
                hist, act, ln_in, row_ff, blocks, head):
    """One new transaction through one window: its window-dependent fields, the input LayerNorm,
    the row feed-forward, the ``L`` pre-LayerNorm blocks of ``M`` members and the head; writes the
    row into the window's cache.

    Args:
        base: ``[M, D]`` float32, the row's summed field embeddings without its window-dependent
            fields (:meth:`IncrementalScorer._row_embedding`).
        keys, values: ``[M, L, H, capacity, dh]`` float32, the window's cache (rows ``[:n]``);
            times ``[capacity]`` float64 seconds, zs ``[capacity]`` float32 standardised log
            amounts, wcats ``[capacity, C]`` int64 first-seen values: row ``n`` is written here.
        n: cached rows; z_sum: sum of their standardised log amounts (float64).
        t: the row's time (seconds); z: its standardised log amount; cats: ``[C]`` int64.
        need_output: False: the last block writes its key/value and stops (a window that does
            not score this row).
        hist: ``(on, w [M, K, D], b [M, D], none [M, D], edges [K] float64)``: amount against
            the window's earlier amounts (``ModelConfig.history_edges``).
        act: ``(on, windows [nw] float64, recent_w [M, A, D], recent_b [M, D], seen_w [M, C+1, D],
            seen_b [M, D], ple_on, lo [A, K], scale [A, K], ple_w [M, A*K, D])``.
        ln_in: ``(w [M, D], b [M, D], eps)``; row_ff: ``(on, w1 [M, D, R], b1 [M, R], w2 [M, R, D], b2 [M, D])``.
        blocks: ``(ln1_w, ln1_b [L, M, D], ln1_eps [L], qkv_w [L, M, D, 3D], qkv_b [L, M, 3D], slope
            [L, M, H], out_w [L, M, D, D], out_b [L, M, D], ln2_w, ln2_b [L, M, D], ln2_eps [L],
            ff1_w [L, M, D, F], ff1_b [L, M, F], ff2_w [L, M, F, D], ff2_b [L, M, D])``; each
            Linear's weight transposed to ``[in, out]``; slope = softplus of each head's decay rate.
        head: ``(ln_w [M, D], ln_b [M, D], eps, w [M, D], b [M])``.
    Returns:
        the members' mean fraud logit (float64), NaN without ``need_output``.
    """
    M, D = base.shape
    x = base.copy()
    if hist[0]:  # amount_vs_history: piecewise-linear code of the amount against the window's mean
        hw, hb, hnone, edges = hist[1], hist[2], hist[3], hist[4]
        if n > 0:
            K = edges.shape[0]  # [dev, K - 1 piecewise-linear columns] (none with fewer than 2 edges)
            feats = np.empty(max(K, 1), np.float32)
            dev = np.float32(z - z_sum / n)
            feats[0] = dev
            for k in range(K - 1):
                width = max(edges[k + 1] - edges[k], 1e-9)
                feats[k + 1] = min(max((np.float64(dev) - edges[k]) / width, 0.0), 1.0)
            for m in range(M):
                x[m] += np.dot(feats, hw[m]) + hb[m]
        else:
            for m in range(M):
                x[m] += hnone[m]
    if act[0]:  # recent-activity and first-seen fields (engine.model.activity)
        r, seen = _activity_inputs(times, zs, wcats, n, t, z, cats, act[1])
        for m in range(M):
            x[m] += np.dot(r, act[2][m]) + act[3][m] + np.dot(seen, act[4][m]) + act[5][m]
        if act[6]:
            lo, scale = act[7], act[8]
            A, K = lo.shape
            code = np.empty(A * K, np.float32)
            for a in range(A):
                for k in range(K):
                    code[a * K + k] = min(max((r[a] - lo[a, k]) * scale[a, k], np.float32(0.0)), np.float32(1.0))
            for m in range(M):
                x[m] += np.dot(code, act[9][m])
    times[n] = t
    zs[n] = z
    for j in range(cats.shape[0]):
        wcats[n, j] = cats[j]
    log_gap = np.empty(n + 1, np.float32)  # log1p(minutes from each cached row to the new one)
    for i in range(n + 1):
        log_gap[i] = math.log1p(np.float32(max(t - times[i], 0.0)) / np.float32(60.0))
    (ln1_w, ln1_b, ln1_eps, qkv_w, qkv_b, slope, out_w, out_b, ln2_w, ln2_b, ln2_eps, ff1_w, ff1_b, ff2_w,
     ff2_b) = blocks
    L = qkv_w.shape[0]
    H = slope.shape[2]
    dh = D // H
    inv_sqrt = np.float32(1.0 / math.sqrt(dh))
    a = np.empty(D, np.float32)
    sc = np.empty(n + 1, np.float32)
    total = 0.0
    for m in range(M):
        h = _layer_norm(x[m], ln_in[0][m], ln_in[1][m], ln_in[2])
        if row_ff[0]:
            h = h + np.dot(_gelu(np.dot(h, row_ff[1][m]) + row_ff[2][m]), row_ff[3][m]) + row_ff[4][m]
        for li in range(L):
            qkv = np.dot(_layer_norm(h, ln1_w[li, m], ln1_b[li, m], ln1_eps[li]), qkv_w[li, m]) + qkv_b[li, m]  # [3D]
            for hh in range(H):
                for k in range(dh):
                    keys[m, li, hh, n, k] = qkv[D + hh * dh + k]
                    values[m, li, hh, n, k] = qkv[2 * D + hh * dh + k]
            if li == L - 1 and not need_output:
                break
            for hh in range(H):  # softmax(q.k / sqrt(dh) - slope * log_gap) over the n + 1 rows
                K = keys[m, li, hh, : n + 1]  # [n + 1, dh]
                V = values[m, li, hh, : n + 1]
                q = qkv[hh * dh : (hh + 1) * dh]
                mx = -np.inf
                for i in range(n + 1):
                    s = np.float32(0.0)
                    for k in range(dh):
                        s += K[i, k] * q[k]
                    s = s * inv_sqrt - slope[li, m, hh] * log_gap[i]
                    sc[i] = s
                    if s > mx:
                        mx = s
                tot = 0.0
                for i in range(n + 1):
                    e = math.exp(sc[i] - mx)
                    sc[i] = e
                    tot += e
                acc = np.zeros(dh, np.float32)
                for i in range(n + 1):
                    p = sc[i]
                    for k in range(dh):
                        acc[k] += p * V[i, k]
                for k in range(dh):
                    a[hh * dh + k] = acc[k] / tot
            h = h + np.dot(a, out_w[li, m]) + out_b[li, m]
            f = _gelu(np.dot(_layer_norm(h, ln2_w[li, m], ln2_b[li, m], ln2_eps[li]), ff1_w[li, m]) + ff1_b[li, m])
            h = h + np.dot(f, ff2_w[li, m]) + ff2_b[li, m]
        if need_output:
            y = _layer_norm(h, head[0][m], head[1][m], head[2])
            lg = np.float32(0.0)
            for i in range(D):
                lg += y[i] * head[3][m, i]
            total += np.float64(lg + head[4][m])
    return total / M if need_output else np.nan


_compile_lock = threading.Lock()


def _c(a, dtype=np.float32) -> np.ndarray:
    return np.ascontiguousarray(a, dtype)


class KernelWeights:
    """The weights of :class:`engine.model.incremental._Weights` laid out for :func:`window_step`
    (member-first, biases ``[M, out]``, blocks stacked layer-first ``[L, M, ...]``; C-contiguous).
    Absent parts (no amount-vs-history field, no activity fields, no row feed-forward) are off
    flags with empty arrays, so every model uses one compiled specialisation."""

    def __init__(self, w):
        M, D = w.M, w.D
        e2, e3 = np.zeros((M, 0), np.float32), np.zeros((M, 0, D), np.float32)
        if w.has_hist:
            self.hist = (True, _c(w.hist_w), _c(w.hist_b[:, 0]), _c(w.hist_none[:, 0]), _c(w.hist_edges, np.float64))
        else:
            self.hist = (False, e3, _c(np.zeros((M, D))), _c(np.zeros((M, D))), np.zeros(0, np.float64))
        A = w.act
        if A is not None:
            ple = A["ple"]
            self.act = (True, _c(A["windows"], np.float64), _c(A["recent_w"]), _c(A["recent_b"][:, 0]), _c(A["seen_w"]),
                        _c(A["seen_b"][:, 0]), ple is not None,
                        _c(ple[0] if ple else np.zeros((0, 0))), _c(ple[1] if ple else np.zeros((0, 0))),
                        _c(ple[2] if ple else e3))
        else:
            self.act = (False, np.zeros(0, np.float64), e3, _c(np.zeros((M, D))), e3, _c(np.zeros((M, D))), False,
                        _c(np.zeros((0, 0))), _c(np.zeros((0, 0))), e3)
        self.ln_in = (_c(w.ln_in[0][:, 0]), _c(w.ln_in[1][:, 0]), float(w.ln_in[2]))
        if w.row_ff is not None:
            w1, b1, w2, b2 = w.row_ff
            self.row_ff = (True, _c(w1), _c(b1[:, 0]), _c(w2), _c(b2[:, 0]))
        else:
            self.row_ff = (False, _c(np.zeros((M, D, 0))), e2, _c(np.zeros((M, 0, D))), _c(np.zeros((M, D))))

        def st(get):
            return _c(np.stack([get(B) for B in w.blocks]))  # [L, M, ...]

        self.blocks = (st(lambda B: B["ln1"][0][:, 0]), st(lambda B: B["ln1"][1][:, 0]),
                       np.array([B["ln1"][2] for B in w.blocks], np.float64),
                       st(lambda B: B["qkv_w"]), st(lambda B: B["qkv_b"][:, 0]), st(lambda B: B["slope"][:, :, 0]),
                       st(lambda B: B["out_w"]), st(lambda B: B["out_b"][:, 0]),
                       st(lambda B: B["ln2"][0][:, 0]), st(lambda B: B["ln2"][1][:, 0]),
                       np.array([B["ln2"][2] for B in w.blocks], np.float64),
                       st(lambda B: B["ff1_w"]), st(lambda B: B["ff1_b"][:, 0]),
                       st(lambda B: B["ff2_w"]), st(lambda B: B["ff2_b"][:, 0]))
        self.head = (_c(w.ln_out[0][:, 0]), _c(w.ln_out[1][:, 0]), float(w.ln_out[2]), _c(w.head_w[:, :, 0]),
                     _c(w.head_b[:, 0, 0]))
        self.C = 0 if A is None else len(A["cols"])
        self._check(M, D, len(w.blocks), w.H)

    def _check(self, M: int, D: int, L: int, H: int) -> None:
        """Every array the kernel indexes has the shape it assumes: it runs without bounds checks
        (they cost ~30 %), so a wrong shape would read or write outside an array, not raise.

        Raises:
            ValueError: "kernel weights: <name>: expected shape X, got Y".
        """
        def want(name, a, shape):
            if tuple(a.shape) != tuple(shape):
                raise ValueError(f"kernel weights: {name}: expected shape {tuple(shape)}, got {tuple(a.shape)}")

        if D % H:
            raise ValueError(f"kernel weights: width {D} is not a multiple of {H} heads")
        on, hw, hb, hnone, edges = self.hist
        if on:
            want("hist_w", hw, (M, max(len(edges), 1), D))
        want("hist_b", hb, (M, D))
        want("hist_none", hnone, (M, D))
        on, windows, rw, rb, sw, sb, ple_on, lo, scale, pw = self.act
        if on:
            A = 2 * len(windows) + 3
            want("recent_w", rw, (M, A, D))
            want("seen_w", sw, (M, self.C + 1, D))
            if ple_on:
                want("activity ple_lo", lo, (A, lo.shape[1]))
                want("activity ple_scale", scale, lo.shape)
                want("activity ple_w", pw, (M, lo.size, D))
        want("recent_b", rb, (M, D))
        want("seen_b", sb, (M, D))
        want("ln_in w", self.ln_in[0], (M, D))
        want("ln_in b", self.ln_in[1], (M, D))
        on, w1, b1, w2, b2 = self.row_ff
        if on:
            R = w1.shape[2]
            want("row_ff w1", w1, (M, D, R))
            want("row_ff b1", b1, (M, R))
            want("row_ff w2", w2, (M, R, D))
        want("row_ff b2", b2, (M, D))
        ln1_w, ln1_b, ln1_eps, qkv_w, qkv_b, slope, out_w, out_b, ln2_w, ln2_b, ln2_eps, ff1_w, ff1_b, ff2_w, ff2_b = \
            self.blocks
        F = ff1_w.shape[-1]
        for name, a, shape in (("ln1_w", ln1_w, (L, M, D)), ("ln1_b", ln1_b, (L, M, D)), ("ln1_eps", ln1_eps, (L,)),
                               ("qkv_w", qkv_w, (L, M, D, 3 * D)), ("qkv_b", qkv_b, (L, M, 3 * D)),
                               ("slope", slope, (L, M, H)), ("out_w", out_w, (L, M, D, D)), ("out_b", out_b, (L, M, D)),
                               ("ln2_w", ln2_w, (L, M, D)), ("ln2_b", ln2_b, (L, M, D)), ("ln2_eps", ln2_eps, (L,)),
                               ("ff1_w", ff1_w, (L, M, D, F)), ("ff1_b", ff1_b, (L, M, F)),
                               ("ff2_w", ff2_w, (L, M, F, D)), ("ff2_b", ff2_b, (L, M, D))):
            want(name, a, shape)
        want("ln_out w", self.head[0], (M, D))
        want("ln_out b", self.head[1], (M, D))
        want("head w", self.head[3], (M, D))
        want("head b", self.head[4], (M,))
        self.shape = (M, D, L, H)
        self._base, self._lead, self._dh = (M, D), (M, L, H), D // H

    def step(self, base: np.ndarray, win, t: float, z: float, cats: np.ndarray, need_output: bool) -> float:
        """:func:`window_step` of ``base [M, D]`` float32 against window ``win`` (an
        ``engine.model.incremental._Window`` with room for one more row); returns the logit (NaN
        without ``need_output``). The caller advances ``win.n`` and ``win.z_sum``.

        Raises:
            ValueError: an argument of another shape than the weights' (the kernel has no bounds
                checks): names it, expected and got.
        """
        n = int(win.n)
        keys = win.keys
        if not (0 <= n < keys.shape[3] and base.shape == self._base and keys.shape == win.values.shape
                and keys.shape[:3] == self._lead and keys.shape[4] == self._dh and len(cats) == self.C == win.cats.shape[1]
                and win.times.shape[0] == win.zs.shape[0] == win.cats.shape[0] == keys.shape[3]):
            M, D, L, H = self.shape
            raise ValueError(f"window_step: expected base ({M}, {D}), keys/values ({M}, {L}, {H}, capacity, {D // H}), "
                             f"{self.C} first-seen values and 0 <= n < capacity; got base {base.shape}, keys "
                             f"{keys.shape}, values {win.values.shape}, cats {len(cats)}, n {n}")
        return window_step(base, win.keys, win.values, win.times, win.zs, win.cats, n, float(win.z_sum),
                           float(t), float(z), np.ascontiguousarray(cats, np.int64), bool(need_output), self.hist,
                           self.act, self.ln_in, self.row_ff, self.blocks, self.head)


def compile_kernel(kw: KernelWeights, win) -> None:
    """Compile :func:`window_step` now (once per process; a few seconds) by stepping the empty
    scratch window ``win``, so the first scored transaction does not pay it; then turn further
    compilation off, so an argument of another type (another specialisation, seconds of compiling
    in the middle of serving) is a TypeError instead."""
    with _compile_lock:
        if window_step.signatures:
            return
        M, D = kw.ln_in[0].shape
        kw.step(np.zeros((M, D), np.float32), win, 0.0, 0.0, np.zeros(win.cats.shape[1], np.int64), True)
        window_step.disable_compile()
