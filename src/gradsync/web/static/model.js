// gradsync's simulator, read in the page: the static export's schedules and topologies
// (gradsync/web/site_model.py writes them) timed here, so every control works with no server.
// Each step mirrors a function of gradsync.model.simulate (named beside it) operation for
// operation, so the times are the same floating-point numbers; a differential test in
// tests/test_web_export.py checks them against gradsync.simulate on random configurations.
"use strict";
const gradsyncModel = (() => {
  const COPY = 1;

  // ---- units (gradsync.units) -----------------------------------------------------------------
  const DECIMAL = { "": 1, k: 1e3, m: 1e6, g: 1e9, t: 1e12 }, BINARY = { ki: 2 ** 10, mi: 2 ** 20, gi: 2 ** 30, ti: 2 ** 40 };
  const QUANTITY = /^([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([kKmMgGtT]i?)?\s*(B|b|bytes?|bits?|bps|Bps)?$/;
  const BITS = new Set(["bit", "bits", "bps"]);
  function quantity(text, what, example, rate) {
    let s = String(text).trim();
    if (rate) s = s.replace(/\s*\/\s*s$/, "");
    const m = QUANTITY.exec(s);
    if (!m) throw new Error(`bad ${what} '${text}': expected a number with a unit, like ${example}`);
    const prefix = (m[2] || "").toLowerCase(), unit = m[3];
    if (BITS.has(unit) && !rate) throw new Error(`bad ${what} '${text}': sizes are in bytes (4KB, 4KiB); bits are for rates (100Mbit/s)`);
    if (unit === "b" && rate) throw new Error(`bad ${what} '${text}': say bits or bytes, like 100Mbit/s or 100MB/s`);
    const value = Number(m[1]) * (prefix in BINARY ? BINARY[prefix] : DECIMAL[prefix]) / (BITS.has(unit) ? 8 : 1);
    if (!(value >= 0) || value === Infinity) throw new Error(`bad ${what} '${text}': expected a finite number >= 0, like ${example}`);
    return value;
  }
  const parseSize = (t) => { const v = quantity(t, "size", "160MB or 4KiB (bytes)", false);
    if (Math.abs(v - Math.round(v)) > 1e-9 * Math.max(v, 1)) throw new Error(`bad size '${t}': ${v} bytes is not a whole number of bytes`);
    return Math.round(v); };
  const parseBandwidth = (t) => quantity(t, "bandwidth", "16GB/s or 100Mbit/s", true);
  function parseTime(t) {
    const m = /^([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(s|ms|us|µs|ns)?$/.exec(String(t).trim());
    if (!m) throw new Error(`bad duration '${t}': expected a number with a unit, like 2us or 1.5ms`);
    return Number(m[1]) * { s: 1, ms: 1e-3, us: 1e-6, "µs": 1e-6, ns: 1e-9 }[m[2] || "s"];
  }

  // ---- a schedule's pieces at d elements (site_model.counts_at) ---------------------------------
  function chunkBounds(d, weights) {                               // core.schedule.chunk_bounds
    let total = 0; for (const w of weights) total += w;
    const out = [0]; let run = 0;
    for (const w of weights) { run += w; out.push(Math.floor((run / total) * d + 1e-9)); }
    out[0] = Math.floor(0 * d + 1e-9);
    return out;
  }
  function pieces(s, d) {
    const n = s.src.length, offset = new Float64Array(n), count = new Float64Array(n);
    let madds = null;
    if (s.mode === "given") {                                      // composed in the page: pieces already laid out
      for (let j = 0; j < n; j++) { offset[j] = s.offset[j]; count[j] = s.count[j]; }
      madds = s.madds;
    } else if (s.mode === "cuts") {
      const outer = chunkBounds(d, s.weights);
      const v = s.labels.map(([k, q, i]) => { const lo = outer[k], hi = outer[k + 1]; return lo + Math.floor((i / q) * (hi - lo) + 1e-9); });
      for (let j = 0; j < n; j++) { offset[j] = v[s.a[j]]; count[j] = v[s.b[j]] - v[s.a[j]]; }
    } else {
      const m = Math.ceil(d / s.components);
      for (let j = 0; j < n; j++) { offset[j] = s.a[j] * m; count[j] = s.q[j] * m; }
      madds = s.compute.k.map((k) => k * m);
    }
    const kept = []; for (let j = 0; j < n; j++) if (count[j] > 0) kept.push(j);
    return { kept, offset, count, madds };
  }

  // ---- routes (model.topology.Topology.route, networkx's bidirectional Dijkstra) ---------------
  function graph(topo) {
    const n = topo.nodes.length, adj = Array.from({ length: n }, () => []), edge = new Map();
    topo.links.forEach((l, i) => {
      const cost = l.latency + 1e6 / l.bandwidth, key = Math.min(l.a, l.b) * n + Math.max(l.a, l.b), old = edge.get(key);
      if (!old) { adj[l.a].push(l.b); adj[l.b].push(l.a); edge.set(key, { cost, link: i }); }
      else if (cost < old.cost) edge.set(key, { cost, link: i });
    });
    const get = (u, v) => edge.get(Math.min(u, v) * n + Math.max(u, v));
    let tree = null;
    if (edge.size === n - 1) {                                      // connected with N - 1 edges: a tree
      const parent = new Int32Array(n).fill(-1), depth = new Int32Array(n).fill(-1), queue = [0];
      depth[0] = 0;
      for (let h = 0; h < queue.length; h++) for (const w of adj[queue[h]]) if (depth[w] < 0) { depth[w] = depth[queue[h]] + 1; parent[w] = queue[h]; queue.push(w); }
      tree = { parent, depth };
    }
    return { adj, get, tree };
  }
  function heapPush(h, item) { h.push(item); let i = h.length - 1;
    while (i > 0) { const p = (i - 1) >> 1; if (less(h[i], h[p])) { [h[i], h[p]] = [h[p], h[i]]; i = p; } else break; } }
  function heapPop(h) { const top = h[0], last = h.pop();
    if (h.length) { h[0] = last; let i = 0; for (;;) { const l = 2 * i + 1, r = l + 1; let m = i;
      if (l < h.length && less(h[l], h[m])) m = l; if (r < h.length && less(h[r], h[m])) m = r;
      if (m === i) break; [h[i], h[m]] = [h[m], h[i]]; i = m; } }
    return top; }
  const less = (a, b) => a[0] < b[0] || (a[0] === b[0] && a[1] < b[1]);
  function dijkstra(g, source, target) {                              // networkx.bidirectional_dijkstra
    if (source === target) return [source];
    const dists = [new Map(), new Map()], preds = [new Map([[source, null]]), new Map([[target, null]])];
    const seen = [new Map([[source, 0]]), new Map([[target, 0]])], fringe = [[], []];
    let c = 0, finaldist = null, meet = null, dir = 1;
    heapPush(fringe[0], [0, c++, source]); heapPush(fringe[1], [0, c++, target]);
    const walk = (v, d) => { const out = []; while (v !== null) { out.push(v); v = preds[d].get(v); } return d === 0 ? out.reverse() : out; };
    while (fringe[0].length && fringe[1].length) {
      dir = 1 - dir;
      const [dist, , v] = heapPop(fringe[dir]);
      if (dists[dir].has(v)) continue;
      dists[dir].set(v, dist);
      if (dists[1 - dir].has(v)) return walk(meet, 0).concat(walk(preds[1].get(meet), 1));
      for (const w of g.adj[v]) {
        const len = dist + g.get(v, w).cost;
        if (dists[dir].has(w)) continue;
        if (!seen[dir].has(w) || len < seen[dir].get(w)) {
          seen[dir].set(w, len); heapPush(fringe[dir], [len, c++, w]); preds[dir].set(w, v);
          if (seen[1 - dir].has(w)) { const f = len + seen[1 - dir].get(w); if (finaldist === null || finaldist > f) { finaldist = f; meet = w; } }
        }
      }
    }
    throw new Error("no route");
  }
  function routeNodes(g, a, b) {
    if (!g.tree) return dijkstra(g, a, b);
    const { parent, depth } = g.tree, up = [a], down = [b];
    while (up[up.length - 1] !== down[down.length - 1]) {
      if (depth[up[up.length - 1]] >= depth[down[down.length - 1]]) up.push(parent[up[up.length - 1]]); else down.push(parent[down[down.length - 1]]);
    }
    return up.concat(down.slice(0, -1).reverse());
  }

  // ---- the topology as channels (simulate.network._Net, _pair_routes) ---------------------------
  function withLinks(topo, bandwidth, latency) {                    // web.view._with_links
    if (bandwidth === null && latency === null) return topo;
    return { ...topo, uniform: bandwidth !== null,       // links of one bandwidth: one tier, so switches may reduce for other groups
             links: topo.links.map((l) => ({ ...l, bandwidth: bandwidth || l.bandwidth, latency: latency === null ? l.latency : latency })) };
  }
  // Routes depend on the topology only: found once per topology object (the page keeps one
  // object per preset, workers and links), as Topology caches its own.
  const routeCache = new WeakMap();
  function cachedNodes(topo, g, a, b) {
    if (!routeCache.has(topo)) routeCache.set(topo, new Map());
    const m = routeCache.get(topo), key = a * topo.nodes.length + b;
    if (!m.has(key)) m.set(key, routeNodes(g, a, b));
    return m.get(key);
  }
  const graphCache = new WeakMap();
  function net(topo, placement) {
    const copying = topo.nodes.map((nd, i) => (nd.copy_rate ? i : -1)).filter((i) => i >= 0);
    const nLinks = 2 * topo.links.length, padding = nLinks + copying.length;
    if (topo.nodes.some((nd) => nd.cores)) throw new Error("nodes with shared cores are not modelled in the page");
    const copyChannel = new Int32Array(topo.nodes.length).fill(padding);
    copying.forEach((p, j) => { copyChannel[p] = nLinks + j; });
    const capacity = [], fanIn = [];
    for (const l of topo.links) capacity.push(l.bandwidth, l.bandwidth);
    for (let i = 0; i < nLinks; i++) fanIn.push(0);
    for (const p of copying) { capacity.push(topo.nodes[p].copy_rate); fanIn.push(topo.nodes[p].fan_in || 0); }
    capacity.push(Infinity); fanIn.push(0);
    const at = (key, none) => placement.map((p) => topo.nodes[p][key] || none);
    if (!graphCache.has(topo)) graphCache.set(topo, graph(topo));
    return { topo, placement, g: graphCache.get(topo), capacity: Float64Array.from(capacity), fanIn: Float64Array.from(fanIn), padding,
             copyChannel, nodeChannel: placement.map((p) => copyChannel[p]), addRate: at("reduce_rate", Infinity),
             maddRate: at("madd_rate", Infinity), overhead: at("message_overhead", 0), startup: at("collective_overhead", 0),
             perRound: at("round_overhead", 0) };
  }
  function route(nt, a, b) {                                         // Topology.route + _pair_routes
    const path = cachedNodes(nt.topo, nt.g, nt.placement[a], nt.placement[b]), links = nt.topo.links;
    const channels = [nt.nodeChannel[a]], through = [];
    let latency = 0;
    for (let h = 0; h + 1 < path.length; h++) {
      const u = path[h], v = path[h + 1], i = nt.g.get(u, v).link, l = links[i];
      channels.push(2 * i + (l.a === u || l.duplex === "half" ? 0 : 1));
      latency += l.latency;
    }
    channels.push(nt.nodeChannel[b]);
    for (const node of path.slice(1, -1)) if (nt.copyChannel[node] !== nt.padding) through.push(nt.copyChannel[node]);
    return { channels: channels.concat(through).filter((c) => c !== nt.padding), latency, nodes: path };
  }

  // ---- max-min fair rates (network._max_min_rates) ----------------------------------------------
  // Progressive filling as the simulator does it, with two exact shortcuts: the per-channel
  // loads (whole numbers) are kept up to date as flows freeze instead of recounted, and a
  // flow's rate is the running sum of the steps up to the one that froze it -- the same
  // additions in the same order as adding each step to every live flow.
  function maxMin(active, paths, nt, inbound) {
    const C = nt.capacity.length, A = active.length, rate = new Float64Array(A);
    let capacity = nt.capacity;
    if (nt.fanIn.some((f) => f > 0)) {
      const k = new Float64Array(C); for (const f of active) k[inbound[f]] += 1;
      capacity = capacity.map((c, j) => c / (1 + nt.fanIn[j] * Math.max(k[j] - 1, 0)));
    }
    const remaining = Float64Array.from(capacity), load = new Float64Array(C), onChannel = Array.from({ length: C }, () => []);
    const frozen = new Uint8Array(A), full = new Uint8Array(C);
    let live = 0, sum = 0;
    for (let j = 0; j < A; j++) {
      const p = paths[active[j]];
      if (!p.length) { rate[j] = Infinity; frozen[j] = 1; continue; }
      live++;
      for (const ch of p) { load[ch] += 1; onChannel[ch].push(j); }
    }
    load[C - 1] = 0;
    while (live) {
      let step = Infinity;
      for (let ch = 0; ch < C - 1; ch++) if (load[ch] > 0) step = Math.min(step, remaining[ch] / load[ch]);
      sum += step;
      const filled = [];
      for (let ch = 0; ch < C - 1; ch++) if (load[ch] > 0) {
        remaining[ch] -= step * load[ch];
        if (remaining[ch] <= 1e-9 * capacity[ch]) { full[ch] = 1; filled.push(ch); }
      }
      for (const ch of filled) for (const j of onChannel[ch]) {
        if (frozen[j]) continue;
        frozen[j] = 1; rate[j] = sum; live--;
        for (const c2 of paths[active[j]]) load[c2] -= 1;
      }
      load[C - 1] = 0;
    }
    return rate;
  }

  // ---- steps and the event loop (flows._steps, engine._run) -------------------------------------
  // With lanes (NCCL's channels) a node's steps are one track per lane, each in its own order.
  function steps(s, kept, offset, count, madds, nt, rounds) {
    const lanes = s.lane ? Math.max(...s.lane) + 1 : 1, lane = (j) => (s.lane ? s.lane[j] : 0);
    const key = new Map(), keys = [];
    const add = (k) => { if (!key.has(k)) { key.set(k, -1); keys.push(k); } };
    const srcKey = (j) => (s.src[j] * lanes + lane(j)) * rounds + s.round[j], dstKey = (j) => (s.dst[j] * lanes + lane(j)) * rounds + s.round[j];
    for (const j of kept) { add(srcKey(j)); add(dstKey(j)); }
    const comp = madds ? s.compute.node.map((nd, c) => [nd * lanes * rounds + s.compute.round[c], madds[c]]) : [];
    for (const [k] of comp) add(k);
    keys.sort((a, b) => a - b); keys.forEach((k, i) => key.set(k, i));
    const stepTrack = keys.map((k) => Math.floor(k / rounds)), stepNode = stepTrack.map((t) => Math.floor(t / lanes));
    const added = new Float64Array(keys.length), work = new Float64Array(keys.length);
    const stepSrc = kept.map((j) => key.get(srcKey(j))), stepDst = kept.map((j) => key.get(dstKey(j)));
    kept.forEach((j, f) => { if (s.op[j] !== COPY) added[stepDst[f]] += count[j]; });
    const madd = new Float64Array(keys.length); for (const [k, m] of comp) madd[key.get(k)] += m;
    const messages = new Float64Array(keys.length); for (const st of stepSrc.concat(stepDst)) messages[st] += 1;
    const anyOverhead = nt.overhead.some((o) => o);
    for (let i = 0; i < keys.length; i++) {
      work[i] = added[i] / nt.addRate[stepNode[i]] + madd[i] / nt.maddRate[stepNode[i]];
      work[i] = work[i] + nt.perRound[stepNode[i]];
      if (anyOverhead) work[i] = work[i] + messages[i] * nt.overhead[stepNode[i]];
    }
    const deps = lanes > 1 ? dataDeps(s, kept, count, offset, stepSrc, stepDst, stepTrack) : [];
    return { stepSrc, stepDst, stepNode, stepTrack, work, deps };
  }

  // Where a flow sends on data that reached its sender in another track: [the step that sends
  // it, the flow it waits for], the latest earlier arrival of the same segment (flows._data_deps).
  function dataDeps(s, kept, count, offset, stepSrc, stepDst, stepTrack) {
    const F = kept.length, entries = [];
    kept.forEach((j, f) => {
      entries.push([s.dst[j], offset[j], count[j], s.round[j], 1, f]);       // an arrival
      entries.push([s.src[j], offset[j], count[j], s.round[j], 0, F + f]);   // a send
    });
    entries.sort((a, b) => a[0] - b[0] || a[1] - b[1] || a[2] - b[2] || a[3] - b[3] || a[4] - b[4] || a[5] - b[5]);
    const deps = [];
    let before = -1;
    entries.forEach((e, i) => {
      const p = entries[i - 1];
      if (!p || p[0] !== e[0] || p[1] !== e[1] || p[2] !== e[2]) before = -1;   // a new node and segment
      if (e[4] === 1) { before = e[5]; return; }
      const f = e[5] - F;
      if (before >= 0 && stepTrack[stepSrc[f]] !== stepTrack[stepDst[before]]) deps.push([stepSrc[f], before]);
    });
    return deps;
  }
  function run(flows, st, nt, nodes) {
    const F = flows.nbytes.length, S = st.stepNode.length, track = st.stepTrack;
    const isLast = track.map((t, i) => i === S - 1 || track[i + 1] !== t);
    const byStep = Array.from({ length: S }, () => []), left = new Int32Array(S), need = new Int32Array(F).fill(2);
    for (let f = 0; f < F; f++) { byStep[st.stepSrc[f]].push(f); byStep[st.stepDst[f]].push(f); left[st.stepSrc[f]]++; left[st.stepDst[f]]++; }
    const start = new Float64Array(F).fill(NaN), sent = new Float64Array(F).fill(NaN), done = new Float64Array(F).fill(NaN);
    const nodeDone = new Float64Array(nodes), busy = new Float64Array(nt.capacity.length);
    // a step that sends on another track's data is held until that flow is delivered (engine._Steps)
    const depLeft = new Int32Array(S), waiters = Array.from({ length: F }, () => []), held = new Float64Array(S).fill(NaN);
    for (const [step, flow] of st.deps) { depLeft[step]++; waiters[flow].push(step); }
    let pending = [], active = [], remaining = [], flying = [], rate = [], now = 0;
    const becomeReady = (i, at) => { if (depLeft[i] > 0) held[i] = at; else pending.push([i, at]); };
    const release = (flow) => {
      for (const i of waiters[flow]) if (--depLeft[i] === 0 && !Number.isNaN(held[i])) { pending.push([i, Math.max(held[i], now)]); held[i] = NaN; }
    };
    for (let i = 0; i < S; i++) if (i === 0 || track[i] !== track[i - 1]) becomeReady(i, nt.startup[st.stepNode[i]]);
    const advance = (finished) => {
      for (const i of finished) { const end = now + st.work[i]; if (isLast[i]) nodeDone[st.stepNode[i]] = Math.max(nodeDone[st.stepNode[i]], end); else becomeReady(i + 1, end); }
    };
    while (active.length || flying.length || pending.length) {
      const drainAt = active.map((f, j) => now + remaining[j] / rate[j]);
      let nxt = Infinity;
      for (const x of drainAt) nxt = Math.min(nxt, x);
      for (const [, x] of flying) nxt = Math.min(nxt, x);
      for (const [, x] of pending) nxt = Math.min(nxt, x);
      if (active.length) {
        const crossed = new Set(); for (const f of active) for (const ch of flows.paths[f]) crossed.add(ch);
        for (const ch of crossed) busy[ch] += nxt - now;
        remaining = remaining.map((r, j) => r - rate[j] * (nxt - now));
      }
      now = nxt;
      if (active.length) {                                            // 1. last bytes out: the latency starts
        const keepA = [], keepR = [];
        active.forEach((f, j) => {
          if (drainAt[j] <= now * (1 + 1e-12) || remaining[j] <= 1e-12 * flows.nbytes[f]) { sent[f] = now; flying.push([f, now + flows.latency[f]]); }
          else { keepA.push(f); keepR.push(remaining[j]); }
        });
        active = keepA; remaining = keepR;
      }
      const arrived = flying.filter(([, x]) => x <= now * (1 + 1e-15) + 1e-18);   // 2. delivered
      if (arrived.length) {
        flying = flying.filter(([, x]) => !(x <= now * (1 + 1e-15) + 1e-18));
        const finished = new Set();
        for (const [f] of arrived) { done[f] = now; for (const s of [st.stepSrc[f], st.stepDst[f]]) { left[s]--; } }
        for (const [f] of arrived) for (const s of [st.stepSrc[f], st.stepDst[f]]) if (left[s] === 0) finished.add(s);
        advance(finished);
        for (const [f] of arrived) release(f);
      }
      const ready = pending.filter(([, x]) => x <= now * (1 + 1e-15) + 1e-18);     // 3. ready steps post
      if (ready.length) {
        pending = pending.filter(([, x]) => !(x <= now * (1 + 1e-15) + 1e-18));
        advance(ready.map(([i]) => i).filter((i) => left[i] === 0));
        const starting = new Set();
        for (const [i] of ready) for (const f of byStep[i]) { need[f]--; if (need[f] === 0) starting.add(f); }
        for (const f of starting) { start[f] = now; active.push(f); remaining.push(flows.nbytes[f]); }
      }
      rate = active.length ? Array.from(maxMin(active, flows.paths, nt, flows.inbound)) : [];
    }
    return { start, sent, done, nodeDone, busy };
  }

  // Where a helper node runs (simulate.network._placement): 'host' on the host, a switch on
  // the node the export found for it (Topology.reducer_for), or the simulator's refusal.
  function helperNode(topo, helper, algorithm) {
    if (helper === "host") return topo.host;
    const where = topo.reducers && topo.reducers[topo.uniform ? "|uniform" : ""][helper];
    if (where === undefined) throw Object.assign(new Error(`no placement for helper node '${helper}'`), { field: "algorithm" });
    if (typeof where === "number") return where;
    throw Object.assign(new Error(where.refused.replace("{algorithm}", algorithm)), { field: "algorithm" });
  }

  // A schedule family at `elements` on a topology (indices of the nodes it runs on): gradsync.simulate.
  function simulate(s, elements, topo, itemsize = 4) {
    const placement = topo.workers.slice(0, s.workers).concat(s.helpers.map((h) => helperNode(topo, h, s.name)));
    const nt = net(topo, placement), { kept, offset, count, madds } = pieces(s, elements);
    const routes = new Map(), paths = [], latency = [], nbytes = [], inbound = [];
    for (const j of kept) {
      const k = s.src[j] * s.nodes + s.dst[j];
      if (!routes.has(k)) routes.set(k, route(nt, s.src[j], s.dst[j]));
      const r = routes.get(k);
      paths.push(r.channels); latency.push(r.latency); nbytes.push(count[j] * itemsize); inbound.push(nt.nodeChannel[s.dst[j]]);
    }
    const st = steps(s, kept, offset, count, madds, nt, Math.max(s.rounds, 1));
    const out = run({ paths, latency, nbytes, inbound }, st, nt, s.nodes);
    const channelBytes = new Float64Array(nt.capacity.length);
    paths.forEach((p, f) => { for (const ch of p) channelBytes[ch] += nbytes[f]; });
    let time = 0; for (const x of out.nodeDone) time = Math.max(time, x);
    return { time, kept, offset, count, placement, routes, ...out, channelBytes, nt };
  }

  return { parseSize, parseBandwidth, parseTime, chunkBounds, pieces, withLinks, simulate, route, net };
})();
if (typeof window !== "undefined") window.gradsyncModel = gradsyncModel;
