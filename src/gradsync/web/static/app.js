// gradsync live view: draws the simulator's timeline of a real gradsync schedule.
// It re-implements no algorithm: transfers, their times, routes and the inputs each carries
// come from /api/simulate.
"use strict";

const COLORS = { 0: "#f59e0b", 1: "#38bdf8", 2: "#c084fc" };   // reduce, copy, coded
const $ = (id) => document.getElementById(id);
const view = $("view"), ctx = view.getContext("2d");
const stats = (window.gradsyncStats = { fps: 0, frames: 0, updateMs: null, requests: 0, drawnWorkers: 0 });

let data = null;          // the current simulation
let anim = null;          // animation state derived from it
let playing = true, speedExp = 0, simNow = 0, lastFrame = null;
let pendingSince = null, controller = null;
const PLAY_SECONDS = 8;   // the whole collective plays in this many seconds at speed 1

function fmtTime(s) {
  if (s >= 1) return s.toPrecision(3) + " s";
  if (s >= 1e-3) return (s * 1e3).toPrecision(3) + " ms";
  return (s * 1e6).toPrecision(3) + " us";
}
function fmtBytes(b) {
  for (const [u, k] of [["GB", 1e9], ["MB", 1e6], ["KB", 1e3]]) if (b >= k) return (b / k).toPrecision(4) + " " + u;
  return b + " B";
}

// ---- requests ------------------------------------------------------------------------------
function params() {
  const p = { algorithm: $("algorithm").value, topology: $("topology").value,
              workers: Number($("workers").value), size: $("size").value.trim() || "160MB" };
  for (const id of ["bandwidth", "latency", "eps"]) if (filled(id)) p[id] = $(id).value.trim();
  if (filled("components")) p.components = Number($("components").value);
  if (failure) p.fail = failure;
  return p;
}
function filled(id) { return $(id).value.trim() !== ""; }
let failure = null;

async function refresh() {
  pendingSince = performance.now();
  if (controller) controller.abort();
  controller = new AbortController();
  stats.requests++;
  try {
    const r = await fetch("/api/simulate", { method: "POST", headers: { "content-type": "application/json" },
                                            body: JSON.stringify(params()), signal: controller.signal });
    const fetched = performance.now();
    const body = await r.json();
    stats.fetchMs = fetched - pendingSince;
    stats.parseMs = performance.now() - fetched;
    if (!r.ok) { $("status").textContent = typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail); return; }
    $("status").textContent = "";
    const loading = performance.now();
    load(body);
    stats.loadMs = performance.now() - loading;
  } catch (e) {
    if (e.name !== "AbortError") $("status").textContent = String(e);
  }
}

// ---- preparing a simulation for drawing ----------------------------------------------------
function load(d) {
  data = d;
  const t = d.transfers, n = t.src.length;
  const byStart = [...Array(n).keys()].sort((a, b) => t.start[a] - t.start[b]);
  const byDone = [...Array(n).keys()].sort((a, b) => t.done[a] - t.done[b]);
  const cut = new Float64Array(n).fill(Infinity);       // when a transfer stops (failure)
  if (d.failure) {
    const stop = new Map(d.failure.stopped.map((s) => [s.node, s.at_s]));
    for (let i = 0; i < n; i++) if (!d.failure.completed[i])
      cut[i] = Math.min(stop.get(t.src[i]) ?? Infinity, stop.get(t.dst[i]) ?? Infinity);
  }
  const cells = d.cells, nodes = d.placement.length;
  const cellOf = (off) => { let lo = 0, hi = cells.length - 1; while (hi - lo > 1) { const m = (lo + hi) >> 1; if (cells[m] <= off) lo = m; else hi = m; } return lo; };
  const span = new Int32Array(2 * n);
  for (let i = 0; i < n; i++) { span[2 * i] = cellOf(t.offset[i]); span[2 * i + 1] = cellOf(t.offset[i] + t.count[i] - 1) + 1; }
  anim = { byStart, byDone, cut, span, nodes, startPtr: 0, donePtr: 0, active: new Set(), state: null };
  drawStatic();
  resetState();
  simNow = 0;
  renderNumbers();
  $("total-time").textContent = fmtTime(d.time_s);
  $("total-time").dataset.timeS = String(d.time_s);
  const opts = Object.entries(d.options || {}).filter(([, v]) => v !== null).map(([k, v]) => `${k}=${v}`).join(", ");
  $("summary").textContent = `${d.algorithm}${opts ? " (" + opts + ")" : ""} on ${d.topology.name}: ` +
    `${d.workers} workers, ${fmtBytes(d.bytes)}, ${d.rounds} rounds — ${d.topology.description}`;
  stats.drawnWorkers = d.workers;
  stats.loadedAt = performance.now();
  stats.timeS = d.time_s;
}

function resetState() {
  const k = data.cells.length - 1;
  anim.state = Array.from({ length: anim.nodes }, (_, node) => new Int32Array(k).fill(node < data.workers ? 1 : 0));
  anim.startPtr = 0; anim.donePtr = 0; anim.active = new Set();
}

// Apply every event up to time `now`: starts enter the active set, completions update buffers.
function advanceTo(now) {
  const t = data.transfers;
  if (now < simNow) resetState();
  while (anim.startPtr < anim.byStart.length && t.start[anim.byStart[anim.startPtr]] <= now) anim.active.add(anim.byStart[anim.startPtr++]);
  while (anim.donePtr < anim.byDone.length && t.done[anim.byDone[anim.donePtr]] <= now) {
    const i = anim.byDone[anim.donePtr++];
    anim.active.delete(i);
    if (anim.cut[i] < Infinity) continue;
    const buf = anim.state[t.dst[i]], carried = t.carried[i];
    for (let c = anim.span[2 * i]; c < anim.span[2 * i + 1]; c++) {
      if (carried < 0) continue;                       // coded packets: decoded at the end
      buf[c] = t.op[i] === 0 ? buf[c] + carried : carried;
    }
  }
  // coded packets carry no input count (-1); the codec (error !== null) decodes the sum at the end
  if (data.error !== null && now >= data.time_s && !data.failure)
    for (let w = 0; w < data.workers; w++) anim.state[w].fill(data.workers);
  simNow = now;
}

// ---- drawing -------------------------------------------------------------------------------
let staticLayer = document.createElement("canvas");
const W = view.width, H = view.height, PAD = 60;
const px = (node) => PAD + node.x * (W - 2 * PAD), py = (node) => PAD + node.y * (H - 2 * PAD);

function drawStatic() {
  staticLayer.width = W; staticLayer.height = H;
  const g = staticLayer.getContext("2d"), nodes = data.topology.nodes;
  const maxBw = Math.max(...data.topology.links.map((l) => l.bandwidth));
  g.font = "11px sans-serif";
  for (const l of data.topology.links) {
    const a = nodes[l.a], b = nodes[l.b];
    g.strokeStyle = "#334155"; g.lineWidth = 1 + 4 * l.bandwidth / maxBw;
    g.beginPath(); g.moveTo(px(a), py(a)); g.lineTo(px(b), py(b)); g.stroke();
    if (data.topology.links.length <= 40) {
      g.fillStyle = "#64748b";
      g.fillText(fmtBytes(l.bandwidth) + "/s", (px(a) + px(b)) / 2 + 3, (py(a) + py(b)) / 2 - 3);
    }
  }
  for (const nd of nodes) {
    g.fillStyle = nd.kind === "gpu" || nd.kind === "host" ? "#1d4ed8" : nd.kind === "cpu" ? "#15803d" : "#475569";
    g.beginPath(); g.arc(px(nd), py(nd), nd.kind === "switch" || nd.kind === "nic" ? 7 : 11, 0, 2 * Math.PI); g.fill();
    if (nodes.length <= 40 || nd.kind !== "gpu") { g.fillStyle = "#cbd5e1"; g.fillText(nd.name, px(nd) + 13, py(nd) - 13); }
  }
}

function pointOnPath(path, f) {
  const nodes = data.topology.nodes, legs = path.length - 1;
  const x = Math.min(f * legs, legs - 1e-9), k = Math.floor(x), r = x - k;
  const a = nodes[path[k]], b = nodes[path[k + 1]];
  return [px(a) + (px(b) - px(a)) * r, py(a) + (py(b) - py(a)) * r];
}

function drawBuffers() {
  const k = data.cells.length - 1, nodes = data.topology.nodes, n = data.workers, cellW = Math.max(1, 36 / k);
  for (let s = 0; s < anim.nodes; s++) {
    const nd = nodes[data.placement[s]], x0 = px(nd) - 18, y0 = py(nd) + 13, buf = anim.state[s];
    for (let c = 0; c < k; c++) {
      const f = Math.min(1, buf[c] / n);
      ctx.fillStyle = f >= 1 ? "#22c55e" : `rgba(148,163,184,${0.15 + 0.7 * f})`;
      ctx.fillRect(x0 + c * cellW, y0, Math.max(cellW - 0.3, 0.7), 6);
    }
  }
}

function drawFailure() {
  if (!data.failure) return;
  const nodes = data.topology.nodes;
  ctx.font = "bold 11px sans-serif";
  for (const s of data.failure.stopped) {
    if (s.at_s > simNow) continue;
    const nd = nodes[data.placement[s.node]];
    ctx.fillStyle = "#ef4444";
    if (s.node === data.failure.device) {
      ctx.strokeStyle = "#ef4444"; ctx.lineWidth = 3; ctx.beginPath();
      ctx.moveTo(px(nd) - 12, py(nd) - 12); ctx.lineTo(px(nd) + 12, py(nd) + 12);
      ctx.moveTo(px(nd) + 12, py(nd) - 12); ctx.lineTo(px(nd) - 12, py(nd) + 12); ctx.stroke();
      ctx.fillText("failed", px(nd) + 13, py(nd) + 4);
    } else if (data.workers <= 16) {
      ctx.fillText("PeerError", px(nd) + 13, py(nd) + 4);
    } else {
      ctx.beginPath(); ctx.arc(px(nd), py(nd), 4, 0, 2 * Math.PI); ctx.fill();
    }
  }
}

function frame(ts) {
  if (lastFrame !== null) {
    const dt = ts - lastFrame;
    stats.fps = stats.fps ? 0.9 * stats.fps + 0.1 * (1000 / Math.max(dt, 1)) : 1000 / Math.max(dt, 1);
    if (data && playing) {
      const rate = data.time_s / (PLAY_SECONDS * 1000) * Math.pow(10, speedExp);
      let next = simNow + dt * rate;
      if (next > data.time_s * 1.08) next = 0;           // loop, with a short pause at the end
      advanceTo(next);
    }
  }
  lastFrame = ts;
  stats.frames++;
  if (data) {
    ctx.clearRect(0, 0, W, H);
    ctx.drawImage(staticLayer, 0, 0);
    const t = data.transfers;
    for (const i of anim.active) {
      const end = Math.min(t.done[i], anim.cut[i]);
      if (simNow > end) continue;
      const f = Math.max(0, Math.min(1, (simNow - t.start[i]) / Math.max(t.done[i] - t.start[i], 1e-15)));
      const [x, y] = pointOnPath(t.path[i], f);
      ctx.fillStyle = anim.cut[i] < Infinity && simNow >= anim.cut[i] ? "#ef4444" : COLORS[t.op[i]];
      ctx.beginPath(); ctx.arc(x, y, 4, 0, 2 * Math.PI); ctx.fill();
    }
    for (const i of anim.active) if (anim.cut[i] < Infinity && simNow >= anim.cut[i]) {
      const [x, y] = pointOnPath(t.path[i], Math.min(1, (anim.cut[i] - t.start[i]) / Math.max(t.done[i] - t.start[i], 1e-15)));
      ctx.fillStyle = "#ef4444"; ctx.beginPath(); ctx.arc(x, y, 4, 0, 2 * Math.PI); ctx.fill();
    }
    drawBuffers();
    drawFailure();
    $("now").textContent = fmtTime(Math.min(simNow, data.time_s));
    if (pendingSince !== null && stats.loadedAt >= pendingSince) {
      stats.updateMs = performance.now() - pendingSince;
      pendingSince = null;
    }
  }
  requestAnimationFrame(frame);
}

function renderNumbers() {
  const d = data, busiest = d.topology.links.reduce((a, l) => (l.bytes > a.bytes ? l : a), { bytes: 0 });
  const nodes = d.topology.nodes;
  const rows = [["simulated time", fmtTime(d.time_s)], ["bus bandwidth", d.busbw_GBps.toPrecision(3) + " GB/s"],
    ["rounds", d.rounds], ["transfers", d.transfers.src.length],
    ["busiest link", busiest.bytes ? `${nodes[busiest.a].name}–${nodes[busiest.b].name}: ${fmtBytes(busiest.bytes)}` : "-"]];
  if (d.error !== null) rows.push(["CERAR predicted error", d.error.toPrecision(3)]);
  if (d.failure) rows.push(["failure", `rank ${d.failure.device} at ${fmtTime(d.failure.at_s)}; ` +
    `${d.failure.stopped.length - 1} peers report it`]);
  $("numbers").innerHTML = rows.map(([k, v]) => `<dt>${k}</dt><dd>${v}</dd>`).join("");
}

// ---- comparison chart ----------------------------------------------------------------------
async function drawChart() {
  const r = await fetch("/api/compare?size=" + encodeURIComponent($("size").value.trim() || "160MB"));
  if (!r.ok) return;
  const c = await r.json(), cv = $("chart"), g = cv.getContext("2d");
  const L = 70, R = 160, T = 20, B = 40, w = cv.width - L - R, h = cv.height - T - B;
  const all = Object.values(c.curves).flatMap((v) => v.simulated_s.concat(v.closed_form_s)).filter((x) => x > 0);
  const lo = Math.log10(Math.min(...all)), hi = Math.log10(Math.max(...all));
  const X = (n) => L + (Math.log2(n) - 1) / (Math.log2(64) - 1) * w, Y = (s) => T + h - (Math.log10(s) - lo) / (hi - lo) * h;
  g.clearRect(0, 0, cv.width, cv.height); g.font = "11px sans-serif"; g.fillStyle = "#94a3b8"; g.strokeStyle = "#334155";
  for (const n of c.workers) { g.fillText(n, X(n) - 5, T + h + 15); }
  for (let e = Math.ceil(lo); e <= hi; e++) { g.fillText(fmtTime(10 ** e), 5, Y(10 ** e) + 4); g.beginPath(); g.moveTo(L, Y(10 ** e)); g.lineTo(L + w, Y(10 ** e)); g.stroke(); }
  g.fillText("workers", L + w / 2, cv.height - 5);
  const palette = ["#f59e0b", "#22c55e", "#38bdf8", "#f472b6", "#a78bfa", "#facc15"];
  Object.entries(c.curves).forEach(([name, v], k) => {
    g.strokeStyle = palette[k % palette.length];
    for (const [series, dash] of [[v.simulated_s, []], [v.closed_form_s, [5, 4]]]) {
      g.setLineDash(dash); g.beginPath();
      series.forEach((s, j) => { if (s > 0) (j ? g.lineTo(X(c.workers[j]), Y(s)) : g.moveTo(X(c.workers[j]), Y(s))); });
      g.stroke();
    }
    g.setLineDash([]); g.fillStyle = g.strokeStyle; g.fillText(name, L + w + 10, T + 15 + 16 * k);
  });
  g.fillStyle = "#f8fafc";
  for (const m of c.seed_marks) {
    const x = X(m.workers), y = Y(m.time_s);
    g.beginPath(); g.moveTo(x, y - 6); g.lineTo(x + 6, y); g.lineTo(x, y + 6); g.lineTo(x - 6, y); g.fill();
    g.fillText(`seed: ${m.algorithm} ${fmtTime(m.time_s)}`, x + 8, y - 6);
  }
  window.gradsyncStats.chart = c;
}

// ---- controls ------------------------------------------------------------------------------
async function init() {
  const presets = await (await fetch("/api/presets")).json();
  $("algorithm").innerHTML = presets.algorithms.map((a) => `<option>${a}</option>`).join("");
  $("topology").innerHTML = presets.topologies.map((a) => `<option>${a}</option>`).join("");
  $("algorithm").value = "ring";
  for (const id of ["algorithm", "topology", "workers", "size", "bandwidth", "latency", "components", "eps"])
    $(id).addEventListener("change", () => { if (id === "size") drawChart(); refresh(); });
  $("play").onclick = () => { playing = !playing; $("play").textContent = playing ? "pause" : "play"; };
  $("restart").onclick = () => advanceTo(0);
  $("step").onclick = () => {                          // to the next start or completion, then pause
    playing = false; $("play").textContent = "play";
    const t = data.transfers, times = [];
    if (anim.startPtr < anim.byStart.length) times.push(t.start[anim.byStart[anim.startPtr]]);
    if (anim.donePtr < anim.byDone.length) times.push(t.done[anim.byDone[anim.donePtr]]);
    advanceTo(times.length ? Math.max(simNow, Math.min(...times)) : data.time_s);
  };
  $("speed").oninput = (e) => { speedExp = Number(e.target.value); };
  $("fail").onclick = () => { failure = { device: Number($("fail-device").value), at: Number($("fail-at").value) }; refresh(); };
  $("heal").onclick = () => { failure = null; refresh(); };
  requestAnimationFrame(frame);
  await refresh();
  drawChart();
}
init();
