// The page's behaviour: zoom and search in the flame graphs, the numbers of the frame
// under the pointer, sorting the functions table, opening a function's code. Every
// number is already in the DOM (data attributes); nothing is fetched.
"use strict";
const W = 1200;
// Each string another process chose (names, binaries, comms) is in the page's string
// table once; elements refer to it by number: a frame's name (data-n), short name
// (data-sn) and binary (data-b), an element's text (data-x) and tooltip (data-tt), a
// code section's function (data-fn). Written out here, before anything reads them.
const S = JSON.parse(document.getElementById("strings").textContent);
for (const e of document.querySelectorAll("[data-x]")) e.textContent = S[e.dataset.x];
for (const e of document.querySelectorAll("[data-tt]")) e.title = S[e.dataset.tt];
for (const e of document.querySelectorAll("[data-fn]")) e.dataset.function = S[e.dataset.fn];
for (const g of document.querySelectorAll("svg.graph g.f")) {
  const d = g.dataset, t = g.querySelector("title");
  d.name = S[d.n]; d.binary = S[d.b]; if (d.sn !== undefined) d.short = S[d.sn];
  t.textContent = `${d.name}${d.binary ? " (" + d.binary + ")" : ""}\n${t.textContent}`;
}
// A frame's label: what of its name fits its width (`w` of the graph, `px` pixels
// wide) at about 7 px a character; nothing under 3.
function label(g, w, px) {
  const name = g.dataset.short || g.dataset.name, fits = Math.floor((w * px - 6) / 7);
  g.querySelector("text").textContent = fits < 3 ? "" : name.length <= fits ? name : name.slice(0, fits - 2) + "..";
}
// The graph's width in pixels. A graph not on screen (a closed code section) has no
// width yet: its labels fit the 1200-unit graph, as the page was written.
const pixels = svg => svg.clientWidth || W;
function fit(g, x, w, px) {
  const r = g.querySelector("rect"), t = g.querySelector("text");
  r.setAttribute("x", (x * W).toFixed(2)); r.setAttribute("width", (w * W).toFixed(2));
  t.setAttribute("x", (x * W).toFixed(2));
  label(g, w, px);
}
function zoom(svg, target) {
  const px = pixels(svg), x0 = +target.dataset.fx, w0 = +target.dataset.fw, d0 = +target.dataset.depth;
  for (const g of svg.querySelectorAll("g.f")) {
    const x = +g.dataset.fx, w = +g.dataset.fw, d = +g.dataset.depth;
    const inside = x >= x0 - 1e-12 && x + w <= x0 + w0 + 1e-9 && d >= d0;
    const above = d < d0 && x <= x0 + 1e-12 && x + w >= x0 + w0 - 1e-9;
    g.style.display = inside || above ? "" : "none";
    if (inside) fit(g, (x - x0) / w0, w / w0, px); else if (above) fit(g, 0, 1, px);
  }
}
function reset(svg) {
  const px = pixels(svg);
  for (const g of svg.querySelectorAll("g.f")) { g.style.display = ""; fit(g, +g.dataset.fx, +g.dataset.fw, px); }
}
for (const svg of document.querySelectorAll("svg.graph")) {
  const px = pixels(svg);
  for (const g of svg.querySelectorAll("g.f")) label(g, +g.dataset.fw, px);
}
function describe(g) {
  const d = g.dataset, pct = x => (100 * x).toFixed(2), total = +d.share / Math.max(+d.width, 1e-300);
  let s = `${d.name}${d.binary ? " (" + d.binary + ")" : ""}\n${document.body.dataset.width}: ${(+d.width).toPrecision(4)} (${pct(+d.share)} %), self ${(+d.self).toPrecision(4)} (${pct(+d.self * total)} %), samples ${d.samples}, self ${d.selfSamples}`;
  const cpi = (v, e) => v !== undefined ? `${(+v).toFixed(2)} ± ${(100 * e).toFixed(1)} %` : "too few samples";
  if (d.cycles !== undefined) s += `\ncycles ${(+d.cycles).toPrecision(4)}, self ${(+d.selfCycles).toPrecision(4)}; instructions ${(+d.instructions).toPrecision(4)}, self ${(+d.selfInstructions).toPrecision(4)}` +
    `\nself CPI ${cpi(d.selfCpi, d.selfCpiError)}, total CPI ${cpi(d.cpi, d.cpiError)}` + (d.referenceCpi !== undefined ? ` (against ${(+d.referenceCpi).toFixed(2)})` : "");
  if (d.delta !== undefined) s += `\nbase ${(+d.base).toPrecision(4)}, change ${+d.base > 0 ? (100 * d.delta / d.base).toFixed(1) + " % ± " + (100 * d.deltaError / d.base).toFixed(1) + " %" : "new"}, z ${(+d.z).toFixed(1)}` +
    (d.significant === "true" ? ", significant" : ", not significant");
  return s;
}
// The colour of the flame graphs and of the tables' CPI cells: CPI against the
// process's (the default), or on the absolute scale; the legend says which. A cell
// paints its background, or what its data-paint names (a block's outline).
function colourBy(mode) {
  document.body.dataset.colour = mode;
  for (const e of document.querySelectorAll("[data-abs-fill]")) {
    const fill = mode === "absolute" ? e.dataset.absFill : e.dataset.fill;
    if (!fill) continue;
    if (e.matches("g.f")) e.querySelector("rect").setAttribute("fill", fill);
    else e.style.setProperty(e.dataset.paint || "background", fill);
  }
  for (const s of document.querySelectorAll(".scale")) s.hidden = !s.classList.contains(mode);
}
for (const b of document.querySelectorAll("button.colour-mode")) b.addEventListener("click", () => colourBy(b.dataset.to));
// A link to a code section (#code-N) opens it.
function openHash() { const m = /^#code-(\d+)$/.exec(location.hash); if (m) open(m[1]); }
addEventListener("hashchange", openHash);
// A link to the page with #absolute opens it on the absolute scale.
if (location.hash === "#absolute" && document.querySelector("button.colour-mode")) colourBy("absolute");
function open(id) {
  const a = document.getElementById("code-" + id);
  if (!a) return;
  a.hidden = false; a.scrollIntoView();
}
for (const svg of document.querySelectorAll("svg.graph")) {
  svg.addEventListener("click", e => {
    const g = e.target.closest("g.f"); if (!g) return;
    if (e.shiftKey && g.dataset.code !== undefined) open(g.dataset.code); else zoom(svg, g);
  });
  svg.addEventListener("mouseover", e => {
    const g = e.target.closest("g.f"); if (g) document.getElementById("details").textContent = describe(g) + (g.dataset.code !== undefined ? "\nshift-click: its code and callers" : "");
  });
}
document.getElementById("reset").addEventListener("click", () => document.querySelectorAll("svg.graph").forEach(reset));
document.getElementById("search").addEventListener("input", e => {
  let re = null;
  try { re = e.target.value ? new RegExp(e.target.value) : null; } catch (_) { return; }
  const svg = document.querySelector("svg.graph.main");
  let covered = [];
  for (const g of svg.querySelectorAll("g.f")) {
    const m = re !== null && re.test(g.dataset.name);
    g.classList.toggle("match", m);
    if (m) covered.push([+g.dataset.fx, +g.dataset.fx + +g.dataset.fw]);
  }
  // The share matched: the union of matching frames' spans (nested matches count once).
  covered.sort((a, b) => a[0] - b[0]);
  let sum = 0, end = -1;
  for (const [a, b] of covered) { if (b > end) { sum += b - Math.max(a, end); end = b; } }
  document.getElementById("matched").textContent = re ? `matched ${(100 * sum).toFixed(2)} %` : "";
});
// Long tables show a page of rows at a time (the rows stay in the DOM, for search and
// tests); sorting sorts them all and returns to the first page.
function paginate(table, page) {
  const rows = table.tBodies[0].rows, size = +table.dataset.page, pages = Math.max(1, Math.ceil(rows.length / size));
  page = Math.min(Math.max(page, 0), pages - 1); table.dataset.at = page;
  for (let i = 0; i < rows.length; i++) rows[i].hidden = i < page * size || i >= (page + 1) * size;
  let bar = table.previousElementSibling;
  if (!bar || !bar.classList.contains("pager")) {
    if (rows.length <= size) return;
    bar = document.createElement("p"); bar.className = "pager"; table.before(bar);
    for (const [label, step] of [["« first", -1e9], ["‹ previous", -1], ["next ›", 1], ["last »", 1e9]]) {
      const b = document.createElement("button"); b.textContent = label;
      b.addEventListener("click", () => paginate(table, +table.dataset.at + step)); bar.append(b);
    }
    bar.append(document.createElement("span"));
  }
  bar.lastChild.textContent = `rows ${page * size + 1}–${Math.min(rows.length, (page + 1) * size)} of ${rows.length}`;
}
for (const th of document.querySelectorAll("table.sortable th")) {
  th.addEventListener("click", () => {
    const table = th.closest("table"), body = table.tBodies[0], i = th.cellIndex, num = th.dataset.t === "n";
    const dir = th.dataset.dir === "desc" ? 1 : -1; th.dataset.dir = dir === 1 ? "asc" : "desc";
    // A number column's rows without a number (below the sample floor) sort last either way.
    const none = r => num && r.cells[i].dataset.v === undefined;
    const key = r => num ? +r.cells[i].dataset.v : r.cells[i].textContent;
    const rows = [...body.rows].sort((a, b) => {
      if (none(a) || none(b)) return none(a) - none(b);
      const x = key(a), y = key(b); return (x < y ? -1 : x > y ? 1 : 0) * dir;
    });
    body.append(...rows);
    if (table.classList.contains("paged")) paginate(table, 0);
  });
}
for (const t of document.querySelectorAll("table.paged")) paginate(t, 0);
document.addEventListener("click", e => {
  const a = e.target.closest("a[data-open]"); if (a) { e.preventDefault(); open(a.dataset.open); }
});
openHash();
