// Overview: the cluster at a glance (with the tesserad that leads), every worker
// with its state, heartbeat age and memory tier bytes, the jobs in progress and the
// latest failures.

import {jobCard} from '../components.js';
import {h, render, table} from '../dom.js';
import * as fmt from '../format.js';
import {finished, sortedJobs, state, workerCounts} from '../store.js';
import {badge, section} from '../ui.js';

function card(label, value, extra, cls) {
  return h('div', {class: ['stat', cls]}, h('span', {class: 'stat-label'}, label),
    h('span', {class: 'stat-value'}, value), extra ? h('span', {class: 'stat-extra'}, extra) : null);
}

// Which tesserad leads, since when, the checkpoint root's epoch it holds, and the
// etcd that elects it ("ha" is empty for a single tesserad).
function leadership(l) {
  if (!l) return null;
  return h('p', {id: 'leadership', class: 'leadership', dataset: {leader: l.leader, epoch: l.epoch}},
    h('span', {class: 'leadership-label'}, l.ha ? 'Leader' : 'Single tesserad'), ' ',
    h('code', null, l.leader), ` since ${fmt.clock(l.leader_since_ms)} · epoch `, h('strong', null, l.epoch),
    l.ha ? [' · HA ', h('code', null, l.ha)] : ' · no HA');
}

function summary() {
  const c = state.cluster;
  if (!c) return h('p', {class: 'empty'}, 'Loading…');
  const w = workerCounts();
  return [leadership(c.leadership), h('div', {class: 'stats', role: 'list'},
    [card('Workers alive', w.alive ?? 0, `${w.suspect ?? 0} suspect`, w.suspect ? 'stat-warn' : null),
      card('Workers dead', w.dead ?? 0, w.dead ? 'jobs that need them fail' : 'none', w.dead ? 'stat-dead' : null),
      card('Meshes', c.meshes),
      card('Checkpoints', c.checkpoints, `${fmt.bytes(c.storage_bytes)} stored of ${fmt.bytes(c.logical_bytes)}`),
      card('Running jobs', c.running_jobs),
      card('Open barriers', c.open_barriers, `${c.preemption_notices} preemption notices`,
        c.preemption_notices ? 'stat-warn' : null),
    ].map((x) => {
      x.setAttribute('role', 'listitem');
      return x;
    }))];
}

export function workersTable() {
  return table({
    caption: 'Workers',
    columns: [{label: 'Worker'}, {label: 'State'}, {label: 'Last heartbeat'}, {label: 'Host'},
      {label: 'Devices', num: true}, {label: 'Memory tier', num: true}, {label: 'Meshes'},
      {label: 'Local API'}],
    rows: state.workers.map((w) => [
      h('span', {class: 'worker-id'}, w.id),
      badge(w.state),
      h('span', {class: w.state === 'alive' ? null : 'strong'}, fmt.ago(w.last_heartbeat_ms_ago)),
      w.host,
      w.devices,
      // What it holds for memory checkpoints, over its meshes.
      h('span', {dataset: {memoryBytes: w.memory_bytes ?? 0}}, w.memory_bytes ? fmt.bytes(w.memory_bytes) : '—'),
      (w.meshes || []).join(', ') || '—',
      h('code', null, w.local_api),
    ]),
    rowClass: (i) => `row-${state.workers[i].state}`,
    empty: 'No worker has registered yet. Start one: tessera-worker --server URL --token TOKEN',
  });
}

export function createClusterView(ctx) {
  const stats = h('div');
  const workers = h('div', {id: 'workers'});
  const active = h('div', {class: 'job-list'});
  const failures = h('div', {class: 'job-list'});
  const el = h('div', {class: 'view'},
    h('section', {class: 'panel', 'aria-label': 'Cluster at a glance'}, stats),
    section('Workers', workers),
    section('Jobs in progress', active),
    section('Latest failures', failures));

  function update() {
    render(stats, summary());
    render(workers, workersTable());
    const jobs = sortedJobs();
    const running = jobs.filter((j) => !finished(j));
    render(active, running.length ? running.map((j) => jobCard(j, ctx))
      : h('p', {class: 'empty'}, 'No job is running.'));
    const failed = jobs.filter((j) => j.state === 'failed').slice(0, 3);
    render(failures, failed.length ? failed.map((j) => jobCard(j, ctx))
      : h('p', {class: 'empty'}, 'No failed job.'));
  }
  return {el, update, refresh: () => Promise.all([ctx.loader.cluster(), ctx.loader.workers(), ctx.loader.jobs()])};
}
