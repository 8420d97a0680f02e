// Shared pieces of the page: messages, the confirmation dialog, state badges,
// progress bars and API errors with their culprit.

import {h, render} from './dom.js';
import * as fmt from './format.js';

// ---------------------------------------------------------------- messages

const MAX_MESSAGES = 3;

function message(kind, ...content) {
  const box = document.getElementById('messages');
  const item = h('div', {class: `message message-${kind}`, role: kind === 'error' ? 'alert' : 'status'},
    h('div', {class: 'message-body'}, content),
    h('button', {type: 'button', class: 'btn-quiet', 'aria-label': 'Dismiss message',
      onclick: () => item.remove()}, '×'));
  box.prepend(item);
  while (box.children.length > MAX_MESSAGES) box.lastElementChild.remove();
  return item;
}

// An API error, with what was being done: "Save step 100 of web: ...".
export function showError(err, what) {
  return message('error', h('strong', null, what ? `${what} failed` : 'Error'), errorBox(err));
}

export function showNotice(text) {
  const item = message('notice', text);
  setTimeout(() => item.remove(), 6000);
}

// ---------------------------------------------------------------- errors

// The keys of docs/openapi.json's error details that name a culprit, in the order shown.
const CULPRITS = ['worker', 'rank', 'missing_workers', 'missing_ranks', 'tensor', 'field', 'file',
  'bad_chunks', 'problems', 'mesh', 'step', 'barrier', 'key', 'job', 'path'];
const MAX_LISTED = 10;

const culpritsFirst = (keys) => CULPRITS.filter((k) => keys.includes(k)).concat(keys.filter((k) => !CULPRITS.includes(k)));

// {tensor: "w", file: "shard-0.tsr", offset: 8} → "tensor w, file shard-0.tsr, offset 8"
function flat(v) {
  if (v !== null && typeof v === 'object' && !Array.isArray(v)) {
    return culpritsFirst(Object.keys(v)).map((k) => `${k.replaceAll('_', ' ')} ${flat(v[k])}`).join(', ');
  }
  return Array.isArray(v) ? v.map(flat).join(', ') : String(v);
}

function detailValue(v) {
  if (Array.isArray(v) && v.some((x) => x !== null && typeof x === 'object')) {
    return h('ul', {class: 'detail-list'}, v.slice(0, MAX_LISTED).map((x) => h('li', null, flat(x))),
      v.length > MAX_LISTED ? h('li', null, `… ${v.length - MAX_LISTED} more`) : null);
  }
  return flat(v).slice(0, 400);
}

// {code, message, details} (an ApiError or a job's error) as a block that names the
// culprit. Details in `omit` (shown elsewhere) and empty ones are left out.
export function errorBox(err, omit = []) {
  const details = err.details || {};
  const empty = (v) => v === null || v === '' || (Array.isArray(v) && !v.length);
  const named = culpritsFirst(Object.keys(details).filter((k) => !omit.includes(k) && !empty(details[k])));
  return h('div', {class: 'error-box'},
    h('p', {class: 'error-message'},
      h('code', {class: 'error-code'}, err.code || 'error'), ' ', err.message || ''),
    named.length ? h('dl', {class: 'culprit'}, named.map((k) => [
      h('dt', null, k.replaceAll('_', ' ')),
      h('dd', {dataset: {detail: k}}, detailValue(details[k])),
    ])) : null);
}

// ---------------------------------------------------------------- confirmation

// A modal question; resolves true when confirmed. `content` may hold inputs the
// caller reads afterwards. Escape or Cancel resolve false.
export function confirmAction({title, content, confirm = 'Confirm', danger = false}) {
  const dialog = document.getElementById('confirm');
  return new Promise((resolve) => {
    const close = (ok) => {
      dialog.close();
      resolve(ok);
    };
    render(dialog,
      h('div', {class: 'dialog-body'},
        h('h2', {id: 'confirm-title'}, title),
        h('div', {class: 'dialog-content'}, content),
        h('div', {class: 'actions'},
          h('button', {type: 'button', class: 'btn', autofocus: true, onclick: () => close(false)}, 'Cancel'),
          h('button', {type: 'button', class: danger ? 'btn btn-danger' : 'btn btn-primary',
            onclick: () => close(true)}, confirm))));
    dialog.setAttribute('aria-labelledby', 'confirm-title');
    dialog.oncancel = (e) => {
      e.preventDefault();
      close(false);
    };
    dialog.showModal();
  });
}

// ---------------------------------------------------------------- small parts

const MARKS = {alive: '●', suspect: '▲', dead: '✕', succeeded: '✓', committed: '✓', failed: '✕',
  cancelled: '■', running: '▶', queued: '…', writing: '▶', merging: '▶', pending: '…',
  waiting: '…', joined: '✓'};

export function badge(stateName) {
  const mark = MARKS[stateName];
  return h('span', {class: `badge state-${stateName}`}, mark ? `${mark} ${stateName}` : stateName);
}

export function progress(done, total, label) {
  const pct = fmt.percent(done, total);
  return h('div', {class: 'progress', role: 'progressbar', 'aria-label': label,
    'aria-valuemin': 0, 'aria-valuemax': 100, 'aria-valuenow': Math.round(pct),
    'aria-valuetext': `${Math.round(pct)}%: ${fmt.bytes(done)} of ${fmt.bytes(total)}`},
  h('div', {class: 'progress-bar', style: {width: `${pct}%`}}));
}

// Runs an async user action with its button disabled meanwhile; errors are shown.
export async function act(button, what, fn) {
  if (button) button.disabled = true;
  try {
    return await fn();
  } catch (e) {
    if (e.status !== 401) showError(e, what);
    return undefined;
  } finally {
    if (button) button.disabled = false;
  }
}

// Asks `question` (confirmAction's options) and, when confirmed, runs act(button, what, fn).
export async function confirmThenAct(button, question, what, fn) {
  if (await confirmAction(question)) await act(button, what, fn);
}

export function field(label, input, hint) {
  const id = input.id || `f-${Math.random().toString(36).slice(2, 9)}`;
  input.id = id;
  const hintId = hint ? `${id}-hint` : undefined;
  if (hintId) input.setAttribute('aria-describedby', hintId);
  return h('div', {class: 'field'},
    h('label', {for: id}, label), input,
    hint ? h('small', {id: hintId, class: 'hint'}, hint) : null);
}

export function section(title, ...content) {
  const id = `s-${title.toLowerCase().replace(/[^a-z0-9]+/g, '-')}`;
  return h('section', {class: 'panel', 'aria-labelledby': id},
    h('h2', {id}, title), content);
}
