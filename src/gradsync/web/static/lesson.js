// The words beside the drawing: the header, what happens now (every round in flight, each told
// from its own transfers), the failure's story, the numbers (time, bus bandwidth, the cost
// formula with this configuration's numbers) and the explanation.
"use strict";

const Lesson = (() => {
  const MAX_TOLD = 3;                          // rounds in flight told at once; the rest counted

  function summary() {
    const d = S.data, opts = Object.entries(d.options || {}).filter(([, v]) => v !== null).map(([k, v]) => `${k}=${v}`).join(", ");
    const codec = d.compression ? `, ${d.compression.codec} on the wire (${d.compression.itemsize}-byte elements)` : ", float32";
    $("summary").textContent = `${d.algorithm}${opts ? " (" + opts + ")" : ""} on ${d.topology.name}: ${d.workers} workers, ` +
      `${fmtBytes(d.bytes)}${codec}, ${d.rounds} rounds — ${describeLinks(d)}`;
  }

  // The topology's description with the links in force: a bandwidth or latency set in the
  // fields replaces the preset's figures (every link then has it).
  function describeLinks(d) {
    const set = [];
    if (filled("bandwidth")) set.push(`every link ${fmtBytes(d.topology.links[0].bandwidth)}/s`);
    if (filled("latency")) set.push(`${fmtTime(d.topology.links[0].latency)} latency per link`);
    if (!set.length) return d.topology.description;
    const plain = d.topology.description.replace(/\s*\(?[0-9.]+\s?[kMGT]?B\/s( links| per link| per GPU)?\)?/g, "").replace(/\s*\(\)/g, "").replace(/,\s*$/, "");
    return `${plain}; ${set.join(", ")} (set)`;
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
  // Whether the failure changes this collective (a death after a rank's last transfer does not).
  const harmless = (f) => firstNotice(f).node === f.device;

  // After a failure the story is the failure's: who has died, who has stopped, what never happens.
  function failureStory() {
    const d = S.data, f = d.failure;
    if (!f || S.now < f.at_s) return null;
    const last = S.anim.lastStop, peers = f.stopped.length - 1, never = S.anim.never.size, first = firstNotice(f);
    const stopped = f.stopped.filter((s) => s.node !== f.device && s.at_s <= S.now).length, died = f.detection === "stall" ? "stalled" : "died";
    const dead = `${nodeName(f.device)} (rank ${f.device}) ${died} at ${fmtTime(f.at_s)}`;
    if (harmless(f)) {
      const when = f.at_s >= d.time_s ? "after the collective had completed" : "after its last transfer of this collective";
      return { key: "f-none", text: `${dead}, ${when}: no effect on this collective, which completes at ${fmtTime(d.time_s)} ` +
        `for every worker. The next collective will find it.`, detail: "" };
    }
    const noticed = `${nodeName(first.node)} noticed at ${fmtTime(first.at_s)} (${howFound(f)})`;
    if (S.now < first.at_s) return { key: "f-wait", text: `${dead}; nobody has noticed yet: its peers wait for it, and ` +
      `${noticed.replace("noticed at", "will notice at")}.`, detail: `${never} of ${d.narration.length} rounds will not complete.` };
    if (S.now < last) return { key: `f${stopped}`, text: `${dead}; ${noticed}. ${stopped} of ${peers} peers have stopped so far: ` +
      `each raises PeerError naming rank ${f.device} once it finds its wait cannot finish.`,
      detail: `${never} of ${d.narration.length} rounds will not complete.` };
    return { key: "done", text: `The collective was abandoned: ${dead}; ${noticed}, and by ${fmtTime(last)} every survivor ` +
      `had raised PeerError naming it; none hangs.`,
      detail: `${never} of ${d.narration.length} rounds never complete (struck through in the list); the restart with the survivors is below.` };
  }

  function narration() {
    const story = failureStory();
    if (story) {
      if (S.anim.current === story.key) return;
      S.anim.current = story.key;
      $("narration").textContent = story.text; $("narration-detail").textContent = story.detail;
      stats.narrated = story.text; stats.narratedRounds = [];
      return;
    }
    const now = Animation.currentRounds(), key = now.join(",");
    if (key === S.anim.current) return;
    S.anim.current = key;
    const d = S.data, told = now.slice(0, MAX_TOLD).map((j) => d.narration[j]).filter(Boolean);
    const more = now.length > MAX_TOLD ? ` (and ${now.length - MAX_TOLD} more rounds in flight: see the list)` : "";
    $("narration").textContent = told.length > 1 ? told.map((s) => `Round ${s.round + 1}: ${s.text}`).join(" ") + more : (told[0] || {}).text || "";
    $("narration-detail").textContent = told.length === 1 ? detail(told[0].round) : `${now.length} rounds in flight at once: each worker moves on as soon as its own transfers are done.`;
    const items = $("steps").children, set = new Set(now);
    for (let q = 0; q < items.length; q++) items[q].className = (set.has(q) ? "now" : q < now[0] ? "done" : "") + (S.anim.never.has(q) ? " never" : "");
    const li = items[now[0]];
    if (li) { const box = $("steps"); box.scrollTop = Math.max(0, li.offsetTop - box.offsetTop - box.clientHeight / 3); }
    stats.narrated = $("narration").textContent; stats.narratedRounds = told.map((s) => s.round);
  }

  // A round's transfers one by one, written from the transfers themselves ("gpu0 -> gpu1: chunk 3").
  const MAX_DETAIL = 64, LISTED = 12;
  const VERB = { [REDUCE]: "adds what it receives to its own", [COPY]: "stores what it receives in place of its own",
                 [CODED]: "folds what it receives into its next packet" };
  function roundTransfers(round) {
    const t = S.data.transfers, A = S.anim, mine = [];
    for (let i = 0; i < t.src.length; i++) if (t.round[i] === round) mine.push(i);
    return mine.sort((a, b) => t.src[a] - t.src[b] || t.dst[a] - t.dst[b] || A.span[2 * a] - A.span[2 * b]);
  }
  function words(i) {
    const t = S.data.transfers, A = S.anim, a = A.span[2 * i], b = A.span[2 * i + 1];
    return t.op[i] === CODED ? "its coded packet" : a === 0 && b === A.k ? "the whole buffer" : b - a === 1 ? `chunk ${a}` : `chunks ${a}-${b - 1}`;
  }
  function detail(round) {
    const t = S.data.transfers, mine = roundTransfers(round);
    const items = mine.slice(0, MAX_DETAIL).map((i) => `${nodeName(t.src[i])} -> ${nodeName(t.dst[i])}: ${words(i)}`);
    return items.join("; ") + (mine.length > MAX_DETAIL ? `, and ${mine.length - MAX_DETAIL} more` : "");
  }
  // The sentence of a round the page lists itself (a composed schedule, or pieces dropped at a
  // tiny size): its transfers, kind by kind, as core.narrate lists what no rule states.
  function listing(entry, j, total) {
    const t = S.data.transfers, mine = roundTransfers(entry.round), parts = [];
    for (const op of [REDUCE, COPY, CODED]) {
      const of = mine.filter((i) => t.op[i] === op);
      if (!of.length) continue;
      const items = of.slice(0, LISTED).map((i) => `${nodeName(t.src[i])} sends ${words(i)} to ${nodeName(t.dst[i])}`);
      parts.push(`${of.length} transfer${of.length > 1 ? "s" : ""}: ${items.join(", ")}${of.length > LISTED ? `, and ${of.length - LISTED} more (listed below)` : ""}, each receiver ${VERB[op]}`);
    }
    return `${entry.phase ? entry.phase + ", " : ""}round ${j + 1} of ${total}: ${parts.join("; ")}.`;
  }

  function numbers() {
    const d = S.data, nodes = d.topology.nodes, f = d.failure, hurt = f && !harmless(f);
    const util = d.topology.links.map((l) => (d.time_s > 0 ? l.busy_s / d.time_s : 0));
    const b = util.indexOf(Math.max(...util)), busiest = d.topology.links[b];
    const rows = [];
    if (hurt) {
      rows.push(["simulated time", `no result: the collective was abandoned; the survivors stopped by ${fmtTime(S.anim.lastStop)} ` +
        `(detection included), ${fmtTime(S.anim.lastStop - f.at_s)} after the ${f.detection}`]);
      rows.push(["bus bandwidth", "none: nothing completed"], ["healthy run", fmtTime(d.time_s)]);
    } else {
      rows.push(["simulated time", fmtTime(d.time_s)], ["bus bandwidth", busbw(d)]);
    }
    rows.push(["rounds", d.rounds], ["transfers", d.transfers.src.length]);
    rows.push(Layout.equallyBusy(util) ? ["links", `all ${util.filter((u) => u > 0).length} in use equally busy, ${Math.round(util[b] * 100)}% of the time`] :
      ["busiest link", busiest && busiest.bytes ? `${nodes[busiest.a].name}–${nodes[busiest.b].name}: ${fmtBytes(busiest.bytes)}, busy ${Math.round(util[b] * 100)}% of the time` : "-"]);
    if (d.algorithm === "ring" && d.topology.preset === "p3.16xlarge" && d.workers === 8 && d.bytes === 160e6 && !filled("bandwidth") && !filled("latency") && !d.compression)
      rows.push(["D2L's figure", `about 6 ms on 8 V100s for 160 MB (its "Parameter Servers" chapter); simulated here: ${fmtTime(d.time_s)}`]);
    if (d.estimate) {
      const e = d.estimate, shown = e.error === null ? "not finite" : e.error.toPrecision(3);
      rows.push(["CERAR error", `<span class="${e.refused ? "bad" : "good"}">${shown} ${e.refused ? "&gt;" : "≤"} ${e.limit} — ${e.refused ? "gradsync refuses this design" : "accepted"}</span>`]);
    }
    if (d.compression) { const c = d.compression;
      rows.push(["compression", `${c.codec}: ${c.collectives} in ${c.itemsize}-byte elements, ${fmtBytes(c.wire_bytes)} sent by the busiest worker (codec compute not drawn)`]); }
    if (f) rows.push(["failure", failureLine(f)]);
    rows.push(...Formula.rows(d));
    $("numbers").innerHTML = rows.map(([key, v]) => `<dt>${key}</dt><dd>${v}</dd>`).join("");
  }

  // Bus bandwidth as nccl-tests defines it: algbw (bytes / time) x 2 (N - 1) / N, on the
  // gradient's own (uncompressed) size; with a codec, also what the wire carried.
  function busbw(d) {
    const factor = 2 * (d.workers - 1) / d.workers, algbw = d.time_s > 0 ? d.bytes / d.time_s : 0;
    let text = `${fmtBytes(algbw * factor)}/s (nccl-tests: size / time × 2 (N − 1) / N, on the ${fmtBytes(d.bytes)} float32 gradient)`;
    if (d.compression) text += `; on the wire ${fmtBytes(algbw * factor * d.compression.itemsize / 4)}/s (${d.compression.codec}: ${d.compression.itemsize}-byte elements)`;
    return text;
  }

  function failureLine(f) {
    const how = f.detection === "stall" ? "stalls" : "crashes";
    if (harmless(f)) return `rank ${f.device} ${how} at ${fmtTime(f.at_s)}, after ${f.at_s >= S.data.time_s ? "the collective ended" : "its last transfer"}: no effect on this collective`;
    const first = firstNotice(f), peers = f.stopped.length - 1;
    return `rank ${f.device} ${how} at ${fmtTime(f.at_s)}; ${peers} ${peers === 1 ? "peer reports" : "peers report"} it, the first at ` +
      `${fmtTime(first.at_s)} (${fmtTime(first.at_s - f.at_s)} later: ${f.detection === "stall" ? "the timeout" : f.check_every_s > 0 ? "liveness check" : "connection closed"})`;
  }

  function panels() {
    const d = S.data;
    d.narration.forEach((s, j) => { if (s.listed && !s.text) s.text = listing(s, j, d.narration.length); });
    numbers();
    $("explain-title").textContent = `How ${d.algorithm} works`;
    $("explanation").textContent = (d.summary ? d.summary + ".\n" : "") + (d.explanation || "");
    const steps = $("steps"), frag = document.createDocumentFragment();
    steps.innerHTML = "";
    d.narration.forEach((s, j) => {
      const li = document.createElement("li"); li.textContent = s.text; if (S.anim.never.has(j)) li.className = "never";
      li.onclick = () => { Controls.pause(); Animation.advanceTo(S.anim.roundStart[j] + 1e-15 * d.time_s); };
      frag.appendChild(li);
    });
    steps.appendChild(frag);
    S.anim.current = null;
    failureBox();
  }

  // One line per moment: who fails, then who stops then (grouped: at 64 workers most stop together).
  function failureBox() {
    const d = S.data, f = d.failure;
    $("failure-box").hidden = !f;
    if (!f) return;
    const groups = new Map();
    for (const s of [...f.stopped].sort((a, b) => a.at_s - b.at_s || a.node - b.node)) {
      const key = s.node === f.device ? "dead" : String(s.at_s);
      if (!groups.has(key)) groups.set(key, { at: s.at_s, dead: s.node === f.device, names: [] });
      groups.get(key).names.push(nodeName(s.node));
    }
    const list = (ns) => ns.length <= 6 ? ns.join(", ") : ns.slice(0, 5).join(", ") + ` and ${ns.length - 5} more`;
    const how = f.detection === "stall" ? "the timeout" : f.check_every_s > 0 ? "a liveness check" : "a closed connection";
    $("failure-events").innerHTML = [...groups.values()].sort((a, b) => a.at - b.at || b.dead - a.dead).map((g) =>
      `<li data-at="${g.at}">${fmtTime(g.at)}: ${g.dead ? `${g.names[0]} ${f.detection === "stall" ? "stalls (alive, silent)" : "dies"}` :
        `${list(g.names)} ${g.names.length > 1 ? "notice" : "notices"} it (${how}, ${fmtTime(g.at - f.at_s)} after) and raise${g.names.length > 1 ? "" : "s"} PeerError naming rank ${f.device}`}</li>`).join("");
    const r = f.recovery;
    if (harmless(f)) {
      $("recovery").textContent = `No survivor waited for it: this collective completes at ${fmtTime(d.time_s)} and nothing restarts now. ` +
        `The next collective would find rank ${f.device} gone; an elastic restart would then re-form the group with the ${d.workers - 1} others` +
        (r && r.time_s ? ` (${fmtTime(r.time_s)} per collective).` : ".");
    } else {
      $("recovery").textContent = r && r.time_s ? `Then every survivor has the error, none hangs. An elastic restart re-forms the group with the ` +
        `${r.workers} survivors (a new rendezvous, seconds) and runs the collective again: ${fmtTime(r.time_s)} for ${r.workers} workers.` :
        `Recovery: ${r ? r.note : ""}`;
    }
    $("recover").hidden = !(r && r.time_s);
  }

  function failureEvents() {
    if (!S.data.failure) return;
    for (const li of $("failure-events").children) li.className = Number(li.dataset.at) <= S.now ? "" : "later";
  }

  // The followed chunk's partial sums, written out with the numbers in the cells.
  function follow() {
    const box = $("follow"), d = S.data, A = S.anim;
    if (S.follow === null || !A.sets) { box.textContent = d && !d.estimate ? (S.geom && S.geom.cell ? "Click a buffer's cell to follow that chunk." : "") : ""; return; }
    const n = d.workers, parts = [];
    for (let s = 0; s < Math.min(A.nodes, 8); s++) {
      const set = A.sets[s];
      parts.push(`${nodeName(s)}: ${set.length === n && n > 6 ? `a0 + … + a${n - 1} (all ${n}) = ${set.reduce((t, w) => t + Values.input(w, S.follow), 0)}` :
        set.length > 6 ? `${set.length} of ${n} inputs` : Values.sum(set, S.follow)}`);
    }
    box.textContent = `Chunk ${S.follow} (click it again to stop; worker i's input in it is a_i) — ` + parts.join("; ") + (A.nodes > 8 ? "; …" : "");
  }

  return { summary, firstNotice, narration, panels, failureEvents, follow };
})();
