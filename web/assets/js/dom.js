// Building the page from plain DOM nodes: text is always set as text, never as
// HTML, so names coming from the API cannot inject markup.

const SVG_NS = 'http://www.w3.org/2000/svg';

function apply(el, attrs) {
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith('on') && typeof value === 'function') {
      el.addEventListener(key.slice(2), value);
    } else if (key === 'class') {
      el.setAttribute('class', Array.isArray(value) ? value.filter(Boolean).join(' ') : value);
    } else if (key === 'dataset') {
      Object.assign(el.dataset, value);
    } else if (key === 'style') {
      Object.assign(el.style, value); // CSSOM: allowed by the page's Content-Security-Policy
    } else if (key in el && typeof el[key] !== 'function' && !(el instanceof SVGElement)) {
      el[key] = value === true ? true : value;
    } else {
      el.setAttribute(key, value === true ? '' : String(value));
    }
  }
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

// h('button', {class: 'btn', onclick: fn}, 'Save') → <button class="btn">Save</button>
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  apply(el, attrs);
  append(el, children);
  return el;
}

export function svg(tag, attrs, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value !== undefined && value !== null) el.setAttribute(key, String(value));
  }
  append(el, children);
  return el;
}

// Replaces a container's children. The element that had the focus is found
// again by its data-key in the new content and focused, so live updates do not
// throw a keyboard user back to the top of the page.
export function render(container, ...children) {
  const active = document.activeElement;
  const key = active && container.contains(active) ? active.dataset.key : undefined;
  container.replaceChildren();
  append(container, children);
  if (key) {
    const again = container.querySelector(`[data-key="${CSS.escape(key)}"]`);
    if (again) again.focus({preventScroll: true});
  }
}

// A table from column headers and rows of cells; `caption` names it for screen readers.
export function table({caption, columns, rows, rowClass, empty}) {
  if (!rows.length && empty) return h('p', {class: 'empty'}, empty);
  return h('div', {class: 'table-wrap', tabindex: 0, role: 'region', 'aria-label': caption},
    h('table', null,
      h('caption', {class: 'sr-only'}, caption),
      h('thead', null, h('tr', null, columns.map((c) =>
        h('th', {scope: 'col', class: c.num ? 'num' : undefined}, c.label)))),
      h('tbody', null, rows.map((row, i) =>
        h('tr', {class: rowClass ? rowClass(i) : undefined}, row.map((cell, j) =>
          h(j === 0 ? 'th' : 'td',
            {scope: j === 0 ? 'row' : undefined, class: columns[j].num ? 'num' : undefined},
            cell)))))));
}

// render(), skipped when `signature` (any JSON-able value describing what the
// content shows) is the same as last time: periodic reloads that change nothing
// leave open selects, typed values and details elements alone.
const signatures = new WeakMap();
export function renderIf(container, signature, build) {
  const sig = JSON.stringify(signature);
  if (signatures.get(container) === sig) return;
  signatures.set(container, sig);
  render(container, build());
}
