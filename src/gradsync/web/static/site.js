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
  // A sentence as written: [round, phase form, text form, numbers...] (site_model.told_in_forms).
  function told(row, forms) {
    let k = 3;
    const fill = (form) => form.replace(/#/g, () => String(row[k++]));
    const phase = fill(forms[row[1]]);
    return { round: row[0], phase, text: fill(forms[row[2]]) };
  }
  function unpacked(f) {
    if (f.unpacked) return f;
    if (f.narration && f.forms) f.narration = f.narration.map((row) => told(row, f.forms));
    for (const key of ["src", "dst", "round", "op", "a", "b", "q", "carried", "channel", "lane"]) if (key in f) f[key] = unpack(f[key]);
    if (f.compute) for (const key of Object.keys(f.compute)) f.compute[key] = unpack(f.compute[key]);
    f.unpacked = true;
    return f;
  }

  function treeSegments(bytes, most) {                              // web.options.tree_segments
    const wanted = Math.max(1, Math.ceil(Math.floor(bytes / 4) / (1 << 18)));
    let s = 1; while (s < wanted) s *= 2;
    return Math.min(most, s);
  }

  // The collectives a codec runs on `e` float32 elements of gradient, one after another: the
  // arithmetic of each codec's `wire` (gradsync.compression: fp16.py, powersgd.py, topk.py,
  // sign.py) for one flat buffer, checked against them by a test. [kind, elements, itemsize].
  function isqrt(x) { let r = Math.floor(Math.sqrt(x)); while (r * r > x) r--; while ((r + 1) * (r + 1) <= x) r++; return r; }
  function wires(codec, e) {
    const [name, arg] = codec.split(":"), value = arg ? Number(arg.split("=")[1]) : null;
    if (name === "fp16" || name === "bf16") return [["all_reduce", e, 2]];
    if (name === "powersgd") {
      const cols = Math.max(1, isqrt(Math.max(e - 1, 0)) + 1), rows = Math.max(1, Math.ceil(e / cols)), k = Math.min(value, rows, cols);
      return [["all_reduce", rows * k, 4], ["all_reduce", cols * k, 4]];
    }
    if (name === "topk") return [["all_gather", 2 * (e ? Math.min(e, Math.max(1, Math.ceil(value * e))) : 0), 4]];
    if (name === "sign") return [["all_gather", Math.ceil(e / 8) + 4, 1]];
    throw fieldError("compression", `unknown codec '${codec}'`);
  }

  // The family for one collective: the algorithm's (in float16 for CERAR's fp16 packets), or
  // the ring's all-gather of n parts.
  function familyFor(core, schedules, algorithm, preset, n, bytes, uniform, wire) {
    if (wire && wire[0] === "all_gather") {
      const f = schedules.all_gather && schedules.all_gather[String(n)];
      if (!f) throw fieldError("compression", `this export has no all-gather of ${n} workers`);
      return unpacked(f);
    }
    const dtypes = core.dtypes[algorithm], dtype = wire && wire[2] === 2 ? (wire.codec === "bf16" ? "bfloat16" : "float16") : "float32";
    if (dtypes && !dtypes.includes(dtype)) throw fieldError("compression", `algorithm '${algorithm}' needs ${dtypes.slice(0, -1).join(", ")} or ${dtypes[dtypes.length - 1]} tensors, got ${dtype}`);
    const segments = treeSegments(bytes, core.limits.tree_segments);
    let key = core.index[`${algorithm}|${preset}|${n}|${segments}${uniform}`] ?? core.index[`${algorithm}|${preset}|${n}|0${uniform}`];
    if (key && dtype === "float16" && core.dtypes[algorithm]) key += "|float16";    // a coded design depends on the dtype
    const found = key && schedules[algorithm] && schedules[algorithm][key];
    if (!found) throw fieldError("algorithm", `${algorithm} is not defined on ${preset} with ${n} workers${dtype !== "float32" ? " in " + dtype : ""}`);
    return unpacked(found);
  }

  function linksOf(core, p) {
    const lim = core.limits, links = {};
    for (const [key, parse, range, text] of [["bandwidth", M.parseBandwidth, lim.bandwidth, "1KB/s and 10TB/s"], ["latency", M.parseTime, lim.latency, "0 and 1s"]]) {
      if (p[key] === undefined || p[key] === null || p[key] === "") { links[key] = null; continue; }
      try { links[key] = parse(p[key]); } catch (e) { throw fieldError(key, e.message); }
      if (!(range[0] <= links[key] && links[key] <= range[1])) throw fieldError(key, `${key} must be between ${text}, got '${p[key]}'`);
    }
    return links;
  }

  // The checked configuration: the collectives (families and their elements), the topology with
  // its links, the bytes per element.
  function configure(core, schedules, p) {
    const preset = p.chartPreset || p.topology, fixed = core.fixed_workers[p.topology];
    const n = fixed && !p.chartPreset ? Math.min(p.workers, fixed) : p.workers, offered = p.chartPreset ? core.chart_switch : core.worker_counts[preset];
    if (!Number.isInteger(p.workers) || p.workers < 2) throw fieldError("workers", `workers must be an integer >= 2, got ${p.workers}`);
    if (!offered.includes(n)) throw fieldError("workers", `this export offers ${offered.join(", ")} workers on ${preset}, not ${n}`);
    let bytes;
    try { bytes = M.parseSize(p.size); } catch (e) { throw fieldError("size", e.message); }
    const lim = core.limits;
    if (!(lim.min_bytes <= bytes && bytes <= lim.max_bytes)) throw fieldError("size", `size must be between ${lim.min_bytes} B and ${lim.max_bytes / 1e9} GB, got '${p.size}'`);
    const links = linksOf(core, p), uniform = links.bandwidth !== null ? "|uniform" : "";   // one bandwidth: options as on one tier of links
    const elements = Math.floor(bytes / 4);
    if (p.compression && !core.compressions.includes(p.compression)) throw fieldError("compression", `unknown codec '${p.compression}': expected one of ${core.compressions.join(", ")}`);
    const plan = p.compression ? wires(p.compression, elements) : [["all_reduce", elements, 4]];
    if (new Set(plan.map((w) => w[2])).size !== 1) throw fieldError("compression", `compression '${p.compression}' mixes element sizes; the view draws one`);
    const parts = plan.map((w) => { w.codec = p.compression;
      return { family: familyFor(core, schedules, p.algorithm, preset, n, bytes, uniform, p.compression ? w : null), elements: w[0] === "all_gather" ? n * w[1] : w[1] }; });
    const topoKey = `${preset}|${n}|${links.bandwidth}|${links.latency}`;
    if (!topologies.has(topoKey)) {                                // one object per links: its routes are kept
      if (topologies.size >= 64) topologies.delete(topologies.keys().next().value);
      topologies.set(topoKey, M.withLinks(core.presets[`${preset}|${n}`], links.bandwidth, links.latency));
    }
    return { parts, topo: topologies.get(topoKey), n, bytes, elements, links, preset, itemsize: plan[0][2] };
  }

  // Several collectives one after another as one family over a buffer that lays their payloads
  // end to end, each keeping its own chunks (web.view._compressed); one stays as it is.
  function compose(parts) {
    if (parts.length === 1) return { family: parts[0].family, elements: parts[0].elements };
    const f = { mode: "given", src: [], dst: [], round: [], op: [], carried: [], offset: [], count: [], rounds: 0, nodes: 0,
                workers: parts[0].family.workers, helpers: parts[0].family.helpers, name: `${parts[0].family.name} x ${parts.length}`, options: {}, narration: null, estimate: null,
                compute: { node: [], round: [] }, madds: null };   // as the server's composed schedule: no local compute
    let offset = 0;
    for (const { family, elements } of parts) {
      const pc = M.pieces(family, elements);
      family.src.forEach((s, j) => {
        f.src.push(s); f.dst.push(family.dst[j]); f.round.push(family.round[j] + f.rounds); f.op.push(family.op[j]);
        f.carried.push(family.carried[j]); f.offset.push(pc.offset[j] + offset); f.count.push(pc.count[j]);
      });
      f.rounds += family.rounds; f.nodes = Math.max(f.nodes, family.nodes); offset += elements;
    }
    return { family: f, elements: offset };
  }

  function cells(family, sim, d, n, maxCells) {                      // web.view.chunk_cuts
    const linspace = (num) => Array.from({ length: num }, (_, i) => (i === num - 1 ? d : Math.trunc(i * (d / (num - 1)))));
    const uniq = (xs) => [...new Set(xs)].sort((a, b) => a - b);
    let cuts;
    if (family.mode === "ceil") { const c = family.components, m = Math.ceil(d / c); cuts = uniq(Array.from({ length: c + 1 }, (_, i) => Math.min(i * m, d))); }
    else { const xs = [0, d]; for (const j of sim.kept) xs.push(sim.offset[j], sim.offset[j] + sim.count[j]); cuts = uniq(xs); }
    if (cuts.length - 1 < n) {                // each piece cut in k equal chunks, so a piece stays whole chunks
      const k = Math.ceil(n / (cuts.length - 1)), xs = [d];
      for (let i = 0; i + 1 < cuts.length; i++) for (let j = 0; j < k; j++) xs.push(cuts[i] + Math.floor((cuts[i + 1] - cuts[i]) * j / k));
      cuts = uniq(xs);
    }
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

  // The sentences: the family's own, where every transfer it narrates is there at this size; a
  // round whose transfers changed (empty pieces dropped at tiny sizes) or a composed schedule
  // (PowerSGD's two all-reduces) gets its transfers listed by the page instead ("listed").
  function narration(f, sim, names) {
    const rounds = [...new Set(sim.kept.map((j) => f.round[j]))].sort((a, b) => a - b);
    if (!f.narration) return rounds.map((r) => ({ round: r, phase: "", text: null, listed: true }));
    const all = new Map(), kept = new Map();
    f.round.forEach((r) => all.set(r, (all.get(r) || 0) + 1));
    sim.kept.forEach((j) => kept.set(f.round[j], (kept.get(f.round[j]) || 0) + 1));
    const told = new Map(f.narration.map((s) => [s.round, s]));
    return rounds.map((r) => (all.get(r) === kept.get(r) && told.has(r) ? { ...told.get(r), text: told.get(r).text.replace(/\u00ab(\d+)\u00bb/g, (_, i) => names[Number(i)]) }
      : { round: r, phase: told.has(r) ? told.get(r).phase : "", text: null, listed: true }));
  }

  // The closed form for the preset's links (its affine terms at these bytes; fp16's wire is half).
  function closedForm(core, p, c) {
    if (c.links.bandwidth !== null || c.links.latency !== null || (p.compression && c.itemsize !== 2)) return null;
    const segments = treeSegments(c.bytes, core.limits.tree_segments);
    const e = core.closed[`${p.algorithm}|${c.preset}|${c.n}|${segments}`] || core.closed[`${p.algorithm}|${c.preset}|${c.n}|0`];
    if (!e) return null;
    const terms = Object.fromEntries(Object.entries(e.terms).map(([k, [a, b]]) => [k, a + b * c.bytes]));
    if (c.itemsize === 2) { terms.closed_form -= terms.bandwidth / 2; terms.bandwidth /= 2; }
    return { formula: e.formula, net: e.net, terms };
  }

  // Everything the page draws for one collective: /api/simulate's answer.
  function simulation(core, schedules, p) {
    const c = configure(core, schedules, p), { family: f, elements } = compose(c.parts), sim = M.simulate(f, elements, c.topo, c.itemsize);
    const names = sim.placement.map((i) => c.topo.nodes[i].name), kept = sim.kept;
    const routeIndex = new Map(), routes = [];
    const route = kept.map((j) => { const k = f.src[j] * f.nodes + f.dst[j];
      if (!routeIndex.has(k)) { routeIndex.set(k, routes.length); routes.push(sim.routes.get(k).nodes); } return routeIndex.get(k); });
    const pick = (xs) => kept.map((j) => xs[j]);
    const out = {
      algorithm: p.algorithm, summary: core.summaries[p.algorithm], explanation: core.explanations[p.algorithm],
      topology: drawing(c, sim), workers: c.n, bytes: c.bytes, elements, time_s: sim.time, rounds: f.rounds,
      options: f.options, busbw_GBps: sim.time > 0 ? c.bytes / sim.time * 2 * (c.n - 1) / c.n / 1e9 : 0,
      error: f.estimate ? f.estimate.error : null, estimate: f.estimate, placement: sim.placement,
      cells: cells(f, sim, elements, c.n, core.limits.max_cells), narration: narration(f, sim, names),
      transfers: { src: pick(f.src), dst: pick(f.dst), round: pick(f.round), op: pick(f.op), offset: pick(sim.offset),
                   count: pick(sim.count), carried: pick(f.carried), start: Array.from(sim.start), done: Array.from(sim.done), route,
                   channel: f.channel ? pick(f.channel) : null },
      routes, failure: null, compression: null, links_in_force: c.links, closed_form: closedForm(core, p, c),
    };
    if (p.compression) {
      const sent = new Float64Array(f.nodes); for (const j of kept) sent[f.src[j]] += sim.count[j];
      out.compression = { codec: p.compression, itemsize: c.itemsize, collectives: c.parts.length > 1 ? `${p.algorithm} x ${c.parts.length}` : c.parts[0].family.name === "ring_all_gather" ? "ring_all_gather" : p.algorithm,
                          wire_bytes: Math.max(...sent) * c.itemsize };
    }
    if (p.fail) {
      const { device, at } = p.fail;
      if (!(Number.isInteger(device) && device >= 0 && device < c.n)) throw fieldError("fail-device", `fail.device must be a worker in 0..${c.n - 1}, got ${device}`);
      const fail = gradsyncFailures.failure({ src: out.transfers.src, dst: out.transfers.dst, round: out.transfers.round },
                             { kept: kept.map((_, i) => i), start: sim.start, done: sim.done }, device, at * sim.time, detectionOf(core, p.fail));
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

  function time(core, schedules, p) {
    const c = configure(core, schedules, p), { family, elements } = compose(c.parts);
    return M.simulate(family, elements, c.topo, c.itemsize).time;
  }

  // Time against workers per algorithm (/api/compare): simulated, and the closed form where the
  // export carries it (the preset's own links). D2L's server grows to N GPUs on one switch.
  function comparison(core, schedules, p, algorithm) {
    const offered = core.worker_counts[p.topology], most = core.fixed_workers[p.topology], grows = p.topology === "pcie-switch-4";
    const workers = grows ? core.chart_switch : most ? [2, 3, 4, 6, 8, 12].filter((n) => n < most).concat([most]) : [2, 3, 4, 8, 16, 32, 64].filter((n) => offered.includes(n));
    const sim = [], closed = [];
    for (const n of workers) {
      const q = { ...p, algorithm, workers: n, fail: null, chartPreset: grows ? "pcie-switch-N" : null };
      try { sim.push(time(core, schedules, q)); } catch (e) { if (e.field === "algorithm" || e.field === "compression") sim.push(null); else throw e; }
      try { const c = configure(core, schedules, q), cf = closedForm(core, q, c); closed.push(cf ? cf.terms.closed_form : null); } catch (e) { closed.push(null); }
    }
    const bytes = M.parseSize(p.size), seed = grows && bytes === 160e6 && !p.bandwidth && !p.latency && !p.compression;
    return { workers, bytes, compression: p.compression || null,
             curves: { [algorithm]: { simulated_s: sim, closed_form_s: closed, exact: !!(core.exact || {})[algorithm] } },
             book_marks: seed ? Object.entries(core.book_figures).map(([a, v]) => ({ algorithm: a, workers: 4, time_s: v })) : [],
             topology: grows ? "pcie-switch-N: N GPUs and the CPU on links to one switch" : `${p.topology}, 2 to ${workers[workers.length - 1]} workers` };
  }

  return { configure, simulation, comparison, time, treeSegments, wires };
})();
if (typeof window !== "undefined") window.gradsyncSite = gradsyncSite;
