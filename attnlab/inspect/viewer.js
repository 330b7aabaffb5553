// attnlab attention viewer (attnlab/inspect/viewer.py): inline in the page, nothing loaded.
//
// The data block holds the tokens, the attention kinds and, per map, its shape (H, Tq, Tk) and
// byte offsets into `blob` = base64(zlib(uint8 weights round(255 w) | uint8 allowed masks)).
// window.attnlabViewer exposes the state to tests and to the console:
//   ready (a Promise), highlighted(), weights(kind, layer, head), setKind(i), setLayer(i),
//   setHeads([...]), setView("head" | "model"), zoom(layer, head)
(function () {
  "use strict";
  const DATA = JSON.parse(document.getElementById("attnlab-data").textContent);
  const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                   "#bcbd22", "#17becf", "#393b79", "#ad494a"];
  const ROW = 20;           // px per token row in the head view
  const ALL_LINES = 20000;  // above this many lines, the head view draws on hover only
  const SVG = svgNamespace();
  const state = { kind: 0, layer: 0, heads: [], view: "head", hover: null, pinned: null, shade: true, sqrt: false,
                  zoom: null };
  const app = document.getElementById("app");
  let bytes = null;

  // an element with attributes and children (nodes or text)
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    for (const c of children) e.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
    return e;
  }
  function svgNamespace() {  // the parser's own, so that no URL is written into the page
    const d = document.createElement("div");
    d.innerHTML = "<svg></svg>";
    return d.firstChild.namespaceURI;
  }
  function checkbox(attrs, checked, onChange) {
    const box = el("input", { type: "checkbox", ...attrs });
    box.checked = checked;
    box.addEventListener("change", () => onChange(box.checked));
    return box;
  }
  function colour(h) { return h < PALETTE.length ? PALETTE[h] : `hsl(${(h * 137.5) % 360},65%,45%)`; }
  function shown(t) { return t.replace(/ /g, "\u2423").replace(/\n/g, "\u23ce").replace(/\t/g, "\u21e5"); }

  async function inflate(b64) {
    const bin = atob(b64);
    const packed = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) packed[i] = bin.charCodeAt(i);
    const stream = new Blob([packed]).stream().pipeThrough(new DecompressionStream("deflate"));
    return new Uint8Array(await new Response(stream).arrayBuffer());
  }

  // ---- the data ----
  function kind() { return DATA.kinds[state.kind]; }
  function map() { return kind().maps[state.layer]; }
  function queryLabels(k) { return DATA.tokens[k.queries]; }
  function keyLabels(k, m) { return m.keyLabels || DATA.tokens[k.keys]; }
  function weight(m, h, i, j) { const [, tq, tk] = m.shape; return bytes[m.offset + (h * tq + i) * tk + j] / 255; }
  function allowed(m, i, j) { return m.allowed === null || bytes[m.allowed + i * m.shape[2] + j] === 1; }
  // weights along a token: over the keys for a query, over the queries for a key
  function along(m, h, side, index) {
    const [, tq, tk] = m.shape, out = [];
    if (side === "query") for (let j = 0; j < tk; j++) out.push(weight(m, h, index, j));
    else for (let i = 0; i < tq; i++) out.push(weight(m, h, i, index));
    return out;
  }
  function selected() { return state.pinned || state.hover; }

  // ---- the page ----
  function header() {
    app.textContent = "";
    app.appendChild(el("h1", {}, DATA.title));
    app.appendChild(el("div", { class: "model" }, Object.entries(DATA.model).map(([k, v]) => `${k} ${v}`).join(" \u00b7 ")));
    if (DATA.notice) app.appendChild(el("div", { class: "notice", id: "notice" }, DATA.notice));
    const kindSel = el("select", { id: "kind" }, ...DATA.kinds.map((k, i) => el("option", { value: i }, k.label)));
    kindSel.addEventListener("change", () => setKind(+kindSel.value));
    const tabs = el("span", { class: "tabs" });
    for (const [v, t] of [["head", "Head view"], ["model", "Model view"]]) {
      const b = el("button", { id: `tab-${v}`, type: "button" }, t);
      b.addEventListener("click", () => setView(v));
      tabs.appendChild(b);
    }
    const shade = checkbox({ id: "shade" }, state.shade, on => { state.shade = on; render(); });
    const sqrt = checkbox({ id: "sqrt" }, state.sqrt, on => { state.sqrt = on; render(); });
    app.appendChild(el("div", { class: "bar" }, el("label", {}, "Attention kind ", kindSel), tabs,
                       el("label", {}, shade, " grey out keys a query may not see"),
                       el("label", {}, sqrt, " heatmaps on a square-root scale (small weights show)")));
    app.appendChild(el("section", { id: "head-view" }));
    app.appendChild(el("section", { id: "model-view" }));
  }

  function render() {
    document.getElementById("kind").value = state.kind;
    for (const v of ["head", "model"]) {
      document.getElementById(`tab-${v}`).classList.toggle("on", state.view === v);
      document.getElementById(`${v}-view`).classList.toggle("hidden", state.view !== v);
    }
    if (state.view === "head") renderHead(); else renderModel();
  }

  // ---- head view: queries left, keys right, a line per head from the token under the mouse ----
  function renderHead() {
    const sec = document.getElementById("head-view"), k = kind(), m = map();
    sec.textContent = "";
    const layerSel = el("select", { id: "layer" }, ...k.maps.map((mm, i) => el("option", { value: i }, `layer ${mm.layer}`)));
    layerSel.value = state.layer;
    layerSel.addEventListener("change", () => setLayer(+layerSel.value));
    const heads = el("span", { class: "heads", id: "heads" }, ...m.heads.map((h, hi) => el("label", {},
      checkbox({ "data-head": h }, state.heads[hi], on => { state.heads[hi] = on; drawLines(); }),
      el("span", { class: "swatch", style: `background:${colour(hi)}` }), `head ${h}`)));
    const bar = el("div", { class: "bar" }, el("label", {}, "Layer ", layerSel), heads);
    for (const [t, on] of [["all", true], ["none", false]]) {
      const b = el("button", { type: "button", id: `heads-${t}` }, t);
      b.addEventListener("click", () => setHeads(m.heads.filter(() => on)));
      bar.appendChild(b);
    }
    sec.appendChild(bar);
    sec.appendChild(el("div", { class: "info" }, `${m.name} \u00b7 weights (${m.shape.join(", ")}) \u00b7 ${m.note}` +
                       " \u00b7 hover a token for its weights, click to pin it"));
    const qs = queryLabels(k), ks = keyLabels(k, m);
    const svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("class", "lines"); svg.setAttribute("id", "lines");
    svg.setAttribute("width", 280); svg.setAttribute("height", Math.max(qs.length, ks.length) * ROW);
    const column = (labels, side) => el("div", { class: `col ${side === "query" ? "left" : "right"}` },
      ...labels.map((t, i) => token(t, i, side)));
    sec.appendChild(el("div", { id: "head-panel" }, column(qs, "query"), svg, column(ks, "key")));
    drawLines();
  }

  function token(text, index, side) {
    const d = el("div", { class: `tok ${side[0]}`, "data-index": index, title: `${side} ${index}: ${text}` }, shown(text));
    d.addEventListener("mouseenter", () => { state.hover = { side, index }; drawLines(); });
    d.addEventListener("mouseleave", () => { state.hover = null; drawLines(); });
    d.addEventListener("click", () => {
      const p = state.pinned;
      state.pinned = p && p.side === side && p.index === index ? null : { side, index };
      drawLines();
    });
    return d;
  }

  function drawLines() {
    if (state.view !== "head") return;
    const svg = document.getElementById("lines"), m = map(), [, tq, tk] = m.shape, width = +svg.getAttribute("width");
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    const sel = selected(), on = m.heads.map((h, hi) => hi).filter(hi => state.heads[hi]);
    const qEls = document.querySelectorAll("#head-panel .tok.q"), kEls = document.querySelectorAll("#head-panel .tok.k");
    for (const e of [...qEls, ...kEls]) { e.classList.remove("active", "pinned", "blocked"); e.style.background = ""; }
    const line = (hi, i, j, w) => {  // opacity = weight
      const l = document.createElementNS(SVG, "line");
      const attrs = { x1: 0, y1: i * ROW + ROW / 2, x2: width, y2: j * ROW + ROW / 2, stroke: colour(hi),
                      "stroke-width": 2, "stroke-opacity": w, "data-head": m.heads[hi], "data-query": i,
                      "data-key": j, "data-weight": w };
      for (const [k, v] of Object.entries(attrs)) l.setAttribute(k, v);
      svg.appendChild(l);
    };
    if (!sel) {  // nothing under the mouse: every line, while there are not too many
      if (on.length * tq * tk > ALL_LINES) return;
      for (const hi of on) for (let i = 0; i < tq; i++) for (let j = 0; j < tk; j++) {
        const w = weight(m, hi, i, j);
        if (w > 0) line(hi, i, j, w);
      }
      return;
    }
    const mine = sel.side === "query" ? qEls : kEls, other = sel.side === "query" ? kEls : qEls;
    if (!mine[sel.index]) return;
    mine[sel.index].classList.add(state.pinned ? "pinned" : "active");
    const peak = new Array(other.length).fill(0);
    for (const hi of on) {
      along(m, hi, sel.side, sel.index).forEach((w, x) => {
        peak[x] = Math.max(peak[x], w);
        if (w > 0) sel.side === "query" ? line(hi, sel.index, x, w) : line(hi, x, sel.index, w);
      });
    }
    other.forEach((e, x) => {
      e.style.background = `rgba(45,79,138,${(0.45 * peak[x]).toFixed(3)})`;
      const ok = sel.side === "query" ? allowed(m, sel.index, x) : allowed(m, x, sel.index);
      if (state.shade && !ok) e.classList.add("blocked");
    });
  }

  // ---- model view: layers x heads heatmaps, one enlarged on click ----
  function paint(m, hi) {  // (Tq, Tk) pixels: white (0) to #08306b (1); grey where the query may not look
    const [, tq, tk] = m.shape, img = new ImageData(tk, tq);
    for (let i = 0; i < tq; i++) for (let j = 0; j < tk; j++) {
      const w = weight(m, hi, i, j), p = 4 * (i * tk + j), v = state.sqrt ? Math.sqrt(w) : w;
      let rgb = [255 - v * 247, 255 - v * 207, 255 - v * 148];
      if (state.shade && !allowed(m, i, j)) rgb = w > 0 ? [220, 40, 40] : [196, 198, 204];  // red: weight where none may be
      img.data.set([rgb[0], rgb[1], rgb[2], 255], p);
    }
    return img;
  }

  function renderModel() {
    const sec = document.getElementById("model-view"), k = kind();
    sec.textContent = "";
    sec.appendChild(el("div", { class: "info" }, "Rows: layers, columns: heads; click a map to enlarge it. " +
                       "Queries down, keys across."));
    const legend = el("div", { class: "legend" });
    for (const [c, t] of [["#fff", "weight 0"], ["#08306b", "weight 1"], ["#c4c6cc", "not allowed"]]) {
      legend.appendChild(el("span", { style: `background:${c}` }));
      legend.appendChild(document.createTextNode(t));
    }
    sec.appendChild(legend);
    const nh = Math.max(...k.maps.map(m => m.shape[0]));
    const grid = el("div", { id: "grid", style: `grid-template-columns: auto repeat(${nh}, auto)` }, el("div", {}));
    for (let hi = 0; hi < nh; hi++) grid.appendChild(el("div", { class: "colname" }, `head ${k.maps[0].heads[hi]}`));
    k.maps.forEach((m, li) => {
      grid.appendChild(el("div", { class: "rowname" }, `layer ${m.layer}`));
      const [h, tq, tk] = m.shape, s = 96 / Math.max(tq, tk);
      for (let hi = 0; hi < nh; hi++) {
        if (hi >= h) { grid.appendChild(el("div", {})); continue; }
        const size = `width:${Math.max(24, tk * s)}px;height:${Math.max(24, tq * s)}px`;
        const c = el("canvas", { width: tk, height: tq, "data-layer": li, "data-head": m.heads[hi], style: size,
                                 title: `${m.name} head ${m.heads[hi]}` });
        c.getContext("2d").putImageData(paint(m, hi), 0, 0);
        c.addEventListener("click", () => zoom(li, m.heads[hi]));
        grid.appendChild(c);
      }
    });
    sec.appendChild(grid);
    if (state.zoom) drawZoom();
  }

  function drawZoom() {
    const old = document.getElementById("zoom");
    if (old) old.remove();
    const k = kind(), m = k.maps[state.zoom.layer], hi = m.heads.indexOf(state.zoom.head), [, tq, tk] = m.shape;
    const close = el("button", { type: "button", id: "zoom-close" }, "close (Esc)");
    const tip = el("div", { id: "zoom-tip" }, "move over a cell");
    const c = el("canvas", { id: "zoom-canvas" });
    const box = el("div", { id: "zoom" }, el("div", { class: "top" },
      el("strong", {}, `${m.name} \u00b7 head ${state.zoom.head} \u00b7 ${m.note}`), close), tip, c);
    close.addEventListener("click", () => { state.zoom = null; box.remove(); });
    const room = Math.max(480, Math.min(window.innerWidth, window.innerHeight) - 160);
    const cell = Math.max(1, Math.min(28, Math.floor(room / Math.max(tq, tk))));
    const labels = cell >= 9, qs = queryLabels(k), ks = keyLabels(k, m), font = `${Math.min(12, cell - 2)}px monospace`;
    let ctx = c.getContext("2d");
    ctx.font = font;
    const margin = labels ? 8 + Math.max(...qs.concat(ks).map(t => ctx.measureText(shown(t).slice(0, 14)).width)) : 0;
    c.width = margin + tk * cell; c.height = margin + tq * cell;  // resizing resets the context
    ctx = c.getContext("2d");
    const off = document.createElement("canvas");
    off.width = tk; off.height = tq;
    off.getContext("2d").putImageData(paint(m, hi), 0, 0);
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(off, margin, margin, tk * cell, tq * cell);
    if (labels) {
      ctx.font = font; ctx.fillStyle = "#1d2330"; ctx.textBaseline = "middle"; ctx.textAlign = "right";
      qs.forEach((t, i) => ctx.fillText(shown(t).slice(0, 14), margin - 4, margin + i * cell + cell / 2));
      ks.forEach((t, j) => {
        ctx.save(); ctx.translate(margin + j * cell + cell / 2, margin - 4); ctx.rotate(-Math.PI / 2);
        ctx.textAlign = "left"; ctx.fillText(shown(t).slice(0, 14), 0, 0); ctx.restore();
      });
    }
    c.addEventListener("mousemove", ev => {
      const r = c.getBoundingClientRect();
      const j = Math.floor((ev.clientX - r.left - margin) / cell), i = Math.floor((ev.clientY - r.top - margin) / cell);
      if (i < 0 || j < 0 || i >= tq || j >= tk) { tip.textContent = ""; return; }
      tip.textContent = `query ${i} ${JSON.stringify(qs[i])} -> key ${j} ${JSON.stringify(ks[j])}: ` +
        `${weight(m, hi, i, j).toFixed(3)}${allowed(m, i, j) ? "" : " (not allowed)"}`;
    });
    document.getElementById("model-view").appendChild(box);
  }

  // ---- the state, from the controls and from scripts ----
  function resetHeads() { state.heads = map().heads.map(() => true); }
  function setKind(i) {
    state.kind = i; state.layer = 0; state.hover = state.pinned = state.zoom = null; resetHeads(); render();
  }
  function setLayer(i) { state.layer = i; state.hover = state.pinned = null; resetHeads(); render(); }
  function setView(v) { state.view = v; render(); }
  function setHeads(list) { state.heads = map().heads.map(h => list.includes(h)); render(); }
  function zoom(layer, head) { state.zoom = { layer, head }; state.view = "model"; render(); }
  document.addEventListener("keydown", ev => {
    if (ev.key !== "Escape" || !state.zoom) return;
    state.zoom = null;
    const z = document.getElementById("zoom");
    if (z) z.remove();
  });

  // what the head view highlights: the hovered (or pinned) token and its weights per ticked head
  function highlighted() {
    const sel = selected();
    if (!sel || state.view !== "head") return null;
    const m = map(), heads = m.heads.filter((h, hi) => state.heads[hi]);
    return { kind: kind().id, layer: m.layer, map: m.name, side: sel.side, index: sel.index,
             heads: heads.map(h => ({ head: h, weights: along(m, m.heads.indexOf(h), sel.side, sel.index) })) };
  }

  function weights(kindIndex, layerIndex, head) {  // one map as rows of weights
    const m = DATA.kinds[kindIndex].maps[layerIndex], hi = m.heads.indexOf(head), rows = [];
    for (let i = 0; i < m.shape[1]; i++) rows.push(along(m, hi, "query", i));
    return rows;
  }

  const ready = (async () => {
    if (typeof DecompressionStream === "undefined") {
      throw new Error("this browser has no DecompressionStream (Chrome 80+, Firefox 113+, Safari 16.4+ have it)");
    }
    bytes = await inflate(DATA.blob);
    if (bytes.length !== DATA.bytes) throw new Error(`the weights are ${bytes.length} bytes, expected ${DATA.bytes}`);
    header(); resetHeads(); render();
    return true;
  })();
  ready.catch(err => {
    app.textContent = "";
    app.appendChild(el("p", { class: "error" }, `Cannot show the weights: ${err.message}`));
  });
  window.attnlabViewer = { ready, data: DATA, state, highlighted, weights, setKind, setLayer, setHeads, setView, zoom };
})();
