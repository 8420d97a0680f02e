// Pieces shown by more than one view: the job card (Overview, Checkpoints, Jobs),
// links to a mesh's checkpoints and the badges of a checkpoint's tiers. ui.js has the generic widgets these are made of.

import {h, table} from './dom.js';
import * as endpoints from './endpoints.js';
import * as fmt from './format.js';
import {finished, jobRate, state} from './store.js';
import {act, badge, errorBox, progress, showNotice} from './ui.js';

// The Checkpoints section's hash route for a mesh, or for one step of it.
export const checkpointHref = (mesh, step) =>
  `#checkpoints/${encodeURIComponent(mesh)}${step !== undefined ? `/${step}` : ''}`;

// ---------------------------------------------------------------- tiers

const TIER_TITLES = {memory: "In the workers' memory", persisted: 'Committed in the checkpoint root'};

// Where a checkpoint is held (its `tiers`): a badge per tier, or '—' for neither.
export function tierBadges(tiers) {
  if (!tiers || !tiers.length) return '—';
  return h('span', {class: 'tiers', dataset: {tiers: tiers.join(' ')}},
    tiers.map((t) => h('span', {class: `badge tier-${t}`, title: TIER_TITLES[t]}, t)));
}

// ---------------------------------------------------------------- jobs

function jobTitle(job) {
  const kind = job.kind === 'mesh_init' ? 'self-test' : job.kind;
  const target = job.kind === 'restore' && job.request && job.request.target_mesh;
  return `${kind} · ${job.mesh}${job.step !== null && job.step !== undefined ? ` · step ${job.step}` : ''}` +
    (target && target !== job.mesh ? ` → ${target}` : '');
}

function workerState(id) {
  const w = state.workers.find((x) => x.id === id);
  return w ? w.state : 'unknown';
}

// Jobs whose closed-by-default worker list the user opened (kept across re-renders).
const opened = new Set();

function perWorker(job) {
  const tasks = [...(job.workers || [])].sort((a, b) => a.rank - b.rank);
  const rows = tasks.map((t) => {
    const ws = workerState(t.id);
    return [
      `rank ${t.rank}`,
      h('span', null, t.id, ws === 'dead' ? h('span', {class: 'badge state-dead'}, '✕ dead') : null),
      badge(t.state),
      t.total_bytes ? progress(t.done_bytes, t.total_bytes, `${t.id} progress`) : '—',
      // A save's worker: no task, the bytes its join says it wrote.
      t.total_bytes ? `${fmt.bytes(t.done_bytes)} / ${fmt.bytes(t.total_bytes)}`
        : (t.state === 'joined' ? fmt.bytes(t.done_bytes || 0) : '—'),
      t.error ? (t.error.message || JSON.stringify(t.error)) : '',
    ];
  });
  return table({
    caption: `Workers of job ${job.id}`,
    columns: [{label: 'Rank'}, {label: 'Worker'}, {label: 'State'}, {label: 'Progress'},
      {label: 'Bytes', num: true}, {label: 'Error'}],
    rows,
    rowClass: (i) => (workerState(tasks[i].id) === 'dead' ? 'row-dead' : undefined),
    empty: 'No worker tasks in this phase.',
  });
}

function verifyResult(job) {
  const r = job.result;
  if (job.kind !== 'verify' || !r || r.ok === undefined) return null;
  if (r.ok) {
    return h('p', {class: 'verify-ok', dataset: {verify: 'ok'}},
      `✓ Verified: ${fmt.plural(r.chunks_checked, 'chunk')} (${fmt.bytes(r.bytes_checked)}) in `,
      `${fmt.plural(r.tensors, 'tensor')}, every checksum matches.`);
  }
  const bad = r.bad_chunks || [];
  return h('div', {class: 'verify-bad', dataset: {verify: 'bad'}},
    h('p', null, `✕ ${fmt.plural(bad.length, 'bad chunk')} of ${r.chunks_checked}, `,
      `${fmt.plural((r.problems || []).length, 'problem')}:`),
    h('ul', null, bad.slice(0, 10).map((b) => h('li', null, `tensor ${b.tensor} in ${b.file} at offset ${b.offset}: ${b.error}`)),
      (r.problems || []).slice(0, 10).map((p) => h('li', null, p))));
}

// One job as a card; while it runs, its Cancel button posts through ctx.api.
export function jobCard(job, ctx) {
  const p = job.progress || {done_bytes: 0, total_bytes: 0};
  const running = !finished(job);
  const rate = jobRate(job);
  const eta = running && rate ? ((p.total_bytes - p.done_bytes) / rate) * 1000 : null;
  const title = jobTitle(job);
  const took = job.ended_at && job.started_at ? job.ended_at - job.started_at : null;
  const timings = Object.entries(job.timings_ms || {}).map(([k, v]) => `${k} ${fmt.duration(v)}`).join(' · ');
  const workers = perWorker(job);
  return h('article', {class: ['job-card', `job-${job.state}`], dataset: {job: job.id, state: job.state},
    'aria-label': `${title}: ${job.state}`},
  h('header', {class: 'job-head'},
    h('h3', null, title),
    badge(job.state),
    h('span', {class: 'phase'}, 'phase ', h('strong', {dataset: {phase: ''}}, job.phase || '—')),
    h('span', {class: 'muted job-id'}, job.id),
    running ? h('button', {type: 'button', class: 'btn btn-small', dataset: {key: `cancel-${job.id}`},
      onclick: (e) => act(e.currentTarget, `Cancel ${job.id}`, async () => {
        await ctx.api.post(endpoints.jobCancel(job.id));
        showNotice(`Cancel requested for ${job.id}`);
      })}, 'Cancel') : null),
  // A job that moves no bytes (a self-test, a barrier) has no bar to show once it ended.
  running || p.total_bytes ? progress(p.done_bytes, p.total_bytes, `${title} progress`) : null,
  h('p', {class: 'job-stats'},
    running || p.total_bytes ? [
      h('span', null, `${fmt.bytes(p.done_bytes)} of ${fmt.bytes(p.total_bytes)} (${Math.round(fmt.percent(p.done_bytes, p.total_bytes))}%)`),
      h('span', null, `rate ${fmt.rate(rate)}`)] : null,
    running ? h('span', null, `ETA ${eta !== null ? fmt.duration(eta) : '—'}`) : null,
    running ? h('span', null, `started ${fmt.clock(job.started_at || job.created_at)}`)
      : h('span', null, `took ${fmt.duration(took)}, ended ${fmt.clock(job.ended_at)}`)),
  job.error ? h('div', {class: 'job-error'}, h('h4', null, job.state === 'cancelled' ? 'Cancelled' : 'Failed'),
    // A verify's bad chunks are listed with its result below.
    errorBox(job.error, job.kind === 'verify' ? ['bad_chunks', 'problems'] : [])) : null,
  verifyResult(job),
  running ? workers : h('details', {open: opened.has(job.id),
    ontoggle: (e) => (e.currentTarget.open ? opened.add(job.id) : opened.delete(job.id))},
  h('summary', {dataset: {key: `workers-${job.id}`}},
    [(job.workers || []).length ? `Workers (${job.workers.length})` : 'Timings', timings].filter(Boolean).join(' · ')),
  workers));
}
