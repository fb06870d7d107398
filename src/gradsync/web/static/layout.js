// Where the drawing puts things (S.geom): nodes where the topology's layout says, in one scale
// for x and y (a ring stays a circle); then buffers, names and labels, nothing over anything else.
"use strict";

const Layout = (() => {
  // Cell widths tried, largest first. Under MIN_CELL px a chunk's cell is too narrow to read or
  // click: neighbouring chunks are then drawn as one cell (aggregated, and the page says so).
  const CELL_WIDTHS = [30, 26, 22, 19, 16, 14, 12, 10, 8];
  const MIN_CELL = 8;
  const NAME_GAP = 2;         // px kept clear on each side of a name, so that two never read as one ("gpu9gpu10")

  function place() {
    S.view = fit($("view"), undefined);
    const { w, h } = S.view, d = S.data, nodes = d.topology.nodes;
    // the nodes' box fitted to the canvas: one scale (a ring stays a circle), or for boards and
    // racks (topology.fill) a scale per axis, at most 1.8 times apart
    const xs = nodes.map((nd) => nd.x), ys = nodes.map((nd) => nd.y), pad = Math.max(34, Math.min(w, h) * 0.07);
    const x0 = Math.min(...xs), y0 = Math.min(...ys), bw = Math.max(Math.max(...xs) - x0, 0.05), bh = Math.max(Math.max(...ys) - y0, 0.05);
    let sx = (w - 2 * pad) / bw, sy = (h - 2 * pad) / bh;
    if (!d.topology.fill) sx = sy = Math.min(sx, sy, (Math.min(w, h) - 2 * pad));
    else { sx = Math.min(sx, 1.8 * sy); sy = Math.min(sy, 1.8 * sx); }
    const ox = (w - sx * bw) / 2 - sx * x0, oy = (h - sy * bh) / 2 - sy * y0;
    const x = (nd) => ox + nd.x * sx, y = (nd) => oy + nd.y * sy;
    const links = new Map();
    for (const l of d.topology.links) {
      const a = nodes[l.a], b = nodes[l.b], ax = x(a), ay = y(a), bx = x(b), by = y(b);
      const len = Math.hypot(bx - ax, by - ay) || 1, bend = l.bend || 0;
      const cx = (ax + bx) / 2 + (-(by - ay) / len) * bend * len, cy = (ay + by) / 2 + ((bx - ax) / len) * bend * len;
      links.set(l.a + "," + l.b, { cx, cy }); links.set(l.b + "," + l.a, { cx, cy });
    }
    const X = nodes.map(x), Y = nodes.map(y);
    let near = Infinity;                               // the closest two nodes set the nodes' size
    for (let i = 0; i < nodes.length; i++) for (let j = 0; j < i; j++) near = Math.min(near, Math.hypot(X[i] - X[j], Y[i] - Y[j]));
    const r = Math.max(2, Math.min(11, 0.28 * near, near / 2 - 3.2));   // node and progress ring clear of the next
    S.geom = { x: X, y: Y, r: nodes.map((nd) => (nd.kind === "switch" || nd.kind === "nic" ? Math.min(7, r) : r)), links };
    S.geom.packet = Math.max(3, Math.min(5.5, 0.5 * r));
    placeLabels();
  }

  // Node marks first; then the buffer strips, as large as fit (where none fit even with chunks
  // aggregated, each worker gets a progress ring); then names, link labels and the busiest-link
  // note, each where it overlaps nothing placed before it.
  function placeLabels() {
    const d = S.data, geom = S.geom, nodes = d.topology.nodes, g = S.view.g, boxes = [];
    const inside = (b) => b.x0 >= 0 && b.y0 >= 0 && b.x1 <= S.view.w && b.y1 <= S.view.h;
    const free = (b) => inside(b) && !boxes.some((o) => overlaps(o, b));
    const ring = (i) => geom.r[i] + 3;                  // the node and its progress ring (a circle; its box for the rest)
    nodes.forEach((_, i) => boxes.push({ kind: "node", owner: i, cx: geom.x[i], cy: geom.y[i], radius: ring(i),
      x0: geom.x[i] - ring(i), y0: geom.y[i] - ring(i), x1: geom.x[i] + ring(i), y1: geom.y[i] + ring(i) }));
    const util = d.topology.links.map((l) => (d.time_s > 0 ? l.busy_s / d.time_s : 0));
    geom.equallyBusy = equallyBusy(util);
    placeCells(boxes, inside);
    placeNames(boxes, free);
    geom.note = null;
    if (geom.equallyBusy) {                           // in a free corner, after the names it must not hide
      font(g, 12);
      const tw = g.measureText(equalNote(util)).width, W = S.view.w, H = S.view.h;
      for (const [x, y] of [[8, 16], [8, H - 6], [W - tw - 8, 16], [W - tw - 8, H - 6]]) {
        const b = { kind: "note", ...textBox(g, equalNote(util), x, y, 12) };
        if (free(b)) { boxes.push(b); geom.note = { x, y }; break; }
      }
    }
    font(g, 11);
    geom.linkLabels = new Map();
    if (d.topology.links.length <= 24) d.topology.links.forEach((l, j) => {
      const c = geom.links.get(l.a + "," + l.b), text = fmtBytes(l.bandwidth) + "/s", b = { kind: "link", owner: j, ...textBox(g, text, c.cx + 4, c.cy + 14) };
      if (free(b)) { boxes.push(b); geom.linkLabels.set(j, { x: c.cx + 4, y: c.cy + 14, text }); }
    });
    geom.busiestLabel = null;
    const top = util.indexOf(Math.max(...util));
    if (!geom.equallyBusy && top >= 0 && util[top] > 0) {
      const l = d.topology.links[top], c = geom.links.get(l.a + "," + l.b), text = `busiest: ${Math.round(util[top] * 100)}% busy`, tw = g.measureText(text).width;
      for (const [dx, dy] of [[6, -6], [-tw - 6, -6], [6, 18], [-tw - 6, 18]]) {
        const b = { kind: "busiest", ...textBox(g, text, c.cx + dx, c.cy + dy) };
        if (free(b)) { boxes.push(b); geom.busiestLabel = { x: c.cx + dx, y: c.cy + dy, text }; break; }
      }
    }
    geom.boxes = boxes;
  }
  const equalNote = (util) => `all ${util.filter((u) => u > 0).length} links in use equally busy: ${Math.round(Math.max(...util) * 100)}% of the time`;

  // The buffers: the widest cells that fit beside every worker (below it, else above, right or
  // left of it: in a crowded ring the side away from its neighbours), each chunk a cell; when a
  // cell would be under MIN_CELL px, `group` neighbouring chunks share one (its fill their mean).
  function placeCells(boxes, inside) {
    const d = S.data, geom = S.geom, k = S.anim.k, workers = Array.from({ length: S.anim.nodes }, (_, s) => d.placement[s]);
    geom.cell = null; geom.strips = null;
    const groups = [1, 2, 4, 8, 16].filter((q) => q === 1 || q < k);
    // every strip below its worker if any width allows, so each is plainly its worker's; else each where it fits
    for (const group of groups) for (const below of [true, false]) for (const w of CELL_WIDTHS) {
      const cells = Math.ceil(k / group), numbers = cells <= 16 && w >= 14, h = Math.max(10, Math.min(26, Math.round(w * 0.9)));
      const sw = w * cells, sh = h + (numbers ? 14 : 0) + (d.estimate ? 14 : 0), placed = [];
      for (const nd of workers) {
        const x = geom.x[nd], y = geom.y[nd], gap = geom.r[nd] + 4;
        const spots = [[x - sw / 2, y + gap], [x - sw / 2, y - gap - sh], [x + gap, y - sh / 2], [x - gap - sw, y - sh / 2]].slice(0, below ? 1 : 4);
        const found = spots.map(([x0, y0]) => ({ kind: "buffer", owner: placed.length, x0, y0, x1: x0 + sw, y1: y0 + sh }))
          .find((b) => inside(b) && !boxes.some((o) => overlaps(o, b)) && !placed.some((o) => overlaps(o, b)));
        if (!found) break;
        placed.push(found);
      }
      if (placed.length === workers.length) {
        geom.cell = { w, h, group, cells, numbers };
        geom.strips = placed;
        boxes.push(...placed);
        return;
      }
    }
  }

  // Names right of their node, else left, else above, else below: GPUs after the rest, so a
  // switch or CPU keeps its name in a crowd.
  function placeNames(boxes, free) {
    const nodes = S.data.topology.nodes, geom = S.geom, g = S.view.g;
    font(g, 12);
    geom.names = new Map();
    const order = [...nodes.keys()].sort((a, b) => (nodes[a].kind === "gpu") - (nodes[b].kind === "gpu"));
    for (const i of order) {
      const tw = g.measureText(nodes[i].name).width, rr = geom.r[i] + 3, x = geom.x[i], y = geom.y[i];
      const spots = [[x + rr + 1, y - geom.r[i] - 2], [x - rr - 1 - tw, y - geom.r[i] - 2], [x - tw / 2, y - rr - 4], [x - tw / 2, y + rr + 14]];
      for (const [x0, base] of spots) {
        const b = { kind: "name", owner: i, x0: x0 - NAME_GAP, y0: base - 11, x1: x0 + tw + NAME_GAP, y1: base + 3 };
        if (free(b)) { boxes.push(b); geom.names.set(i, { x: x0, y: base }); break; }
      }
    }
  }

  function curve(g, a, b) {
    const c = S.geom.links.get(a + "," + b);
    g.moveTo(S.geom.x[a], S.geom.y[a]);
    if (c) g.quadraticCurveTo(c.cx, c.cy, S.geom.x[b], S.geom.y[b]); else g.lineTo(S.geom.x[b], S.geom.y[b]);
  }

  // Whether every link that carries data is as busy as the busiest (within 1%): then none is
  // marked "busiest", as if it were the bottleneck.
  function equallyBusy(util) {
    const used = util.filter((u) => u > 0);
    return used.length > 1 && Math.min(...used) >= 0.99 * Math.max(...used);
  }

  // Where a transfer is at fraction f of its path (f clamped to [0, 1]; curves followed).
  function pointOnPath(path, f) {
    const geom = S.geom;
    f = Math.max(0, Math.min(1, Number.isFinite(f) ? f : 0));
    const legs = path.length - 1;
    if (legs < 1) return [geom.x[path[0]], geom.y[path[0]], 0, 0];
    const x = Math.min(f * legs, legs - 1e-9), k = Math.floor(x), r = x - k, a = path[k], b = path[k + 1];
    const ax = geom.x[a], ay = geom.y[a], bx = geom.x[b], by = geom.y[b], c = geom.links.get(a + "," + b);
    if (!c) return [ax + (bx - ax) * r, ay + (by - ay) * r, bx - ax, by - ay];
    const u = 1 - r;
    return [u * u * ax + 2 * u * r * c.cx + r * r * bx, u * u * ay + 2 * u * r * c.cy + r * r * by,
            2 * u * (c.cx - ax) + 2 * r * (bx - c.cx), 2 * u * (c.cy - ay) + 2 * r * (by - c.cy)];
  }

  // A worker's buffer strip, and the cell (group of chunks) under a point.
  function strip(node) {
    const geom = S.geom;
    if (!geom.cell) return null;
    const { w, h, cells } = geom.cell, b = geom.strips[node];
    return { x0: b.x0, y0: b.y0, w, h, cells };
  }
  function chunkAt(x, y) {
    for (let s = 0; s < S.anim.nodes; s++) {
      const b = strip(s);
      if (b && y >= b.y0 && y <= b.y0 + b.h && x >= b.x0 && x < b.x0 + b.w * b.cells) return Math.floor((x - b.x0) / b.w) * S.geom.cell.group;
    }
    return undefined;
  }

  return { place, curve, equallyBusy, equalNote, pointOnPath, strip, chunkAt };
})();
