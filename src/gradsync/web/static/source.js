// Where the page's answers come from: the server's JSON API (gradsync serve), or in a static
// export (gradsync serve --export) the page itself, timing the exported schedules with
// gradsync's simulator read in JS (site.js, model.js). Both give the same answers in the same
// form, so no other part of the page knows which it runs on.
"use strict";

const Source = (() => {
  const STATIC = window.GRADSYNC_STATIC === true;
  // An export's data are scripts that call window.gradsyncData(key, value), loaded on demand
  // (scripts load from file:// URLs, where fetch is refused).
  const exported = {};
  window.gradsyncData = (key, value) => { exported[key] = value; };
  window.gradsyncSchedules = {};
  let core = null;

  function staticData(key) {
    return new Promise((ok, fail) => {
      if (key in exported) return ok(exported[key]);
      const script = document.createElement("script");
      script.src = `data/${key}.js`;
      script.onload = () => (key in exported ? ok(exported[key]) : fail(new Error(`no data for ${key}`)));
      script.onerror = () => fail(new Error(`this export has no ${key.replace(/-/g, " ")}`));
      document.head.appendChild(script);
    });
  }
  async function schedulesFor(names) {
    for (const name of names) {
      if (name in window.gradsyncSchedules) continue;
      const data = await staticData(`schedules-${name}`);          // the families, and their sentences' forms
      for (const f of Object.values(data.families)) f.forms = data.forms;
      window.gradsyncSchedules[name] = data.families;
    }
  }
  const loadAll = () => schedulesFor(core.algorithms.concat(["all_gather"]));
  // the families a question needs: its algorithm's, and the ring's all-gather for codecs that gather
  const needed = (params, algorithm) => [algorithm].concat(/^(topk|sign)/.test(params.compression || "") ? ["all_gather"] : []);

  // What the page offers: algorithms, topologies, codecs, the runtime's detection parameters.
  async function presets() {
    if (!STATIC) return (await fetch("api/presets")).json();
    core = window.gradsyncCore = await staticData("model");
    if (core.cerar) window.gradsyncCerar = await staticData("cerar");
    return core;
  }

  // An answer computed in the page: 200 with the body, or 400 with the error (and its field).
  function answer(fn) {
    try { return { ok: true, status: 200, body: fn() }; }
    catch (e) { return { ok: false, status: 400, body: { detail: e.message, field: e.field || null } }; }
  }

  // Ask the server, asking again while it answers 202 (still computing) unless `stale()` says
  // a newer question owns the answer; `waiting(detail)` is told each time it waits.
  async function ask(url, init, stale, waiting) {
    for (;;) {
      const r = await fetch(url, init), body = await r.json();
      if (stale() || r.status !== 202) return { ok: r.ok, status: r.status, body };
      if (waiting) waiting(body.detail);
      await new Promise((ok) => setTimeout(ok, 1000 * Number(r.headers.get("retry-after") || 1)));
      if (stale()) return { ok: false, status: 0, body: {} };
    }
  }

  async function simulate(params, signal, stale, waiting) {
    if (STATIC) {
      await schedulesFor(needed(params, params.algorithm));
      return answer(() => gradsyncSite.simulation(core, window.gradsyncSchedules, params));
    }
    return ask("api/simulate", { method: "POST", headers: { "content-type": "application/json" },
                                 body: JSON.stringify(params), signal }, stale, waiting);
  }
  // The export only: one configuration computed now (tests lay out many without waiting).
  const simulateNow = (params) => gradsyncSite.simulation(core, window.gradsyncSchedules, params);

  async function compare(params, algorithm, signal, stale) {
    if (STATIC) {
      await schedulesFor(needed(params, algorithm));
      await new Promise((ok) => setTimeout(ok, 0));            // a frame between curves
      return answer(() => gradsyncSite.comparison(core, window.gradsyncSchedules, params, algorithm));
    }
    const q = new URLSearchParams({ size: params.size, topology: params.topology, algorithm });
    for (const key of ["bandwidth", "latency", "components", "eps", "compression"]) if (params[key] !== undefined) q.set(key, params[key]);
    return ask("api/compare?" + q.toString(), { signal }, stale);
  }

  // The worker counts a topology is offered at (null: any from 2 to 64).
  const workerCounts = (topology) => (STATIC ? core.worker_counts[topology] : null);

  return { STATIC, presets, simulate, simulateNow, compare, loadAll, workerCounts };
})();
window.gradsyncLoadAll = () => Source.loadAll();
