// The timeline under the drawing: one row per sender (as many lanes as it has transfers at
// once: two rings, or sharded's N - 1 sends, side by side instead of painted over each other),
// one bar per transfer from its start to its completion, striped in its chunks' colours; every
// row named (blocks of rows by the range of their names where rows are thin). A failure's
// detection runs on after the collective, each survivor's wait an amber band.
"use strict";

const Timeline = (() => {
  const GUTTER = 64, TOP = 14, layer = document.createElement("canvas");

  function lanes() {
    const t = S.data.transfers, senders = S.anim.nodes;
    const most = Math.max(1, Math.min(6, Math.floor(120 / (senders * 3)))), lane = new Int32Array(t.src.length);
    const ends = Array.from({ length: senders }, () => []);
    for (const i of [...t.src.keys()].sort((a, b) => t.start[a] - t.start[b])) {
      const e = ends[t.src[i]];
      let l = e.findIndex((end) => end <= t.start[i] * (1 + 1e-12));
      if (l < 0) l = e.length < most ? e.push(0) - 1 : e.indexOf(Math.min(...e));
      e[l] = Math.max(e[l], t.done[i]); lane[i] = l;
    }
    const first = []; let rows = 0;
    for (const e of ends) { first.push(rows); rows += Math.max(1, e.length); }
    return { lane, first, rows, senders };
  }

  // Row names: each sender's name beside its rows; where rows are thinner than a line of text,
  // a block of consecutive senders shares one label naming the first and the last.
  function names(g, L, rowH) {
    const out = [], per = Math.max(1, Math.ceil(11.5 / (rowH * L.rows / L.senders)));
    for (let s = 0; s < L.senders; s += per) {
      const last = Math.min(L.senders, s + per) - 1, y0 = TOP + L.first[s] * rowH;
      const y1 = TOP + (last + 1 < L.senders ? L.first[last + 1] : L.rows) * rowH;
      const label = last === s ? nodeName(s) : `${nodeName(s)}–${nodeName(last).replace(/^[^0-9]*/, "")}`;
      out.push({ first: s, last, label, y0, y1 });
    }
    const tail = out[out.length - 1];                 // a last block too thin for its label joins the one before
    if (out.length > 1 && tail.y1 - tail.y0 < 11.5) {
      const prev = out[out.length - 2];
      out.splice(-2, 2, { first: prev.first, last: tail.last, y0: prev.y0, y1: tail.y1,
                         label: `${nodeName(prev.first)}–${nodeName(tail.last).replace(/^[^0-9]*/, "")}` });
    }
    font(g, 11); g.fillStyle = COLOR.dim; g.strokeStyle = "#334155"; g.lineWidth = 1;
    for (const b of out) {
      g.fillText(b.label, 4, Math.min(b.y1, (b.y0 + b.y1) / 2 + 4), GUTTER - 10);
      if (b.last > b.first) { g.beginPath(); g.moveTo(GUTTER - 4, b.y0 + 1); g.lineTo(GUTTER - 4, b.y1 - 1); g.stroke(); }
    }
    stats.timelineRows = out.map(({ first, last, label }) => ({ first, last, label }));
    stats.timelineKnots = S.anim.warped ? S.anim.knots.slice() : null;
  }

  function draw() {
    const L = lanes(), rows = L.rows, d = S.data, t = d.transfers, A = S.anim;
    const rowH = Math.max(2, Math.min(12, 110 / rows));   // at most ~134 px: the timeline stays above the fold
    const T = (S.timeline = fit($("timeline"), Math.round(rows * rowH + TOP + 12)));
    T.rowH = rowH; T.lanes = L;
    layer.width = $("timeline").width; layer.height = $("timeline").height;
    const g = layer.getContext("2d"), k = A.k;
    g.setTransform(T.dpr, 0, 0, T.dpr, 0, 0);
    const X = (T.X = (s) => GUTTER + Animation.toFrac(s) * (T.w - GUTTER - 8));
    names(g, L, rowH);
    // the bars, batched by colour (one fillStyle per chunk and kind, not per bar: 8,064 bars at 64 workers)
    const batches = new Map(), h = Math.max(rowH - 1, 1);
    g.strokeStyle = "#475569"; g.lineWidth = 1;
    for (let i = 0; i < t.src.length; i++) {
      const row = L.first[t.src[i]] + L.lane[i], x0 = X(t.start[i]), x1 = X(Math.min(t.done[i], A.cut[i]));
      if (A.cut[i] < Infinity)                          // what the failure keeps from happening: a grey ghost
        g.strokeRect(Math.max(x0, x1) + 0.5, TOP + row * rowH + 0.5, Math.max(X(t.done[i]) - Math.max(x0, x1) - 1, 0.8), Math.max(rowH - 1.5, 0.8));
      if (!(x1 > x0)) continue;
      const c0 = A.span[2 * i], c1 = A.span[2 * i + 1], stripes = t.op[i] === CODED ? 1 : Math.min(c1 - c0, 4);
      for (let q = 0; q < stripes; q++) {
        const colour = t.op[i] === CODED ? COLOR.coded : chunkColor(c0 + Math.floor(q * (c1 - c0) / stripes), k, t.op[i] === REDUCE ? 50 : 65);
        if (!batches.has(colour)) batches.set(colour, []);
        batches.get(colour).push(x0, TOP + row * rowH + 0.5 + (q * h) / stripes, Math.max(x1 - x0 - 0.5, 0.8), h / stripes);
      }
    }
    for (const [colour, r] of batches) { g.fillStyle = colour; for (let j = 0; j < r.length; j += 4) g.fillRect(r[j], r[j + 1], r[j + 2], r[j + 3]); }
    axis(g, T, rows * rowH);
    if (d.failure) detection(g, T, L, rowH);
  }

  // The axis: its ends' times, and where it is stretched (each phase at least a share of the
  // width, so a fast phase beside a slow one stays visible) the phases' boundaries, marked.
  function axis(g, T, height) {
    const A = S.anim, w = T.w - GUTTER - 8, bottom = TOP + height;
    font(g, 11); g.fillStyle = COLOR.dim;
    const label = A.warped ? "axis stretched: each phase at least 1/8 of its width" : "";
    if (label) g.fillText(label, GUTTER, 11, w - 50);
    if (!A.warped) return;
    g.strokeStyle = "#475569"; g.setLineDash([2, 3]); g.lineWidth = 1;
    for (const s of A.knots.slice(1, -1)) { const x = T.X(s); g.beginPath(); g.moveTo(x, TOP); g.lineTo(x, bottom); g.stroke(); }
    g.setLineDash([]);
  }

  // From the failure to each survivor's detection: an amber band on its rows (it waits in vain)
  // ending in a red tick (it raises PeerError); the axis broken where the gap is compressed.
  function detection(g, T, L, rowH) {
    const f = S.data.failure, A = S.anim, X = T.X, top = TOP, bottom = TOP + L.rows * rowH;
    if (A.split < 1 && A.end > 3 * S.data.time_s) {
      const xb = X(S.data.time_s);
      g.fillStyle = "#020617"; g.fillRect(xb - 3, top - 4, 6, bottom - top + 8);
      g.strokeStyle = COLOR.dim; g.lineWidth = 1; g.beginPath();
      for (const dx of [-3, 1]) { g.moveTo(xb + dx, bottom + 2); g.lineTo(xb + dx + 2, top - 4); }
      g.stroke();
    }
    for (const s of f.stopped) {
      if (s.node === f.device) continue;
      const row = L.first[s.node], lanes = (s.node + 1 < L.first.length ? L.first[s.node + 1] : L.rows) - row;
      const y = top + row * rowH, h = Math.max(lanes * rowH, 2), x0 = X(Math.max(f.at_s, s.began_s ?? f.at_s)), x1 = X(s.at_s);
      g.fillStyle = "rgba(251, 191, 36, 0.28)"; g.fillRect(x0, y, Math.max(x1 - x0, 1), h);
      g.fillStyle = COLOR.fail; g.fillRect(x1 - 1, y, 2, h);
    }
    const colour = f.detection === "stall" ? COLOR.stall : COLOR.fail, x = X(f.at_s), word = f.detection === "stall" ? "stall" : "crash";
    g.fillStyle = colour; g.fillRect(x - 1, top - 4, 2, L.rows * rowH + 4); font(g, 11, "bold");
    const label = Math.max(GUTTER, Math.min(x + 3, T.w - g.measureText(word).width - 2)), lw = g.measureText(word).width;
    g.fillText(word, label, 11);
    const first = Lesson.firstNotice(f);
    if (first.node === f.device) return;
    const xf = X(first.at_s), text = `noticed +${fmtTime(first.at_s - f.at_s)}`, w = g.measureText(text).width;
    for (const at of [xf - w - 3, xf + 3]) if (at > label + lw + 6 && at + w < T.w - 2) { g.fillStyle = COLOR.wait; g.fillText(text, at, 11); break; }
  }

  function drawCursor() {
    const T = S.timeline, g = T.g;
    g.clearRect(0, 0, T.w, T.h);
    g.drawImage(layer, 0, 0, T.w, T.h);
    const x = T.X(Math.min(S.now, S.anim.end));
    g.fillStyle = "#f8fafc"; g.fillRect(x - 1, 4, 2, T.h - 8);
  }

  // The moment under a point of the timeline (as a fraction of it), for dragging.
  function fractionAt(clientX) {
    const r = $("timeline").getBoundingClientRect();
    return (clientX - r.left - GUTTER) / (r.width - GUTTER - 8);
  }

  return { draw, drawCursor, fractionAt };
})();
