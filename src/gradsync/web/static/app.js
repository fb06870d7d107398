// gradsync live view: draws the simulator's timeline of a real gradsync schedule.
// It re-implements no algorithm: transfers, their times, routes, the inputs each carries and
// the sentence for each round come from /api/simulate, or in a static export from the
// exported schedules timed in the page (site.js, model.js: the same answer, checked).
"use strict";

const $ = (id) => document.getElementById(id);
const REDUCE = 0, COPY = 1, CODED = 2;
const CODED_COLOR = "#c084fc", FAIL_COLOR = "#ef4444", DONE_RING = "#f8fafc", WAIT_COLOR = "#fbbf24";
const MIN_FONT = 11;                       // CSS px: no text smaller than this, on any canvas
const ROUND_SECONDS = 0.6;                 // at speed 1 a round plays in about this long...
const PLAY_LIMITS = [6, 40];               // ...within these seconds for the whole collective
const stats = (window.gradsyncStats = { fps: 0, frames: 0, updateMs: null, requests: 0, drawnWorkers: 0,
                                         minFont: Infinity, chartRequests: 0, chartApplied: 0 });

let data = null;          // the current simulation
let anim = null;          // animation state derived from it
let playing = true, speedExp = 0, simNow = 0, lastFrame = null;
let pendingSince = null, simController = null, simSeq = 0;
let failure = null, hover = null, hidePackets = false;
let fixedWorkers = {};

// ---- formatting --------------------------------------------------------------------------------
function fmtTime(s) {
  if (s === null || s === undefined) return "-";
  if (s >= 1) return s.toPrecision(3) + " s";
  if (s >= 1e-3) return (s * 1e3).toPrecision(3) + " ms";
  return (s * 1e6).toPrecision(3) + " µs";
}
function fmtBytes(b) {
  for (const [u, k] of [["TB", 1e12], ["GB", 1e9], ["MB", 1e6], ["KB", 1e3]]) if (b >= k) return (b / k).toPrecision(3) + " " + u;
  return b + " B";
}
function font(g, px, weight = "") { px = Math.max(MIN_FONT, px); stats.minFont = Math.min(stats.minFont, px); g.font = `${weight} ${px}px system-ui, sans-serif`; }
const chunkHue = (c, k) => (360 * c) / Math.max(k, 1);
const chunkColor = (c, k, light = 55) => `hsl(${chunkHue(c, k)}, 85%, ${light}%)`;

// ---- canvases: sized to their box, sharp on high-DPI screens -------------------------------------
function fit(canvas, height) {
  const dpr = window.devicePixelRatio || 1, w = canvas.clientWidth || 300;
  const h = height ?? canvas.clientHeight ?? w;
  if (height !== undefined) canvas.style.height = h + "px";
  canvas.width = Math.round(w * dpr); canvas.height = Math.round(h * dpr);
  const g = canvas.getContext("2d");
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  return { g, w, h, dpr };
}

// ---- requests ----------------------------------------------------------------------------------
// A static export (gradsync serve --export) has no server: its data are scripts that call
// window.gradsyncData(key, value), loaded on demand (they also load from file:// URLs).
const STATIC = window.GRADSYNC_STATIC === true;
const exported = {};
window.gradsyncData = (key, value) => { exported[key] = value; };
function staticData(key) {
  return new Promise((ok, fail) => {
    if (key in exported) return ok(exported[key]);
    const script = document.createElement("script");
    script.src = `data/${key}.js`;
    script.onload = () => (key in exported ? ok(exported[key]) : fail(new Error(`no data for ${key}`)));
    script.onerror = () => fail(new Error(`this export has no ${key.replace(/-/g, " ")}: run gradsync serve for it`));
    document.head.appendChild(script);
  });
}

// The export's model: data/model.js at start, each algorithm's schedules when first chosen.
window.gradsyncSchedules = {};
async function schedulesFor(names) {
  for (const name of names) if (!(name in window.gradsyncSchedules)) window.gradsyncSchedules[name] = await staticData(`schedules-${name}`);
}
window.gradsyncLoadAll = () => schedulesFor(window.gradsyncCore.algorithms);

// An error is shown under the field that caused it (the whole message; the old drawing is
// dimmed so it is not taken for the answer).
const FIELD_OF = [[/^(bad size|size)/, "size"], [/^(bad bandwidth|bandwidth)/, "bandwidth"], [/^(bad duration|latency)/, "latency"],
  [/^fail\.(detection|check_every_s|timeout_s)/, "fail-how"], [/^fail\.device|^fail/, "fail-device"], [/^(workers|this export offers|topology .* has)/, "workers"], [/^components/, "components"],
  [/^eps/, "eps"], [/^(compression|unknown codec)/, "compression"], [/^(algorithm|unknown algorithm)/, "algorithm"]];
function fieldOf(message) { for (const [re, id] of FIELD_OF) if (re.test(message)) return id; return null; }
function showError(field, message) {
  for (const el of document.querySelectorAll(".field-error")) el.remove();
  for (const el of document.querySelectorAll("[aria-invalid]")) el.removeAttribute("aria-invalid");
  $("stage").classList.toggle("stale", !!message);
  stats.error = message ? { field, message } : null;
  if (!message) return;
  const input = field && $(field), p = document.createElement("p");
  p.className = "field-error"; p.setAttribute("role", "alert"); p.textContent = message;
  if (input) { input.setAttribute("aria-invalid", "true"); (input.closest("label") || input).after(p); }
  else $("panel").prepend(p);
}

function filled(id) { return $(id).value.trim() !== ""; }
function params() {
  const p = { algorithm: $("algorithm").value, topology: $("topology").value,
              workers: Number($("workers").value), size: $("size").value.trim() || "160MB" };
  for (const id of ["bandwidth", "latency"]) if (filled(id)) p[id] = $(id).value.trim();
  if (filled("eps")) p.eps = Number($("eps").value);
  if (filled("components")) p.components = Number($("components").value);
  if ($("compression").value) p.compression = $("compression").value;
  if (failure) p.fail = failure;
  return p;
}

async function refresh() {
  const seq = ++simSeq;
  pendingSince = performance.now();
  if (simController) simController.abort();
  simController = new AbortController();
  stats.requests++;
  stats.pending = true;
  $("status").textContent = "simulating…";
  try {
    if (STATIC) {                                                // the page is its own server
      await schedulesFor([$("algorithm").value]);
      if (seq !== simSeq) return;
      let body;
      try { body = gradsyncSite.simulation(window.gradsyncCore, window.gradsyncSchedules, params()); }
      catch (e) { stats.pending = false; $("status").textContent = ""; showError(e.field || fieldOf(e.message), e.message); pendingSince = null; return; }
      stats.pending = false; $("status").textContent = ""; showError(null);
      const keep = data && data.time_s > 0 ? Math.min(simNow / data.time_s, 1) : 0;
      load(body); advanceTo(keep * body.time_s);
      stats.timing = { fetch: 0, parse: 0, load: performance.now() - pendingSince };
      return;
    }
    const r = await fetch("api/simulate", { method: "POST", headers: { "content-type": "application/json" },
                                           body: JSON.stringify(params()), signal: simController.signal });
    const fetched = performance.now();
    const body = await r.json();
    if (seq !== simSeq) return;                                   // a newer request owns the view
    const parsed = performance.now();
    stats.pending = false;
    if (r.status === 202) {                                       // still computing: ask again shortly
      $("status").textContent = "computing… " + body.detail;
      setTimeout(() => { if (seq === simSeq) refresh(); }, 1000 * Number(r.headers.get("retry-after") || 1));
      return;
    }
    if (!r.ok) { const m = typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail);
                 $("status").textContent = ""; showError(fieldOf(m), m); pendingSince = null; return; }
    $("status").textContent = ""; showError(null);
    const keep = data && data.time_s > 0 ? Math.min(simNow / data.time_s, 1) : 0;
    load(body);
    advanceTo(keep * body.time_s);                                // a change keeps the position
    stats.timing = { fetch: fetched - pendingSince, parse: parsed - fetched, load: performance.now() - parsed };
  } catch (e) {
    if (e.name !== "AbortError" && seq === simSeq) { $("status").textContent = String(e); stats.pending = false; }
  }
}

// ---- preparing a simulation for drawing --------------------------------------------------------
function load(d) {
  data = d;
  const t = d.transfers, n = t.src.length, k = d.cells.length - 1;
  t.path = t.route.map((r) => d.routes[r]);             // routes come once each; transfers point to them
  const byStart = [...Array(n).keys()].sort((a, b) => t.start[a] - t.start[b]);
  const byDone = [...Array(n).keys()].sort((a, b) => t.done[a] - t.done[b]);
  const cut = new Float64Array(n).fill(Infinity);       // when a transfer stops (failure)
  if (d.failure) {
    // a transfer that cannot complete moves until one of its ends stops; one in a round that an
    // end never reaches (its rounds are sequential) never starts
    const stop = new Map(d.failure.stopped.map((s) => [s.node, s.at_s])), stuck = new Map();
    for (let i = 0; i < n; i++) if (!d.failure.completed[i])
      for (const x of [t.src[i], t.dst[i]]) if (x !== d.failure.device) stuck.set(x, Math.min(stuck.get(x) ?? Infinity, t.round[i]));
    for (let i = 0; i < n; i++) if (!d.failure.completed[i]) {
      const never = t.round[i] > (stuck.get(t.src[i]) ?? Infinity) || t.round[i] > (stuck.get(t.dst[i]) ?? Infinity);
      cut[i] = never ? t.start[i] : Math.min(stop.get(t.src[i]) ?? Infinity, stop.get(t.dst[i]) ?? Infinity);
    }
  }
  const cells = d.cells;
  const cellOf = (off) => { let lo = 0, hi = cells.length - 1; while (hi - lo > 1) { const m = (lo + hi) >> 1; if (cells[m] <= off) lo = m; else hi = m; } return lo; };
  const span = new Int32Array(2 * n);
  for (let i = 0; i < n; i++) {
    if (t.op[i] === CODED) { span[2 * i] = 0; span[2 * i + 1] = k; continue; }   // a mixture of every chunk
    span[2 * i] = cellOf(t.offset[i]); span[2 * i + 1] = Math.max(cellOf(t.offset[i] + t.count[i] - 1) + 1, span[2 * i] + 1);
  }
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
  anim = { byStart, byDone, cut, span, nodes: d.placement.length, k, roundIndex, roundStart, roundDone, never,
           codedPerWorker, startPtr: 0, donePtr: 0, active: new Set(), state: null, coded: null, current: -1, end, split };
  anim.followSets = new Map();
  if (follow !== null && (follow >= anim.k || d.estimate)) follow = null;
  if (follow !== null) anim.followSets = followSets(follow);
  resetState();
  simNow = 0;
  layoutView();
  drawTimeline();
  renderPanels();
  $("total-time").textContent = fmtTime(d.time_s);
  $("total-time").dataset.timeS = String(d.time_s);
  const opts = Object.entries(d.options || {}).filter(([, v]) => v !== null).map(([key, v]) => `${key}=${v}`).join(", ");
  $("summary").textContent = `${d.algorithm}${opts ? " (" + opts + ")" : ""} on ${d.topology.name}: ` +
    `${d.workers} workers, ${fmtBytes(d.bytes)}, ${d.rounds} rounds — ${describeLinks(d)}`;
  stats.drawnWorkers = d.workers;
  stats.loadedAt = performance.now();
  stats.timeS = d.time_s;
  stats.failure = d.failure ? { device: d.failure.device, at_s: d.failure.at_s, detection: d.failure.detection,
                                 first_s: firstNotice(d.failure).at_s, last_s: lastStop, end_s: end } : null;
  speedLabel();
  markChart();
}

// The topology's description with the links in force: a bandwidth or latency set in the
// fields replaces the preset's figures (every link then has it).
function describeLinks(d) {
  const set = [];
  if (filled("bandwidth")) set.push(`every link ${fmtBytes(d.topology.links[0].bandwidth)}/s`);
  if (filled("latency")) set.push(`${fmtTime(d.topology.links[0].latency)} latency per link`);
  if (!set.length) return d.topology.description;
  const plain = d.topology.description.replace(/\s*\(?[0-9.]+\s?[kMGT]?B\/s( links| per link)?\)?/g, "").replace(/\s*\(\)/g, "");
  return `${plain}; ${set.join(", ")} (set)`;
}

function resetState() {
  anim.state = Array.from({ length: anim.nodes }, (_, node) => new Int32Array(anim.k).fill(node < data.workers ? 1 : 0));
  anim.coded = new Int32Array(anim.nodes);
  anim.sets = follow === null ? null : Array.from({ length: anim.nodes }, (_, node) => (node < data.workers ? [node] : []));
  anim.startPtr = 0; anim.donePtr = 0; anim.active = new Set(); anim.stopped = new Set();
}

// The timeline's position (0-1, beyond 1 past the end) of time `s`, and back: the collective on
// the first `split` of it, the failure's detection after it (a broken axis when much later).
function toFrac(s) {
  const a = anim.split, T0 = data.time_s, E = anim.end;
  if (s > E) return 1 + (s - E) / Math.max(E, 1e-300);
  if (s <= T0 || E <= T0) return a * s / Math.max(T0, 1e-300);
  return a + (1 - a) * (s - T0) / (E - T0);
}
function fromFrac(f) {
  const a = anim.split, T0 = data.time_s, E = anim.end;
  if (f > 1) return E + (f - 1) * E;
  if (f <= a || E <= T0) return (f / a) * T0;
  return T0 + (f - a) / (1 - a) * (E - T0);
}

// Apply every event up to time `now`: starts enter the active set, completions update buffers.
function advanceTo(now) {
  if (!data) return;
  const t = data.transfers;
  now = Math.max(0, now);
  if (now < simNow) resetState();
  while (anim.startPtr < anim.byStart.length && t.start[anim.byStart[anim.startPtr]] <= now) anim.active.add(anim.byStart[anim.startPtr++]);
  while (anim.donePtr < anim.byDone.length && t.done[anim.byDone[anim.donePtr]] <= now) {
    const i = anim.byDone[anim.donePtr++];
    anim.active.delete(i);
    if (anim.cut[i] < Infinity) { if (anim.cut[i] > t.start[i]) anim.stopped.add(i); continue; }   // a failure cut it: it stays where it stopped
    if (t.op[i] === CODED) { anim.coded[t.dst[i]]++; continue; }
    const buf = anim.state[t.dst[i]], carried = t.carried[i];
    for (let c = anim.span[2 * i]; c < anim.span[2 * i + 1]; c++) buf[c] = t.op[i] === REDUCE ? buf[c] + carried : carried;
    if (anim.sets && anim.followSets.has(i)) {
      const got = anim.followSets.get(i);
      anim.sets[t.dst[i]] = t.op[i] === REDUCE ? [...new Set([...anim.sets[t.dst[i]], ...got])].sort((a, b) => a - b) : got;
    }
  }
  simNow = now;
}

// ---- following one chunk -----------------------------------------------------------------------
// Clicking a buffer cell follows that chunk: the others are dimmed and each buffer's partial sum
// of it is written out (a0 + a2 + a3: worker i's input is a_i). Which inputs a packet carries is
// what its sender held when its round began, as schedule.carried_inputs counts them (a test
// checks the sizes against its counts).
let follow = null;
function followSets(c) {
  const t = data.transfers, held = Array.from({ length: anim.nodes }, (_, n) => (n < data.workers ? [n] : []));
  const carried = new Map(), order = [...t.src.keys()].filter((i) => t.op[i] !== CODED && anim.span[2 * i] <= c && c < anim.span[2 * i + 1])
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
  follow = c === null || data.estimate || c >= anim.k ? null : c;
  anim.followSets = follow === null ? new Map() : followSets(follow);
  const now = simNow; resetState(); simNow = 0; advanceTo(now);
  stats.follow = follow;
  updateFollow();
}
function partialSum(set) { return set.length ? set.map((w) => `a${w}`).join(" + ") : "nothing yet"; }
function updateFollow() {
  const box = $("follow");
  if (follow === null || !anim.sets) { box.textContent = data && !data.estimate ? "Click a buffer's cell to follow that chunk." : ""; return; }
  const n = data.workers, parts = [];
  for (let s = 0; s < Math.min(anim.nodes, 8); s++) {
    const set = anim.sets[s], name = data.topology.nodes[data.placement[s]].name;
    parts.push(`${name}: ${set.length === n ? `a0 + … + a${n - 1} (all ${n})` : set.length > 6 ? `${set.length} of ${n} inputs` : partialSum(set)}`);
  }
  box.textContent = `Chunk ${follow} (click it again to stop) — ` + parts.join("; ") + (anim.nodes > 8 ? "; …" : "");
}

// Per cell, the fraction of the N inputs it holds (coded: packets received of those due; the
// decode at the end gives every cell the estimate of the full sum).
function cellFill(node, c) {
  if (data.estimate) {
    if (data.failure) return Math.min(1, anim.coded[node] / Math.max(anim.codedPerWorker[node], 1)) * 0.999;
    return simNow >= data.time_s ? 1 : Math.min(1, anim.coded[node] / Math.max(anim.codedPerWorker[node], 1)) * 0.999;
  }
  return Math.min(1, anim.state[node][c] / data.workers);
}

// ---- the topology drawing ----------------------------------------------------------------------
const view = $("view");
let V = null;                       // { g, w, h } of the view canvas
let staticLayer = document.createElement("canvas");
let geom = null;                    // per node: x, y, radius; per link: control point

function layoutView() {
  V = fit(view, undefined);
  const { w, h } = V, nodes = data.topology.nodes;
  // one scale for x and y (a ring stays a circle), centred in the canvas
  const side = Math.min(w, h), pad = Math.max(34, side * 0.07), ox = (w - side) / 2, oy = (h - side) / 2;
  const x = (nd) => ox + pad + nd.x * (side - 2 * pad), y = (nd) => oy + pad + nd.y * (side - 2 * pad);
  const links = new Map();
  for (const l of data.topology.links) {
    const a = nodes[l.a], b = nodes[l.b], ax = x(a), ay = y(a), bx = x(b), by = y(b);
    const len = Math.hypot(bx - ax, by - ay) || 1, bend = l.bend || 0;
    const cx = (ax + bx) / 2 + (-(by - ay) / len) * bend * len, cy = (ay + by) / 2 + ((bx - ax) / len) * bend * len;
    links.set(l.a + "," + l.b, { cx, cy }); links.set(l.b + "," + l.a, { cx, cy });
  }
  const X = nodes.map(x), Y = nodes.map(y);
  let near = Infinity;                               // the closest two nodes set the nodes' size
  for (let i = 0; i < nodes.length; i++) for (let j = 0; j < i; j++) near = Math.min(near, Math.hypot(X[i] - X[j], Y[i] - Y[j]));
  const r = Math.max(2, Math.min(11, 0.28 * near, near / 2 - 3.2));   // node and progress ring clear of the next
  geom = { x: X, y: Y, r: nodes.map((nd) => (nd.kind === "switch" || nd.kind === "nic" ? Math.min(7, r) : r)), links };
  geom.packet = Math.max(3, Math.min(5.5, 0.5 * r));
  placeLabels();
  drawStatic();
}

// ---- where labels and buffers go: nothing drawn over anything else ------------------------------
// Node marks are placed first; then the buffer strips, as large as fit (cells scale with the
// canvas; where none fit, each worker gets a progress ring instead); then names, link labels
// and the busiest-link note, each only where it overlaps nothing placed before it.
const overlaps = (a, b) => a.x0 < b.x1 && b.x0 < a.x1 && a.y0 < b.y1 && b.y0 < a.y1;
const CELL_WIDTHS = [30, 26, 22, 19, 16, 14, 12, 10, 8, 6, 5, 4, 3];
function placeLabels() {
  const nodes = data.topology.nodes, k = anim.k, g = V.g, boxes = [];
  const inside = (b) => b.x0 >= 0 && b.y0 >= 0 && b.x1 <= V.w && b.y1 <= V.h;
  const free = (b) => inside(b) && !boxes.some((o) => overlaps(o, b));   // boxes of nodes are never tested against each other
  const ring = (i) => geom.r[i] + 3;                  // the node and its progress ring (a circle; its box for the rest)
  nodes.forEach((_, i) => boxes.push({ kind: "node", owner: i, cx: geom.x[i], cy: geom.y[i], radius: ring(i),
    x0: geom.x[i] - ring(i), y0: geom.y[i] - ring(i), x1: geom.x[i] + ring(i), y1: geom.y[i] + ring(i) }));
  geom.equallyBusy = equallyBusy(data.topology.links.map((l) => (data.time_s > 0 ? l.busy_s / data.time_s : 0)));
  if (geom.equallyBusy) boxes.push({ kind: "note", x0: 6, y0: 4, x1: 6 + 330, y1: 20 });
  geom.cell = null;
  const workers = Array.from({ length: anim.nodes }, (_, s) => data.placement[s]);
  for (const w of CELL_WIDTHS) {
    const h = Math.max(10, Math.min(26, Math.round(w * 0.9))), numbers = k <= 8 && w >= 12;
    const strips = workers.map((nd, s) => ({ kind: "buffer", owner: s, x0: geom.x[nd] - (w * k) / 2, y0: geom.y[nd] + geom.r[nd] + 4,
      x1: geom.x[nd] + (w * k) / 2, y1: geom.y[nd] + geom.r[nd] + 4 + h + (numbers ? 14 : 0) + (data.estimate ? 14 : 0) }));
    const clear = strips.every((b, j) => inside(b) && !boxes.some((o) => overlaps(o, b)) && !strips.some((o, q) => q !== j && overlaps(o, b)));
    if (clear) { geom.cell = { w, h, numbers }; boxes.push(...strips); break; }
  }
  font(g, 12);
  geom.names = new Map();
  for (const i of [...nodes.keys()].sort((a, b) => (nodes[a].kind === "gpu") - (nodes[b].kind === "gpu"))) {
    const tw = g.measureText(nodes[i].name).width, base = geom.y[i] - geom.r[i] - 2;
    for (const x0 of [geom.x[i] + ring(i) + 1, geom.x[i] - ring(i) - 1 - tw]) {     // right of the node, else left
      const b = { kind: "name", owner: i, x0, y0: base - 11, x1: x0 + tw, y1: base + 3 };
      if (free(b)) { boxes.push(b); geom.names.set(i, x0); break; }
    }
  }
  font(g, 11);
  geom.linkLabels = new Map();
  data.topology.links.forEach((l, j) => {
    if (data.topology.links.length > 24) return;
    const c = geom.links.get(l.a + "," + l.b), text = fmtBytes(l.bandwidth) + "/s";
    const b = { kind: "link", owner: j, x0: c.cx + 4, y0: c.cy + 3, x1: c.cx + 4 + g.measureText(text).width, y1: c.cy + 17 };
    if (free(b)) { boxes.push(b); geom.linkLabels.set(j, { x: c.cx + 4, y: c.cy + 14, text }); }
  });
  geom.busiestLabel = null;
  const util = data.topology.links.map((l) => (data.time_s > 0 ? l.busy_s / data.time_s : 0)), top = util.indexOf(Math.max(...util));
  if (!geom.equallyBusy && top >= 0 && util[top] > 0) {
    const l = data.topology.links[top], c = geom.links.get(l.a + "," + l.b), text = `busiest: ${Math.round(util[top] * 100)}% busy`, tw = g.measureText(text).width;
    for (const [dx, dy] of [[6, -6], [-tw - 6, -6], [6, 18], [-tw - 6, 18]]) {
      const b = { kind: "busiest", x0: c.cx + dx, y0: c.cy + dy - 11, x1: c.cx + dx + tw, y1: c.cy + dy + 3 };
      if (free(b)) { boxes.push(b); geom.busiestLabel = { x: c.cx + dx, y: c.cy + dy, text }; break; }
    }
  }
  geom.boxes = boxes;
}

function curve(g, a, b) {
  const c = geom.links.get(a + "," + b);
  g.moveTo(geom.x[a], geom.y[a]);
  if (c) g.quadraticCurveTo(c.cx, c.cy, geom.x[b], geom.y[b]); else g.lineTo(geom.x[b], geom.y[b]);
}

function drawStatic() {
  const dpr = V.dpr;
  staticLayer.width = view.width; staticLayer.height = view.height;
  const g = staticLayer.getContext("2d");
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  const nodes = data.topology.nodes, links = data.topology.links;
  const util = links.map((l) => (data.time_s > 0 ? l.busy_s / data.time_s : 0));
  const busiest = util.indexOf(Math.max(...util));
  const maxBw = Math.max(...links.map((l) => l.bandwidth));
  links.forEach((l, k) => {
    // load shading: idle links grey, the busier the more orange; the busiest outlined
    const u = Math.min(1, util[k]);
    g.strokeStyle = u > 0 ? `hsla(${30 - 10 * u}, 90%, ${30 + 25 * u}%, ${0.35 + 0.65 * u})` : "#1e293b";
    g.lineWidth = 1 + 4 * l.bandwidth / maxBw;
    g.beginPath(); curve(g, l.a, l.b); g.stroke();
  });
  // The algorithm's own structure (a tree's parents and children, a hierarchy's rails, a ring
  // over a switch), when its routes do not show it: a dashed line per pair that talks.
  const pairs = new Map(), t = data.transfers;
  for (let i = 0; i < t.src.length; i++) {
    const a = Math.min(t.src[i], t.dst[i]), b = Math.max(t.src[i], t.dst[i]);
    if (!pairs.has(a * 4096 + b)) pairs.set(a * 4096 + b, t.path[i].length > 2);
  }
  stats.logical = 0;
  if (pairs.size <= 2 * data.workers && [...pairs.values()].some(Boolean)) {
    g.strokeStyle = "rgba(226, 232, 240, 0.55)"; g.setLineDash([3, 4]); g.lineWidth = 1.2;
    for (const key of pairs.keys()) {
      const a = data.placement[Math.floor(key / 4096)], b = data.placement[key % 4096];
      g.beginPath(); g.moveTo(geom.x[a], geom.y[a]); g.lineTo(geom.x[b], geom.y[b]); g.stroke();
    }
    g.setLineDash([]);
    stats.logical = pairs.size;
  }
  $("legend-logical").hidden = !stats.logical;
  const even = geom.equallyBusy;
  stats.equallyBusy = even;
  if (even) {                                        // a symmetric ring: no link is the bottleneck
    font(g, 12); g.fillStyle = "#fbbf24";
    g.fillText(`all ${util.filter((u) => u > 0).length} links in use equally busy: ${Math.round(util[busiest] * 100)}% of the time`, 8, 16);
  } else if (busiest >= 0 && util[busiest] > 0) {
    const l = links[busiest], c = geom.links.get(l.a + "," + l.b);
    g.strokeStyle = "#fbbf24"; g.setLineDash([6, 4]); g.lineWidth = 1.5;
    g.beginPath(); curve(g, l.a, l.b); g.stroke(); g.setLineDash([]);
    font(g, 11); g.fillStyle = "#fbbf24";
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
    if (geom.names.has(i)) { font(g, 12); g.fillStyle = "#e2e8f0"; g.fillText(nd.name, geom.names.get(i), geom.y[i] - r - 2); }
  });
}

// Whether every link that carries data is as busy as the busiest (within 1%): then none is
// marked "busiest", as if it were the bottleneck.
function equallyBusy(util) {
  const used = util.filter((u) => u > 0);
  return used.length > 1 && Math.min(...used) >= 0.99 * Math.max(...used);
}

// Where a transfer is at fraction f of its path (f clamped to [0, 1]; curves followed).
function pointOnPath(path, f) {
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

// A packet: a dot in its chunk's colour, a bar of colours for several chunks, a diamond for coded.
// Packets shrink with the nodes (no jump at some N): 5.5 px beside full-size nodes, 3 at the least.
function packetSize() { return geom.packet; }

// An arrowhead ahead of a packet, pointing where it goes.
function arrow(g, x, y, ux, uy, size) {
  const tip = size + 5, back = size + 1;
  g.fillStyle = "#f8fafc"; g.beginPath();
  g.moveTo(x + ux * tip, y + uy * tip);
  g.lineTo(x + ux * back - uy * 3, y + uy * back + ux * 3); g.lineTo(x + ux * back + uy * 3, y + uy * back - ux * 3);
  g.fill();
}

function drawPacket(g, i, x, y, failed, ux = 0, uy = 0) {
  const t = data.transfers, k = anim.k, c0 = anim.span[2 * i], c1 = anim.span[2 * i + 1];
  const size = packetSize();
  if (!failed && (ux || uy) && size >= 4) arrow(g, x, y, ux, uy, t.op[i] === CODED || c1 - c0 === 1 ? size : 2 * size);
  if (failed) { g.fillStyle = FAIL_COLOR; g.beginPath(); g.arc(x, y, size, 0, 2 * Math.PI); g.fill(); return; }
  if (t.op[i] === CODED) {
    g.fillStyle = CODED_COLOR; g.beginPath();
    g.moveTo(x, y - size - 1); g.lineTo(x + size + 1, y); g.lineTo(x, y + size + 1); g.lineTo(x - size - 1, y); g.fill();
    return;
  }
  if (c1 - c0 === 1) { g.fillStyle = chunkColor(c0, k); g.beginPath(); g.arc(x, y, size, 0, 2 * Math.PI); g.fill(); return; }
  const parts = Math.min(c1 - c0, 8), width = Math.min(4 * size, 2 * size + parts * 2), step = (c1 - c0) / parts;
  for (let p = 0; p < parts; p++) {
    g.fillStyle = chunkColor(c0 + Math.floor(p * step), k);
    g.fillRect(x - width / 2 + (p * width) / parts, y - size, width / parts + 0.5, 2 * size);
  }
  g.strokeStyle = COPY === t.op[i] ? "#e2e8f0" : "#0f172a"; g.lineWidth = 1;
  g.strokeRect(x - width / 2, y - size, width, 2 * size);
}

function drawPackets(g) {
  const t = data.transfers, buckets = new Map();
  for (const i of anim.active) {
    const end = Math.min(t.done[i], anim.cut[i]);
    if (simNow > end || anim.cut[i] <= t.start[i]) continue;     // cut before it left: nothing moves
    const f = (simNow - t.start[i]) / Math.max(t.done[i] - t.start[i], 1e-15);
    const [x, y, dx, dy] = pointOnPath(t.path[i], f);
    const key = Math.round(x / 6) + "," + Math.round(y / 6);
    const b = buckets.get(key);
    if (b) b.items.push(i); else buckets.set(key, { x, y, dx, dy, items: [i] });
  }
  // flows that share a point are fanned out across the path, and counted when there are many
  for (const { x, y, dx, dy, items } of buckets.values()) {
    const len = Math.hypot(dx, dy) || 1, nx = -dy / len, ny = dx / len, shown = Math.min(items.length, 5);
    for (let j = 0; j < shown; j++) {
      const o = (j - (shown - 1) / 2) * (packetSize() * 1.6);
      const i = items[j], carries = follow === null || (anim.span[2 * i] <= follow && follow < anim.span[2 * i + 1]);
      g.globalAlpha = carries ? 1 : 0.15;
      drawPacket(g, i, x + nx * o, y + ny * o, false, dx / len, dy / len);
      g.globalAlpha = 1;
    }
    if (items.length > 1) { font(g, 11, "bold"); g.fillStyle = "#f8fafc"; g.fillText(`×${items.length}`, x + nx * 24 + 4, y + ny * 24 + 4); }
  }
  // where a failure stopped a transfer: a red mark at the point it reached
  for (const i of [...anim.active, ...anim.stopped]) if (anim.cut[i] < Infinity && simNow >= anim.cut[i] && anim.cut[i] > t.start[i]) {
    const [x, y] = pointOnPath(t.path[i], (anim.cut[i] - t.start[i]) / Math.max(t.done[i] - t.start[i], 1e-15));
    drawPacket(g, i, x, y, true);
  }
}

// Each worker's buffer: its chunks side by side, each filling in its chunk's colour as inputs arrive.
function cellGeometry(node) {
  if (!geom.cell) return null;
  const { w, h } = geom.cell, k = anim.k;
  const nd = data.placement[node], x0 = geom.x[nd] - (w * k) / 2, y0 = geom.y[nd] + geom.r[nd] + 4;
  return { x0, y0, w, h };
}

function drawBuffers(g) {
  const k = anim.k, est = data.estimate, refused = est && est.refused;
  for (let s = 0; s < anim.nodes; s++) {
    const box = cellGeometry(s);
    const nd = data.placement[s];
    if (!box) {                                 // many workers: one progress ring per worker
      let sum = 0;
      for (let c = 0; c < k; c++) sum += cellFill(s, c);
      const f = sum / k;
      g.strokeStyle = refused && f >= 1 ? FAIL_COLOR : f >= 1 ? "#4ade80" : "#94a3b8"; g.lineWidth = 2;
      g.beginPath(); g.arc(geom.x[nd], geom.y[nd], geom.r[nd] + 2, -Math.PI / 2, -Math.PI / 2 + 2 * Math.PI * f); g.stroke();
      continue;
    }
    const { x0, y0, w, h } = box;
    for (let c = 0; c < k; c++) {
      const f = cellFill(s, c), x = x0 + c * w;
      g.globalAlpha = follow === null || c === follow ? 1 : 0.2;
      g.fillStyle = "#1e293b"; g.fillRect(x, y0, w - 1, h);
      if (f > 0) {
        g.fillStyle = est ? (f >= 1 ? (refused ? FAIL_COLOR : chunkColor(c, k)) : CODED_COLOR) : chunkColor(c, k, f >= 1 ? 55 : 40);
        g.fillRect(x, y0 + h * (1 - f), w - 1, h * f);
      }
      if (f >= 1 && !refused) { g.strokeStyle = DONE_RING; g.lineWidth = 1; g.strokeRect(x + 0.5, y0 + 0.5, w - 2, h - 1); }
    }
    g.globalAlpha = 1;
    if (geom.cell.numbers) {
      font(g, 11); g.fillStyle = "#cbd5e1";
      for (let c = 0; c < k; c++) g.fillText(String(c), x0 + c * w + w / 2 - 3, y0 + h + 12);
    }
    if (refused && simNow >= data.time_s) { font(g, 11, "bold"); g.fillStyle = FAIL_COLOR; g.fillText("refused", x0, y0 + h + (geom.cell.numbers ? 26 : 12)); }
  }
}

function redName(g, nd) {
  if (!geom.names.has(nd)) return;
  font(g, 12); g.fillStyle = FAIL_COLOR;
  g.fillText(data.topology.nodes[nd].name, geom.names.get(nd), geom.y[nd] - geom.r[nd] - 2);
}

function drawFailure(g) {
  if (!data.failure) return;
  for (const s of data.failure.stopped) {
    if (s.at_s > simNow && s.node !== data.failure.device && simNow >= data.failure.at_s) {
      const nd = data.placement[s.node];                // dead already, not yet noticed: waiting in vain
      g.strokeStyle = WAIT_COLOR; g.lineWidth = 2; g.setLineDash([3, 3]);
      g.beginPath(); g.arc(geom.x[nd], geom.y[nd], geom.r[nd] + 2, 0, 2 * Math.PI); g.stroke(); g.setLineDash([]);
    }
    if (s.at_s > simNow) continue;
    const nd = data.placement[s.node], x = geom.x[nd], y = geom.y[nd];
    g.fillStyle = FAIL_COLOR; g.strokeStyle = FAIL_COLOR;
    if (s.node === data.failure.device) {
      g.lineWidth = 3; g.beginPath();
      const a = geom.r[nd] + 2;                      // the cross stays inside the node's own box
      g.moveTo(x - a, y - a); g.lineTo(x + a, y + a); g.moveTo(x + a, y - a); g.lineTo(x - a, y + a); g.stroke();
      redName(g, nd);
      // a pulse: the failed device stays visibly "alive" in the drawing even when nothing else moves
      const phase = (performance.now() % 1200) / 1200;
      g.globalAlpha = 0.6 * (1 - phase); g.lineWidth = 2; g.beginPath(); g.arc(x, y, geom.r[nd] + 3 + 10 * phase, 0, 2 * Math.PI); g.stroke();
      g.globalAlpha = 1;
    } else {                                         // PeerError: a red ring and a red name (the panel says the rest)
      g.lineWidth = 2; g.beginPath(); g.arc(x, y, geom.r[nd] + 2, 0, 2 * Math.PI); g.stroke();
      redName(g, nd);
    }
  }
}

function drawHover(g) {
  if (hover === null) return;
  const nd = data.placement[hover], x = geom.x[nd], y = geom.y[nd], k = anim.k;
  const lines = [`${data.topology.nodes[nd].name} (worker ${hover})`];
  let complete = 0;
  for (let c = 0; c < k; c++) if (cellFill(hover, c) >= 1) complete++;
  lines.push(`${complete} of ${k} chunks hold the full sum`);
  const stop = data.failure && data.failure.stopped.find((s) => s.node === hover && s.at_s <= simNow);
  if (stop) { lines.push(stop.message);
    if (stop.node !== data.failure.device) lines.push(`rank ${data.failure.device} died at ${fmtTime(stop.died_s)}; this rank noticed at ${fmtTime(stop.at_s)}`); }
  font(g, 12);
  const bw = Math.max(...lines.map((l) => g.measureText(l).width)) + 12, bh = 16 * lines.length + 8 + 18;
  const bx = Math.min(x + 12, V.w - bw - 4), by = Math.min(y + 12, V.h - bh - 4);
  g.fillStyle = "rgba(15,23,42,0.95)"; g.fillRect(bx, by, bw, bh);
  g.fillStyle = "#e2e8f0"; lines.forEach((l, j) => g.fillText(l, bx + 6, by + 16 + 16 * j));
  const cw = (bw - 12) / k;
  for (let c = 0; c < k; c++) {
    const f = cellFill(hover, c);
    g.fillStyle = "#1e293b"; g.fillRect(bx + 6 + c * cw, by + bh - 18, Math.max(cw - 0.5, 0.5), 12);
    g.fillStyle = chunkColor(c, k); g.fillRect(bx + 6 + c * cw, by + bh - 18 + 12 * (1 - f), Math.max(cw - 0.5, 0.5), 12 * f);
  }
}

// ---- the timeline (a Gantt strip: one row per sender) ------------------------------------------
const timeline = $("timeline");
let T = null, timelineLayer = document.createElement("canvas");
const GUTTER = 64;

// Lanes: each sender gets as many rows as it has transfers at once (up to what fits), so
// concurrent sends (two rings, sharded's N - 1) are side by side, not painted over each other.
function timelineLanes() {
  const t = data.transfers, senders = data.workers + (data.placement.length > data.workers ? 1 : 0);
  const most = Math.max(1, Math.min(6, Math.floor(120 / (senders * 3)))), lane = new Int32Array(t.src.length);
  const ends = Array.from({ length: senders }, () => []);
  for (const i of [...t.src.keys()].sort((a, b) => t.start[a] - t.start[b])) {
    const e = ends[Math.min(t.src[i], senders - 1)];
    let l = e.findIndex((end) => end <= t.start[i] * (1 + 1e-12));
    if (l < 0) l = e.length < most ? e.push(0) - 1 : e.indexOf(Math.min(...e));
    e[l] = Math.max(e[l], t.done[i]); lane[i] = l;
  }
  const first = []; let rows = 0;
  for (const e of ends) { first.push(rows); rows += Math.max(1, e.length); }
  return { lane, first, rows, senders };
}

function drawTimeline() {
  const L = timelineLanes(), rows = L.rows;
  const rowH = Math.max(2, Math.min(12, 110 / rows));   // at most ~134 px: the timeline stays above the fold
  T = fit(timeline, Math.round(rows * rowH + 24));
  T.rowH = rowH; T.rows = rows; T.lanes = L;
  timelineLayer.width = timeline.width; timelineLayer.height = timeline.height;
  const g = timelineLayer.getContext("2d"), t = data.transfers, k = anim.k;
  g.setTransform(T.dpr, 0, 0, T.dpr, 0, 0);
  const X = (s) => GUTTER + toFrac(s) * (T.w - GUTTER - 8);
  font(g, 11); g.fillStyle = "#94a3b8";
  let lastLabel = -Infinity;
  L.first.forEach((row, s) => {
    const y = 12 + row * rowH + Math.min(rowH, 12) / 2 + 3;
    if (y - lastLabel < 12) return;                      // labels never overlap: some rows go unnamed
    g.fillText(s < data.workers ? data.topology.nodes[data.placement[s]].name : "helper", 4, y); lastLabel = y;
  });
  for (let i = 0; i < t.src.length; i++) {
    const row = L.first[Math.min(t.src[i], L.senders - 1)] + L.lane[i], x0 = X(t.start[i]), x1 = X(Math.min(t.done[i], anim.cut[i]));
    if (anim.cut[i] < Infinity) {                        // what the failure keeps from happening: a grey ghost
      g.strokeStyle = "#475569"; g.lineWidth = 1;
      g.strokeRect(Math.max(x0, x1) + 0.5, 12 + row * rowH + 0.5, Math.max(X(t.done[i]) - Math.max(x0, x1) - 1, 0.8), Math.max(rowH - 1.5, 0.8));
    }
    if (!(x1 > x0)) continue;
    // a transfer of several chunks is striped in their colours, not painted as its first
    const c0 = anim.span[2 * i], c1 = anim.span[2 * i + 1], stripes = t.op[i] === CODED ? 1 : Math.min(c1 - c0, 4), h = Math.max(rowH - 1, 1);
    for (let q = 0; q < stripes; q++) {
      g.fillStyle = t.op[i] === CODED ? CODED_COLOR : chunkColor(c0 + Math.floor(q * (c1 - c0) / stripes), k, t.op[i] === REDUCE ? 50 : 65);
      g.fillRect(x0, 12 + row * rowH + 0.5 + (q * h) / stripes, Math.max(x1 - x0 - 0.5, 0.8), h / stripes);
    }
  }
  if (data.failure) drawDetection(g, X, L, rowH);
  T.X = X;
}

// From the death to each survivor's detection: an amber band on its rows (it waits in vain)
// ending in a red tick (it raises PeerError); the axis broken where the gap is compressed.
function drawDetection(g, X, L, rowH) {
  const f = data.failure, rows = L.rows, top = 12, bottom = 12 + rows * rowH;
  if (anim.split < 1 && anim.end > 3 * data.time_s) {            // the broken axis
    const xb = X(data.time_s);
    g.fillStyle = "#020617"; g.fillRect(xb - 3, top - 4, 6, bottom - top + 8);
    g.strokeStyle = "#94a3b8"; g.lineWidth = 1; g.beginPath();
    for (const dx of [-3, 1]) { g.moveTo(xb + dx, bottom + 2); g.lineTo(xb + dx + 2, top - 4); }
    g.stroke();
  }
  for (const s of f.stopped) {
    if (s.node === f.device) continue;
    const sender = Math.min(s.node, L.senders - 1), row = L.first[sender];
    const lanes = (sender + 1 < L.first.length ? L.first[sender + 1] : rows) - row, y = top + row * rowH, h = Math.max(lanes * rowH, 2);
    const x0 = X(Math.max(f.at_s, s.began_s ?? f.at_s)), x1 = X(s.at_s);
    g.fillStyle = "rgba(251, 191, 36, 0.28)"; g.fillRect(x0, y, Math.max(x1 - x0, 1), h);
    g.fillStyle = FAIL_COLOR; g.fillRect(x1 - 1, y, 2, h);
  }
  g.fillStyle = FAIL_COLOR; const x = X(f.at_s);
  g.fillRect(x - 1, 8, 2, rows * rowH + 4); font(g, 11, "bold");
  const label = Math.min(x + 3, T.w - 48); g.fillText("failure", label, 10);
  const first = firstNotice(f), xf = X(first.at_s), text = `noticed +${fmtTime(first.at_s - f.at_s)}`, w = g.measureText(text).width;
  if (first.node !== f.device && xf - w - 3 > label + g.measureText("failure").width + 6) { g.fillStyle = WAIT_COLOR; g.fillText(text, xf - w - 3, 10); }
  else if (first.node !== f.device && xf + 3 + w < T.w && xf + 3 > label + g.measureText("failure").width + 6) { g.fillStyle = WAIT_COLOR; g.fillText(text, xf + 3, 10); }
}

function drawCursor() {
  const g = T.g;
  g.clearRect(0, 0, T.w, T.h);
  g.drawImage(timelineLayer, 0, 0, T.w, T.h);
  const x = T.X(Math.min(simNow, anim.end));
  g.fillStyle = "#f8fafc"; g.fillRect(x - 1, 4, 2, T.h - 8);
}

// ---- narration and panels ----------------------------------------------------------------------
function currentStep() {
  // the earliest round still moving data; before the first start, the first; after the end, the last
  let best = -1;
  for (const i of anim.active) {
    if (simNow > Math.min(data.transfers.done[i], anim.cut[i])) continue;
    const j = anim.roundIndex.get(data.transfers.round[i]);
    if (best < 0 || j < best) best = j;
  }
  if (best >= 0) return best;
  let last = 0;
  for (let j = 0; j < anim.roundStart.length; j++) if (anim.roundStart[j] <= simNow) last = j;
  return last;
}

// The survivor that found the failure first, and the words for how it did.
function firstNotice(f) {
  return f.stopped.filter((s) => s.node !== f.device).sort((a, b) => a.at_s - b.at_s || a.node - b.node)[0] || f.stopped[0];
}
function howFound(f) {
  if (f.detection === "stall") return `the timeout, ${fmtTime(f.timeout_s)} after the collective began: a stalled process closes nothing`;
  if (f.check_every_s <= 0) return "its connection closed at once";
  return `its next liveness check, every ${fmtTime(f.check_every_s)}`;
}

// After a failure the story is the failure's: who has died, who has stopped, what never happens.
function failureStory() {
  const f = data.failure;
  if (!f || simNow < f.at_s) return null;
  const name = (node) => data.topology.nodes[data.placement[node]].name, last = Math.max(...f.stopped.map((s) => s.at_s));
  const stopped = f.stopped.filter((s) => s.node !== f.device && s.at_s <= simNow).length, peers = f.stopped.length - 1;
  const never = anim.never.size, first = firstNotice(f), died = f.detection === "stall" ? "stalled" : "died";
  const dead = `${name(f.device)} (rank ${f.device}) ${died} at ${fmtTime(f.at_s)}`;
  if (first.node === f.device) return { key: "f-none", text: `${dead}, after its last transfer: no survivor waits for it, and the collective completes.`,
    detail: "" };
  const noticed = `${name(first.node)} noticed at ${fmtTime(first.at_s)} (${howFound(f)})`;
  if (first.node !== f.device && simNow < first.at_s) return { key: "f-wait", text: `${dead}; nobody has noticed yet: ` +
    `its peers wait for it, and ${noticed.replace("noticed at", "will notice at")}.`,
    detail: `${never} of ${data.narration.length} rounds will not complete.` };
  if (simNow < last) return { key: `f${stopped}`, text: `${dead}; ${noticed}. ` +
    `${stopped} of ${peers} peers have stopped so far: each raises PeerError naming rank ${f.device} once it finds its wait cannot finish.`,
    detail: `${never} of ${data.narration.length} rounds will not complete.` };
  return { key: "done", text: `The collective was abandoned: ${dead}; ${noticed}, and by ` +
    `${fmtTime(last)} every survivor had raised PeerError naming it; none hangs.`,
    detail: `${never} of ${data.narration.length} rounds never complete (greyed in the list); the restart with the survivors is below.` };
}

function updateNarration() {
  const story = failureStory();
  if (story) {
    if (anim.current === story.key) return;
    anim.current = story.key;
    $("narration").textContent = story.text; $("narration-detail").textContent = story.detail;
    stats.narrated = story.text;
    return;
  }
  const j = currentStep();
  if (j === anim.current) return;
  anim.current = j;
  const step = data.narration[j];
  if (!step) return;
  $("narration").textContent = step.text;
  $("narration-detail").textContent = step.transfers;
  const items = $("steps").children;
  for (let q = 0; q < items.length; q++) items[q].className = (q === j ? "now" : q < j ? "done" : "") + (anim.never.has(q) ? " never" : "");
  const li = items[j];
  if (li) { const box = $("steps"); box.scrollTop = Math.max(0, li.offsetTop - box.offsetTop - box.clientHeight / 3); }
  stats.narrated = step.text;
}

function renderPanels() {
  const d = data, nodes = d.topology.nodes;
  const util = d.topology.links.map((l) => (d.time_s > 0 ? l.busy_s / d.time_s : 0));
  const b = util.indexOf(Math.max(...util)), busiest = d.topology.links[b];
  const rows = [["simulated time", fmtTime(d.time_s)], ["bus bandwidth", d.busbw_GBps.toPrecision(3) + " GB/s"],
    ["rounds", d.rounds], ["transfers", d.transfers.src.length],
    equallyBusy(util) ? ["links", `all ${util.filter((u) => u > 0).length} in use equally busy, ${Math.round(util[b] * 100)}% of the time`] :
    ["busiest link", busiest && busiest.bytes ? `${nodes[busiest.a].name}–${nodes[busiest.b].name}: ${fmtBytes(busiest.bytes)}, busy ${Math.round(util[b] * 100)}% of the time` : "-"]];
  if (d.algorithm === "ring" && d.topology.preset === "p3.16xlarge" && d.workers === 8 && d.bytes === 160e6 && !filled("bandwidth") && !filled("latency"))
    rows.push(["D2L's figure", `about 6 ms on 8 V100s for 160 MB (its "Parameter Servers" chapter); simulated here: ${fmtTime(d.time_s)}`]);
  if (d.estimate) {
    const e = d.estimate;
    const shown = e.error === null ? "not finite" : e.error.toPrecision(3);
    rows.push(["CERAR error", `<span class="${e.refused ? "bad" : "good"}">${shown} ${e.refused ? "&gt;" : "≤"} ${e.limit} — ${e.refused ? "gradsync refuses this design" : "accepted"}</span>`]);
  }
  if (d.compression) {
    const c = d.compression;
    rows.push(["compression", `${c.codec}: ${c.collectives} in ${c.itemsize}-byte elements, ${fmtBytes(c.wire_bytes)} sent by the busiest worker (codec compute not drawn)`]);
  }
  if (d.failure) { const f = d.failure, first = firstNotice(f);
    rows.push(["failure", `rank ${f.device} ${f.detection === "stall" ? "stalls" : "crashes"} at ${fmtTime(f.at_s)}; ${f.stopped.length - 1} peers report it, ` +
      `the first at ${fmtTime(first.at_s)} (${fmtTime(first.at_s - f.at_s)} later: ${f.detection === "stall" ? "the timeout" : f.check_every_s > 0 ? "liveness check" : "connection closed"})`]); }
  $("numbers").innerHTML = rows.map(([key, v]) => `<dt>${key}</dt><dd>${v}</dd>`).join("");
  $("explain-title").textContent = `How ${d.algorithm} works`;
  $("explanation").textContent = (d.summary ? d.summary + ".\n" : "") + (d.explanation || "");
  const steps = $("steps");
  steps.innerHTML = "";
  const frag = document.createDocumentFragment();
  d.narration.forEach((s, j) => {
    const li = document.createElement("li"); li.textContent = s.text; if (anim.never.has(j)) li.className = "never";
    li.onclick = () => { playing = false; $("play").textContent = "play"; advanceTo(anim.roundStart[j] + 1e-15 * d.time_s); };
    frag.appendChild(li);
  });
  steps.appendChild(frag);
  anim.current = -1;
  // failure and recovery
  $("failure-box").hidden = !d.failure;
  if (d.failure) {
    // one line per moment: who dies, then who stops then (grouped: at 64 workers most stop together)
    const f = d.failure, name = (s) => nodes[d.placement[s.node]].name, groups = new Map();
    for (const s of [...f.stopped].sort((a, b2) => a.at_s - b2.at_s || a.node - b2.node)) {
      const key = s.node === f.device ? "dead" : String(s.at_s);
      if (!groups.has(key)) groups.set(key, { at: s.at_s, dead: s.node === f.device, names: [] });
      groups.get(key).names.push(name(s));
    }
    const list = (ns) => ns.length <= 6 ? ns.join(", ") : ns.slice(0, 5).join(", ") + ` and ${ns.length - 5} more`;
    $("failure-events").innerHTML = [...groups.values()].sort((a, b2) => a.at - b2.at || b2.dead - a.dead).map((g) =>
      `<li data-at="${g.at}">${fmtTime(g.at)}: ${g.dead ? `${g.names[0]} ${f.detection === "stall" ? "stalls (alive, silent)" : "dies"}` :
        `${list(g.names)} ${g.names.length > 1 ? "notice" : "notices"} it (${f.detection === "stall" ? "the timeout" : f.check_every_s > 0 ? "a liveness check" : "a closed connection"}, ` +
        `${fmtTime(g.at - f.at_s)} after) and raise${g.names.length > 1 ? "" : "s"} PeerError naming rank ${f.device}`}</li>`).join("");
    const r = f.recovery;
    $("recovery").textContent = r && r.time_s ? `Then every survivor has the error, none hangs. An elastic restart re-forms the group with the ` +
      `${r.workers} survivors (a new rendezvous, seconds) and runs the collective again: ${fmtTime(r.time_s)} for ${r.workers} workers.` :
      `Recovery: ${r ? r.note : ""}`;
    $("recover").hidden = !(r && r.time_s);
  }
}

function updateFailureEvents() {
  if (!data.failure) return;
  for (const li of $("failure-events").children) li.className = Number(li.dataset.at) <= simNow ? "" : "later";
}

// ---- the frame loop ----------------------------------------------------------------------------
function playSeconds() { return Math.min(PLAY_LIMITS[1], Math.max(PLAY_LIMITS[0], ROUND_SECONDS * Math.max(data.rounds, 1))); }
function speedLabel() {
  if (!data) return;
  const perRound = playSeconds() / Math.max(data.rounds, 1) / Math.pow(10, speedExp);
  $("speed-label").textContent = `1 round ≈ ${perRound >= 10 ? perRound.toFixed(0) : perRound.toPrecision(2)} s`;
  stats.secondsPerRound = perRound;
}

function frame(ts) {
  requestAnimationFrame(frame);                       // first: nothing below can end the loop
  if (lastFrame !== null) {
    const dt = ts - lastFrame;
    stats.fps = stats.fps ? 0.9 * stats.fps + 0.1 * (1000 / Math.max(dt, 1)) : 1000 / Math.max(dt, 1);
    if (data && playing) {
      let next = toFrac(simNow) + dt * anim.split / (playSeconds() * 1000) * Math.pow(10, speedExp);
      if (next > 1 + 0.15 * anim.split) next = 0;        // loop, with a short pause at the end
      advanceTo(fromFrac(next));
    }
  }
  lastFrame = ts;
  stats.frames++;
  render();
}

function render() {
  if (!data || !V) return;
  const g = V.g;
  g.clearRect(0, 0, V.w, V.h);
  g.drawImage(staticLayer, 0, 0, V.w, V.h);
  drawBuffers(g);
  if (!hidePackets) drawPackets(g);                  // packets pass over the buffers, never under
  drawFailure(g);
  drawHover(g);
  drawCursor();
  updateNarration();
  updateFailureEvents();
  if (anim.followShown !== anim.donePtr) { anim.followShown = anim.donePtr; updateFollow(); }
  $("now").textContent = fmtTime(Math.min(simNow, anim.end));
  if (!scrubbing) $("scrub").value = String(data.time_s > 0 ? Math.min(toFrac(simNow), 1) : 0);
  if (pendingSince !== null && stats.loadedAt >= pendingSince) {
    stats.updateMs = performance.now() - pendingSince;
    if (stats.timing) stats.timing.total = stats.updateMs;
    pendingSince = null;
  }
}

// ---- the comparison chart ----------------------------------------------------------------------
const MARKERS = ["circle", "square", "triangle", "diamond", "cross", "plus", "star", "circle"];
const PALETTE = ["#f59e0b", "#22c55e", "#38bdf8", "#f472b6", "#a78bfa", "#facc15", "#fb7185", "#2dd4bf"];
let chart = { seq: 0, controller: null, curves: {}, meta: null, hidden: new Set() };

function marker(g, kind, x, y, r) {
  g.beginPath();
  if (kind === "circle") g.arc(x, y, r, 0, 2 * Math.PI);
  else if (kind === "square") g.rect(x - r, y - r, 2 * r, 2 * r);
  else if (kind === "triangle") { g.moveTo(x, y - r - 1); g.lineTo(x + r + 1, y + r); g.lineTo(x - r - 1, y + r); g.closePath(); }
  else if (kind === "diamond") { g.moveTo(x, y - r - 1); g.lineTo(x + r + 1, y); g.lineTo(x, y + r + 1); g.lineTo(x - r - 1, y); g.closePath(); }
  else if (kind === "star") { for (let j = 0; j < 10; j++) { const a = -Math.PI / 2 + j * Math.PI / 5, q = j % 2 ? r / 2 : r + 1; g.lineTo(x + q * Math.cos(a), y + q * Math.sin(a)); } g.closePath(); }
  else {                                  // cross or plus: strokes
    const [dx, dy] = kind === "cross" ? [r, r] : [r, 0];
    g.moveTo(x - dx, y - dy); g.lineTo(x + dx, y + dy); g.moveTo(x - dy, y + dx); g.lineTo(x + dy, y - dx);
    g.lineWidth = 2; g.stroke(); return;
  }
  g.fill();
}

function chartQuery(algorithm) {
  const q = new URLSearchParams({ size: $("size").value.trim() || "160MB", topology: $("topology").value, algorithm });
  for (const id of ["bandwidth", "latency", "components", "eps"]) if (filled(id)) q.set(id, $(id).value.trim());
  return "api/compare?" + q.toString();
}

async function loadChart() {
  const seq = ++chart.seq;
  if (chart.controller) chart.controller.abort();               // stale requests are cancelled...
  chart.controller = new AbortController();
  const signal = chart.controller.signal, names = $("algorithm").options;
  chart.curves = {}; chart.meta = null;
  const list = [...names].map((o) => o.value);
  $("chart-status").textContent = `computing 0 of ${list.length}…`;
  drawChart();
  let done = 0;
  for (const name of list) {                                    // one bounded request per algorithm
    try {
      stats.chartRequests++;
      let r, c;
      if (STATIC) {
        await schedulesFor([name]);
        await new Promise((ok) => setTimeout(ok, 0));            // a frame between curves
        if (seq !== chart.seq) return;
        try { c = gradsyncSite.comparison(window.gradsyncCore, window.gradsyncSchedules, params(), name); r = { ok: true, status: 200 }; }
        catch (e) { c = { detail: e.message }; r = { ok: false, status: 400 }; }
      }
      for (; !STATIC;) {                                        // 202: accepted, still computing: ask again
        r = await fetch(chartQuery(name), { signal });
        c = await r.json();
        if (seq !== chart.seq) return;                          // ...and one that still lands is ignored
        if (r.status !== 202) break;
        await new Promise((ok) => setTimeout(ok, 1000 * Number(r.headers.get("retry-after") || 1)));
        if (seq !== chart.seq) return;
      }
      if (!r.ok) { $("chart-status").textContent = c.detail || "chart unavailable"; continue; }
      chart.meta = c; chart.curves[name] = c.curves[name];
      stats.chartApplied++;
      stats.chart = { bytes: c.bytes, topology: c.topology, curves: chart.curves, workers: c.workers, book_marks: c.book_marks };
    } catch (e) {
      if (e.name === "AbortError" || seq !== chart.seq) return;
    }
    done++;
    $("chart-status").textContent = done < list.length ? `computing ${done} of ${list.length}…` : "";
    drawChart();
  }
}

function markChart() { if (chart.meta) drawChart(); }

function drawChart() {
  const cv = $("chart"), { g, w, h } = fit(cv, undefined);
  const c = chart.meta, names = [...$("algorithm").options].map((o) => o.value);
  $("chart-where").textContent = c ? `(${c.topology}, ${fmtBytes(c.bytes)})` : "";
  legend(names);
  if (!c) { font(g, 13); g.fillStyle = "#94a3b8"; g.fillText("computing…", w / 2 - 30, h / 2); return; }
  const L = 64, R = 12, Tp = 12, B = 34, pw = w - L - R, ph = h - Tp - B;
  const all = Object.entries(chart.curves).filter(([n]) => !chart.hidden.has(n))
    .flatMap(([, v]) => v.simulated_s.concat(v.closed_form_s)).filter((x) => x > 0);
  if (!all.length) return;
  let lo = Math.log10(Math.min(...all)), hi = Math.log10(Math.max(...all));
  if (hi - lo < 0.5) { lo -= 0.25; hi += 0.25; }
  const ws = c.workers, wl = Math.log2(ws[0]), wh = Math.log2(ws[ws.length - 1]);
  const X = (n) => L + (Math.log2(n) - wl) / Math.max(wh - wl, 1e-9) * pw, Y = (s) => Tp + ph - (Math.log10(s) - lo) / (hi - lo) * ph;
  font(g, 11); g.fillStyle = "#94a3b8"; g.strokeStyle = "#1e293b"; g.lineWidth = 1;
  for (const n of ws) g.fillText(n, X(n) - 5, Tp + ph + 15);
  for (let e = Math.ceil(lo); e <= hi; e++) { g.fillText(fmtTime(10 ** e), 2, Y(10 ** e) + 4); g.beginPath(); g.moveTo(L, Y(10 ** e)); g.lineTo(L + pw, Y(10 ** e)); g.stroke(); }
  g.fillText("workers", L + pw / 2 - 20, h - 4);
  // the configuration being animated
  const nowN = data ? data.workers : null;
  if (nowN && nowN >= ws[0] && nowN <= ws[ws.length - 1]) {
    g.strokeStyle = "#64748b"; g.setLineDash([3, 4]); g.beginPath(); g.moveTo(X(nowN), Tp); g.lineTo(X(nowN), Tp + ph); g.stroke(); g.setLineDash([]);
  }
  names.forEach((name, k) => {
    const v = chart.curves[name];
    if (!v || chart.hidden.has(name)) return;
    const color = PALETTE[k % PALETTE.length];
    g.strokeStyle = color; g.fillStyle = color;
    for (const [series, dash, width] of [[v.closed_form_s, [6, 5], 1.2], [v.simulated_s, [], 2]]) {
      g.setLineDash(dash); g.lineWidth = width; g.beginPath(); let open = false;
      series.forEach((s, j) => { if (s > 0) { open ? g.lineTo(X(ws[j]), Y(s)) : g.moveTo(X(ws[j]), Y(s)); open = true; } else open = false; });
      g.stroke();
    }
    g.setLineDash([]);
    v.simulated_s.forEach((s, j) => { if (s > 0) marker(g, MARKERS[k % MARKERS.length], X(ws[j]), Y(s), 3.5); });
  });
  for (const m of c.book_marks || []) {
    const x = X(m.workers), y = Y(m.time_s);
    g.strokeStyle = "#f8fafc"; g.lineWidth = 1.5; g.beginPath(); g.rect(x - 5, y - 5, 10, 10); g.stroke();
    font(g, 11); g.fillStyle = "#f8fafc"; g.fillText(`D2L ${m.algorithm} ${fmtTime(m.time_s)}`, x + 8, y - 6);
  }
  if (data && chart.curves[data.algorithm]) {
    const j = ws.indexOf(data.workers), s = j >= 0 ? chart.curves[data.algorithm].simulated_s[j] : null;
    const y = s > 0 ? Y(s) : data.time_s > 0 && data.time_s >= 10 ** lo && data.time_s <= 10 ** hi ? Y(data.time_s) : null;
    if (y !== null) {
      g.strokeStyle = "#f8fafc"; g.lineWidth = 2; g.beginPath(); g.arc(X(data.workers), y, 9, 0, 2 * Math.PI); g.stroke();
      font(g, 11, "bold"); g.fillStyle = "#f8fafc"; g.fillText("animated", Math.min(X(data.workers) + 12, w - 60), y + 16);
      stats.chartMark = { algorithm: data.algorithm, workers: data.workers };
    }
  }
}

function legend(names) {
  const ul = $("chart-legend");
  ul.innerHTML = names.map((name, k) => {
    const color = PALETTE[k % PALETTE.length], exact = chart.curves[name] ? chart.curves[name].exact !== false : true;
    return `<li data-name="${name}" class="${chart.hidden.has(name) ? "off" : ""}"><svg width="26" height="12"><line x1="0" y1="6" x2="26" y2="6" stroke="${color}" stroke-width="2"/>` +
      `<text x="9" y="10" fill="${color}" font-size="11">${["●", "■", "▲", "◆", "✕", "+", "★", "●"][k % 8]}</text></svg>${name}${exact ? "" : " (approximate)"}</li>`;
  }).join("");
  for (const li of ul.children) li.onclick = () => { const n = li.dataset.name; chart.hidden.has(n) ? chart.hidden.delete(n) : chart.hidden.add(n); drawChart(); };
}

// ---- controls ----------------------------------------------------------------------------------
let scrubbing = false;
function pause() { playing = false; $("play").textContent = "play"; }
// "step" stops at every event (a transfer starts or lands) and halfway between two, so a
// paused view shows packets on their links, not only inside their senders.
function stops() {
  if (anim.stops) return anim.stops;
  const t = data.transfers, failed = data.failure ? data.failure.stopped.map((s) => s.at_s) : [];
  const ev = [...new Set([0, ...t.start, ...t.done, data.time_s, ...failed])].sort((a, b) => a - b), out = [];
  ev.forEach((e, k) => { if (k) out.push((ev[k - 1] + e) / 2); out.push(e); });
  return (anim.stops = out);
}
function stepForward() {
  pause();
  const next = stops().find((e) => e > simNow + 1e-12 * data.time_s);
  advanceTo(next === undefined ? anim.end : next);
}
function stepBack() {
  pause();
  const before = stops().filter((e) => e < simNow - 1e-12 * data.time_s);
  advanceTo(before.length ? before[before.length - 1] : 0);
}
function seekFraction(f) { advanceTo(fromFrac(Math.max(0, Math.min(1, f)))); }

function syncWorkersField() {
  const fixed = fixedWorkers[$("topology").value], field = $("workers");
  if (fixed) {
    field.max = String(fixed);
    field.value = String(fixed);                      // the whole machine; fewer can be chosen after
    $("workers-note").textContent = `${$("topology").value} has ${fixed} GPUs: at most ${fixed} workers`;
  } else { field.max = "64"; $("workers-note").textContent = STATIC ? `this export offers ${window.gradsyncCore.worker_counts[$("topology").value].join(", ")} workers` : ""; }
  clearStaleFailure();
}

// A failure of a device the controls no longer have is cleared (and said so), never kept to
// refuse every later change.
function clearStaleFailure() {
  const n = Number($("workers").value), field = $("fail-device");
  field.max = String(Math.max(0, n - 1));
  if (Number(field.value) > n - 1) field.value = String(Math.max(0, n - 1));
  if (failure && failure.device > n - 1) {
    $("fail-note").textContent = `the failure of device ${failure.device} was cleared: there are ${n} workers now`;
    failure = null;
  }
}

function legendHtml() {
  $("legend").innerHTML = `<span><i style="background:linear-gradient(90deg,${[0, 1, 2, 3, 4, 5].map((c) => chunkColor(c, 6)).join(",")})"></i>` +
    `chunk colours (chunk i starts in colour i)</span><span><i style="background:${CODED_COLOR};transform:rotate(45deg)"></i>coded packet</span>` +
    `<span><i style="background:${FAIL_COLOR}"></i>stopped by a failure (a red ring: PeerError)</span><span><i style="border:1px solid ${DONE_RING}"></i>chunk holds the full sum</span>` +
    `<span><i style="background:#fbbf24"></i>busiest link</span>` +
    `<span id="legend-logical" hidden><i style="border-top:2px dashed #e2e8f0;height:0"></i>who sends to whom (the algorithm's own structure)</span>`;
}

async function init() {
  legendHtml();
  const presets = STATIC ? (window.gradsyncCore = await staticData("model")) : await (await fetch("api/presets")).json();
  if (STATIC) {                        // CERAR's own design and the codecs are the server's
    for (const id of ["components", "eps"]) { $(id).disabled = true; $(id).title = "run gradsync serve for this"; }
  }
  fixedWorkers = presets.fixed_workers || {};
  $("algorithm").innerHTML = presets.algorithms.map((a) => `<option>${a}</option>`).join("");
  $("topology").innerHTML = presets.topologies.map((a) => `<option>${a}</option>`).join("");
  for (const c of presets.compressions || []) $("compression").add(new Option(c, c));
  $("algorithm").value = "ring";
  const chartInputs = new Set(["topology", "size", "bandwidth", "latency", "components", "eps"]);
  for (const id of ["algorithm", "topology", "workers", "size", "bandwidth", "latency", "components", "eps", "compression"])
    $(id).addEventListener("change", () => {
      if (id === "topology") syncWorkersField();
      if (id === "workers") { const m = Number($("workers").max); if (Number($("workers").value) > m) $("workers").value = String(m); clearStaleFailure(); }
      if (chartInputs.has(id)) loadChart();
      refresh();
    });
  $("play").onclick = () => { playing = !playing; $("play").textContent = playing ? "pause" : "play"; };
  $("restart").onclick = () => advanceTo(0);
  $("step").onclick = stepForward;
  $("back").onclick = stepBack;
  $("speed").oninput = (e) => { speedExp = Number(e.target.value); speedLabel(); };
  $("scrub").addEventListener("input", (e) => { scrubbing = true; pause(); seekFraction(Number(e.target.value)); });
  $("scrub").addEventListener("change", () => { scrubbing = false; });
  const drag = (e) => { if (!T || !data) return; const r = timeline.getBoundingClientRect(); pause();
    seekFraction((e.clientX - r.left - GUTTER) / (r.width - GUTTER - 8)); };
  timeline.addEventListener("pointerdown", (e) => { timeline.setPointerCapture(e.pointerId); drag(e); });
  timeline.addEventListener("pointermove", (e) => { if (e.buttons) drag(e); });
  view.addEventListener("pointermove", (e) => {
    if (!data || !geom) return;
    const r = view.getBoundingClientRect(), x = e.clientX - r.left, y = e.clientY - r.top;
    let best = null, bd = 18 * 18;
    for (let s = 0; s < data.workers; s++) { const nd = data.placement[s], d = (geom.x[nd] - x) ** 2 + (geom.y[nd] - y) ** 2; if (d < bd) { bd = d; best = s; } }
    hover = best;
  });
  view.addEventListener("pointerleave", () => { hover = null; });
  view.addEventListener("click", (e) => {
    if (!data || !geom || !geom.cell) return;
    const r = view.getBoundingClientRect(), x = e.clientX - r.left, y = e.clientY - r.top;
    for (let s = 0; s < anim.nodes; s++) {
      const b = cellGeometry(s);
      if (b && y >= b.y0 && y <= b.y0 + b.h && x >= b.x0 && x < b.x0 + b.w * anim.k) {
        const c = Math.floor((x - b.x0) / b.w);
        setFollow(c === follow ? null : c);
        return;
      }
    }
  });
  $("fail").onclick = () => { failure = { device: Number($("fail-device").value), at: Number($("fail-at").value), detection: $("fail-how").value }; refresh(); };
  $("fail-how").addEventListener("change", () => { if (failure) { failure = { ...failure, detection: $("fail-how").value }; refresh(); } });
  $("heal").onclick = () => { failure = null; $("fail-note").textContent = ""; refresh(); };
  $("recover").onclick = () => {
    if (!data || !data.failure || !data.failure.recovery) return;
    $("workers").value = String(data.failure.recovery.workers); failure = null; refresh();
  };
  document.addEventListener("keydown", (e) => {
    if (e.target.closest && e.target.closest("input, select, textarea") || e.ctrlKey || e.metaKey || e.altKey || !data) return;
    const keys = { " ": () => $("play").click(), ArrowRight: stepForward, ArrowLeft: stepBack, Home: () => advanceTo(0),
                   f: () => $("fail").click(), h: () => $("heal").click() };
    if (keys[e.key]) { e.preventDefault(); keys[e.key](); }
  });
  let resizeTimer = null;
  new ResizeObserver(() => { clearTimeout(resizeTimer); resizeTimer = setTimeout(() => { if (data) { layoutView(); drawTimeline(); } drawChart(); }, 60); }).observe(document.body);
  requestAnimationFrame(frame);
  syncWorkersField();
  await refresh();
  loadChart();
}

// For tests and for people poking at the page from the console.
window.gradsyncView = {
  seek: (t) => { pause(); advanceTo(t); render(); },
  state: () => ({ now: simNow, cells: data.cells, workers: data.workers, counts: anim.state.map((a) => Array.from(a)),
                  coded: Array.from(anim.coded), fills: anim.state.map((_, s) => Array.from({ length: anim.k }, (_, c) => cellFill(s, c))) }),
  cellBox: (node, c) => { const b = cellGeometry(node); return b && { x: b.x0 + c * b.w, y: b.y0, w: b.w - 1, h: b.h }; },
  // the colour drawn at a point of the view (CSS pixels), after drawing the current state
  // (bare: without the packets, which pass over the buffers)
  pixel: (x, y, bare = false) => { hidePackets = bare; render(); hidePackets = false;
    return Array.from(V.g.getImageData(Math.round(x * V.dpr), Math.round(y * V.dpr), 1, 1).data); },
  step: () => currentStep(),
  fmt: (sec) => fmtTime(sec),
  frac: (sec) => toFrac(sec),
  follow: (c) => { setFollow(c); render(); return follow; },
  sums: () => (anim.sets ? anim.sets.map((x) => x.slice()) : null),
  carriedSets: () => (follow === null ? null : [...anim.followSets.entries()].map(([i, set]) => [i, set.length, data.transfers.carried[i], anim.span[2 * i + 1] - anim.span[2 * i]])),
  boxes: () => geom.boxes.map((b) => ({ ...b })),
  cell: () => geom.cell && { ...geom.cell },
  inFlight: () => { const t = data.transfers; let n = 0; for (const i of anim.active) if (t.start[i] < simNow && simNow < Math.min(t.done[i], anim.cut[i])) n++; return n; },
  // the export only: lay out one configuration now (no animation frame), for layout tests
  layoutFor: (p) => { load(gradsyncSite.simulation(window.gradsyncCore, window.gradsyncSchedules, p)); return geom.boxes.map((b) => ({ ...b })); },
};
init();
