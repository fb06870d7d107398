// How a failure spreads through a timed collective, as the static page tells it: which
// transfers complete when one worker crashes or stalls, and when and why each survivor stops
// (gradsync.web.failures, step for step, checked against it by the export's tests). It reads
// a simulation of model.js (its flows' starts and deliveries).
const gradsyncFailures = (() => {
  // When a rank that began waiting at `began` raises, the failure reaching it at `seen`
  // (web/failures.detected): crash, its next liveness check; stall, the collective's deadline.
  function detected(detection, every, timeout, began, seen) {
    if (detection === "stall") return Math.max(began, seen, timeout);
    if (every <= 0) return Math.max(began, seen);
    return began + every * Math.max(1, Math.ceil((seen - began) / every));
  }

  // Which transfers complete when worker `device` crashes (or stalls) at `at` seconds, and when
  // and why each other worker stops, with the runtime's detection delay (web/failures.failure,
  // step for step). `s`: src, dst, round per transfer; `sim`: kept (transfer of each flow),
  // start, done; `opts`: detection ("crash" | "stall"), check_every_s, timeout_s.
  function failure(s, sim, device, at, opts) {
    const detection = opts.detection, every = opts.check_every_s, timeout = opts.timeout_s;
    if (detection !== "crash" && detection !== "stall") throw new Error(`detection must be one of crash, stall, got '${detection}'`);
    const m = sim.kept.length, src = [], dst = [], rnd = [];
    for (let f = 0; f < m; f++) { src.push(s.src[sim.kept[f]]); dst.push(s.dst[sim.kept[f]]); rnd.push(s.round[sim.kept[f]]); }
    let nodes = device + 1; for (let f = 0; f < m; f++) nodes = Math.max(nodes, src[f] + 1, dst[f] + 1);
    const order = [...Array(m).keys()].sort((a, b) => sim.start[a] - sim.start[b]);
    const end = new Array(nodes).fill(Infinity), stuck = new Array(nodes).fill(Infinity), cause = new Map(), rounds = new Map();
    end[device] = at;
    for (const i of order) for (const x of [src[i], dst[i]]) {
      const key = x + "|" + rnd[i]; if (!rounds.has(key)) rounds.set(key, []); rounds.get(key).push(i);
    }
    const completes = (i) => rnd[i] <= stuck[src[i]] && rnd[i] <= stuck[dst[i]] && sim.done[i] <= Math.min(end[src[i]], end[dst[i]]);
    for (let changed = true; changed;) {
      changed = false;
      for (const i of order) {
        if (completes(i)) continue;
        for (const x of [src[i], dst[i]]) if (x !== device && stuck[x] > rnd[i]) { stuck[x] = rnd[i]; changed = true; }
      }
      for (let x = 0; x < nodes; x++) {
        if (x === device || stuck[x] === Infinity) continue;
        const r = stuck[x], mine = rounds.get(x + "|" + r);
        let seen = Infinity, why = null;
        for (const i of mine) {
          if (completes(i)) continue;
          const y = src[i] === x ? dst[i] : src[i];
          let v, via;
          if (y === device || stuck[y] < r) { v = at; via = false; }          // the death, or a peer that never gets here
          else if (end[y] < Infinity) { v = end[y]; via = true; }            // a survivor that stopped
          else continue;
          if (v < seen) { seen = v; why = [i, y, via]; }
        }
        if (why === null) continue;
        const began = sim.start[mine[0]], when = detected(detection, every, timeout, began, seen);
        if (when < end[x]) { end[x] = when; cause.set(x, [began, seen, ...why]); changed = true; }
      }
    }
    const completed = order.map((_, i) => completes(i)), stopped = [];
    for (let x = 0; x < nodes; x++) {
      if (x === device) stopped.push({ node: x, at_s: at, died_s: at, began_s: null, seen_s: at, waited_for: null,
        message: detection === "crash" ? "died: its process is gone" : "stalled: alive, but it no longer sends or receives" });
      else if (end[x] < Infinity) {
        const [began, seen, i, y, via] = cause.get(x);
        stopped.push({ node: x, at_s: end[x], died_s: at, began_s: began, seen_s: seen, waited_for: y,
                       message: failureMessage(detection, every, device, y, dst[i] === x ? "receive from" : "send to", via) });
      }
    }
    return { device, at_s: at, detection, check_every_s: every, timeout_s: timeout, completed, stopped };
  }

  function failureMessage(detection, every, device, peer, direction, via) {    // web/failures._message
    const waited = `while this rank waited to ${direction} rank ${peer}`;
    if (detection === "stall") return `PeerError: rank ${device} did not answer before the timeout ${waited}`;
    if (every <= 0) return `PeerError: rank ${device} failed (its connection closed) ${waited}`;
    if (via) return `PeerError: rank ${device} died (recorded in the group's segment), seen at this rank's next liveness check once rank ${peer} had stopped, ${waited}`;
    return `PeerError: rank ${device} died (its process is gone), seen at this rank's next liveness check ${waited}`;
  }

  return { failure, detected };
})();
if (typeof window !== "undefined") window.gradsyncFailures = gradsyncFailures;
