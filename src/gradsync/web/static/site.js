// The static export's answers to the page's questions, computed in the page: what the server's
// /api/simulate (web.view.simulate_now) and /api/compare return, from the exported model
// (data/model.js, data/schedules-*.js) and gradsyncModel's simulator. Bad input is an error
// naming its field (err.field), shown next to it.
"use strict";
const gradsyncSite = (() => {
  const M = gradsyncModel, CODED = 2;
  const topologies = new Map();
  function fieldError(field, message) { const e = new Error(message); e.field = field; return e; }

  // A family's integer columns as written: a list, or runs of equal steps (site_model.pack).
  function unpack(column) {
    if (!column || Array.isArray(column)) return column;
    const r = column.runs, out = [r[0]];
    for (let j = 1; j < r.length; j += 2) { const base = out[out.length - 1]; for (let k = 1; k <= r[j + 1]; k++) out.push(base + r[j] * k); }
    return out;
  }
  function unpacked(f) {
    if (f.unpacked) return f;
    for (const key of ["src", "dst", "round", "op", "a", "b", "q", "carried", "channel"]) if (key in f) f[key] = unpack(f[key]);
    if (f.compute) for (const key of Object.keys(f.compute)) f.compute[key] = unpack(f.compute[key]);
    f.unpacked = true;
    return f;
  }

  function treeSegments(bytes, most) {                              // web.options.tree_segments
    const wanted = Math.max(1, Math.ceil(Math.floor(bytes / 4) / (1 << 18)));
    let s = 1; while (s < wanted) s *= 2;
    return Math.min(most, s);
  }

  // The checked configuration: the schedule family, the topology with its links, the elements.
  function configure(core, schedules, p) {
    const preset = p.topology, fixed = core.fixed_workers[preset];
    const n = fixed ? Math.min(p.workers, fixed) : p.workers, offered = core.worker_counts[preset];
    if (!Number.isInteger(p.workers) || p.workers < 2) throw fieldError("workers", `workers must be an integer >= 2, got ${p.workers}`);
    if (!offered.includes(n)) throw fieldError("workers", `this export offers ${offered.slice(0, 15).join(", ")}${offered.length > 15 ? ", " + offered.slice(15).join(", ") : ""} workers on ${preset}, not ${n}`);
    let bytes;
    try { bytes = M.parseSize(p.size); } catch (e) { throw fieldError("size", e.message); }
    const lim = core.limits;
    if (!(lim.min_bytes <= bytes && bytes <= lim.max_bytes)) throw fieldError("size", `size must be between ${lim.min_bytes / 1e3} kB and ${lim.max_bytes / 1e9} GB in this export, got '${p.size}'`);
    const links = {};
    for (const [key, parse, range, text] of [["bandwidth", M.parseBandwidth, lim.bandwidth, "1KB/s and 10TB/s"], ["latency", M.parseTime, lim.latency, "0 and 1s"]]) {
      if (p[key] === undefined || p[key] === null || p[key] === "") { links[key] = null; continue; }
      try { links[key] = parse(p[key]); } catch (e) { throw fieldError(key, e.message); }
      if (!(range[0] <= links[key] && links[key] <= range[1])) throw fieldError(key, `${key} must be between ${text}, got '${p[key]}'`);
    }
    const segments = treeSegments(bytes, lim.tree_segments);
    const uniform = links.bandwidth !== null ? "|uniform" : "";   // one bandwidth: options as on one tier of links
    const key = core.index[`${p.algorithm}|${preset}|${n}|${segments}${uniform}`] ?? core.index[`${p.algorithm}|${preset}|${n}|0${uniform}`];
    const found = key && schedules[p.algorithm] && schedules[p.algorithm][key], family = found && unpacked(found);
    if (!family) throw fieldError("algorithm", `${p.algorithm} is not defined on ${preset} with ${n} workers`);
    const topoKey = `${preset}|${n}|${links.bandwidth}|${links.latency}`;
    if (!topologies.has(topoKey)) {                                // one object per links: its routes are kept
      if (topologies.size >= 64) topologies.delete(topologies.keys().next().value);
      topologies.set(topoKey, M.withLinks(core.presets[`${preset}|${n}`], links.bandwidth, links.latency));
    }
    const topo = topologies.get(topoKey);
    let itemsize = 4;
    if (p.compression) {                         // fp16 / bf16: the same collective in 2-byte elements
      if (!core.compressions.includes(p.compression)) throw fieldError("compression", `this export offers compression ${core.compressions.join(" or ")}, not '${p.compression}'`);
      if (!core.exact_only.includes(p.algorithm)) throw fieldError("compression", `in this export, compression applies to the exact algorithms; run gradsync serve for ${p.algorithm} with ${p.compression}`);
      itemsize = 2;
    }
    return { family, topo, n, bytes, elements: Math.floor(bytes / 4), links, preset, itemsize };
  }

  function cells(family, sim, d, n, maxCells) {                      // web.view.chunk_cuts
    const linspace = (num) => Array.from({ length: num }, (_, i) => (i === num - 1 ? d : Math.trunc(i * (d / (num - 1)))));
    const uniq = (xs) => [...new Set(xs)].sort((a, b) => a - b);
    let cuts;
    if (family.mode === "ceil") { const c = family.components, m = Math.ceil(d / c); cuts = uniq(Array.from({ length: c + 1 }, (_, i) => Math.min(i * m, d))); }
    else { const xs = [0, d]; for (const j of sim.kept) xs.push(sim.offset[j], sim.offset[j] + sim.count[j]); cuts = uniq(xs); }
    if (cuts.length - 1 < n) cuts = uniq(cuts.concat(linspace(n + 1)));
    if (cuts.length - 1 > maxCells) cuts = uniq(linspace(maxCells + 1));
    return cuts;
  }

  function drawing(c, sim) {
    const cb = sim.channelBytes, topo = c.topo;
    return { name: topo.name, preset: c.preset, description: topo.description, fixed_workers: topo.fixed_workers, fill: topo.fill,
             nodes: topo.nodes.map((nd) => ({ name: nd.name, kind: nd.kind, x: nd.x, y: nd.y })),
             links: topo.links.map((l, k) => ({ a: l.a, b: l.b, bandwidth: l.bandwidth, latency: l.latency, bend: l.bend,
                                                bytes: cb[2 * k] + cb[2 * k + 1], busy_s: Math.max(cb[2 * k], cb[2 * k + 1]) / l.bandwidth })) };
  }

  // Everything the page draws for one collective: /api/simulate's answer.
  function simulation(core, schedules, p) {
    const c = configure(core, schedules, p), f = c.family, sim = M.simulate(f, c.elements, c.topo, c.itemsize);
    const names = sim.placement.map((i) => c.topo.nodes[i].name), kept = sim.kept;
    const routeIndex = new Map(), routes = [];
    const route = kept.map((j) => { const k = f.src[j] * f.nodes + f.dst[j];
      if (!routeIndex.has(k)) { routeIndex.set(k, routes.length); routes.push(sim.routes.get(k).nodes); } return routeIndex.get(k); });
    const pick = (xs) => kept.map((j) => xs[j]);
    const out = {
      algorithm: p.algorithm, summary: core.summaries[p.algorithm], explanation: core.explanations[p.algorithm],
      topology: drawing(c, sim), workers: c.n, bytes: c.bytes, elements: c.elements, time_s: sim.time, rounds: f.rounds,
      options: f.options, busbw_GBps: sim.time > 0 ? c.bytes / sim.time * 2 * (c.n - 1) / c.n / 1e9 : 0,
      error: f.estimate ? f.estimate.error : null, estimate: f.estimate, placement: sim.placement,
      cells: cells(f, sim, c.elements, c.n, core.limits.max_cells),
      narration: f.narration.map((s) => Object.fromEntries(Object.entries(s).map(([k, v]) =>
        [k, typeof v === "string" ? v.replace(/\u00ab(\d+)\u00bb/g, (_, i) => names[Number(i)]) : v]))),
      transfers: { src: pick(f.src), dst: pick(f.dst), round: pick(f.round), op: pick(f.op), offset: pick(sim.offset),
                   count: pick(sim.count), carried: pick(f.carried), start: Array.from(sim.start), done: Array.from(sim.done), route,
                   channel: f.channel ? pick(f.channel) : null },
      routes, failure: null, compression: null, links_in_force: c.links,
    };
    if (p.compression) {
      const sent = new Float64Array(f.nodes); for (const j of kept) sent[f.src[j]] += sim.count[j];
      out.compression = { codec: p.compression, itemsize: c.itemsize, collectives: p.algorithm, wire_bytes: Math.max(...sent) * c.itemsize };
    }
    if (p.fail) {
      const { device, at } = p.fail;
      if (!(Number.isInteger(device) && device >= 0 && device < c.n)) throw fieldError("fail-device", `fail.device must be a worker in 0..${c.n - 1}, got ${device}`);
      const opts = detectionOf(core, p.fail);
      const fail = M.failure({ src: out.transfers.src, dst: out.transfers.dst, round: out.transfers.round },
                             { kept: kept.map((_, i) => i), start: sim.start, done: sim.done }, device, at * sim.time, opts);
      out.failure = { ...fail, recovery: recovery(core, schedules, p, c.n) };
    }
    return out;
  }

  // How the failure is found (web/failures.failure's parameters): the runtime's liveness-check
  // interval and timeout, exported from gradsync.runtime (data/model.js), unless the request sets them.
  function detectionOf(core, fail) {
    const d = core.detection, detection = fail.detection ?? "crash";
    if (!d.modes.includes(detection)) throw fieldError("fail-how", `fail.detection must be one of ${d.modes.join(", ")}, got '${detection}'`);
    const every = fail.check_every_s ?? d.check_every_s, timeout = fail.timeout_s ?? d.timeout_s;
    if (!(typeof every === "number" && every >= 0 && every <= 10)) throw fieldError("fail-how", `fail.check_every_s must be between 0 and 10 seconds, got ${every}`);
    if (!(typeof timeout === "number" && timeout > 0 && timeout <= 1e6)) throw fieldError("fail-how", `fail.timeout_s must be a positive number of seconds up to 1e6, got ${timeout}`);
    return { detection, check_every_s: every, timeout_s: timeout };
  }

  function recovery(core, schedules, p, n) {                        // web.view._recovery
    if (n - 1 < 2) return { workers: n - 1, time_s: null, note: "one survivor has nothing to synchronize with" };
    try { return { workers: n - 1, time_s: time(core, schedules, { ...p, workers: n - 1, fail: null }), note: "" }; }
    catch (e) { return { workers: n - 1, time_s: null, note: e.message }; }
  }

  function time(core, schedules, p) { const c = configure(core, schedules, p); return M.simulate(c.family, c.elements, c.topo, c.itemsize).time; }

  // Time against workers per algorithm (/api/compare's simulated curves; no closed forms here).
  function comparison(core, schedules, p, algorithm) {
    const offered = core.worker_counts[p.topology], most = core.fixed_workers[p.topology];
    const workers = most ? [2, 3, 4, 6, 8, 12].filter((n) => n < most).concat([most]) : [2, 3, 4, 8, 16, 32, 64].filter((n) => offered.includes(n));
    const sim = workers.map((n) => { try { return time(core, schedules, { ...p, algorithm, workers: n, fail: null, compression: null }); } catch (e) { if (e.field === "algorithm") return null; throw e; } });
    const bytes = M.parseSize(p.size), seed = p.topology === "pcie-switch-4" && bytes === 160e6 && !p.bandwidth && !p.latency;
    return { workers, bytes, curves: { [algorithm]: { simulated_s: sim, closed_form_s: workers.map(() => null), exact: !!(core.exact || {})[algorithm] } },
             book_marks: seed ? Object.entries(core.book_figures).map(([a, v]) => ({ algorithm: a, workers: 4, time_s: v })) : [],
             topology: `${p.topology}, 2 to ${workers[workers.length - 1]} workers (simulated in this page)` };
  }

  return { configure, simulation, comparison, time, treeSegments };
})();
if (typeof window !== "undefined") window.gradsyncSite = gradsyncSite;
