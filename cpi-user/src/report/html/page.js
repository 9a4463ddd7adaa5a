// The page's behaviour: zoom and search in the flame graphs, the numbers of the frame
// under the pointer, sorting the functions table, opening a function's code. Every
// number is already in the DOM (data attributes); nothing is fetched.
"use strict";
const W = 1200;
function fit(g, x, w) {
  const r = g.querySelector("rect"), t = g.querySelector("text");
  r.setAttribute("x", (x * W).toFixed(2)); r.setAttribute("width", (w * W).toFixed(2));
  t.setAttribute("x", (x * W).toFixed(2));
  const name = g.dataset.name, fits = Math.floor((w * W * g.ownerSVGElement.clientWidth / W - 6) / 7);
  t.textContent = fits < 3 ? "" : name.length <= fits ? name : name.slice(0, fits - 2) + "..";
}
function zoom(svg, target) {
  const x0 = +target.dataset.fx, w0 = +target.dataset.fw, d0 = +target.dataset.depth;
  for (const g of svg.querySelectorAll("g.f")) {
    const x = +g.dataset.fx, w = +g.dataset.fw, d = +g.dataset.depth;
    const inside = x >= x0 - 1e-12 && x + w <= x0 + w0 + 1e-9 && d >= d0;
    const above = d < d0 && x <= x0 + 1e-12 && x + w >= x0 + w0 - 1e-9;
    g.style.display = inside || above ? "" : "none";
    if (inside) fit(g, (x - x0) / w0, w / w0); else if (above) fit(g, 0, 1);
  }
}
function reset(svg) {
  for (const g of svg.querySelectorAll("g.f")) { g.style.display = ""; fit(g, +g.dataset.fx, +g.dataset.fw); }
}
function describe(g) {
  const d = g.dataset, pct = (100 * +d.share).toFixed(2);
  let s = `${d.name}${d.binary ? " (" + d.binary + ")" : ""}\n${document.body.dataset.width}: ${(+d.width).toPrecision(4)} (${pct} %), self ${(+d.self).toPrecision(4)}, samples ${d.samples}`;
  if (d.cycles !== undefined) s += `\ncycles ${(+d.cycles).toPrecision(4)}, instructions ${(+d.instructions).toPrecision(4)}, CPI ` +
    (d.cpi !== undefined ? `${(+d.cpi).toFixed(2)} ± ${(100 * d.cpiError).toFixed(1)} %` : "too few samples");
  if (d.delta !== undefined) s += `\nbase ${(+d.base).toPrecision(4)}, change ${+d.base > 0 ? (100 * d.delta / d.base).toFixed(1) + " % ± " + (100 * d.deltaError / d.base).toFixed(1) + " %" : "new"}, z ${(+d.z).toFixed(1)}` +
    (d.significant === "true" ? ", significant" : ", not significant");
  return s;
}
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
for (const th of document.querySelectorAll("table.sortable th")) {
  th.addEventListener("click", () => {
    const table = th.closest("table"), body = table.tBodies[0], i = th.cellIndex, num = th.dataset.t === "n";
    const dir = th.dataset.dir === "desc" ? 1 : -1; th.dataset.dir = dir === 1 ? "asc" : "desc";
    const key = r => num ? +(r.cells[i].dataset.v || 0) : r.cells[i].textContent;
    const rows = [...body.rows].sort((a, b) => { const x = key(a), y = key(b); return (x < y ? -1 : x > y ? 1 : 0) * dir; });
    body.append(...rows);
  });
}
document.addEventListener("click", e => {
  const a = e.target.closest("a[data-open]"); if (a) { e.preventDefault(); open(a.dataset.open); }
});
