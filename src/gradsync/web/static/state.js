// gradsync live view: the one state object every part of the page reads and changes, and what
// they all share (constants, formats, canvases sized to their box). The page is plain scripts
// loaded in order (no build step, nothing fetched): state, source, animation, layout, canvas,
// timeline, chart, lesson, tour, controls; each part is one object of public functions.
// Everything drawn comes from gradsync's schedules and simulator: /api/simulate, or in a static
// export the exported schedules timed in the page (site.js, model.js: the same answer, checked).
"use strict";

const $ = (id) => document.getElementById(id);
const REDUCE = 0, COPY = 1, CODED = 2;
const COLOR = { coded: "#c084fc", fail: "#ef4444", done: "#f8fafc", wait: "#fbbf24", stall: "#a78bfa", text: "#e2e8f0",
                dim: "#94a3b8", grid: "#1e293b" };
const MIN_FONT = 11;                       // CSS px: no text smaller than this, on any canvas
const ROUND_SECONDS = 0.6;                 // at speed 1 a round plays in about this long...
const PLAY_LIMITS = [6, 40];               // ...within these seconds for the whole collective
const stats = (window.gradsyncStats = { fps: 0, frames: 0, updateMs: null, requests: 0, drawnWorkers: 0,
                                         minFont: Infinity, chartRequests: 0, chartApplied: 0 });

// The state: set by the handlers, the frame loop and the test hook, through the parts' functions.
const S = {
  data: null,            // the simulation shown (the answer of /api/simulate)
  anim: null,            // what drawing it needs, derived once per simulation (animation.js)
  now: 0,                // the moment shown, seconds into the collective
  playing: true, speedExp: 0, lastFrame: null, scrubbing: false,
  seq: 0, pendingSince: null, controller: null,     // the simulation request in flight
  failure: null,         // the failure asked for: { device, at, detection }
  follow: null,          // the chunk followed, or null
  hover: null,           // the worker under the pointer
  hidePackets: false,    // draw without packets (the test hook's pixel reads)
  fixedWorkers: {},      // presets with their own worker count
  view: null, geom: null,                           // the drawing's canvas and where things go (layout.js)
  timeline: null,                                   // the timeline's canvas and scale (timeline.js)
  chart: { seq: 0, controller: null, curves: {}, meta: null, hidden: new Set(), boxes: [] },
  compare: null,         // a second algorithm beside the first (lesson.js), or null
};

function fmtTime(s) {
  if (s === null || s === undefined || !Number.isFinite(s)) return "-";
  if (s >= 1) return s.toPrecision(3) + " s";
  if (s >= 1e-3) return (s * 1e3).toPrecision(3) + " ms";
  return (s * 1e6).toPrecision(3) + " µs";
}
function fmtBytes(b) {
  for (const [u, k] of [["TB", 1e12], ["GB", 1e9], ["MB", 1e6], ["kB", 1e3]]) if (b >= k) return (b / k).toPrecision(3) + " " + u;
  return Math.round(b) + " B";
}
function font(g, px, weight = "") {
  px = Math.max(MIN_FONT, px);
  stats.minFont = Math.min(stats.minFont, px);
  g.font = `${weight} ${px}px system-ui, sans-serif`;
}
const chunkHue = (c, k) => (360 * c) / Math.max(k, 1);
const chunkColor = (c, k, light = 55) => `hsl(${chunkHue(c, k)}, 85%, ${light}%)`;
const filled = (id) => $(id).value.trim() !== "";
const nodeName = (node) => S.data.topology.nodes[S.data.placement[node]].name;   // a schedule node's name

// A canvas sized to its box, sharp on high-DPI screens.
function fit(canvas, height) {
  const dpr = window.devicePixelRatio || 1, w = canvas.clientWidth || 300;
  const h = height ?? canvas.clientHeight ?? w;
  if (height !== undefined) canvas.style.height = h + "px";
  canvas.width = Math.round(w * dpr); canvas.height = Math.round(h * dpr);
  const g = canvas.getContext("2d");
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  return { g, w, h, dpr };
}

// Boxes that must not overlap, and must stay inside their canvas (a test reads them).
const overlaps = (a, b) => a.x0 < b.x1 && b.x0 < a.x1 && a.y0 < b.y1 && b.y0 < a.y1;
function textBox(g, text, x, y, size = 11) {          // the box of text drawn with its baseline at y
  return { x0: x, y0: y - size, x1: x + g.measureText(text).width, y1: y + 3 };
}
