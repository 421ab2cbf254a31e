"""The MIP planner: histograms -> column generation on boxes -> MIP -> batches, with a certified bound.

Flow (data one way): aggregate each bucket into cells; settle what the shape choice
can settle in closed form (reference mode: it only moves compile cost); generate
candidate boxes by pricing the LP relaxation over the full box grid, which also
yields a Lagrangian lower bound valid for the whole problem; solve the MIP over the
generated boxes with the chosen backend (warm-started from the greedy packer when it
is valid); turn the solution into batches; re-check every limit exactly and repair
(tighten and re-solve) if the exact metrics disagree with the model.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace

import numpy as np

from model.boxes import BucketModel, Grid, bucket_model, candidate_grid
from model.costs import align, compile_cost
from model.errors import InfeasibleError
from model.formulation import MipArrays, Restriction, build_model, restriction
from model.histogram import Histogram, build_histogram
from model.pricing import Duals, box_arcs, duals_from_lp, lagrangian_bound, shape_cap_dual
from model.schema import Batching, Planned, Problem, SolveReport
from model.shapes import choose_shapes
from solvers.backends import get_backend
from solvers.backends.result import SolveOptions

log = logging.getLogger("shapeplan")

MAX_GEN_VALUES = 1024  # gen values per bucket before the histogram is coarsened
PRICING_BUDGET = 2.5e7  # (box t values) x (gen values) x (cells) per pricing pass before coarsening
COLUMNS_PER_ROUND = 300  # boxes added per bucket per pricing round
MAX_ROUNDS = 30
TARGET_GAP = 1e-3  # stop improving once the incumbent is this close to the certified bound


def reference_shapes(bms: list[BucketModel], max_shapes: int, max_seq_len: int | None) -> list[int]:
    """Reference mode: the declared shape only sets compile cost, so each bucket compiles ONE shape.

    Any plan must give bucket b a shape >= its largest aligned prompt; extra shapes only
    add compile cost and spikes.  With K shapes across buckets, pick K of the bucket
    maxima minimising total compile cost (each bucket uses the smallest pick above its
    maximum) -- exact by dynamic programming over the sorted maxima.
    """
    need = [int(bm.hist.S.max()) for bm in bms]
    values = sorted(set(need))
    p = bms[0].params
    cost = {v: float(compile_cost(v, p)) for v in values}
    # best[j][k]: min compile of buckets with max <= values[j], k picks, values[j] picked
    inf = float("inf")
    count = [sum(1 for n in need if n == v) for v in values]
    best = [[inf] * (max_shapes + 1) for _ in values]
    choice = [[-1] * (max_shapes + 1) for _ in values]
    for j, v in enumerate(values):
        best[j][1] = sum(count[:j + 1]) * cost[v]
        for k in range(2, max_shapes + 1):
            for i in range(j):
                val = best[i][k - 1] + sum(count[i + 1:j + 1]) * cost[v]
                if val < best[j][k]:
                    best[j][k], choice[j][k] = val, i
    j = len(values) - 1
    k = min(range(1, max_shapes + 1), key=lambda kk: best[j][kk])
    picks = []
    while j >= 0 and k >= 1:
        picks.append(values[j])
        j, k = choice[j][k], k - 1
    picks.sort()
    return [min(v for v in picks if v >= n) for n in need]


def own_box_duals(bm: BucketModel, grid: Grid) -> Duals:
    """Multipliers that price each cell at its cheapest box (its own tight one), limits at zero.

    At these prices no box has a negative value, so the Lagrangian reduces to "every
    request in its own smallest box, no overheads": weak but always valid, the floor
    the column-generation bounds must beat.
    """
    from model.boxes import box_unit_cost

    t_own = bm.hist.S if bm.mode == "reference" else grid.ts[np.searchsorted(grid.ts, bm.hist.S)]
    return Duals(box_unit_cost(bm, t_own, bm.hist.G))


def gen_budget(hist: Histogram, n_t: int | None) -> int:
    """How many gen values a bucket may keep so one pricing pass stays within PRICING_BUDGET."""
    n_t = n_t or len(np.unique(hist.S))
    return int(np.clip(PRICING_BUDGET / (n_t * max(len(hist), 1)), 48, MAX_GEN_VALUES))


def fine_bound(problem: Problem, fine: list[Histogram], coarse: list[Histogram], duals: list[Duals], kappa: float,
               compile_fixed: list[float], shapes) -> tuple[float, tuple[float, ...] | None]:
    """The Lagrangian bound on the EXACT histograms, with each fine cell priced at its coarse cell's dual.

    A coarsened model over-states costs, so its own bound could exceed the true optimum;
    evaluating the Lagrangian on the exact cells keeps the certificate valid.
    """
    fbms, fgrids, fduals = [], [], []
    for b, (hf, hc, d, f) in enumerate(zip(fine, coarse, duals, compile_fixed)):
        bucket = problem.buckets[b]
        bm = bucket_model(hf, gen_min_of(bucket.gen_len, hf), problem.limits[b], problem.params, problem.mode)
        fbms.append(replace(bm, const_cost=bm.const_cost + f))
        fgrids.append(candidate_grid(fbms[-1], shapes))
        coarse_of_fine = np.zeros(len(hf), np.int64)
        coarse_of_fine[hf.cell_of] = hc.cell_of
        fduals.append(replace(d, pi=d.pi[coarse_of_fine]))
    bound = lagrangian_bound(fbms, fgrids, fduals, problem.max_batch_size, shapes, kappa, problem.max_shapes)
    floor = lagrangian_bound(fbms, fgrids, [own_box_duals(bm, g) for bm, g in zip(fbms, fgrids)],
                             problem.max_batch_size, shapes, 0.0, problem.max_shapes)
    best = max((bound, floor), key=lambda bd: bd.total)
    return best.total, best.per_bucket


def gen_min_of(bucket_gen: np.ndarray, hist: Histogram) -> np.ndarray:
    """Smallest real gen_len in each cell (pad is counted against it)."""
    out = np.full(len(hist), np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(out, hist.cell_of, bucket_gen)
    return out


def seed_restriction(bm: BucketModel, grid: Grid, extra_cell: np.ndarray, extra_box: np.ndarray) -> Restriction:
    """Each cell's own tight box (so coverage is always possible) plus extra (cell, box) arcs."""
    hist = bm.hist
    t_own = hist.S if bm.mode == "reference" else grid.ts[np.searchsorted(grid.ts, hist.S)]
    own = grid.index(t_own, hist.G)
    cell = np.concatenate([np.arange(len(hist)), extra_cell]).astype(np.int64)
    box = np.concatenate([own, extra_box]).astype(np.int64)
    boxes = np.unique(box)
    key = np.unique(np.searchsorted(boxes, box) * len(hist) + cell)
    return restriction(grid, boxes, key % len(hist), key // len(hist))


def grow(bm: BucketModel, grid: Grid, res: Restriction, duals: Duals, new_boxes: np.ndarray,
         slack: float, keep_cells: list[np.ndarray] | None = None) -> Restriction:
    """Add boxes and re-derive every box's arcs at the current prices (keeping arcs in use)."""
    boxes = np.unique(np.concatenate([res.boxes, new_boxes]))
    cells, pos = box_arcs(bm, grid, duals, boxes, slack)
    old_cell = res.arc_cell
    old_pos = np.searchsorted(boxes, res.boxes[res.arc_box])
    key = np.unique(np.concatenate([pos * len(bm.hist) + cells, old_pos * len(bm.hist) + old_cell]))
    return restriction(grid, boxes, key % len(bm.hist), key // len(bm.hist))


def _greedy(problem: Problem) -> tuple[Batching, ...] | None:
    """The greedy packer's plan (a warm start and a yardstick), or None if it finds none."""
    from solvers.packers import PACKERS

    packer = PACKERS.get("greedy")
    if packer is None:
        return None
    try:
        return packer(problem)
    except InfeasibleError:
        return None


def warm_start_boxes(batchings: tuple[Batching, ...] | None, bms: list[BucketModel], grids: list[Grid],
                     problem: Problem) -> list[tuple[np.ndarray, Batching]] | None:
    """Boxes of a packer's plan on the model's grid, or None if the grid cannot express it."""
    if batchings is None:
        return None
    out = []
    for bm, grid, bucket, bt in zip(bms, grids, problem.buckets, batchings):
        S = align(bucket.prompt_len) if bm.mode == "reference" else bt.shape_of[bt.batch_of]
        nb = len(bt.shape_of)
        t = np.zeros(nb, np.int64)
        g = np.zeros(nb, np.int64)
        np.maximum.at(t, bt.batch_of, S)
        np.maximum.at(g, bt.batch_of, bm.hist.G[bm.hist.cell_of])
        if bm.mode == "strict":
            t = bt.shape_of.astype(np.int64)
        if not (np.isin(t, grid.ts).all() and np.isin(g, grid.gs).all()):
            return None
        out.append((grid.index(t, g), bt))
    return out


def plan_mip(problem: Problem, backend: str = "highs", time_limit: float = 60.0) -> Planned:
    """Plan every bucket by optimisation; the report carries a certified lower bound and gap."""
    t0 = time.perf_counter()
    deadline = t0 + time_limit
    solver = get_backend(backend)
    lp_solver = get_backend("highs")  # column generation needs LP duals
    strict = problem.mode == "strict"
    notes: list[str] = []
    fine = [build_histogram(b) for b in problem.buckets]
    greedy = _greedy(problem)
    certified = -np.inf  # a bound valid for the whole problem, whatever the search below restricts
    if strict:
        all_shapes = np.unique(np.concatenate([h.S for h in fine]))
        if problem.max_seq_len is not None:
            all_shapes = all_shapes[all_shapes <= problem.max_seq_len]
        fine_bms = [bucket_model(h, gen_min_of(b.gen_len, h), lim, problem.params, problem.mode)
                    for h, b, lim in zip(fine, problem.buckets, problem.limits)]
        choice = choose_shapes(fine_bms, all_shapes, problem.max_shapes)
        certified = choice.bound
        # search at the relaxation's shapes: a mixed candidate set (e.g. with greedy's shapes) leaves the
        # LP's shape layer fractional and column generation stalls; the greedy plan stays a fallback
        shapes = np.asarray(choice.shapes, dtype=np.int64)
        log.info("strict mode: shape relaxation bound %.6e at shapes %s", choice.bound, list(choice.shapes))
        ref_shape = None
        compile_fixed = [0.0] * len(fine)
    else:
        shapes = None
        ref_bms = [bucket_model(h, gen_min_of(b.gen_len, h), lim, problem.params, problem.mode)
                   for h, b, lim in zip(fine, problem.buckets, problem.limits)]
        ref_shape = reference_shapes(ref_bms, problem.max_shapes, problem.max_seq_len)
        compile_fixed = [float(compile_cost(s, problem.params)) for s in ref_shape]
        notes.append(f"reference mode: one compiled shape per bucket ({', '.join(map(str, ref_shape))}); "
                     "the declared shape moves only compile cost, so more shapes never pay")
    n_t = len(shapes) if strict else None
    hists = [build_histogram(b, gen_budget(h, n_t)) if gen_budget(h, n_t) < len(np.unique(h.G)) else h
             for b, h in zip(problem.buckets, fine)]
    bms = [bucket_model(h, gen_min_of(b.gen_len, h), lim, problem.params, problem.mode)
           for h, b, lim in zip(hists, problem.buckets, problem.limits)]
    bms = [replace(bm, const_cost=bm.const_cost + f) for bm, f in zip(bms, compile_fixed)]
    grids = [candidate_grid(bm, shapes) for bm in bms]
    warm = warm_start_boxes(greedy, bms, grids, problem)
    empty = np.zeros(0, np.int64)
    res = [seed_restriction(bm, grid, bm.hist.cell_of if warm else empty,
                            warm[b][0][warm[b][1].batch_of] if warm else empty)
           for b, (bm, grid) in enumerate(zip(bms, grids))]
    # the Lagrangian certifies only when the search space is the whole problem
    lagrangian_valid = not strict or len(shapes) == len(all_shapes)
    fixed_shapes = [1] * len(bms)

    start = lagrangian_bound(bms, grids, [own_box_duals(bm, grid) for bm, grid in zip(bms, grids)],
                             problem.max_batch_size, shapes, 0.0, problem.max_shapes)
    best_bound, best_bucket_bounds = start.total, start.per_bucket  # search bound (restricted problem)
    duals = [Duals(np.zeros(len(bm.hist))) for bm in bms]
    lp_budget = 0.45 * time_limit
    lp_history: list[float] = []
    for rnd in range(MAX_ROUNDS):
        model = build_model(bms, res, shapes, problem.max_shapes, fixed_shapes, problem.max_batch_size, True)
        lp = lp_solver.solve(model, SolveOptions(time_limit=max(1.0, deadline - time.perf_counter()), relax=True))
        if lp.row_duals is None or lp.x is None:
            if rnd == 0:
                raise InfeasibleError(f"the LP relaxation failed (status {lp.status})")
            notes.append(f"LP relaxation returned no duals (status {lp.status}); bound from round {rnd - 1}")
            break
        last_lp = lp
        duals = [duals_from_lp(model, lp.row_duals, b, len(bm.hist)) for b, bm in enumerate(bms)]
        kappa = shape_cap_dual(model, lp.row_duals)
        bound = lagrangian_bound(bms, grids, duals, problem.max_batch_size, shapes, kappa, problem.max_shapes)
        if bound.total > best_bound:
            best_bound, best_bucket_bounds = bound.total, bound.per_bucket
        log.info("column generation round %d: LP %.6e, Lagrangian bound %.6e, %d boxes, %d arcs (%.1f s)",
                 rnd, lp.objective, bound.total, sum(len(r.boxes) for r in res), sum(len(r.arc_cell) for r in res),
                 time.perf_counter() - t0)
        lp_model, lp_res = model, res
        added = 0
        new_res = []
        for bm, grid, r, d, h in zip(bms, grids, res, duals, bound.prices):
            h = h.copy()
            h[r.boxes] = 0.0
            cand = np.flatnonzero(h < -1e-6 * max(1.0, abs(lp.objective or 1.0)) / max(1, len(h)))
            cand = cand[np.argsort(h[cand])][:COLUMNS_PER_ROUND]
            added += len(cand)
            new_res.append(grow(bm, grid, r, d, cand, slack=0.0))
        res = new_res
        gap_lp = (lp.objective - bound.total) / max(abs(lp.objective), 1.0)
        lp_history.append(lp.objective)
        stalled = len(lp_history) >= 3 and lp_history[-3] - lp_history[-1] < 1e-6 * abs(lp.objective)
        if added == 0 or gap_lp < 1e-4 or stalled or time.perf_counter() - t0 > lp_budget:
            break

    # certify: the Lagrangian on the exact histogram (if the search was the whole problem), else the relaxation
    cert_bucket = None
    if lagrangian_valid:
        if any(h.coarsened for h in hists):
            lb, cert_bucket = fine_bound(problem, fine, hists, duals, kappa, compile_fixed, shapes)
            notes.append("gen values were coarsened for the search; the bound is certified on the exact histogram")
        else:
            lb, cert_bucket = best_bound, best_bucket_bounds
        certified = max(certified, lb)
    else:
        notes.append("strict mode: the bound is the shape relaxation (every request at its own gen_len under "
                     "the best K shapes), valid for the whole problem")
    # 1) incumbent: the MIP over the LP's support (small: it solves in seconds)
    support = [_support(bm, grid, r, lp_model, last_lp.x, b) for b, (bm, grid, r) in enumerate(zip(bms, grids, lp_res))]
    best = _solve_restricted(solver, bms, support, shapes, problem, fixed_shapes, warm,
                             min(deadline, time.perf_counter() + 0.25 * max(1.0, deadline - time.perf_counter())))
    # 2) if the incumbent is not yet within the target gap: the MIP over every generated box
    #    that reduced costs cannot rule out, warm-started from the incumbent
    if best is None or (best.objective - best_bound) > TARGET_GAP * best.objective:
        if best is not None and best_bound > -np.inf and not strict:
            gap_abs = best.objective - best_bound
            res = [_merge(grid, _prune(bm, grid, r, d, gap_abs), inc)
                   for bm, grid, r, d, inc in zip(bms, grids, res, duals, best.res)]
        full = _solve_restricted(solver, bms, res, shapes, problem, fixed_shapes, warm, deadline, incumbent=best)
        if full is not None and (best is None or full.objective < best.objective - 1e-9 * abs(best.objective)):
            best = full
    if best is None:
        raise InfeasibleError(_infeasible_message(problem, bms, "no solution"))
    model, res, mip = best.model, best.res, best.result
    batchings = tuple(_batching(bm, r, model, mip.x, b, problem, ref_shape, shapes)
                      for b, (bm, r) in enumerate(zip(bms, res)))
    candidates = {"mip": batchings}
    if warm:
        candidates["greedy warm start"] = tuple(w[1] for w in warm)
    chosen, objective, broken = exact_pick(problem, candidates)
    if chosen != "mip":
        notes.append(f"the {chosen} plan is cheaper under the exact cost model than the MIP's "
                     "(the search ran on a coarsened histogram) and is returned instead")
    if broken:
        notes.append(f"exact re-evaluation: {broken}")
    batchings = candidates[chosen]
    gap = (objective - certified) / objective if objective > 0 else 0.0
    status = "optimal" if gap <= 1e-4 else ("time_limit" if mip.status == "time_limit" else "feasible")
    report = SolveReport(status, objective, certified, gap, time.perf_counter() - t0, mip.backend, mip.version,
                         cert_bucket, tuple(notes))
    return Planned(batchings, report)


def _warm_vector(model: MipArrays, bms, res, warm, shapes) -> np.ndarray | None:
    """The greedy plan as a column vector, or None if the restriction cannot express it."""
    x = np.zeros(model.n_cols)
    for b, (bm, r, (boxes, bt)) in enumerate(zip(bms, res, warm)):
        pos = np.searchsorted(r.boxes, boxes)
        if (pos >= len(r.boxes)).any() or (r.boxes[np.minimum(pos, len(r.boxes) - 1)] != boxes).any():
            return None
        mblk = model.block("col", "m", b)
        xblk = model.block("col", "x", b)
        x[mblk.start + pos] = 1.0
        cell = bm.hist.cell_of
        box_of_req = pos[bt.batch_of]
        arc_key = r.arc_box * len(bm.hist) + r.arc_cell
        want = box_of_req * len(bm.hist) + cell
        order = np.argsort(arc_key)
        idx = np.searchsorted(arc_key[order], want)
        if (idx >= len(order)).any() or (arc_key[order][np.minimum(idx, len(order) - 1)] != want).any():
            return None
        np.add.at(x, xblk.start + order[idx], 1.0)
        if shapes is not None:
            zblk = model.block("col", "z", b)
            used = np.unique(np.searchsorted(shapes, r.t[pos]))
            x[zblk.start + used] = 1.0
    if shapes is not None:
        yblk = model.block("col", "y")
        for b in range(len(bms)):
            zblk = model.block("col", "z", b)
            x[yblk.start:yblk.stop] = np.maximum(x[yblk.start:yblk.stop], x[zblk.start:zblk.stop])
    return x


def _batching(bm: BucketModel, r: Restriction, model: MipArrays, x: np.ndarray, b: int, problem: Problem,
              ref_shape: list[int] | None, shapes) -> Batching:
    """Concrete batches: hand each cell's requests to its arcs in file order; split boxes into m_k batches."""
    mblk = model.block("col", "m", b)
    xblk = model.block("col", "x", b)
    m = np.rint(x[mblk.slice()]).astype(np.int64)
    xa = np.rint(x[xblk.slice()]).astype(np.int64)
    hist = bm.hist
    order = np.argsort(hist.cell_of, kind="stable")  # requests grouped by cell, file order within
    cell_start = np.concatenate([[0], np.cumsum(hist.count)])
    used = np.flatnonzero(xa > 0)
    used = used[np.lexsort((r.arc_box[used], r.arc_cell[used]))]
    box_of = np.full(len(hist.cell_of), -1, dtype=np.int64)
    offset = cell_start[:-1].copy()
    for a in used:
        c = r.arc_cell[a]
        k = min(int(xa[a]), int(cell_start[c + 1] - offset[c]))
        box_of[order[offset[c]:offset[c] + k]] = r.arc_box[a]
        offset[c] += k
    if (box_of < 0).any():
        raise RuntimeError(f"bucket {hist.name}: MIP solution leaves {int((box_of < 0).sum())} requests unplanned")
    boxes, batch_of = np.unique(box_of, return_inverse=True)
    if problem.max_batch_size is not None:  # split each box into ceil(n/B) batches
        rank = np.empty_like(batch_of)
        srt = np.argsort(batch_of, kind="stable")
        starts = np.searchsorted(batch_of[srt], np.arange(len(boxes)))
        rank[srt] = np.arange(len(batch_of)) - starts[batch_of[srt]]
        sub = rank // problem.max_batch_size
        key = batch_of * (len(batch_of) + 1) + sub
        uniq, batch_of = np.unique(key, return_inverse=True)
        boxes = boxes[uniq // (len(box_of) + 1)]
    shape_of = np.full(len(boxes), ref_shape[b], np.int64) if ref_shape is not None else r.t[boxes]
    return Batching(batch_of.astype(np.int64), shape_of.astype(np.int64))


def exact_pick(problem: Problem, candidates: dict[str, tuple[Batching, ...]]) -> tuple[str, float, str]:
    """Re-evaluate each candidate exactly (spike placement included); keep the cheapest that meets every limit.

    The model is conservative, so its plan should pass; if a candidate breaks a limit
    the message says which, and a passing candidate is preferred over any failing one.
    """
    from model.costs import plan_metrics
    from model.expand import assemble
    from model.validate import limit_checks, plan_rows

    best = None
    messages = []
    for name, batchings in candidates.items():
        total, failing = 0.0, []
        for bucket, bt, lim in zip(problem.buckets, batchings, problem.limits):
            plan = assemble(bucket, bt, problem.params, problem.mode, lim)
            idx, _ = plan_rows(bucket, plan)
            m = plan_metrics(bucket.prompt_len[idx], bucket.gen_len[idx], plan.batch_ids, plan.seq_align,
                             problem.params, problem.mode)
            total += m.cost
            failing += [f"{bucket.name} {c.metric} {c.value:.6g} > {c.limit:.6g}" for c in limit_checks(m, lim)
                        if not c.ok]
        if failing:
            messages.append(f"{name} plan breaks {', '.join(failing)}")
        key = (bool(failing), total)
        if best is None or key < best[0]:
            best = (key, name, total)
    return best[1], best[2], "; ".join(messages)


def _infeasible_message(problem: Problem, bms: list[BucketModel], status: str) -> str:
    """Say which limits cannot be met together, and what each can reach on its own."""
    names = [f"{bm.hist.name}: {', '.join(f'{k} <= {v:g}' for k, v in bm.limits.items())}" for bm in bms]
    return f"the limits cannot all be met (MIP status {status}); limits: {'; '.join(names)}"


@dataclass(frozen=True, eq=False)
class _Solved:
    model: MipArrays
    res: list
    result: object

    @property
    def objective(self) -> float:
        return float(self.result.objective)


def _support(bm: BucketModel, grid: Grid, r: Restriction, model: MipArrays, x: np.ndarray, b: int) -> Restriction:
    """The boxes and arcs the LP uses, plus each cell's own box: a small MIP that is quick to solve."""
    mblk = model.block("col", "m", b)
    xblk = model.block("col", "x", b)
    keep_arc = x[xblk.slice()] > 1e-6
    seed = seed_restriction(bm, grid, r.arc_cell[keep_arc], r.boxes[r.arc_box[keep_arc]])
    return seed


def _prune(bm: BucketModel, grid: Grid, r: Restriction, d: Duals, gap: float) -> Restriction:
    """Drop boxes and arcs that no solution better than the incumbent can use (reduced-cost fixing).

    Any plan using box k costs at least LB + max(0, v_k) (+ e_ck for each arc with e_ck > 0),
    where v_k is the box's unclipped Lagrangian value; so v_k > gap rules k out.
    """
    from model.pricing import box_values

    v = box_values(bm, grid, d, r.boxes)
    keep_box = v <= gap
    cells, pos = box_arcs(bm, grid, d, r.boxes, slack=gap)
    keep = keep_box[pos]
    old = keep_box[r.arc_box]
    cell = np.concatenate([cells[keep], r.arc_cell[old]])
    box = np.concatenate([r.boxes[pos[keep]], r.boxes[r.arc_box[old]]])
    return seed_restriction(bm, grid, cell, box)


def _merge(grid: Grid, a: Restriction, b: Restriction) -> Restriction:
    """Union of two restrictions of the same bucket."""
    box = np.concatenate([a.boxes[a.arc_box], b.boxes[b.arc_box]])
    cell = np.concatenate([a.arc_cell, b.arc_cell])
    n = int(max(a.arc_cell.max(), b.arc_cell.max())) + 1
    boxes = np.unique(box)
    key = np.unique(np.searchsorted(boxes, box) * n + cell)
    return restriction(grid, boxes, key % n, key // n)


def _solve_restricted(solver, bms, res, shapes, problem: Problem, fixed_shapes, warm, until: float,
                      incumbent: "_Solved | None" = None) -> "_Solved | None":
    """Solve the MIP over a restriction (limits hard); warm-start from an incumbent if one fits."""
    model = build_model(bms, res, shapes, problem.max_shapes, fixed_shapes, problem.max_batch_size, False)
    start = None
    if incumbent is not None:
        start = _transfer(incumbent, model, res)
    elif warm:
        start = _warm_vector(model, bms, res, warm, shapes)
    progress = lambda inc, bnd: log.info("  MIP incumbent %.6e", inc)  # noqa: E731
    out = solver.solve(model, SolveOptions(time_limit=max(1.0, until - time.perf_counter()), warm_start=start,
                                           on_progress=progress))
    log.info("MIP over %d boxes / %d arcs: %s, objective %s (%s %.1f s)", sum(len(r.boxes) for r in res),
             sum(len(r.arc_cell) for r in res), out.status, out.objective, out.backend, out.time_s)
    return _Solved(model, res, out) if out.has_solution else None


def _transfer(inc: "_Solved", model: MipArrays, res: list) -> np.ndarray | None:
    """Map an incumbent's column values onto a bigger restriction (same meaning, new positions)."""
    x = np.zeros(model.n_cols)
    for b, (r_old, r_new) in enumerate(zip(inc.res, res)):
        for name, old_keys, new_keys in (
                ("m", r_old.boxes, r_new.boxes),
                ("x", r_old.boxes[r_old.arc_box] * (1 << 20) + r_old.arc_cell,
                 r_new.boxes[r_new.arc_box] * (1 << 20) + r_new.arc_cell)):
            ob = inc.model.block("col", name, b)
            nb = model.block("col", name, b)
            vals = inc.result.x[ob.slice()]
            order = np.argsort(new_keys)
            pos = np.searchsorted(new_keys[order], old_keys)
            pos = np.minimum(pos, len(order) - 1)
            if (new_keys[order][pos] != old_keys).any():
                return None
            x[nb.start + order[pos]] = vals
        for name in ("z",):
            ob, nb = inc.model.block("col", name, b), model.block("col", name, b)
            if ob is not None:
                x[nb.slice()] = inc.result.x[ob.slice()]
    ob, nb = inc.model.block("col", "y"), model.block("col", "y")
    if ob is not None:
        x[nb.slice()] = inc.result.x[ob.slice()]
    return x
