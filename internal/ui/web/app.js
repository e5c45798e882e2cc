// dflow's dashboard: one panel per run, drawn as the page loads from the
// runs' graphs and frames so far that the server put in the page
// (#dflow-data), then fed new frames by server-sent events
// (/api/events?run=N&from=I). Plain DOM and SVG, no library.
"use strict";
const NS = "http://www.w3.org/2000/svg";
const GAP = 180, ROW = 20, HEAD = 34, VGAP = 28, BAR = 80, BAR_X = 22, QW = 50;
// BAND_OVER: a busy-share chart of more replicas than this draws their
// spread (a band) and the least busy one, not a line each.
// EMPTY: a queue at this depth or under is empty (a summary's mean
// depth: the diagnosis' "always empty").
const BAND_OVER = 4, EMPTY = 0.05;
const COLOURS = ["#4a78c2", "#3a9a4d", "#c8413b", "#e0a020", "#8a5cc2", "#2aa0a0", "#c25c9a", "#777"];

function el(tag, attrs, parent, text) {
  const e = tag.startsWith("svg:") ? document.createElementNS(NS, tag.slice(4)) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  if (parent) parent.appendChild(e);
  return e;
}
const pct = (x) => Math.round(100 * (x || 0)) + "%";
const fmtNum = (v) => Math.abs(v) >= 1000 ? v.toFixed(0) : Math.abs(v) >= 10 ? v.toFixed(1) : v.toFixed(3);
const fmtRate = (v) => (v >= 100 ? v.toFixed(0) : v.toFixed(1)) + " items/s";
const fmtSecs = (s) => s >= 60 ? Math.floor(s / 60) + "m" + Math.round(s % 60) + "s" : s.toFixed(1) + "s";

// layout places stages in columns by their longest path from a source;
// boxes are wider when they name each replica's cluster worker.
function layout(g) {
  const BOX_W = g.stages.some((s) => s.workers) ? 290 : 220;
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
  const order = g.stages.slice().sort((a, b) => layer[a.name] - layer[b.name]);
  return { pos, order, BOX_W, width: 20 + ncols * BOX_W + (ncols - 1) * GAP, height: height + 10 };
}

function panel(g, index, root, init) {
  const div = el("section", { class: "run", "data-run": index }, root);
  el("h2", {}, div, g.title);
  const top = el("div", { class: "top" }, div);
  const status = el("span", { class: "status" }, top, g.live ? "starting" : "report");
  const clock = el("span", {}, top);
  const bar = el("span", { class: "progress" }, top);
  const fill = el("div", { style: "width:0" }, bar);
  const eta = el("span", { class: "eta" }, top);
  const error = el("div", { class: "error", role: "alert", hidden: "" }, div);
  const replay = el("label", { class: "replay" }, div);
  el("span", { class: "replay-name" }, replay, "replay");
  const slider = el("input", { type: "range", min: 0, max: 0, value: 0, "aria-label": "replay: pick a frame of the run" }, replay);
  const showing = el("span", { class: "showing" }, replay);

  const view = { reps: {}, queues: {}, edgeLabels: {}, rates: {}, nodes: {} };
  let L, svg;
  // graph draws the pipeline's graph, or draws it again in place when a
  // stage has gained rows (grow)
  function graph() {
    L = layout(g);
    const BOX_W = L.BOX_W, old = svg;
    svg = el("svg:svg", { class: "graph", viewBox: `0 0 ${L.width} ${L.height}` });
    if (old) old.replaceWith(svg);
    else div.appendChild(svg);
    for (const k of Object.keys(view)) view[k] = {};
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
      const qx = x2 - GAP + 10;
      const label = el("svg:text", { class: "edge-label", x: qx, y: b.y + 12 + k * 12, "data-edge": e.name }, svg);
      view.edgeLabels[e.name] = label;
      e.queues.forEach((q, i) => {
        const rows = q.consumers.map((c) => b.y + HEAD + c * ROW);
        const y = q.consumers.length === 1 ? rows[0] : (rows[0] + rows[rows.length - 1]) / 2;
        const gq = el("svg:g", { transform: `translate(${qx},${y})` }, svg);
        const qb = el("svg:rect", { class: "q-bg", x: 0, y: 1, width: QW, height: ROW - 6, "data-queue-gauge": `${e.name}/${i}` }, gq);
        const qf = el("svg:rect", { class: "q-fill", x: 0, y: 1, width: 0, height: ROW - 6 }, gq);
        const qt = el("svg:text", { x: QW + 5, y: ROW - 7, "data-queue": `${e.name}/${i}` }, gq, `0/${e.capacity}`);
        const wiring = `producers ${q.producers.join(",")} -> consumers ${q.consumers.join(",")}`;
        const qtip = el("svg:title", {}, gq, `edge ${e.name} queue ${i}: ${wiring}`);
        view.queues[`${e.name}/${i}`] = { bg: qb, fill: qf, text: qt, tip: qtip, cap: e.capacity, e, i, wiring, to: e.to, consumers: q.consumers };
      });
    }
    for (const s of g.stages) {
      const p = L.pos[s.name];
      // a sink's idle share is how it spends its time: drawn in a quiet colour
      const gs = el("svg:g", { transform: `translate(${p.x},${p.y})`, "data-stage": s.name, class: s.sink ? "sink" : "" }, svg);
      el("svg:rect", { class: "stage-box", width: BOX_W, height: p.h, rx: 5 }, gs);
      el("svg:text", { class: "stage-name", x: 8, y: 15 }, gs, s.name);
      view.nodes[s.name] = el("svg:text", { class: "node", x: 8, y: 28, "data-node": s.name }, gs, `${s.node} ×${s.replicas}`);
      const rate = el("svg:text", { class: "rate", x: BOX_W - 8, y: 15, "text-anchor": "end", "data-rate": s.name }, gs);
      view.rates[s.name] = rate;
      for (let i = 0; i < s.replicas; i++) {
        const gr = el("svg:g", { class: "rep", transform: `translate(8,${HEAD + i * ROW})`, "data-replica": `${s.name}/${i}` }, gs);
        el("svg:text", { class: "rep-index", x: 0, y: ROW - 8 }, gr, `${i}`);
        el("svg:rect", { class: "rep-bg", x: BAR_X, width: BAR, height: ROW - 5 }, gr);
        const seg = ["busy", "idle", "blocked"].map((c) => el("svg:rect", { class: `seg-${c}`, height: ROW - 5, width: 0 }, gr));
        el("svg:rect", { class: "rep-frame", x: BAR_X, width: BAR, height: ROW - 5 }, gr);
        const t = el("svg:text", { class: "rep-text", x: BAR_X + BAR + 6, y: ROW - 8 }, gr, "");
        const w = s.workers ? el("svg:text", { class: "worker", x: BOX_W - 16, y: ROW - 8, "text-anchor": "end", "data-worker": `${s.name}/${i}` }, gr, s.workers[i] || "") : null;
        const tip = el("svg:title", {}, gr);
        view.reps[`${s.name}/${i}`] = { g: gr, seg, text: t, tip, worker: w };
      }
    }
  }
  graph();
  // grow gives a stage a row for each replica a frame has beyond those it
  // was drawn with (a rebalance starts some during the run), wired to its
  // shared edges' one queue, and draws the graph again
  function grow(fr) {
    let grown = false;
    const upTo = (n) => Array.from({ length: n }, (_, i) => i);
    for (const s of g.stages) {
      const n = ((((fr.stages || {})[s.name]) || {}).busy || []).length;
      if (n <= s.replicas) continue;
      s.replicas = n;
      grown = true;
      for (const e of g.edges) {
        if (e.queues.length !== 1) continue;
        if (e.to === s.name) e.queues[0].consumers = upTo(n);
        if (e.from === s.name) e.queues[0].producers = upTo(n);
      }
    }
    if (!grown) return;
    graph();
    if (!follow) draw(frames[+slider.value]); // following, the next draw comes at once
  }
  el("h3", {}, div, "over the run");
  const chartsDiv = el("div", { class: "charts" }, div);
  const charts = [];
  // zero: a value the chart's labels would print as 0 (0.0/s, 0%)
  for (const s of L.order) {
    charts.push(chart(chartsDiv, `stage/${s.name}/rate`, `${s.name} · throughput`, "items/s", null, (v) => v.toFixed(1) + "/s",
      () => [{ name: s.name, pts: series((f) => (f.rate || {})[s.name]) }], { zero: 0.05 }));
    const band = s.replicas > BAND_OVER;
    // every replica that ran: a rebalance starts some after the run
    const ran = () => Math.max(s.replicas, ...frames.map((f) => (((f.stages || {})[s.name] || {}).busy || []).length));
    charts.push(chart(chartsDiv, `stage/${s.name}/busy`, `${s.name} · busy share ${band ? `of ${s.replicas} replicas` : "per replica"}`, "% of time busy", 100, (v) => Math.round(v) + "%",
      () => Array.from({ length: ran() }, (_, i) => ({ name: `${i}`, pts: series((f) => { const sf = (f.stages || {})[s.name]; return sf && sf.busy[i] !== undefined ? 100 * sf.busy[i] : undefined; }) })),
      { band, zero: 0.5 }));
    for (const e of g.edges.filter((e) => e.from === s.name || (!e.from && s === L.order[L.order.length - 1])))
      charts.push(chart(chartsDiv, `edge/${e.name}/depth`, `${e.name} · queue depth (${e.policy})`, "items queued", e.capacity, (v) => `${v}/${e.capacity}`,
        () => e.queues.map((q, i) => ({ name: e.queues.length > 1 ? `q${i}→${q.consumers.join(",")}` : "queue", pts: series((f) => ((f.queues || {})[e.name] || [])[i]) })),
        { cap: e.capacity, zero: 0 }));
  }
  // the panels that have shown nothing but zero so far, named, not drawn
  const zeroNote = el("p", { class: "zero-note", hidden: "" }, div);
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
  // series: [t, value] of every sampled frame (not the summary) where
  // the value is known
  function series(of) {
    const pts = [];
    for (const f of frames) {
      if (f.summary) continue;
      const v = of(f);
      if (v !== undefined && v !== null && isFinite(v)) pts.push([f.t, v]);
    }
    return pts;
  }
  const sparks = {};
  // a rebalance's moves so far, in time order, each drawn as a marker on
  // every chart
  const moves = () => frames.flatMap((f) => f.moves || []);
  // sizes: the replicas of each stage of a rebalance over the run, as
  // steps, in a chart of its own ahead of the others; made with the first
  // frame that gives them (none without a rebalance)
  let sizes = null;
  function sizesChart() {
    if (sizes || !frames.some((f) => f.replicas)) return;
    const names = g.stages.map((s) => s.name).filter((n) => frames.some((f) => (f.replicas || {})[n] !== undefined));
    sizes = chart(chartsDiv, "rebalance/replicas", "replicas per stage (rebalance)", "replicas", null, (v) => `${v}`,
      () => names.map((n) => ({ name: n, pts: steps(series((f) => (f.replicas || {})[n])) })), { zero: 0 });
    chartsDiv.prepend(sizes.box);
    charts.unshift(sizes);
  }

  function draw(f) {
    if (!f) return;
    status.textContent = f.status;
    clock.textContent = fmtSecs(f.t);
    const n = frames.indexOf(f);
    showing.textContent = f.summary
      ? `whole run, ${fmtSecs(f.t)}: the report's summary (frame ${n + 1} of ${frames.length})`
      : `t = ${fmtSecs(f.t)}: the last ${fmtSecs(n > 0 ? f.t - frames[n - 1].t : f.t)} (frame ${n + 1} of ${frames.length})`;
    if (f.progress >= 0) {
      fill.style.width = pct(f.progress);
      eta.textContent = pct(f.progress) + (f.eta >= 0 ? " · ETA " + fmtSecs(f.eta) : "");
    } else {
      bar.style.display = "none";
      eta.textContent = "";
    }
    for (const e of g.edges) {
      const it = (f.items || {})[e.name], label = view.edgeLabels[e.name];
      if (label) label.textContent = `${e.name} · ${e.policy}` + (it ? ` · ${it[0]}→${it[1]}` : "");
    }
    const starvedNow = new Set(); // "stage/i" of each replica marked starved
    for (const s of g.stages) {
      const n = (f.replicas || {})[s.name];
      if (n !== undefined) {
        const first = frames.find((fr) => (fr.replicas || {})[s.name] !== undefined).replicas[s.name];
        view.nodes[s.name].textContent = `${s.node} ×${n}` + (n !== first ? ` (×${first} at the start)` : "");
      }
      const rate = (f.rate || {})[s.name];
      view.rates[s.name].textContent = rate === undefined ? "" : fmtRate(rate) + (f.summary ? " (run)" : "");
      const sf = (f.stages || {})[s.name];
      if (!sf) continue;
      const idles = (sf.idle || []).slice().sort((a, b) => a - b);
      const median = idles.length ? idles[Math.floor((idles.length - 1) / 2)] : 0;
      for (let i = 0; i < s.replicas; i++) {
        const v = view.reps[`${s.name}/${i}`];
        const b = sf.busy[i] || 0, id = (sf.idle || [])[i] || 0, bl = (sf.blocked || [])[i] || 0;
        let x = BAR_X;
        [b, id, bl].forEach((share, k) => {
          v.seg[k].setAttribute("x", x);
          v.seg[k].setAttribute("width", BAR * share);
          x += BAR * share;
        });
        const done = sf.done && sf.done[i] && f.status === "running";
        // starved: idle well above its siblings' median (the diagnosis' rule)
        const starved = !s.source && !done && s.replicas > 1 && id >= median + 0.25;
        // blocked: the frame's tag, which the server holds for a few
        // frames either way (no flicker near the threshold)
        const blocked = !done && (sf.tagged ? !!sf.tagged[i] : bl >= 0.5);
        if (starved) starvedNow.add(`${s.name}/${i}`);
        v.g.setAttribute("class", "rep" + (starved ? " starved" : blocked ? " blocked" : ""));
        const items = sf.in && sf.in[i] !== undefined ? ` · in ${sf.in[i]} out ${sf.out[i]}` : "";
        v.text.textContent = `busy ${pct(b)}` + (starved ? " starved" : blocked ? " blocked" : "") + (done ? " done" : "");
        const worker = (sf.workers && sf.workers[i]) || (s.workers && s.workers[i]) || "";
        if (v.worker) v.worker.textContent = worker;
        v.tip.textContent = `${s.name}[${i}]${worker ? " on worker " + worker : ""}: busy ${pct(b)}, idle ${pct(id)}, blocked ${pct(bl)} ` +
          (f.summary ? "of its lifetime (whole run)" : "of the last interval") + items;
      }
    }
    for (const q of Object.values(view.queues)) {
      const name = q.e.name, i = q.i;
      let d, text, tip;
      if (f.summary) {
        d = ((f.mean_queues || {})[name] || [])[i];
        const mx = ((f.max_queues || {})[name] || [])[i];
        if (d === undefined) continue;
        text = `mean ${d.toFixed(1)}/${q.cap}`;
        tip = `edge ${name} queue ${i} over the whole run: mean depth ${d.toFixed(2)}, max ${mx}, capacity ${q.cap} items`;
      } else {
        d = ((f.queues || {})[name] || [])[i];
        if (d === undefined) continue;
        text = `${d}/${q.cap}`;
        tip = `edge ${name} queue ${i}: ${d} items queued, capacity ${q.cap}`;
      }
      const r = q.cap > 0 ? d / q.cap : 0;
      const over = q.cap > 0 && d > q.cap;
      if (over) {
        // never drawn as if within capacity: the figure says what it counts
        text += " over capacity";
        tip += ". The depth exceeds the capacity: this report's dflow counted a remote queue's items in transit as well as those queued";
      }
      // an empty queue is the problem sign where a replica it feeds is
      // starved: the gauge is filled with the starved colour (--starved,
      // the legend's); empty before a replica that is not, it stays white
      const hungry = d <= EMPTY && q.consumers.some((c) => starvedNow.has(`${q.to}/${c}`));
      if (hungry) tip += `; empty while ${q.to} ${q.consumers.filter((c) => starvedNow.has(`${q.to}/${c}`)).join(",")} starves`;
      q.bg.setAttribute("class", "q-bg" + (hungry ? " starved" : ""));
      q.fill.setAttribute("width", QW * Math.min(r, 1));
      q.fill.setAttribute("class", "q-fill" + (over ? " over" : r >= 0.9 ? " full" : ""));
      q.text.textContent = text;
      q.tip.textContent = `${tip} (${q.wiring})`;
    }
    const zeroMetrics = drawMetrics(f);
    const tEnd = frames.length ? frames[frames.length - 1].t : f.t;
    const ms = moves();
    const zero = charts.filter((c) => !c.draw(tEnd, f.t, ms)).map((c) => c.title).concat(zeroMetrics);
    zeroNote.hidden = !zero.length;
    zeroNote.textContent = zero.length ? `zero throughout so far, not drawn until they move: ${zero.join("; ")}` : "";
    diag.replaceChildren();
    for (const d of f.diagnosis || []) el("li", {}, diag, d);
    if (!(f.diagnosis || []).length) el("li", {}, diag, f.status === "running" ? "nothing to say yet" : "nothing limited the run");
  }

  // drawMetrics draws a small series per node metric up to f, and
  // returns the names of those that have been zero in every frame so far
  // (not drawn).
  function drawMetrics(f) {
    const upTo = frames.indexOf(f);
    let any = false;
    const zero = [];
    for (const [stage, ms] of Object.entries(f.metrics || {}))
      for (const name of Object.keys(ms).sort()) {
        const key = `${stage}.${name}`;
        if (frames.every((fr) => !((fr.metrics || {})[stage] || {})[name])) {
          zero.push(`${stage} ${name}`);
          if (sparks[key]) sparks[key].box.hidden = true;
          continue;
        }
        any = true;
        let s = sparks[key];
        if (!s) {
          const box = el("div", { class: "metric" }, metrics);
          const label = el("div", {}, box);
          const svg = el("svg:svg", { viewBox: "0 0 170 36", preserveAspectRatio: "none" }, box);
          s = sparks[key] = { box, label, line: el("svg:polyline", {}, svg) };
        }
        s.box.hidden = false;
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
    return zero;
  }

  function take(fr) {
    frames.push(fr);
    grow(fr);
    sizesChart();
    if (fr.error) {
      error.hidden = false;
      error.textContent = `run ${fr.status}: ${fr.error}`;
    }
  }
  function follows() {
    slider.max = frames.length - 1;
    if (follow) {
      slider.value = frames.length - 1;
      draw(frames[frames.length - 1]);
    }
  }
  // the frames the page came with: drawn now, without waiting for events
  for (const fr of init.frames) take(fr);
  if (frames.length) follows();
  if (init.ended) return;
  const es = new EventSource(`api/events?run=${index}&from=${frames.length}`);
  es.onmessage = (ev) => {
    take(JSON.parse(ev.data));
    follows();
  };
  es.addEventListener("end", () => es.close());
  es.onerror = () => { if (frames.length && frames[frames.length - 1].status !== "running") es.close(); };
}

// nice ticks from 0 to hi
function ticks(hi) {
  const raw = hi / 5, mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((st) => st >= raw);
  const out = [];
  for (let k = 0; ; k++) {
    const v = +(k * step).toPrecision(6);
    out.push(v);
    if (v >= hi * (1 - 1e-9)) return out;
  }
}

// steps turns [t, value] points into a step line: each value holds until
// the next point's time
function steps(pts) {
  const out = [];
  pts.forEach((p, i) => {
    if (i > 0 && p[1] !== pts[i - 1][1]) out.push([p[0], pts[i - 1][1]]);
    out.push(p);
  });
  return out;
}

// moveText says a rebalance's move in words, as the run's diagnosis does
function moveText(m) {
  const n = m.replicas === 1 ? "1 replica" : `${m.replicas} replicas`;
  const measured = m.measured_gain !== undefined && m.measured_gain !== null ? `, measured ${signed(m.measured_gain)}` : "";
  return `at ${fmtSecs(m.t)} the rebalance moved ${n} ${m.from || "(spare)"} -> ${m.to} (${m.reason}), predicted ${signed(m.predicted_gain)} of the time left${measured}`;
}
const signed = (x) => (x >= 0 ? "+" : "") + Math.round(100 * x) + "%";

// quantile q of sorted values v, linear between ranks
function quantile(v, q) {
  const pos = q * (v.length - 1), lo = Math.floor(pos), hi = Math.ceil(pos);
  return v[lo] + (v[hi] - v[lo]) * (pos - lo);
}

// spread: per time, the minimum, quartiles, median and maximum of the
// series' values there
function spread(ss) {
  const byT = new Map();
  for (const s of ss) for (const [t, v] of s.pts) (byT.get(t) || byT.set(t, []).get(t)).push(v);
  return [...byT.keys()].sort((a, b) => a - b).map((t) => {
    const v = byT.get(t).sort((a, b) => a - b);
    return { t, min: v[0], q1: quantile(v, 0.25), med: quantile(v, 0.5), q3: quantile(v, 0.75), max: v[v.length - 1] };
  });
}

// chart is one time series panel: time in seconds along x, the unit
// along y from 0 (to fixed when given, else to the data's top), a line
// per series, the capacity (opts.cap) as a dashed line, the replay
// position as a vertical marker with each series' value there, and each
// move of a rebalance (draw's moves) as a violet rule titled in words. With
// opts.band (many replicas) it draws their spread instead of a line
// each: the range from the lowest to the highest as a light band, the
// middle half (quartiles) darker, the median as a line, and the least
// busy series (the lowest mean so far: the starved replica) as an amber
// line named in the legend. draw returns false, and hides the panel,
// while no value so far is above opts.zero (it would read 0 throughout).
function chart(parent, key, title, unit, fixed, fmt, data, opts) {
  const W = 330, H = 150, ML = 46, MR = 10, MT = 10, MB = 32;
  const { cap, band, zero = 0 } = opts || {};
  const box = el("figure", { class: "chart", "data-chart": key }, parent);
  el("figcaption", {}, box, title);
  const svg = el("svg:svg", { viewBox: `0 0 ${W} ${H}` }, box);
  const legend = el("div", { class: "chart-legend" }, box);
  const plot = el("svg:g", {}, svg);
  const xa = el("svg:g", { class: "axis x-axis" }, svg), ya = el("svg:g", { class: "axis y-axis" }, svg);
  el("svg:text", { class: "axis-label", x: ML + (W - ML - MR) / 2, y: H - 2, "text-anchor": "middle" }, svg, "time (s)");
  el("svg:text", { class: "axis-label", transform: `translate(10,${MT + (H - MT - MB) / 2}) rotate(-90)`, "text-anchor": "middle" }, svg, unit);
  return {
    title,
    box,
    draw(tEnd, tAt, moves) {
      const ss = data();
      if (!ss.some((s) => s.pts.some((p) => Math.abs(p[1]) > zero))) {
        box.hidden = true;
        return false;
      }
      box.hidden = false;
      let hi = fixed || 0;
      for (const s of ss) for (const p of s.pts) hi = Math.max(hi, p[1]);
      if (!(hi > 0)) hi = 1;
      const yt = ticks(hi);
      hi = yt[yt.length - 1];
      const xt = ticks(Math.max(tEnd, 1e-3));
      const t1 = xt[xt.length - 1];
      const X = (t) => ML + ((W - ML - MR) * t) / t1, Y = (v) => H - MB - ((H - MT - MB) * v) / hi;
      const pts = (ps) => ps.map(([t, v]) => `${X(t).toFixed(1)},${Y(v).toFixed(1)}`).join(" ");
      xa.replaceChildren();
      ya.replaceChildren();
      el("svg:line", { x1: ML, x2: W - MR, y1: H - MB, y2: H - MB }, xa);
      el("svg:line", { x1: ML, x2: ML, y1: MT, y2: H - MB }, ya);
      for (const t of xt) {
        el("svg:line", { x1: X(t), x2: X(t), y1: H - MB, y2: H - MB + 4 }, xa);
        el("svg:text", { x: X(t), y: H - MB + 14, "text-anchor": "middle" }, xa, `${t}`);
      }
      for (const v of yt) {
        el("svg:line", { class: "grid", x1: ML, x2: W - MR, y1: Y(v), y2: Y(v) }, ya);
        el("svg:text", { x: ML - 4, y: Y(v) + 3, "text-anchor": "end" }, ya, `${v}`);
      }
      plot.replaceChildren();
      if (cap) {
        el("svg:line", { class: "capacity", x1: ML, x2: W - MR, y1: Y(cap), y2: Y(cap) }, plot);
        el("svg:text", { class: "capacity-label", x: W - MR - 2, y: Y(cap) + 11, "text-anchor": "end" }, plot, `capacity ${cap}`);
      }
      legend.replaceChildren();
      // the value at the replay position: the last sample at or before it
      const at = (ps, of) => { let a; for (const p of ps) if (p.t <= tAt + 1e-9) a = of(p); return a; };
      const item = (cls, style, text) => {
        const it = el("span", { class: cls }, legend);
        el("i", { class: cls, style }, it);
        it.append(text);
      };
      if (band) {
        const sp = spread(ss);
        const area = (lo, hi) => pts(sp.map((p) => [p.t, hi(p)]).concat(sp.slice().reverse().map((p) => [p.t, lo(p)])));
        el("svg:polygon", { class: "band range", points: area((p) => p.min, (p) => p.max) }, plot);
        el("svg:polygon", { class: "band quartiles", points: area((p) => p.q1, (p) => p.q3) }, plot);
        el("svg:polyline", { class: "median", points: pts(sp.map((p) => [p.t, p.med])) }, plot);
        const mean = (s) => s.pts.reduce((a, p) => a + p[1], 0) / s.pts.length;
        const least = ss.filter((s) => s.pts.length).reduce((a, s) => (mean(s) < mean(a) ? s : a));
        el("svg:polyline", { class: "least", points: pts(least.pts), "data-series": least.name }, plot);
        box.dataset.least = least.name;
        const p = at(sp, (p) => p), lv = at(least.pts.map(([t, val]) => ({ t, val })), (p) => p.val);
        item("median", "", "median" + (p ? " " + fmt(p.med) : ""));
        item("quartiles", "", "middle half" + (p ? ` ${fmt(p.q1)}–${fmt(p.q3)}` : ""));
        item("range", "", `all ${ss.length}` + (p ? ` ${fmt(p.min)}–${fmt(p.max)}` : ""));
        item("least", "", `least busy: replica ${least.name}, ${fmt(mean(least))} on average` + (lv !== undefined ? `, ${fmt(lv)} here` : ""));
      } else {
        ss.forEach((s, k) => {
          const c = COLOURS[k % COLOURS.length];
          // earlier lines wider: lines that coincide (replicas in lockstep) show as bands
          if (s.pts.length) el("svg:polyline", { class: "series", stroke: c, "stroke-width": 1.5 + 1.5 * (ss.length - 1 - k), points: pts(s.pts) }, plot);
          const a = at(s.pts.map(([t, val]) => ({ t, val })), (p) => p.val);
          item("", `background:${c}`, `${s.name}${a !== undefined ? " " + fmt(a) : ""}`);
        });
      }
      (moves || []).forEach((m, k) => {
        const mg = el("svg:g", { class: "move", "data-move": k }, plot);
        el("svg:line", { x1: X(m.t), x2: X(m.t), y1: MT, y2: H - MB }, mg);
        el("svg:line", { class: "move-hit", x1: X(m.t), x2: X(m.t), y1: MT, y2: H - MB }, mg);
        el("svg:title", {}, mg, moveText(m));
      });
      el("svg:line", { class: "marker", x1: X(tAt), x2: X(tAt), y1: MT, y2: H - MB, "data-t": tAt }, plot);
      return true;
    },
  };
}

// the runs as the server put them in the page: their graphs and frames
// so far
const root = document.getElementById("runs");
JSON.parse(document.getElementById("dflow-data").textContent).runs.forEach((r, i) => panel(r.graph, i, root, r));
