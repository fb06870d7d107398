// The page starts here: the settings filled from what the source offers, every handler bound,
// the frame loop started; and window.gradsyncView, the hook tests use.
"use strict";

function legendHtml() {
  $("legend").innerHTML = `<span><i style="background:linear-gradient(90deg,${[0, 1, 2, 3, 4, 5].map((c) => chunkColor(c, 6)).join(",")})"></i>` +
    `chunk colours (chunk i starts in colour i); numbers: the sum a cell holds</span><span><i style="background:${COLOR.coded};transform:rotate(45deg)"></i>coded packet</span>` +
    `<span><i style="background:${COLOR.fail}"></i>crash, and who noticed it (a red ring: PeerError)</span><span><i style="background:${COLOR.stall}"></i>stall (alive, silent)</span>` +
    `<span><i style="border:1px solid ${COLOR.done}"></i>chunk holds the full sum</span><span><i style="background:${COLOR.wait}"></i>busiest link</span>` +
    `<span id="legend-rings"></span><span id="legend-logical" hidden><i style="border-top:2px dashed #e2e8f0;height:0"></i>who sends to whom (the algorithm's own structure)</span>`;
}

function bindSettings() {
  for (const id of Controls.FIELDS)
    $(id).addEventListener("change", () => {
      if (id === "topology") Controls.syncWorkers();
      if (id === "workers") { const m = Number($("workers").max); if (Number($("workers").value) > m) $("workers").value = String(m); Controls.clearStaleFailure(); }
      if (Controls.CHART_FIELDS.has(id)) Chart.load();
      Compare.load();
      Controls.refresh();
    });
  $("beside").addEventListener("change", () => Compare.load());
  $("fail").onclick = () => { S.failure = { device: Number($("fail-device").value), at: Number($("fail-at").value), detection: $("fail-how").value }; Controls.refresh(); };
  $("fail-how").addEventListener("change", () => { if (S.failure) { S.failure = { ...S.failure, detection: $("fail-how").value }; Controls.refresh(); } });
  $("heal").onclick = () => { S.failure = null; $("fail-note").textContent = ""; Controls.refresh(); };
  $("recover").onclick = () => {
    if (!S.data || !S.data.failure || !S.data.failure.recovery) return;
    $("workers").value = String(S.data.failure.recovery.workers); S.failure = null; Controls.refresh(); Compare.load();
  };
}

function bindPlayback() {
  const view = $("view"), timeline = $("timeline");
  $("play").onclick = () => { S.playing = !S.playing; $("play").textContent = S.playing ? "pause" : "play"; };
  $("restart").onclick = () => Animation.advanceTo(0);
  $("step").onclick = () => Controls.stepBy(1);
  $("back").onclick = () => Controls.stepBy(-1);
  $("speed").oninput = (e) => { S.speedExp = Number(e.target.value); Controls.speedLabel(); };
  $("scrub").addEventListener("input", (e) => { S.scrubbing = true; Controls.pause(); Controls.seekFraction(Number(e.target.value)); });
  $("scrub").addEventListener("change", () => { S.scrubbing = false; });
  const drag = (e) => { if (S.timeline && S.data) { Controls.pause(); Controls.seekFraction(Timeline.fractionAt(e.clientX)); } };
  timeline.addEventListener("pointerdown", (e) => { timeline.setPointerCapture(e.pointerId); drag(e); });
  timeline.addEventListener("pointermove", (e) => { if (e.buttons) drag(e); });
  view.addEventListener("pointermove", (e) => {
    if (!S.data || !S.geom) return;
    const r = view.getBoundingClientRect(), x = e.clientX - r.left, y = e.clientY - r.top;
    let best = null, bd = 18 * 18;
    for (let s = 0; s < S.data.workers; s++) { const nd = S.data.placement[s], d = (S.geom.x[nd] - x) ** 2 + (S.geom.y[nd] - y) ** 2; if (d < bd) { bd = d; best = s; } }
    S.hover = best;
  });
  view.addEventListener("pointerleave", () => { S.hover = null; });
  view.addEventListener("click", (e) => {
    if (!S.data || !S.geom) return;
    const r = view.getBoundingClientRect(), c = Layout.chunkAt(e.clientX - r.left, e.clientY - r.top);
    if (c !== undefined) { Animation.setFollow(c === S.follow ? null : c); Lesson.follow(); }
  });
  document.addEventListener("keydown", (e) => {
    if (e.target.closest && e.target.closest("input, select, textarea") || e.ctrlKey || e.metaKey || e.altKey || !S.data) return;
    const keys = { " ": () => $("play").click(), ArrowRight: () => Controls.stepBy(1), ArrowLeft: () => Controls.stepBy(-1),
                   Home: () => Animation.advanceTo(0), f: () => $("fail").click(), h: () => $("heal").click() };
    if (keys[e.key]) { e.preventDefault(); keys[e.key](); }
  });
}

async function init() {
  legendHtml();
  const offered = await Source.presets();
  S.fixedWorkers = offered.fixed_workers || {};
  $("algorithm").innerHTML = offered.algorithms.map((a) => `<option>${a}</option>`).join("");
  $("beside").innerHTML = `<option value="">none</option>` + offered.algorithms.map((a) => `<option>${a}</option>`).join("");
  $("topology").innerHTML = offered.topologies.map((a) => `<option>${a}</option>`).join("");
  for (const c of offered.compressions || []) $("compression").add(new Option(c, c));
  $("algorithm").value = "ring";
  bindSettings(); bindPlayback(); Tour.init();
  let resizeTimer = null;
  new ResizeObserver(() => { clearTimeout(resizeTimer); resizeTimer = setTimeout(() => {
    if (S.data) { Layout.place(); Canvas.drawStatic(); Timeline.draw(); Compare.draw(); } Chart.draw(); }, 60); }).observe(document.body);
  requestAnimationFrame(Controls.frame);
  Controls.syncWorkers();
  await Controls.refresh();
  Chart.load();
}

// For tests and for people poking at the page from the console.
window.gradsyncView = {
  seek: (t) => { Controls.pause(); Animation.advanceTo(t); Controls.render(); },
  state: () => ({ now: S.now, cells: S.data.cells, workers: S.data.workers, counts: S.anim.state.map((a) => Array.from(a)),
                  coded: Array.from(S.anim.coded), values: Values.now().map((a) => Array.from(a)),
                  fills: S.anim.state.map((_, s) => Array.from({ length: S.anim.k }, (_, c) => Animation.cellFill(s, c))) }),
  cellBox: (node, c) => { const b = Layout.strip(node), q = b && Math.floor(c / S.geom.cell.group); return b && { x: b.x0 + q * b.w, y: b.y0, w: b.w - 1, h: b.h }; },
  // the colour drawn at a point of the view (CSS pixels), after drawing the current state
  // (bare: without the packets, which pass over the buffers)
  pixel: (x, y, bare = false) => { S.hidePackets = bare; Controls.render(); S.hidePackets = false;
    return Array.from(S.view.g.getImageData(Math.round(x * S.view.dpr), Math.round(y * S.view.dpr), 1, 1).data); },
  step: () => Animation.currentRounds()[0],
  rounds: () => Animation.currentRounds(),
  fmt: (sec) => fmtTime(sec),
  frac: (sec) => Animation.toFrac(sec),
  follow: (c) => { Animation.setFollow(c); Controls.render(); Lesson.follow(); return S.follow; },
  sums: () => (S.anim.sets ? S.anim.sets.map((x) => x.slice()) : null),
  carriedSets: () => (S.follow === null ? null : [...S.anim.followSets.entries()].map(([i, set]) => [i, set.length, S.data.transfers.carried[i], S.anim.span[2 * i + 1] - S.anim.span[2 * i]])),
  boxes: () => S.geom.boxes.map((b) => ({ ...b })),
  chartBoxes: () => ({ boxes: S.chart.boxes.map((b) => ({ ...b })), size: S.chart.size, styles: stats.chartStyles }),
  cell: () => S.geom.cell && { ...S.geom.cell },
  inFlight: () => { const t = S.data.transfers; let n = 0; for (const i of S.anim.active) if (t.start[i] < S.now && S.now < Math.min(t.done[i], S.anim.cut[i])) n++; return n; },
  // the export only: lay out one configuration now (no animation frame), for layout tests
  layoutFor: (p) => { Controls.show(Source.simulateNow(p)); return S.geom.boxes.map((b) => ({ ...b })); },
  tour: (k) => Tour.show(k),
};
init();
