// Plain SVG charts: a line chart of (x, y) series and a stacked bar chart over
// buckets. Each comes with its numbers as a table, for screen readers and for
// reading exact values.

import {h, svg, table} from './dom.js';

const W = 640;
const H = 240;
const M = {left: 76, right: 16, top: 28, bottom: 42};

// About `count` round tick values from lo up to the first at or above hi. Round
// in `unit`s (1024² for MiB), so byte axes read 1 MiB, 2 MiB rather than 977 KiB.
// `integers`: no fractional ticks (steps).
function ticks(lo, hi, {count = 5, unit = 1, integers = false} = {}) {
  if (hi <= lo) return [lo];
  const raw = (hi - lo) / unit / count;
  const mag = 10 ** Math.floor(Math.log10(raw));
  let step = [1, 2, 5, 10].map((k) => k * mag).find((s) => raw <= s) * unit;
  if (integers) step = Math.max(1, Math.round(step));
  const out = [];
  const first = Math.floor(lo / step) * step;
  for (let v = first; out.length < 100; v += step) {
    out.push(Number(v.toPrecision(12)));
    if (v >= hi - step * 1e-9) break;
  }
  return out;
}

// The 1024-power unit that suits byte values up to `max`.
function byteUnit(max) {
  let unit = 1;
  while (max / unit >= 1024) unit *= 1024;
  return unit;
}

// Grid, ticks and axes; the y label sits above the y axis, in the top margin.
function frame({xTicks, yTicks, x, y, xFormat, yFormat, xLabel, yLabel}) {
  return [
    yTicks.map((v) => svg('g', {class: 'tick'},
      svg('line', {x1: M.left, x2: W - M.right, y1: y(v), y2: y(v), class: 'grid'}),
      svg('text', {x: M.left - 6, y: y(v) + 4, 'text-anchor': 'end'}, yFormat(v)))),
    xTicks.map((v) => svg('g', {class: 'tick'},
      svg('line', {x1: x(v), x2: x(v), y1: H - M.bottom, y2: H - M.bottom + 4, class: 'axis'}),
      svg('text', {x: x(v), y: H - M.bottom + 16, 'text-anchor': 'middle'}, xFormat(v)))),
    svg('line', {x1: M.left, x2: W - M.right, y1: H - M.bottom, y2: H - M.bottom, class: 'axis'}),
    svg('line', {x1: M.left, x2: M.left, y1: M.top, y2: H - M.bottom, class: 'axis'}),
    svg('text', {x: (M.left + W - M.right) / 2, y: H - 6, 'text-anchor': 'middle', class: 'axis-label'}, xLabel),
    svg('text', {x: 4, y: 14, 'text-anchor': 'start', class: 'axis-label'}, yLabel),
  ];
}

function legend(series) {
  return h('ul', {class: 'chart-legend'}, series.map((s) =>
    h('li', null, h('span', {class: `swatch ${s.cls}`, 'aria-hidden': 'true'}), s.name)));
}

function figure(title, chart, series, dataTable) {
  const id = `chart-${title.toLowerCase().replace(/[^a-z0-9]+/g, '-')}`;
  chart.setAttribute('aria-labelledby', id);
  return h('figure', {class: 'chart'},
    h('figcaption', {id}, title),
    chart,
    legend(series),
    h('details', {class: 'chart-data'}, h('summary', null, 'Numbers'), dataTable));
}

// series: [{name, cls, points: [{x, y}]}] (points sorted by x). `bytes`: y values
// are bytes (ticks at round KiB/MiB/GiB); x values are integers (steps).
export function lineChart({title, series, xLabel, yLabel, xFormat = String, yFormat = String, bytes = false, empty}) {
  const all = series.flatMap((s) => s.points);
  if (!all.length) return h('figure', {class: 'chart'}, h('figcaption', null, title), h('p', {class: 'empty'}, empty));
  let x0 = Math.min(...all.map((p) => p.x));
  let x1 = Math.max(...all.map((p) => p.x));
  if (x0 === x1) {
    x0 -= 1;
    x1 += 1;
  }
  const pad = (x1 - x0) * 0.04; // keeps the first and last points off the frame
  const [tx0, tx1] = [x0, x1];
  x0 -= pad;
  x1 += pad;
  const yMax = Math.max(...all.map((p) => p.y)) || 1;
  const yTicks = ticks(0, yMax, {unit: bytes ? byteUnit(yMax) : 1});
  const y1 = yTicks.at(-1);
  const x = (v) => M.left + ((v - x0) / (x1 - x0)) * (W - M.left - M.right);
  const y = (v) => H - M.bottom - (v / y1) * (H - M.top - M.bottom);
  const xTicks = ticks(tx0, tx1, {count: 6, integers: true}).filter((v) => v >= x0 && v <= x1);
  const chart = svg('svg', {viewBox: `0 0 ${W} ${H}`, role: 'img', class: 'chart-svg'},
    frame({xTicks, yTicks, x, y, xFormat, yFormat, xLabel, yLabel}),
    series.map((s) => svg('g', {class: `series ${s.cls}`},
      s.points.length > 1 ? svg('polyline', {points: s.points.map((p) => `${x(p.x)},${y(p.y)}`).join(' ')}) : null,
      s.points.map((p) => svg('circle', {cx: x(p.x), cy: y(p.y), r: 4},
        svg('title', null, `${s.name}: ${xLabel} ${xFormat(p.x)}, ${yFormat(p.y)}`))))));
  const rows = series.flatMap((s) => s.points.map((p) => [s.name, xFormat(p.x), yFormat(p.y)]));
  return figure(title, chart, series,
    table({caption: title, columns: [{label: 'Series'}, {label: xLabel}, {label: yLabel, num: true}], rows}));
}

// buckets: [{label, values: {seriesKey: n}}]; series: [{key, name, cls}].
export function barChart({title, buckets, series, xLabel, yLabel, empty}) {
  const totals = buckets.map((b) => series.reduce((sum, s) => sum + (b.values[s.key] || 0), 0));
  if (!totals.some((t) => t > 0)) {
    return h('figure', {class: 'chart'}, h('figcaption', null, title), h('p', {class: 'empty'}, empty));
  }
  const yTicks = ticks(0, Math.max(...totals), {integers: true});
  const y1 = Math.max(yTicks.at(-1), 1);
  const slot = (W - M.left - M.right) / buckets.length;
  const y = (v) => H - M.bottom - (v / y1) * (H - M.top - M.bottom);
  const every = Math.ceil(buckets.length / 8);
  const xTicks = buckets.map((_, i) => i).filter((i) => i % every === 0);
  const chart = svg('svg', {viewBox: `0 0 ${W} ${H}`, role: 'img', class: 'chart-svg'},
    frame({xTicks, yTicks, x: (i) => M.left + slot * (i + 0.5), y, xFormat: (i) => buckets[i].label,
      yFormat: String, xLabel, yLabel}),
    buckets.map((b, i) => {
      let base = 0;
      return svg('g', null, series.map((s) => {
        const v = b.values[s.key] || 0;
        if (!v) return null;
        const rect = svg('rect', {x: M.left + slot * i + slot * 0.15, width: slot * 0.7,
          y: y(base + v), height: y(base) - y(base + v), class: `bar ${s.cls}`},
        svg('title', null, `${b.label}: ${v} ${s.name}`));
        base += v;
        return rect;
      }));
    }));
  const rows = buckets.filter((_, i) => totals[i] > 0).map((b) => [b.label, ...series.map((s) => b.values[s.key] || 0)]);
  return figure(title, chart, series, table({caption: title,
    columns: [{label: xLabel}, ...series.map((s) => ({label: s.name, num: true}))], rows}));
}
