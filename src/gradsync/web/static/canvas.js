// The drawing: links shaded by load, nodes, the buffers filling as inputs arrive, packets on
// their routes, a failure and who noticed it. A static layer (links, names) is drawn once per
// layout; the rest every frame.
"use strict";

const Canvas = (() => {
  const layer = document.createElement("canvas");

  function drawStatic() {
    const d = S.data, geom = S.geom, g = layer.getContext("2d"), view = $("view");
    layer.width = view.width; layer.height = view.height;
    g.setTransform(S.view.dpr, 0, 0, S.view.dpr, 0, 0);
    const nodes = d.topology.nodes, links = d.topology.links;
    const util = links.map((l) => (d.time_s > 0 ? l.busy_s / d.time_s : 0)), busiest = util.indexOf(Math.max(...util));
    const maxBw = Math.max(...links.map((l) => l.bandwidth));
    links.forEach((l, k) => {                // idle links grey, the busier the more orange
      const u = Math.min(1, util[k]);
      g.strokeStyle = u > 0 ? `hsla(${30 - 10 * u}, 90%, ${30 + 25 * u}%, ${0.35 + 0.65 * u})` : COLOR.grid;
      g.lineWidth = 1 + 4 * l.bandwidth / maxBw;
      g.beginPath(); Layout.curve(g, l.a, l.b); g.stroke();
    });
    drawLogical(g);
    drawRings(g);
    stats.equallyBusy = geom.equallyBusy;
    if (geom.equallyBusy) {                  // a symmetric ring: no link is the bottleneck
      font(g, 12); g.fillStyle = COLOR.wait;
      if (geom.note) g.fillText(Layout.equalNote(util), geom.note.x, geom.note.y);
    } else if (busiest >= 0 && util[busiest] > 0) {
      const l = links[busiest];
      g.strokeStyle = COLOR.wait; g.setLineDash([6, 4]); g.lineWidth = 1.5;
      g.beginPath(); Layout.curve(g, l.a, l.b); g.stroke(); g.setLineDash([]);
      font(g, 11); g.fillStyle = COLOR.wait;
      if (geom.busiestLabel) g.fillText(geom.busiestLabel.text, geom.busiestLabel.x, geom.busiestLabel.y);
    }
    font(g, 11); g.fillStyle = "#64748b";
    for (const { x, y, text } of geom.linkLabels.values()) g.fillText(text, x, y);
    nodes.forEach((nd, i) => {
      g.fillStyle = nd.kind === "gpu" || nd.kind === "host" ? "#1d4ed8" : nd.kind === "cpu" ? "#15803d" : "#475569";
      g.beginPath();
      const r = geom.r[i];
      if (nd.kind === "switch" || nd.kind === "nic") g.rect(geom.x[i] - r, geom.y[i] - r, 2 * r, 2 * r); else g.arc(geom.x[i], geom.y[i], r, 0, 2 * Math.PI);
      g.fill();
      if (geom.names.has(i)) { font(g, 12); g.fillStyle = COLOR.text; g.fillText(nd.name, geom.names.get(i).x, geom.names.get(i).y); }
    });
  }

  // The algorithm's own structure (a tree's parents and children, a hierarchy's rails, a ring
  // over a switch), when its routes do not show it: a dashed line per pair that talks.
  function drawLogical(g) {
    const d = S.data, t = d.transfers, pairs = new Map();
    for (let i = 0; i < t.src.length; i++) {
      const a = Math.min(t.src[i], t.dst[i]), b = Math.max(t.src[i], t.dst[i]);
      if (!pairs.has(a * 4096 + b)) pairs.set(a * 4096 + b, t.path[i].length > 2);
    }
    stats.logical = 0;
    if (pairs.size <= 2 * d.workers && [...pairs.values()].some(Boolean)) {
      g.strokeStyle = "rgba(226, 232, 240, 0.55)"; g.setLineDash([3, 4]); g.lineWidth = 1.2;
      for (const key of pairs.keys()) {
        const a = d.placement[Math.floor(key / 4096)], b = d.placement[key % 4096];
        g.beginPath(); g.moveTo(S.geom.x[a], S.geom.y[a]); g.lineTo(S.geom.x[b], S.geom.y[b]); g.stroke();
      }
      g.setLineDash([]);
      stats.logical = pairs.size;
    }
    $("legend-logical").hidden = !stats.logical;
  }

  // Several rings at once (channels, each on its own part of the buffer): each ring's hops in
  // its own colour, drawn beside the links it uses (offset per ring, so two rings on one link
  // both show), and its packets ringed in that colour.
  const RING_COLORS = ["#22d3ee", "#f472b6", "#a3e635", "#fb923c", "#c084fc", "#facc15", "#60a5fa", "#f87171"];
  const ringColor = (c) => RING_COLORS[c % RING_COLORS.length];
  function rings() {
    const t = S.data.transfers, A = S.anim;
    if (!t.channel) return [];
    const out = [];
    t.channel.forEach((c, i) => {
      const r = out[c] || (out[c] = { channel: c, paths: new Map(), first: Infinity, end: 0 });
      r.paths.set(t.src[i] * 4096 + t.dst[i], t.path[i]); r.first = Math.min(r.first, A.span[2 * i]); r.end = Math.max(r.end, A.span[2 * i + 1]);
    });
    return out.filter(Boolean);
  }
  function drawRings(g) {
    const found = rings(), d = S.data, geom = S.geom;
    stats.rings = found.map((r) => ({ channel: r.channel, color: ringColor(r.channel), hops: r.paths.size, chunks: [r.first, r.end] }));
    $("legend-rings").innerHTML = found.length > 1 ? found.map((r) => `<span><i style="background:${ringColor(r.channel)}"></i>ring ${r.channel + 1}: chunks ${r.first}-${r.end - 1}</span>`).join("") : "";
    if (found.length < 2) return;
    g.lineWidth = 2; g.setLineDash([]);
    found.forEach((r, k) => {
      const off = (k - (found.length - 1) / 2) * 5;
      g.strokeStyle = ringColor(r.channel); g.globalAlpha = 0.85;
      for (const path of r.paths.values()) {           // along the route, links' curves included, beside them
        g.beginPath();
        for (let q = 0; q <= 24; q++) {
          const [x, y, dx, dy] = Layout.pointOnPath(path, q / 24), len = Math.hypot(dx, dy) || 1;
          if (q) g.lineTo(x - dy / len * off, y + dx / len * off); else g.moveTo(x - dy / len * off, y + dx / len * off);
        }
        g.stroke();
      }
      g.globalAlpha = 1;
    });
  }

  // A packet: a dot in its chunk's colour, a bar of colours for several chunks, a diamond for
  // coded; an arrowhead ahead of it, pointing where it goes.
  function arrow(g, x, y, ux, uy, size) {
    const tip = size + 5, back = size + 1;
    g.fillStyle = "#f8fafc"; g.beginPath();
    g.moveTo(x + ux * tip, y + uy * tip);
    g.lineTo(x + ux * back - uy * 3, y + uy * back + ux * 3); g.lineTo(x + ux * back + uy * 3, y + uy * back - ux * 3);
    g.fill();
  }
  function drawPacket(g, i, x, y, failed, ux = 0, uy = 0) {
    const t = S.data.transfers, k = S.anim.k, c0 = S.anim.span[2 * i], c1 = S.anim.span[2 * i + 1], size = S.geom.packet;
    if (!failed && (ux || uy) && size >= 4) arrow(g, x, y, ux, uy, t.op[i] === CODED || c1 - c0 === 1 ? size : 2 * size);
    if (failed) { g.fillStyle = COLOR.fail; g.beginPath(); g.arc(x, y, size, 0, 2 * Math.PI); g.fill(); return; }
    if (t.op[i] === CODED) {
      g.fillStyle = COLOR.coded; g.beginPath();
      g.moveTo(x, y - size - 1); g.lineTo(x + size + 1, y); g.lineTo(x, y + size + 1); g.lineTo(x - size - 1, y); g.fill();
      return;
    }
    if (c1 - c0 === 1) {
      g.fillStyle = chunkColor(c0, k); g.beginPath(); g.arc(x, y, size, 0, 2 * Math.PI); g.fill();
      if (t.channel) { g.strokeStyle = ringColor(t.channel[i]); g.lineWidth = 2; g.stroke(); }
      return;
    }
    const parts = Math.min(c1 - c0, 8), width = Math.min(4 * size, 2 * size + parts * 2), step = (c1 - c0) / parts;
    for (let p = 0; p < parts; p++) {
      g.fillStyle = chunkColor(c0 + Math.floor(p * step), k);
      g.fillRect(x - width / 2 + (p * width) / parts, y - size, width / parts + 0.5, 2 * size);
    }
    g.strokeStyle = COPY === t.op[i] ? COLOR.text : "#0f172a"; g.lineWidth = 1;
    g.strokeRect(x - width / 2, y - size, width, 2 * size);
  }

  function drawPackets(g) {
    const t = S.data.transfers, A = S.anim, buckets = new Map();
    for (const i of A.active) {
      const end = Math.min(t.done[i], A.cut[i]);
      if (S.now > end || A.cut[i] <= t.start[i]) continue;     // cut before it left: nothing moves
      const f = (S.now - t.start[i]) / Math.max(t.done[i] - t.start[i], 1e-15);
      const [x, y, dx, dy] = Layout.pointOnPath(t.path[i], f);
      const key = Math.round(x / 6) + "," + Math.round(y / 6), b = buckets.get(key);
      if (b) b.items.push(i); else buckets.set(key, { x, y, dx, dy, items: [i] });
    }
    // flows that share a point are fanned out across the path, and counted where the count
    // overlaps no name, node or buffer
    const taken = S.geom.boxes.filter((b) => b.kind !== "link" && b.kind !== "busiest");
    for (const { x, y, dx, dy, items } of buckets.values()) {
      const len = Math.hypot(dx, dy) || 1, nx = -dy / len, ny = dx / len, shown = Math.min(items.length, 5);
      for (let j = 0; j < shown; j++) {
        const o = (j - (shown - 1) / 2) * (S.geom.packet * 1.6), i = items[j];
        g.globalAlpha = S.follow === null || (A.span[2 * i] <= S.follow && S.follow < A.span[2 * i + 1]) ? 1 : 0.15;
        drawPacket(g, i, x + nx * o, y + ny * o, false, dx / len, dy / len);
        g.globalAlpha = 1;
      }
      if (items.length > 1) counter(g, taken, `×${items.length}`, x, y, nx, ny);
    }
    for (const i of [...A.active, ...A.stopped]) if (A.cut[i] < Infinity && S.now >= A.cut[i] && A.cut[i] > t.start[i]) {
      const [x, y] = Layout.pointOnPath(t.path[i], (A.cut[i] - t.start[i]) / Math.max(t.done[i] - t.start[i], 1e-15));
      drawPacket(g, i, x, y, true);              // where a failure stopped a transfer
    }
  }
  function counter(g, taken, text, x, y, nx, ny) {
    font(g, 11, "bold");
    for (const side of [1, -1]) {
      const bx = x + side * nx * 24 + 4, by = y + side * ny * 24 + 4, b = textBox(g, text, bx, by);
      if (b.x0 >= 0 && b.x1 <= S.view.w && b.y0 >= 0 && b.y1 <= S.view.h && !taken.some((o) => overlaps(o, b))) {
        g.fillStyle = "#f8fafc"; g.fillText(text, bx, by); return;
      }
    }
  }

  // Each worker's buffer: its chunks side by side (or groups of neighbouring chunks where a
  // chunk's cell would be too narrow), filling in the chunk's colour as inputs arrive.
  function drawBuffers(g) {
    const d = S.data, A = S.anim, k = A.k, est = d.estimate, refused = est && est.refused;
    for (let s = 0; s < A.nodes; s++) {
      const box = Layout.strip(s), nd = d.placement[s];
      if (!box) { progressRing(g, s, nd, refused); continue; }     // many workers: one progress ring each
      const { x0, y0, w, h, cells } = box, group = S.geom.cell.group;
      for (let q = 0; q < cells; q++) {
        const c0 = q * group, c1 = Math.min(k, c0 + group), x = x0 + q * w, mid = Math.floor((c0 + c1 - 1) / 2);
        let f = 0; for (let c = c0; c < c1; c++) f += Animation.cellFill(s, c) / (c1 - c0);
        g.globalAlpha = S.follow === null || (c0 <= S.follow && S.follow < c1) ? 1 : 0.2;
        g.fillStyle = COLOR.grid; g.fillRect(x, y0, w - 1, h);
        if (f > 0) {
          g.fillStyle = est ? (f >= 1 ? (refused ? COLOR.fail : chunkColor(mid, k)) : COLOR.coded) : chunkColor(mid, k, f >= 1 ? 55 : 40);
          g.fillRect(x, y0 + h * (1 - f), w - 1, h * f);
        }
        if (f >= 1 && !refused) { g.strokeStyle = COLOR.done; g.lineWidth = 1; g.strokeRect(x + 0.5, y0 + 0.5, w - 2, h - 1); }
        Values.draw(g, s, c0, c1, x, y0, w, h);
      }
      g.globalAlpha = 1;
      if (S.geom.cell.numbers) {
        font(g, 11); g.fillStyle = "#cbd5e1";
        for (let q = 0; q < cells; q++) g.fillText(String(q * group), x0 + q * w + w / 2 - 3, y0 + h + 12);
      }
      if (refused && S.now >= d.time_s) { font(g, 11, "bold"); g.fillStyle = COLOR.fail; g.fillText("refused", x0, y0 + h + (S.geom.cell.numbers ? 26 : 12)); }
    }
  }
  function progressRing(g, s, nd, refused) {
    let sum = 0;
    for (let c = 0; c < S.anim.k; c++) sum += Animation.cellFill(s, c);
    const f = sum / S.anim.k;
    g.strokeStyle = refused && f >= 1 ? COLOR.fail : f >= 1 ? "#4ade80" : COLOR.dim; g.lineWidth = 2;
    g.beginPath(); g.arc(S.geom.x[nd], S.geom.y[nd], S.geom.r[nd] + 2, -Math.PI / 2, -Math.PI / 2 + 2 * Math.PI * f); g.stroke();
  }

  function colourName(g, nd, colour) {
    if (!S.geom.names.has(nd)) return;
    font(g, 12); g.fillStyle = colour;
    g.fillText(S.data.topology.nodes[nd].name, S.geom.names.get(nd).x, S.geom.names.get(nd).y);
  }

  // A crash: a red cross; a stall: a violet pause sign (alive, silent). Survivors waiting in
  // vain: a dashed amber ring; once they notice (PeerError): a red ring.
  function drawFailure(g) {
    const f = S.data.failure, geom = S.geom;
    if (!f) return;
    for (const s of f.stopped) {
      const nd = S.data.placement[s.node], x = geom.x[nd], y = geom.y[nd], a = geom.r[nd] + 2;
      if (s.at_s > S.now && s.node !== f.device && S.now >= f.at_s) {
        g.strokeStyle = COLOR.wait; g.lineWidth = 2; g.setLineDash([3, 3]);
        g.beginPath(); g.arc(x, y, a, 0, 2 * Math.PI); g.stroke(); g.setLineDash([]);
      }
      if (s.at_s > S.now) continue;
      if (s.node !== f.device) {
        g.strokeStyle = COLOR.fail; g.lineWidth = 2; g.beginPath(); g.arc(x, y, a, 0, 2 * Math.PI); g.stroke();
        colourName(g, nd, COLOR.fail);
        continue;
      }
      const stall = f.detection === "stall", colour = stall ? COLOR.stall : COLOR.fail;
      g.strokeStyle = colour; g.fillStyle = colour; g.lineWidth = 3; g.beginPath();
      if (stall) { g.fillRect(x - a, y - a, a * 0.7, 2 * a); g.fillRect(x + a * 0.3, y - a, a * 0.7, 2 * a); }
      else { g.moveTo(x - a, y - a); g.lineTo(x + a, y + a); g.moveTo(x + a, y - a); g.lineTo(x - a, y + a); g.stroke(); }
      colourName(g, nd, colour);
      const phase = (performance.now() % 1200) / 1200;     // a pulse: it stays visible when nothing else moves
      g.globalAlpha = 0.6 * (1 - phase); g.lineWidth = 2; g.beginPath(); g.arc(x, y, geom.r[nd] + 3 + 10 * phase, 0, 2 * Math.PI); g.stroke();
      g.globalAlpha = 1;
    }
  }

  function drawHover(g) {
    if (S.hover === null) return;
    const d = S.data, nd = d.placement[S.hover], x = S.geom.x[nd], y = S.geom.y[nd], k = S.anim.k;
    const lines = [`${d.topology.nodes[nd].name} (worker ${S.hover})`];
    let complete = 0;
    for (let c = 0; c < k; c++) if (Animation.cellFill(S.hover, c) >= 1) complete++;
    lines.push(`${complete} of ${k} chunks hold the full sum`);
    const stop = d.failure && d.failure.stopped.find((s) => s.node === S.hover && s.at_s <= S.now);
    if (stop) { lines.push(stop.message);
      if (stop.node !== d.failure.device) lines.push(`rank ${d.failure.device} failed at ${fmtTime(stop.died_s)}; this rank noticed at ${fmtTime(stop.at_s)}`); }
    font(g, 12);
    const bw = Math.min(S.view.w - 8, Math.max(...lines.map((l) => g.measureText(l).width)) + 12), bh = 16 * lines.length + 8 + 18;
    const bx = Math.max(4, Math.min(x + 12, S.view.w - bw - 4)), by = Math.min(y + 12, S.view.h - bh - 4);
    g.fillStyle = "rgba(15,23,42,0.95)"; g.fillRect(bx, by, bw, bh);
    g.fillStyle = COLOR.text; lines.forEach((l, j) => g.fillText(l, bx + 6, by + 16 + 16 * j, bw - 12));
    const cw = (bw - 12) / k;
    for (let c = 0; c < k; c++) {
      const f = Animation.cellFill(S.hover, c);
      g.fillStyle = COLOR.grid; g.fillRect(bx + 6 + c * cw, by + bh - 18, Math.max(cw - 0.5, 0.5), 12);
      g.fillStyle = chunkColor(c, k); g.fillRect(bx + 6 + c * cw, by + bh - 18 + 12 * (1 - f), Math.max(cw - 0.5, 0.5), 12 * f);
    }
  }

  function render() {
    if (!S.data || !S.view) return;
    const g = S.view.g;
    g.clearRect(0, 0, S.view.w, S.view.h);
    g.drawImage(layer, 0, 0, S.view.w, S.view.h);
    drawBuffers(g);
    if (!S.hidePackets) drawPackets(g);        // packets pass over the buffers, never under
    drawFailure(g);
    drawHover(g);
  }

  return { drawStatic, render };
})();
