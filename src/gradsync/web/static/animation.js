// What drawing a simulation needs, derived once when it arrives (S.anim), and the replay of its
// timeline to any moment: transfers start and land, buffers fill with the inputs they carry.
"use strict";

const Animation = (() => {
  // Per transfer, when a failure stops it (Infinity: it completes): a transfer that cannot
  // complete moves until one of its ends stops; one in a round that an end never reaches (its
  // rounds are sequential) never starts.
  function cuts(d) {
    const t = d.transfers, n = t.src.length, cut = new Float64Array(n).fill(Infinity);
    if (!d.failure) return cut;
    const stop = new Map(d.failure.stopped.map((s) => [s.node, s.at_s])), stuck = new Map();
    for (let i = 0; i < n; i++) if (!d.failure.completed[i])
      for (const x of [t.src[i], t.dst[i]]) if (x !== d.failure.device) stuck.set(x, Math.min(stuck.get(x) ?? Infinity, t.round[i]));
    for (let i = 0; i < n; i++) if (!d.failure.completed[i]) {
      const never = t.round[i] > (stuck.get(t.src[i]) ?? Infinity) || t.round[i] > (stuck.get(t.dst[i]) ?? Infinity);
      cut[i] = never ? t.start[i] : Math.min(stop.get(t.src[i]) ?? Infinity, stop.get(t.dst[i]) ?? Infinity);
    }
    return cut;
  }

  // The cells [first, end) of each transfer (a coded packet: every cell, a mixture of all).
  function spans(d, k) {
    const t = d.transfers, n = t.src.length, cells = d.cells, span = new Int32Array(2 * n);
    const cellOf = (off) => { let lo = 0, hi = cells.length - 1; while (hi - lo > 1) { const m = (lo + hi) >> 1; if (cells[m] <= off) lo = m; else hi = m; } return lo; };
    for (let i = 0; i < n; i++) {
      if (t.op[i] === CODED) { span[2 * i] = 0; span[2 * i + 1] = k; continue; }
      span[2 * i] = cellOf(t.offset[i]); span[2 * i + 1] = Math.max(cellOf(t.offset[i] + t.count[i] - 1) + 1, span[2 * i] + 1);
    }
    return span;
  }

  function prepare(d) {
    const t = d.transfers, n = t.src.length, k = d.cells.length - 1;
    t.path = t.route.map((r) => d.routes[r]);             // routes come once each; transfers point to them
    const rounds = d.narration.length, roundIndex = new Map(d.narration.map((s, j) => [s.round, j]));
    const roundStart = new Float64Array(rounds).fill(Infinity), roundDone = new Float64Array(rounds).fill(0);
    for (let i = 0; i < n; i++) {
      const j = roundIndex.get(t.round[i]);
      roundStart[j] = Math.min(roundStart[j], t.start[i]); roundDone[j] = Math.max(roundDone[j], t.done[i]);
    }
    const never = new Set();                              // rounds a failure keeps from completing
    if (d.failure) for (let i = 0; i < n; i++) if (!d.failure.completed[i]) never.add(roundIndex.get(t.round[i]));
    const codedPerWorker = new Int32Array(d.placement.length);
    for (let i = 0; i < n; i++) if (t.op[i] === CODED) codedPerWorker[t.dst[i]]++;
    // the story's clock runs past the collective to the last survivor's detection; when that is
    // much later (a 60 s timeout after a 5 ms collective), the timeline's last fifth is that gap
    const lastStop = d.failure ? Math.max(...d.failure.stopped.map((s) => s.at_s)) : 0, end = Math.max(d.time_s, lastStop);
    const split = end <= d.time_s ? 1 : end <= 3 * d.time_s ? d.time_s / end : 0.8;
    S.anim = { byStart: [...Array(n).keys()].sort((a, b) => t.start[a] - t.start[b]),
               byDone: [...Array(n).keys()].sort((a, b) => t.done[a] - t.done[b]),
               cut: cuts(d), span: spans(d, k), nodes: d.placement.length, k, roundIndex, roundStart, roundDone, never,
               codedPerWorker, startPtr: 0, donePtr: 0, active: new Set(), state: null, coded: null, current: null,
               end, split, lastStop, followSets: new Map(), stops: null };
    Object.assign(S.anim, stretch(d, roundStart, roundDone));
    if (S.follow !== null && (S.follow >= k || d.estimate)) S.follow = null;
    if (S.follow !== null) S.anim.followSets = followSets(S.follow);
    reset();
    S.now = 0;
  }

  // Each node's buffer: per cell, how many inputs it holds (its own at the start).
  function reset() {
    const A = S.anim, W = S.data.workers;
    A.state = Array.from({ length: A.nodes }, (_, node) => new Int32Array(A.k).fill(node < W ? 1 : 0));
    A.coded = new Int32Array(A.nodes);
    A.sets = S.follow === null ? null : Array.from({ length: A.nodes }, (_, node) => (node < W ? [node] : []));
    A.startPtr = 0; A.donePtr = 0; A.active = new Set(); A.stopped = new Set();
  }

  // The collective's axis, stretched where a phase would take under 1/20 of it (PCIe steps
  // beside a slow Ethernet phase): each phase's span then gets at least 1/8 of the width, the
  // axis linear inside it. Knots: the phases' boundaries in time, and their place on the axis.
  const SHORT = 0.05, LEAST = 0.125;
  function stretch(d, roundStart, roundDone) {
    const T0 = d.time_s, spans = new Map();
    d.narration.forEach((x, j) => {
      const [a, b] = spans.get(x.phase) || [Infinity, 0];
      if (roundStart[j] < Infinity) spans.set(x.phase, [Math.min(a, roundStart[j]), Math.max(b, roundDone[j])]);
    });
    const knots = [...new Set([0, T0, ...[...spans.values()].flat().map((v) => Math.min(Math.max(v, 0), T0))])].sort((a, b) => a - b);
    const widths = knots.slice(1).map((v, i) => (v - knots[i]) / Math.max(T0, 1e-300));
    if (!(T0 > 0) || knots.length < 3 || Math.min(...widths.filter((w) => w > 1e-9)) >= SHORT)
      return { warped: false, knots: [0, T0], kfrac: [0, 1] };
    const share = widths.map((w) => (w > 1e-9 ? Math.max(w, LEAST) : 0)), total = share.reduce((a, b) => a + b, 0);
    const kfrac = [0]; share.forEach((w) => kfrac.push(kfrac[kfrac.length - 1] + w / total));
    return { warped: true, knots, kfrac };
  }
  function piecewise(x, xs, ys) {
    let i = 1; while (i < xs.length - 1 && x > xs[i]) i++;
    const span = xs[i] - xs[i - 1];
    return span > 0 ? ys[i - 1] + (ys[i] - ys[i - 1]) * (x - xs[i - 1]) / span : ys[i];
  }

  // The timeline's position (0-1, beyond 1 past the end) of time `s`, and back: the collective on
  // the first `split` of it, the failure's detection after it (a broken axis when much later).
  function toFrac(s) {
    const A = S.anim, a = A.split, T0 = S.data.time_s, E = A.end;
    if (s > E) return 1 + (s - E) / Math.max(E, 1e-300);
    if (s <= T0 || E <= T0) return a * piecewise(Math.min(s, T0), A.knots, A.kfrac) + (s > T0 ? a * (s - T0) / Math.max(T0, 1e-300) : 0);
    return a + (1 - a) * (s - T0) / (E - T0);
  }
  function fromFrac(f) {
    const A = S.anim, a = A.split, T0 = S.data.time_s, E = A.end;
    if (f > 1) return E + (f - 1) * E;
    if (f <= a || E <= T0) return f <= a ? piecewise(f / a, A.kfrac, A.knots) : T0 + (f / a - 1) * T0;
    return T0 + (f - a) / (1 - a) * (E - T0);
  }

  // Apply every event up to time `now`: starts enter the active set, completions update buffers.
  function advanceTo(now) {
    if (!S.data) return;
    const t = S.data.transfers, A = S.anim;
    now = Math.max(0, now);
    if (now < S.now) reset();
    while (A.startPtr < A.byStart.length && t.start[A.byStart[A.startPtr]] <= now) A.active.add(A.byStart[A.startPtr++]);
    while (A.donePtr < A.byDone.length && t.done[A.byDone[A.donePtr]] <= now) {
      const i = A.byDone[A.donePtr++];
      A.active.delete(i);
      if (A.cut[i] < Infinity) { if (A.cut[i] > t.start[i]) A.stopped.add(i); continue; }   // a failure cut it: it stays where it stopped
      if (t.op[i] === CODED) { A.coded[t.dst[i]]++; continue; }
      const buf = A.state[t.dst[i]], carried = t.carried[i];
      for (let c = A.span[2 * i]; c < A.span[2 * i + 1]; c++) buf[c] = t.op[i] === REDUCE ? buf[c] + carried : carried;
      if (A.sets && A.followSets.has(i)) {
        const got = A.followSets.get(i);
        A.sets[t.dst[i]] = t.op[i] === REDUCE ? [...new Set([...A.sets[t.dst[i]], ...got])].sort((a, b) => a - b) : got;
      }
    }
    S.now = now;
  }

  // Following one chunk: which inputs each packet of it carries is what its sender held when
  // its round began, as schedule.carried_inputs counts them (a test checks the sizes).
  function followSets(c) {
    const d = S.data, t = d.transfers, A = S.anim, held = Array.from({ length: A.nodes }, (_, n) => (n < d.workers ? [n] : []));
    const carried = new Map(), order = [...t.src.keys()].filter((i) => t.op[i] !== CODED && A.span[2 * i] <= c && c < A.span[2 * i + 1])
      .sort((a, b) => t.round[a] - t.round[b]);
    for (let q = 0; q < order.length;) {
      const r = t.round[order[q]], batch = [];
      while (q < order.length && t.round[order[q]] === r) batch.push(order[q++]);
      for (const i of batch) carried.set(i, held[t.src[i]].slice());          // snapshots first, then the writes
      for (const i of batch) held[t.dst[i]] = t.op[i] === REDUCE ? [...new Set([...held[t.dst[i]], ...carried.get(i)])].sort((a, b) => a - b) : carried.get(i);
    }
    return carried;
  }
  function setFollow(c) {
    S.follow = c === null || S.data.estimate || c >= S.anim.k ? null : c;
    S.anim.followSets = S.follow === null ? new Map() : followSets(S.follow);
    const now = S.now; reset(); S.now = 0; advanceTo(now);
    stats.follow = S.follow;
  }

  // Per cell, the fraction of the N inputs it holds (coded: packets received of those due; the
  // decode at the end gives every cell the estimate of the full sum).
  function cellFill(node, c) {
    const d = S.data, A = S.anim;
    if (d.estimate) {
      const got = Math.min(1, A.coded[node] / Math.max(A.codedPerWorker[node], 1)) * 0.999;
      return !d.failure && S.now >= d.time_s ? 1 : got;
    }
    return Math.min(1, A.state[node][c] / d.workers);
  }

  // The rounds moving data now (several overlap in a pipeline, or where workers run ahead);
  // before the first start the first, after the end the last.
  function currentRounds() {
    const t = S.data.transfers, A = S.anim, found = new Set();
    for (const i of A.active) if (S.now <= Math.min(t.done[i], A.cut[i])) found.add(A.roundIndex.get(t.round[i]));
    if (found.size) return [...found].sort((a, b) => a - b);
    let last = 0;
    for (let j = 0; j < A.roundStart.length; j++) if (A.roundStart[j] <= S.now) last = j;
    return [last];
  }

  // "step" stops at every event (a transfer starts or lands) and halfway between two, so a
  // paused view shows packets on their links, not only inside their senders.
  function stops() {
    const A = S.anim;
    if (A.stops) return A.stops;
    const t = S.data.transfers, failed = S.data.failure ? S.data.failure.stopped.map((s) => s.at_s) : [];
    const ev = [...new Set([0, ...t.start, ...t.done, S.data.time_s, ...failed])].sort((a, b) => a - b), out = [];
    ev.forEach((e, k) => { if (k) out.push((ev[k - 1] + e) / 2); out.push(e); });
    return (A.stops = out);
  }

  return { prepare, reset, toFrac, fromFrac, advanceTo, setFollow, cellFill, currentRounds, stops };
})();
