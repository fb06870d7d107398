// Numbers a student can add: worker i's gradient holds the small integer a_i(c) = 1 + (i + 2c)
// mod 9 in chunk c, and each cell shows the sum its buffer holds now. A packet carries what its
// sender held when its round began (the schedule's rule: every node sends a snapshot taken after
// its previous round), so the replay takes each round's snapshots before its writes.
"use strict";

const Values = (() => {
  let cache = null;                            // { data, payload: per transfer its values, per cell of its span }

  const input = (i, c) => 1 + ((i + 2 * c) % 9);

  function payloads() {
    const d = S.data, t = d.transfers, A = S.anim;
    if (cache && cache.data === d) return cache.payload;
    const held = Array.from({ length: A.nodes }, (_, n) => Float64Array.from({ length: A.k }, (_, c) => (n < d.workers ? input(n, c) : 0)));
    const payload = new Array(t.src.length), order = [...t.src.keys()].sort((a, b) => t.round[a] - t.round[b]);
    for (let q = 0; q < order.length;) {
      const r = t.round[order[q]], batch = [];
      while (q < order.length && t.round[order[q]] === r) batch.push(order[q++]);
      for (const i of batch) payload[i] = held[t.src[i]].slice(A.span[2 * i], A.span[2 * i + 1]);
      for (const i of batch) if (t.op[i] !== CODED) payload[i].forEach((v, j) => {
        const c = A.span[2 * i] + j;
        held[t.dst[i]][c] = t.op[i] === REDUCE ? held[t.dst[i]][c] + v : v;
      });
    }
    cache = { data: d, payload, now: null, values: null };
    return payload;
  }

  // What each node's cells hold at the moment shown: the transfers landed by now, in order.
  function now() {
    const d = S.data, t = d.transfers, A = S.anim, payload = payloads();
    if (cache.now === S.now && cache.values) return cache.values;
    const values = Array.from({ length: A.nodes }, (_, n) => Float64Array.from({ length: A.k }, (_, c) => (n < d.workers ? input(n, c) : 0)));
    for (let p = 0; p < A.donePtr; p++) {
      const i = A.byDone[p];
      if (A.cut[i] < Infinity || t.op[i] === CODED) continue;
      payload[i].forEach((v, j) => { const c = A.span[2 * i] + j; values[t.dst[i]][c] = t.op[i] === REDUCE ? values[t.dst[i]][c] + v : v; });
    }
    cache.now = S.now; cache.values = values;
    return values;
  }

  // Shown only where every number fits its cell (few workers, wide cells), never for coded schedules.
  function shown() {
    return S.geom.cell && S.geom.cell.group === 1 && S.geom.cell.w >= 16 && S.geom.cell.h >= 12 && !S.data.estimate && S.data.workers <= 16;
  }

  function draw(g, node, c0, c1, x, y, w, h) {
    if (c1 - c0 !== 1 || !shown()) return;
    const text = String(now()[node][c0]);
    font(g, 11, "bold");
    const tw = g.measureText(text).width;
    if (tw > w - 3) return;
    g.lineWidth = 3; g.strokeStyle = "#020617"; g.lineJoin = "round";       // an outline: the fill stays visible
    g.strokeText(text, x + (w - 1 - tw) / 2, y + h / 2 + 4);
    g.fillStyle = "#f8fafc"; g.fillText(text, x + (w - 1 - tw) / 2, y + h / 2 + 4);
  }

  // The sum of the inputs in `set` for chunk c, written out: "a3 + a4 = 4 + 6 = 10".
  function sum(set, c) {
    if (!set.length) return "nothing yet";
    const parts = set.map((w) => input(w, c)), total = parts.reduce((a, b) => a + b, 0);
    return set.length === 1 ? `a${set[0]} = ${total}` : `${set.map((w) => `a${w}`).join(" + ")} = ${parts.join(" + ")} = ${total}`;
  }

  return { input, now, shown, draw, sum };
})();
