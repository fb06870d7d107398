// The chart: time against workers for every algorithm on the chosen topology, links, codec and
// CERAR settings; simulated (solid, one colour and marker per algorithm, no two alike) and, where
// the answer has them, in closed form (dashed). Labelled axes at any range; every label inside
// the canvas and clear of the others (a test reads S.chart.boxes); the configuration animated
// above circled; D2L's 60 / 80 / 15 ms marked on its server.
"use strict";

const Chart = (() => {
  const STYLES = [["#f59e0b", "circle"], ["#22c55e", "square"], ["#38bdf8", "triangle"], ["#f472b6", "diamond"],
                  ["#a78bfa", "cross"], ["#facc15", "plus"], ["#fb7185", "star"], ["#2dd4bf", "down"], ["#e2e8f0", "hexagon"],
                  ["#84cc16", "ring"], ["#fb923c", "bar"], ["#60a5fa", "x-square"], ["#34d399", "open-square"],
                  ["#fcd34d", "open-triangle"], ["#e879f9", "open-diamond"], ["#94a3b8", "open-down"]];
  const GLYPH = { circle: "●", square: "■", triangle: "▲", diamond: "◆", cross: "✕", plus: "+", star: "★", down: "▼",
                  hexagon: "⬢", ring: "○", bar: "▬", "x-square": "⊠", "open-square": "□", "open-triangle": "△",
                  "open-diamond": "◇", "open-down": "▽" };
  const style = (k) => STYLES[k % STYLES.length];

  function marker(g, kind, x, y, r) {
    if (kind.startsWith("open-")) {                 // the shape's outline: four more styles, still apart
      const fill = g.fillStyle; g.fillStyle = "rgba(0,0,0,0)"; marker(g, kind.slice(5), x, y, r);
      g.fillStyle = fill; g.lineWidth = 2; g.stroke(); return;
    }
    g.beginPath();
    if (kind === "circle" || kind === "ring") g.arc(x, y, r, 0, 2 * Math.PI);
    else if (kind === "square" || kind === "x-square") g.rect(x - r, y - r, 2 * r, 2 * r);
    else if (kind === "triangle") { g.moveTo(x, y - r - 1); g.lineTo(x + r + 1, y + r); g.lineTo(x - r - 1, y + r); g.closePath(); }
    else if (kind === "down") { g.moveTo(x, y + r + 1); g.lineTo(x + r + 1, y - r); g.lineTo(x - r - 1, y - r); g.closePath(); }
    else if (kind === "diamond") { g.moveTo(x, y - r - 1); g.lineTo(x + r + 1, y); g.lineTo(x, y + r + 1); g.lineTo(x - r - 1, y); g.closePath(); }
    else if (kind === "hexagon") { for (let j = 0; j < 6; j++) g.lineTo(x + (r + 1) * Math.cos(j * Math.PI / 3), y + (r + 1) * Math.sin(j * Math.PI / 3)); g.closePath(); }
    else if (kind === "bar") g.rect(x - r - 1, y - r / 2, 2 * r + 2, r);
    else if (kind === "star") { for (let j = 0; j < 10; j++) { const a = -Math.PI / 2 + j * Math.PI / 5, q = j % 2 ? r / 2 : r + 1; g.lineTo(x + q * Math.cos(a), y + q * Math.sin(a)); } g.closePath(); }
    if (kind === "ring" || kind === "x-square") {
      g.lineWidth = 2; g.stroke();
      if (kind === "x-square") { g.beginPath(); g.moveTo(x - r, y - r); g.lineTo(x + r, y + r); g.moveTo(x + r, y - r); g.lineTo(x - r, y + r); g.stroke(); }
      return;
    }
    if (kind === "cross" || kind === "plus") {
      const [dx, dy] = kind === "cross" ? [r, r] : [r + 1, 0];
      g.moveTo(x - dx, y - dy); g.lineTo(x + dx, y + dy); g.moveTo(x - dy, y + dx); g.lineTo(x + dy, y - dx);
      g.lineWidth = 2; g.stroke(); return;
    }
    g.fill();
  }

  // Ticks a reader can read at any range on a log axis: powers of ten, then 1-2-5, then
  // 1-1.5-2-3-5-7, then evenly spaced round values, until there are at least three.
  function ticks(lo, hi) {
    for (const steps of [[1], [1, 2, 5], [1, 1.5, 2, 3, 5, 7]]) {
      const out = [];
      for (let e = Math.floor(lo) - 1; e <= Math.ceil(hi); e++) for (const m of steps) {
        const v = m * 10 ** e;
        if (Math.log10(v) >= lo - 1e-9 && Math.log10(v) <= hi + 1e-9) out.push(v);
      }
      if (out.length >= 3) return out;
    }
    const a = 10 ** lo, b = 10 ** hi, step = 10 ** Math.floor(Math.log10((b - a) / 3)), out = [];
    for (let v = Math.ceil(a / step) * step; v <= b; v += step) out.push(v);
    return out;
  }

  async function load() {
    const c = S.chart, seq = ++c.seq;
    if (c.controller) c.controller.abort();                      // stale requests are cancelled...
    c.controller = new AbortController();
    c.curves = {}; c.meta = null;
    const list = [...$("algorithm").options].map((o) => o.value), p = Controls.params();
    $("chart-status").textContent = `computing 0 of ${list.length}…`;
    draw();
    let done = 0;
    for (const name of list) {                                   // one bounded request per algorithm
      try {
        stats.chartRequests++;
        const r = await Source.compare(p, name, c.controller.signal, () => seq !== c.seq);
        if (seq !== c.seq) return;                               // ...and one that still lands is ignored
        if (!r.ok) { $("chart-status").textContent = r.body.detail || "chart unavailable"; continue; }
        c.meta = r.body; c.curves[name] = r.body.curves[name];
        stats.chartApplied++;
        stats.chart = { bytes: r.body.bytes, topology: r.body.topology, curves: c.curves, workers: r.body.workers,
                        book_marks: r.body.book_marks, compression: r.body.compression || null };
      } catch (e) {
        if (e.name === "AbortError" || seq !== c.seq) return;
      }
      done++;
      $("chart-status").textContent = done < list.length ? `computing ${done} of ${list.length}…` : "";
      draw();
    }
  }

  function draw() {
    const cv = $("chart"), { g, w, h } = fit(cv, undefined), c = S.chart.meta, names = [...$("algorithm").options].map((o) => o.value);
    const boxes = (S.chart.boxes = []), closed = c && Object.values(S.chart.curves).some((v) => v.closed_form_s.some((x) => x > 0));
    $("chart-where").textContent = c ? `(${c.topology}, ${fmtBytes(c.bytes)}${c.compression ? ", " + c.compression : ""})` : "";
    $("chart-caption").textContent = "simulated: solid with markers" + (closed ? "; closed form: dashed" : "") + "; ◯ the configuration animated above";
    legend(names);
    stats.chartStyles = names.map((n, k) => ({ name: n, color: style(k)[0], marker: style(k)[1] }));
    S.chart.size = { w, h };
    if (!c) { font(g, 13); g.fillStyle = COLOR.dim; g.fillText("computing…", w / 2 - 30, h / 2); return; }
    const all = Object.entries(S.chart.curves).filter(([n]) => !S.chart.hidden.has(n))
      .flatMap(([, v]) => v.simulated_s.concat(v.closed_form_s)).filter((x) => x > 0);
    if (!all.length) return;
    let lo = Math.log10(Math.min(...all)), hi = Math.log10(Math.max(...all));
    if (hi - lo < 0.3) { lo -= 0.15; hi += 0.15; }
    lo -= 0.04 * (hi - lo); hi += 0.04 * (hi - lo);
    font(g, 11);
    const ys = ticks(lo, hi), L = Math.max(...ys.map((v) => g.measureText(fmtTime(v)).width)) + 26, R = 12, Tp = 14, B = 34;
    const pw = w - L - R, ph = h - Tp - B, ws = c.workers, wl = Math.log2(ws[0]), wh = Math.log2(ws[ws.length - 1]);
    const X = (n) => L + (Math.log2(n) - wl) / Math.max(wh - wl, 1e-9) * pw, Y = (s) => Tp + ph - (Math.log10(s) - lo) / (hi - lo) * ph;
    axes(g, boxes, { L, Tp, pw, ph, w, h, X, Y, ws, ys });
    series(g, names, X, Y, ws);
    marks(g, boxes, c, X, Y, w, h);
  }

  function put(g, boxes, text, x, y, size = 11) {            // a label, if it fits clear of the others
    const b = textBox(g, text, x, y, size);
    if (b.x0 < 0 || b.y0 < 0 || b.x1 > S.chart.size.w || b.y1 > S.chart.size.h || boxes.some((o) => overlaps(o, b))) return false;
    g.fillText(text, x, y); boxes.push({ ...b, text });
    return true;
  }

  function axes(g, boxes, a) {
    font(g, 11); g.fillStyle = COLOR.dim; g.strokeStyle = COLOR.grid; g.lineWidth = 1;
    for (const n of a.ws) put(g, boxes, String(n), a.X(n) - g.measureText(String(n)).width / 2, a.Tp + a.ph + 15);
    for (const v of a.ys) {
      put(g, boxes, fmtTime(v), a.L - 6 - g.measureText(fmtTime(v)).width, a.Y(v) + 4);
      g.beginPath(); g.moveTo(a.L, a.Y(v)); g.lineTo(a.L + a.pw, a.Y(v)); g.stroke();
    }
    put(g, boxes, "workers (log scale)", a.L + a.pw / 2 - g.measureText("workers (log scale)").width / 2, a.h - 4);
    g.save(); g.translate(11, a.Tp + a.ph / 2 + 40); g.rotate(-Math.PI / 2); g.fillText("time (log scale)", 0, 0); g.restore();
    boxes.push({ x0: 0, y0: a.Tp + a.ph / 2 - 45, x1: 14, y1: a.Tp + a.ph / 2 + 41, text: "time (log scale)" });
    if (S.data && S.data.workers >= a.ws[0] && S.data.workers <= a.ws[a.ws.length - 1]) {
      g.strokeStyle = "#64748b"; g.setLineDash([3, 4]); g.beginPath(); g.moveTo(a.X(S.data.workers), a.Tp); g.lineTo(a.X(S.data.workers), a.Tp + a.ph); g.stroke(); g.setLineDash([]);
    }
  }

  function series(g, names, X, Y, ws) {
    names.forEach((name, k) => {
      const v = S.chart.curves[name];
      if (!v || S.chart.hidden.has(name)) return;
      const [color, kind] = style(k);
      g.strokeStyle = color; g.fillStyle = color;
      for (const [values, dash, width] of [[v.closed_form_s, [6, 5], 1.2], [v.simulated_s, [], 2]]) {
        g.setLineDash(dash); g.lineWidth = width; g.beginPath(); let open = false;
        values.forEach((s, j) => { if (s > 0) { open ? g.lineTo(X(ws[j]), Y(s)) : g.moveTo(X(ws[j]), Y(s)); open = true; } else open = false; });
        g.stroke();
      }
      g.setLineDash([]);
      v.simulated_s.forEach((s, j) => { if (s > 0) marker(g, kind, X(ws[j]), Y(s), 3.5); });
    });
  }

  // D2L's figures beside their points, and the run animated above (on the curve of its own
  // codec: the chart's curves are computed with it).
  function marks(g, boxes, c, X, Y, w, h) {
    for (const m of c.book_marks || []) {
      const x = X(m.workers), y = Y(m.time_s), text = `D2L ${m.algorithm} ${fmtTime(m.time_s)}`;
      g.strokeStyle = "#f8fafc"; g.lineWidth = 1.5; g.beginPath(); g.rect(x - 5, y - 5, 10, 10); g.stroke();
      font(g, 11); g.fillStyle = "#f8fafc";
      const tw = g.measureText(text).width;
      [[x + 8, y - 6], [x - 8 - tw, y - 6], [x + 8, y + 14], [x - 8 - tw, y + 14], [x - tw / 2, y - 10], [x - tw / 2, y + 20]]
        .some(([a, b]) => put(g, boxes, text, a, b));
    }
    const d = S.data;
    stats.chartMark = null;
    if (!d || !S.chart.curves[d.algorithm]) return;
    const j = c.workers.indexOf(d.workers), s = j >= 0 ? S.chart.curves[d.algorithm].simulated_s[j] : null;
    if (!(s > 0)) return;
    g.strokeStyle = "#f8fafc"; g.lineWidth = 2; g.beginPath(); g.arc(X(d.workers), Y(s), 9, 0, 2 * Math.PI); g.stroke();
    font(g, 11, "bold"); g.fillStyle = "#f8fafc";
    const tw = g.measureText("animated").width;
    [[X(d.workers) + 12, Y(s) + 16], [X(d.workers) - 12 - tw, Y(s) + 16], [X(d.workers) + 12, Y(s) - 10], [X(d.workers) - 12 - tw, Y(s) - 10]]
      .some(([a, b]) => put(g, boxes, "animated", a, b));
    stats.chartMark = { algorithm: d.algorithm, workers: d.workers, time_s: s };
  }

  function legend(names) {
    const ul = $("chart-legend");
    ul.innerHTML = names.map((name, k) => {
      const [color, kind] = style(k), exact = S.chart.curves[name] ? S.chart.curves[name].exact !== false : true;
      return `<li data-name="${name}" class="${S.chart.hidden.has(name) ? "off" : ""}"><svg width="26" height="12"><line x1="0" y1="6" x2="26" y2="6" stroke="${color}" stroke-width="2"/>` +
        `<text x="8" y="10" fill="${color}" font-size="11">${GLYPH[kind]}</text></svg>${name}${exact ? "" : " (approximate)"}</li>`;
    }).join("");
    for (const li of ul.children) li.onclick = () => { const n = li.dataset.name; S.chart.hidden.has(n) ? S.chart.hidden.delete(n) : S.chart.hidden.add(n); draw(); };
  }

  return { load, draw, ticks };
})();
