// A short guided tour a student steps through: the ring, then why topology matters, then a
// failure. Each step sets the controls (the same ones a student uses), waits for the answer,
// then places the playback; its words quote the numbers of the run on screen, never fixed ones.
"use strict";

const Tour = (() => {
  const ring4 = { algorithm: "ring", topology: "ring", workers: "4", size: "16MB", bandwidth: "", latency: "", compression: "", beside: "" };
  const roundEnd = (j) => S.anim.roundDone[Math.min(j, S.anim.roundDone.length - 1)];
  const STEPS = [
    { title: "1. A ring of four GPUs", set: ring4, follow: 0, at: () => 0,
      text: () => `Each GPU's gradient is cut into ${S.anim.k} chunks; the numbers are the values each cell holds (worker i's ` +
        `input is a_i). Press "step ▶" to move one event at a time and watch chunk 0 travel around the ring, each GPU adding its own value ` +
        `to it. The drawing, the timeline below and "What happens now" all show the same transfers.` },
    { title: "2. Reduce-scatter done", set: ring4, follow: 0, at: () => roundEnd(S.data.workers - 2),
      text: () => `After ${S.data.workers - 1} steps every GPU holds the full sum of one chunk (a white frame): chunk 0's sum ` +
        `${Values.sum([...Array(S.data.workers).keys()], 0)} sits at one GPU. Each step moved only 1/${S.data.workers} of the buffer per GPU, ` +
        `on every link at once.` },
    { title: "3. All-gather", set: ring4, follow: 0, at: () => S.data.time_s,
      text: () => `${S.data.workers - 1} more steps pass the finished chunks around, overwriting: every GPU ends with every sum, ` +
        `in ${fmtTime(S.data.time_s)} here. The formula under the settings says why: 2 (N − 1) steps of n / N bytes each.` },
    { title: "4. Topology: a p3.16xlarge", set: { ...ring4, topology: "p3.16xlarge", workers: "8", size: "160MB" }, at: () => S.data.time_s * 0.3,
      text: () => { Tour.eight = S.data.time_s;
        return `Eight V100s joined by NVLink in a hybrid cube-mesh. gradsync runs two rings at once over different NVLinks, each on its ` +
          `own part of the buffer (the sentences name both): ${fmtTime(S.data.time_s)} for 160 MB, where D2L reports about 6 ms.`; } },
    { title: "5. The same machine, six GPUs", set: { ...ring4, topology: "p3.16xlarge", workers: "6", size: "160MB" }, at: () => S.data.time_s * 0.3,
      text: () => `With six of the eight GPUs the two NVLink rings do not close: one ring runs, some of its hops routed through ` +
        `a third node, its links unequally busy: ${fmtTime(S.data.time_s)}` +
        `${Tour.eight ? `, ${(S.data.time_s / Tour.eight).toFixed(1)}× the ${fmtTime(Tour.eight)} of all eight` : ""}. ` +
        `The busiest link (dashed amber) sets the pace.` },
    { title: "6. D2L's server, side by side", set: { ...ring4, algorithm: "central", topology: "pcie-switch-4", workers: "4", size: "160MB", beside: "sharded" },
      at: () => S.data.time_s * 0.4,
      text: () => `Four GPUs on one PCIe switch: summing on one GPU (central) against sharding the sum over all four (beside it, ` +
        `same clock): ${fmtTime(S.data.time_s)} against ${S.compare ? fmtTime(S.compare.time_s) : "…"}, D2L's 60 and 15 ms.` },
    { title: "7. A crash", set: { ...ring4, workers: "8", size: "160MB" }, fail: { device: 5, at: 0.4, detection: "crash" },
      at: () => S.data.failure.at_s * 1.01,
      text: () => `gpu5 dies 40% into the collective. Its neighbours wait for it (amber rings) until their next liveness check ` +
        `finds it; then each raises PeerError naming rank 5 (red). Press play and watch "What happens now".` },
    { title: "8. A stall", set: { ...ring4, workers: "8", size: "160MB" }, fail: { device: 5, at: 0.4, detection: "stall" },
      at: () => S.data.failure.at_s * 1.01,
      text: () => `Now gpu5 hangs, alive (a violet pause sign): no process dies, no connection closes, so its peers only stop at the ` +
        `collective's timeout, ${fmtTime(S.data.failure.timeout_s)} after it began; the timeline's axis breaks to show that gap.` },
  ];
  let step = -1;

  async function show(k) {
    step = Math.max(0, Math.min(STEPS.length - 1, k));
    const s = STEPS[step];
    $("tour").hidden = false;
    $("tour-title").textContent = s.title; $("tour-text").textContent = "…";
    $("tour-back").disabled = step === 0; $("tour-next").disabled = step === STEPS.length - 1;
    await Controls.apply(s.set, s.fail || null);
    Controls.pause();
    Animation.setFollow(s.follow === undefined ? null : s.follow);
    Animation.advanceTo(s.at());
    Canvas.render();
    if (s.set.beside) await Compare.load();
    $("tour-text").textContent = s.text();
    stats.tour = { step, title: s.title, text: $("tour-text").textContent };
  }

  function init() {
    $("tour-start").onclick = () => show(0);
    $("tour-next").onclick = () => show(step + 1);
    $("tour-back").onclick = () => show(step - 1);
    $("tour-end").onclick = () => { $("tour").hidden = true; step = -1; stats.tour = null; };
  }

  return { init, show, steps: STEPS.length };
})();
