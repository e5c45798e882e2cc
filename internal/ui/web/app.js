// dflow's dashboard: one panel per run (/api/runs), each fed frames by
// server-sent events (/api/events?run=N). Plain DOM and SVG, no library.
"use strict";
const NS = "http://www.w3.org/2000/svg";
const BOX_W = 190, GAP = 190, ROW = 20, HEAD = 34, VGAP = 28;

function el(tag, attrs, parent, text) {
  const e = tag.startsWith("svg:") ? document.createElementNS(NS, tag.slice(4)) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  if (parent) parent.appendChild(e);
  return e;
}
const pct = (x) => Math.round(100 * (x || 0)) + "%";
const fmtNum = (v) => Math.abs(v) >= 1000 ? v.toFixed(0) : Math.abs(v) >= 10 ? v.toFixed(1) : v.toFixed(3);
const fmtSecs = (s) => s >= 60 ? Math.floor(s / 60) + "m" + Math.round(s % 60) + "s" : s.toFixed(1) + "s";

// layout places stages in columns by their longest path from a source.
function layout(g) {
  const layer = {};
  g.stages.forEach((s) => (layer[s.name] = 0));
  for (let pass = 0; pass < g.stages.length; pass++)
    for (const e of g.edges)
      if (e.from && e.to && layer[e.to] < layer[e.from] + 1) layer[e.to] = layer[e.from] + 1;
  const cols = {}, pos = {};
  for (const s of g.stages) (cols[layer[s.name]] = cols[layer[s.name]] || []).push(s);
  let height = 0;
  for (const [c, stages] of Object.entries(cols)) {
    let y = 10;
    for (const s of stages) {
      const h = HEAD + s.replicas * ROW + 8;
      pos[s.name] = { x: 10 + c * (BOX_W + GAP), y, h };
      y += h + VGAP;
    }
    height = Math.max(height, y);
  }
  const ncols = Object.keys(cols).length;
  return { pos, width: 20 + ncols * BOX_W + (ncols - 1) * GAP, height: height + 10 };
}

function panel(g, index, root) {
  const div = el("section", { class: "run", "data-run": index }, root);
  el("h2", {}, div, g.title);
  const top = el("div", { class: "top" }, div);
  const status = el("span", { class: "status" }, top, g.live ? "starting" : "report");
  const clock = el("span", {}, top);
  const bar = el("span", { class: "progress" }, top);
  const fill = el("div", { style: "width:0" }, bar);
  const eta = el("span", { class: "eta" }, top);
  const slider = el("input", { type: "range", min: 0, max: 0, value: 0, title: "time" }, div);

  const L = layout(g);
  const svg = el("svg:svg", { class: "graph", viewBox: `0 0 ${L.width} ${L.height}` }, div);
  const view = { reps: {}, queues: {}, edgeLabels: {} };
  // edges first, under the boxes
  const incoming = {};
  for (const e of g.edges) {
    const a = L.pos[e.from], b = L.pos[e.to];
    if (!a || !b) continue;
    const k = (incoming[e.to] = (incoming[e.to] || 0) + 1) - 1;
    const x1 = a.x + BOX_W, y1 = a.y + a.h / 2, x2 = b.x, y2 = b.y + b.h / 2;
    const mx = (x1 + x2) / 2;
    el("svg:path", { class: "edge", d: `M${x1},${y1} C${mx},${y1} ${mx},${y2} ${x2},${y2}` }, svg);
    // the queues: one gauge per queue, beside the consumers it feeds
    const qx = x2 - 150 - k * 0;
    const label = el("svg:text", { class: "edge-label", x: qx, y: b.y + 12 + k * 12, "data-edge": e.name }, svg);
    view.edgeLabels[e.name] = label;
    e.queues.forEach((q, i) => {
      const rows = q.consumers.map((c) => b.y + HEAD + c * ROW);
      const y = q.consumers.length === 1 ? rows[0] : (rows[0] + rows[rows.length - 1]) / 2;
      const gq = el("svg:g", { transform: `translate(${qx},${y})` }, svg);
      el("svg:rect", { class: "q-bg", x: 0, y: 1, width: 70, height: ROW - 6 }, gq);
      const qf = el("svg:rect", { class: "q-fill", x: 0, y: 1, width: 0, height: ROW - 6 }, gq);
      const qt = el("svg:text", { x: 76, y: ROW - 7, "data-queue": `${e.name}/${i}` }, gq, `0/${e.capacity}`);
      el("svg:title", {}, gq, `edge ${e.name} queue ${i}: producers ${q.producers.join(",")} -> consumers ${q.consumers.join(",")}`);
      view.queues[`${e.name}/${i}`] = { fill: qf, text: qt, cap: e.capacity };
    });
  }
  for (const s of g.stages) {
    const p = L.pos[s.name];
    const gs = el("svg:g", { transform: `translate(${p.x},${p.y})`, "data-stage": s.name }, svg);
    el("svg:rect", { class: "stage-box", width: BOX_W, height: p.h, rx: 5 }, gs);
    el("svg:text", { class: "stage-name", x: 8, y: 15 }, gs, s.name);
    el("svg:text", { class: "node", x: 8, y: 28 }, gs, `${s.node} ×${s.replicas}`);
    for (let i = 0; i < s.replicas; i++) {
      const gr = el("svg:g", { class: "rep", transform: `translate(8,${HEAD + i * ROW})`, "data-replica": `${s.name}/${i}` }, gs);
      el("svg:rect", { class: "rep-bg", width: 110, height: ROW - 5 }, gr);
      const seg = ["busy", "idle", "blocked"].map((c) => el("svg:rect", { height: ROW - 5, width: 0, fill: `var(--${c})` }, gr));
      el("svg:rect", { class: "rep-frame", width: 110, height: ROW - 5 }, gr);
      const t = el("svg:text", { x: 116, y: ROW - 8 }, gr, `${i}`);
      const tip = el("svg:title", {}, gr);
      view.reps[`${s.name}/${i}`] = { g: gr, seg, text: t, tip };
    }
  }
  const mh = el("h3", {}, div, "node metrics");
  const metrics = el("div", { class: "metrics" }, div);
  el("h3", {}, div, "diagnosis");
  const diag = el("ul", { class: "diagnosis" }, div);

  const frames = [];
  let follow = true;
  slider.addEventListener("input", () => {
    follow = +slider.value === frames.length - 1;
    draw(frames[+slider.value]);
  });
  const sparks = {};

  function draw(f) {
    if (!f) return;
    status.textContent = f.status;
    clock.textContent = fmtSecs(f.t);
    if (f.progress >= 0) {
      fill.style.width = pct(f.progress);
      eta.textContent = pct(f.progress) + (f.eta >= 0 ? " · ETA " + fmtSecs(f.eta) : "");
    } else {
      bar.style.display = "none";
      eta.textContent = "";
    }
    for (const [name, depths] of Object.entries(f.queues || {}))
      depths.forEach((d, i) => {
        const q = view.queues[`${name}/${i}`];
        if (!q) return;
        const r = q.cap > 0 ? Math.min(d / q.cap, 1) : 0;
        q.fill.setAttribute("width", 70 * r);
        q.fill.setAttribute("class", "q-fill" + (r >= 0.9 ? " full" : d === 0 ? " empty" : ""));
        q.text.textContent = `${d}/${q.cap}`;
      });
    for (const e of g.edges) {
      const it = (f.items || {})[e.name], label = view.edgeLabels[e.name];
      if (label) label.textContent = `${e.name} · ${e.policy}` + (it ? ` · ${it[0]}→${it[1]}` : "");
    }
    for (const s of g.stages) {
      const sf = (f.stages || {})[s.name];
      if (!sf) continue;
      const idles = (sf.idle || []).slice().sort((a, b) => a - b);
      const median = idles.length ? idles[Math.floor((idles.length - 1) / 2)] : 0;
      for (let i = 0; i < s.replicas; i++) {
        const v = view.reps[`${s.name}/${i}`];
        const b = sf.busy[i] || 0, id = (sf.idle || [])[i] || 0, bl = (sf.blocked || [])[i] || 0;
        let x = 0;
        [b, id, bl].forEach((share, k) => {
          v.seg[k].setAttribute("x", x);
          v.seg[k].setAttribute("width", 110 * share);
          x += 110 * share;
        });
        const done = sf.done && sf.done[i] && f.status === "running";
        // starved: idle well above its siblings' median (the diagnosis' rule)
        const starved = !s.source && !done && s.replicas > 1 && id >= median + 0.25;
        const blocked = !done && bl >= 0.5;
        v.g.setAttribute("class", "rep" + (starved ? " starved" : blocked ? " blocked" : ""));
        const items = sf.in && sf.in[i] !== undefined ? ` · in ${sf.in[i]} out ${sf.out[i]}` : "";
        v.text.textContent = `${i} ${pct(b)}` + (starved ? " starved" : blocked ? " blocked" : "") + (done ? " done" : "");
        v.tip.textContent = `${s.name}[${i}]: busy ${pct(b)}, idle ${pct(id)}, blocked ${pct(bl)}${items}`;
      }
    }
    drawMetrics(f);
    diag.replaceChildren();
    for (const d of f.diagnosis || []) el("li", {}, diag, d);
    if (!(f.diagnosis || []).length) el("li", {}, diag, f.status === "running" ? "nothing to say yet" : "nothing limited the run");
  }

  function drawMetrics(f) {
    const upTo = frames.indexOf(f);
    let any = false;
    for (const [stage, ms] of Object.entries(f.metrics || {}))
      for (const name of Object.keys(ms).sort()) {
        any = true;
        const key = `${stage}.${name}`;
        let s = sparks[key];
        if (!s) {
          const box = el("div", { class: "metric" }, metrics);
          const label = el("div", {}, box);
          const svg = el("svg:svg", { viewBox: "0 0 170 36", preserveAspectRatio: "none" }, box);
          s = sparks[key] = { label, line: el("svg:polyline", {}, svg) };
        }
        const pts = [];
        for (let i = 0; i <= upTo; i++) {
          const m = (frames[i].metrics || {})[stage];
          if (m && m[name] !== undefined) pts.push([frames[i].t, m[name]]);
        }
        s.label.textContent = `${stage} ${name} = ${fmtNum(ms[name])}`;
        if (pts.length < 2) continue;
        const t0 = pts[0][0], t1 = pts[pts.length - 1][0] || 1;
        let lo = Math.min(...pts.map((p) => p[1])), hi = Math.max(...pts.map((p) => p[1]));
        if (hi === lo) { hi += 1; lo -= 1; }
        s.line.setAttribute("points", pts.map(([t, v]) =>
          `${(170 * (t - t0)) / Math.max(t1 - t0, 1e-9)},${33 - (30 * (v - lo)) / (hi - lo)}`).join(" "));
      }
    mh.style.display = metrics.style.display = any ? "" : "none";
  }

  const es = new EventSource(`api/events?run=${index}`);
  es.onmessage = (ev) => {
    frames.push(JSON.parse(ev.data));
    slider.max = frames.length - 1;
    if (follow) {
      slider.value = frames.length - 1;
      draw(frames[frames.length - 1]);
    }
  };
  es.addEventListener("end", () => es.close());
  es.onerror = () => { if (frames.length && frames[frames.length - 1].status !== "running") es.close(); };
}

fetch("api/runs").then((r) => r.json()).then((runs) => {
  const root = document.getElementById("runs");
  runs.forEach((g, i) => panel(g, i, root));
});
