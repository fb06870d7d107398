// The cost formula of the algorithm shown, in its author's words, with this configuration's
// numbers: the parameters it reads off the topology and its latency, bandwidth, reduction and
// codec terms (gradsync.model.cost.terms), beside the simulated time.
"use strict";

const Formula = (() => {
  const SYMBOLS = [["alpha", "α", "latency per message"], ["beta", "B", "bandwidth (1/β)"], ["local_alpha", "α_local", "latency inside a machine"],
                   ["local_beta", "B_local", "bandwidth inside a machine"], ["host_alpha", "α_host", "latency to the host"],
                   ["host_beta", "B_host", "bandwidth to the host"], ["gamma", "γ", "per element added"], ["mu", "μ", "per multiply-add"]];

  function parameters(d, net) {
    const out = [`N = ${d.workers}`, `n = ${fmtBytes(d.compression ? d.bytes * d.compression.itemsize / 4 : d.bytes)}` +
                 (d.compression ? ` (${d.compression.codec})` : "")];
    for (const [key, sym, what] of SYMBOLS) {
      const v = net[key];
      if (!(v > 0)) continue;
      out.push(key.endsWith("beta") ? `${sym} = ${fmtBytes(1 / v)}/s (${what})` : `${sym} = ${fmtTime(v)} (${what})`);
    }
    if (net.ring_betas && net.ring_betas.length > 1) out.push(`rings at ${net.ring_betas.map((b) => fmtBytes(1 / b) + "/s").join(", ")}`);
    return out.join(", ");
  }

  function rows(d) {
    const c = d.closed_form;
    if (!c) return [["cost formula", d.compression ? `not written for ${d.compression.codec}'s collectives` : "none for this configuration"]];
    const t = c.terms, parts = [`latency ${fmtTime(t.latency)}`, `bandwidth ${fmtTime(t.bandwidth)}`];
    if (t.reduction > 0) parts.push(`reductions ${fmtTime(t.reduction)}`);
    if (t.codec > 0) parts.push(`codec ${fmtTime(t.codec)}`);
    if (Math.abs(t.overlap) > 1e-6 * t.closed_form) parts.push(`${fmtTime(t.overlap)} not split into these terms`);
    const ratio = d.time_s > 0 ? ` (the simulator's ${fmtTime(d.time_s)} is ${(d.time_s / t.closed_form).toFixed(2)}× it: it times every link and node, not one path)` : "";
    stats.formula = { formula: c.formula, terms: t };
    return [["cost formula", `${c.formula || "(not written out)"} with ${parameters(d, c.net || {})}`],
            ["its terms", `${parts.join(" + ")} = ${fmtTime(t.closed_form)} in closed form${c.note ? " " + c.note : ""}${ratio}`]];
  }

  return { rows };
})();
