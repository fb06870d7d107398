// The settings and the playback controls: what they ask for (params), the answer put on screen
// (refresh, show), errors under the field that caused them, the frame loop, the keyboard and
// the hook tests and curious people use from the console.
"use strict";

const Controls = (() => {
  const FIELDS = ["algorithm", "topology", "workers", "size", "bandwidth", "latency", "compression", "components", "eps"];
  const CHART_FIELDS = new Set(["topology", "size", "bandwidth", "latency", "components", "eps", "compression"]);
  const FIELD_OF = [[/^(bad size|size)/, "size"], [/^(bad bandwidth|bandwidth)/, "bandwidth"], [/^(bad duration|latency)/, "latency"],
    [/^fail\.(detection|check_every_s|timeout_s)/, "fail-how"], [/^fail\.device|^fail/, "fail-device"], [/^(workers|this export offers|topology .* has)/, "workers"],
    [/^components/, "components"], [/^eps/, "eps"], [/^(compression|unknown codec|in this export, compression)/, "compression"], [/^(algorithm|unknown algorithm)/, "algorithm"]];
  const fieldOf = (message) => (FIELD_OF.find(([re]) => re.test(message)) || [null, null])[1];

  function params() {
    const p = { algorithm: $("algorithm").value, topology: $("topology").value, workers: Number($("workers").value),
                size: $("size").value.trim() || "160MB" };
    for (const id of ["bandwidth", "latency"]) if (filled(id)) p[id] = $(id).value.trim();
    if (filled("eps")) p.eps = Number($("eps").value);
    if (filled("components")) p.components = Number($("components").value);
    if ($("compression").value) p.compression = $("compression").value;
    if (S.failure) p.fail = S.failure;
    return p;
  }

  // An error is shown under the field that caused it (the whole message; the old drawing is
  // dimmed so it is not taken for the answer).
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

  async function refresh() {
    const seq = ++S.seq;
    S.pendingSince = performance.now();
    if (S.controller) S.controller.abort();
    S.controller = new AbortController();
    stats.requests++; stats.pending = true;
    $("status").textContent = "simulating…";
    try {
      const r = await Source.simulate(params(), S.controller.signal, () => seq !== S.seq, (detail) => { $("status").textContent = "computing… " + detail; });
      if (seq !== S.seq) return;                                      // a newer request owns the view
      stats.pending = false; $("status").textContent = "";
      if (!r.ok) {
        const m = typeof r.body.detail === "string" ? r.body.detail : JSON.stringify(r.body.detail);
        showError(r.body.field || fieldOf(m), m); S.pendingSince = null; return;
      }
      showError(null);
      const keep = S.data && S.data.time_s > 0 ? Math.min(S.now / S.data.time_s, 1) : 0;
      show(r.body);
      Animation.advanceTo(keep * r.body.time_s);                      // a change keeps the position
    } catch (e) {
      if (e.name !== "AbortError" && seq === S.seq) { $("status").textContent = String(e); stats.pending = false; }
    }
  }

  // Put one answer on screen.
  function show(d) {
    S.data = d;
    Animation.prepare(d);
    Layout.place(); Canvas.drawStatic(); Timeline.draw(); Lesson.panels(); Lesson.summary();
    $("total-time").textContent = fmtTime(S.anim.end) + (S.anim.end > d.time_s ? ` (healthy run ${fmtTime(d.time_s)})` : "");
    $("total-time").dataset.timeS = String(d.time_s);
    const f = d.failure;
    Object.assign(stats, { drawnWorkers: d.workers, loadedAt: performance.now(), timeS: d.time_s, cell: S.geom.cell && { ...S.geom.cell },
      failure: f ? { device: f.device, at_s: f.at_s, detection: f.detection, first_s: Lesson.firstNotice(f).at_s, last_s: S.anim.lastStop, end_s: S.anim.end } : null });
    $("cells-note").textContent = !S.geom.cell ? `${S.anim.k} chunks per buffer do not fit under ${d.workers} workers here: each worker's ring shows how much of the sum it holds.`
      : S.geom.cell.group > 1 ? `Each cell stands for ${S.geom.cell.group} neighbouring chunks (one chunk would be under 8 px): its fill is their mean.` : "";
    speedLabel();
    // the side-by-side strips and the chart's mark after the first frame of the new answer
    requestAnimationFrame(() => setTimeout(() => { if (S.data !== d) return; Compare.table(); Compare.draw(); if (S.chart.meta) Chart.draw(); }, 0));
  }

  // The controls set from a tour step (or any caller), the answer awaited.
  async function apply(values, failure) {
    for (const [id, v] of Object.entries(values)) {
      if ($(id).value === v) continue;
      $(id).value = v;
      if (id === "topology") syncWorkers(values.workers);
    }
    S.failure = failure;
    Chart.load(); Compare.load();
    await refresh();
  }

  function pause() { S.playing = false; $("play").textContent = "play"; }
  function playSeconds() { return Math.min(PLAY_LIMITS[1], Math.max(PLAY_LIMITS[0], ROUND_SECONDS * Math.max(S.data.rounds, 1))); }
  function speedLabel() {
    if (!S.data) return;
    const perRound = playSeconds() / Math.max(S.data.rounds, 1) / Math.pow(10, S.speedExp);
    $("speed-label").textContent = `1 round ≈ ${perRound >= 10 ? perRound.toFixed(0) : perRound.toPrecision(2)} s`;
    stats.secondsPerRound = perRound;
  }
  function stepBy(dir) {
    pause();
    const eps = 1e-12 * S.data.time_s, stops = Animation.stops();
    const next = dir > 0 ? stops.find((e) => e > S.now + eps) : stops.filter((e) => e < S.now - eps).pop();
    Animation.advanceTo(next === undefined ? (dir > 0 ? S.anim.end : 0) : next);
  }
  const seekFraction = (f) => Animation.advanceTo(Animation.fromFrac(Math.max(0, Math.min(1, f))));

  function frame(ts) {
    requestAnimationFrame(frame);                       // first: nothing below can end the loop
    if (S.lastFrame !== null) {
      const dt = ts - S.lastFrame;
      stats.fps = stats.fps ? 0.9 * stats.fps + 0.1 * (1000 / Math.max(dt, 1)) : 1000 / Math.max(dt, 1);
      if (S.data && S.playing) {
        let next = Animation.toFrac(S.now) + dt * S.anim.split / (playSeconds() * 1000) * Math.pow(10, S.speedExp);
        if (next > 1 + 0.15 * S.anim.split) next = 0;        // loop, with a short pause at the end
        Animation.advanceTo(Animation.fromFrac(next));
      }
    }
    S.lastFrame = ts;
    stats.frames++;
    render();
  }
  function render() {
    if (!S.data || !S.view) return;
    Canvas.render(); Timeline.drawCursor(); Compare.cursor();
    Lesson.narration(); Lesson.failureEvents();
    if (S.anim.followShown !== S.anim.donePtr) { S.anim.followShown = S.anim.donePtr; Lesson.follow(); }
    $("now").textContent = fmtTime(Math.min(S.now, S.anim.end));
    if (!S.scrubbing) $("scrub").value = String(S.data.time_s > 0 ? Math.min(Animation.toFrac(S.now), 1) : 0);
    if (S.pendingSince !== null && stats.loadedAt >= S.pendingSince) {
      stats.updateMs = performance.now() - S.pendingSince;
      S.pendingSince = null;
    }
  }

  // The workers field follows the topology: a fixed machine's count (fewer can be chosen after).
  function syncWorkers(wanted) {
    const fixed = S.fixedWorkers[$("topology").value], field = $("workers"), counts = Source.workerCounts($("topology").value);
    field.max = String(fixed || (counts ? Math.max(...counts) : 64));
    if (fixed) field.value = String(wanted ? Math.min(Number(wanted), fixed) : fixed);
    $("workers-note").textContent = fixed ? `${$("topology").value} has ${fixed} GPUs: at most ${fixed} workers` : "";
    clearStaleFailure();
  }

  // A failure of a device the controls no longer have is cleared (and said so), never kept to
  // refuse every later change.
  function clearStaleFailure() {
    const n = Number($("workers").value), field = $("fail-device");
    field.max = String(Math.max(0, n - 1));
    if (Number(field.value) > n - 1) field.value = String(Math.max(0, n - 1));
    if (S.failure && S.failure.device > n - 1) {
      $("fail-note").textContent = `the failure of device ${S.failure.device} was cleared: there are ${n} workers now`;
      S.failure = null;
    }
  }

  return { params, showError, refresh, show, apply, pause, stepBy, seekFraction, frame, render, syncWorkers, clearStaleFailure, fieldOf, FIELDS, CHART_FIELDS, speedLabel };
})();
