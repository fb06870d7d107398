// Two algorithms side by side: the one animated and a second on the same topology, links, size
// and codec, each a strip of its rounds on one clock (the cursor moves on both), with their
// numbers in one table: time, rounds, what the busiest worker sends, the formula's terms.
"use strict";

const Compare = (() => {
  let seq = 0;

  async function load() {
    const name = $("beside").value, mine = ++seq;
    S.compare = null;
    $("compare-box").hidden = !name;
    if (!name) return;
    $("compare-table").innerHTML = "<tr><td>computing…</td></tr>";
    const p = { ...Controls.params(), algorithm: name };
    delete p.fail;
    const r = await Source.simulate(p, undefined, () => mine !== seq);
    if (mine !== seq) return;
    if (!r.ok) { $("compare-table").innerHTML = `<tr><td>${r.body.detail || "not available"}</td></tr>`; return; }
    S.compare = r.body;
    stats.compare = { algorithm: name, time_s: r.body.time_s };
    table(); draw();
  }

  function facts(d) {
    const sent = new Float64Array(d.placement.length);
    d.transfers.src.forEach((s, i) => { sent[s] += d.transfers.count[i]; });
    const item = d.compression ? d.compression.itemsize : 4, c = d.closed_form && d.closed_form.terms;
    return [d.algorithm, fmtTime(d.time_s), String(d.rounds), String(d.transfers.src.length), fmtBytes(Math.max(...sent) * item),
            c ? fmtTime(c.latency) : "-", c ? fmtTime(c.bandwidth) : "-"];
  }

  function table() {
    if (!S.compare || !S.data) return;
    const head = ["", "time", "rounds", "transfers", "busiest worker sends", "latency term", "bandwidth term"];
    const rows = [facts(S.data), facts(S.compare)], faster = S.data.time_s <= S.compare.time_s ? 0 : 1;
    $("compare-table").innerHTML = `<tr>${head.map((h) => `<th>${h}</th>`).join("")}</tr>` +
      rows.map((r, j) => `<tr class="${j === faster ? "good" : ""}">${r.map((x) => `<td>${x}</td>`).join("")}</tr>`).join("");
    const ratio = Math.max(S.data.time_s, S.compare.time_s) / Math.max(Math.min(S.data.time_s, S.compare.time_s), 1e-300);
    $("compare-note").textContent = `${rows[faster][0]} is ${ratio.toFixed(2)}× faster here; the strips share one clock.`;
  }

  // Each algorithm's rounds as blocks on one time axis (the slower one's length), drawn once
  // per answer into a layer; every frame the layer and a cursor at now.
  const layer = document.createElement("canvas");
  let scale = null;
  function draw() {
    if (!S.compare || !S.data || $("compare-box").hidden) return;
    const view = (scale = fit($("compare-view"), 64)), end = Math.max(S.data.time_s, S.compare.time_s), L = 92;
    layer.width = $("compare-view").width; layer.height = $("compare-view").height;
    const g = layer.getContext("2d");
    g.setTransform(view.dpr, 0, 0, view.dpr, 0, 0);
    scale.X = (s) => L + (s / Math.max(end, 1e-300)) * (view.w - L - 8);
    [S.data, S.compare].forEach((d, row) => {
      const t = d.transfers, starts = new Map(), dones = new Map(), ops = new Map();
      t.round.forEach((r, i) => { starts.set(r, Math.min(starts.get(r) ?? Infinity, t.start[i])); dones.set(r, Math.max(dones.get(r) ?? 0, t.done[i])); ops.set(r, t.op[i]); });
      const y = 8 + row * 26;
      font(g, 11); g.fillStyle = COLOR.text; g.fillText(`${d.algorithm} ${fmtTime(d.time_s)}`, 4, y + 13, L - 8);
      for (const [r, a] of starts) {
        g.fillStyle = ops.get(r) === REDUCE ? `hsl(${(r * 47) % 360}, 60%, 45%)` : ops.get(r) === CODED ? COLOR.coded : `hsl(${(r * 47) % 360}, 60%, 62%)`;
        g.fillRect(scale.X(a), y, Math.max(scale.X(dones.get(r)) - scale.X(a) - 0.5, 0.8), 18);
      }
    });
  }
  function cursor() {
    if (!S.compare || !scale || $("compare-box").hidden) return;
    const g = scale.g, x = scale.X(Math.min(S.now, S.data.time_s));
    g.clearRect(0, 0, scale.w, scale.h);
    g.drawImage(layer, 0, 0, scale.w, scale.h);
    g.fillStyle = "#f8fafc"; g.fillRect(x - 1, 4, 2, scale.h - 8);
  }

  return { load, draw, table, cursor };
})();
