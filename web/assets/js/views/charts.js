// Charts: save and restore throughput and checkpoint size over steps, and the
// coordination activity (barriers, collective jobs) of the last minutes.

import {barChart, lineChart} from '../chart.js';
import {h, renderIf} from '../dom.js';
import * as fmt from '../format.js';
import {persisted, sortedJobs, state} from '../store.js';
import {field, section} from '../ui.js';

const BUCKET_MS = 30000;
const BUCKETS = 20;

function throughput(mesh) {
  const done = sortedJobs().filter((j) => j.state === 'succeeded' && j.step !== null &&
    (!mesh || j.mesh === mesh) && j.ended_at && j.started_at && j.ended_at > j.started_at);
  const series = (kind, name, cls) => ({name, cls, points: done.filter((j) => j.kind === kind).map((j) => {
    const bytes = (j.result && j.result.checkpoint && j.result.checkpoint.logical_bytes) || j.progress.total_bytes;
    return {x: j.step, y: (bytes / (j.ended_at - j.started_at)) * 1000};
  }).filter((p) => p.y > 0).sort((a, b) => a.x - b.x)});
  return lineChart({
    title: 'Save and restore throughput by step', xLabel: 'step', yLabel: 'throughput', bytes: true,
    yFormat: (v) => (v > 0 ? fmt.rate(v) : '0'),
    series: [series('save', 'save', 's-save'), series('restore', 'restore', 's-restore')],
    empty: 'No finished save or restore yet.',
  });
}

function sizes(mesh) {
  const list = (mesh ? state.checkpoints.get(mesh) || []
    : [...state.checkpoints.values()].flat()).filter(persisted);
  const points = (key) => list.map((c) => ({x: c.step, y: c[key]})).sort((a, b) => a.x - b.x);
  return lineChart({
    title: 'Checkpoint size by step', xLabel: 'step', yLabel: 'size', yFormat: fmt.bytes, bytes: true,
    series: [{name: 'logical', cls: 's-logical', points: points('logical_bytes')},
      {name: 'stored', cls: 's-stored', points: points('stored_bytes')}],
    empty: 'No committed checkpoint yet.',
  });
}

function activity(mesh) {
  const now = Date.now();
  const start = now - BUCKETS * BUCKET_MS;
  const buckets = Array.from({length: BUCKETS}, (_, i) => ({
    label: new Date(start + i * BUCKET_MS).toLocaleTimeString([], {hour: '2-digit', minute: '2-digit', second: '2-digit'}),
    values: {},
  }));
  const add = (t, key) => {
    const i = Math.floor((t - start) / BUCKET_MS);
    if (i >= 0 && i < BUCKETS) buckets[i].values[key] = (buckets[i].values[key] || 0) + 1;
  };
  for (const e of state.barrierEvents) add(e.t, e.action);
  for (const j of sortedJobs()) {
    if (j.kind === 'collective' && (!mesh || j.mesh === mesh)) add(j.created_at, 'collective');
  }
  return barChart({
    title: `Coordination activity, per ${BUCKET_MS / 1000} s`, xLabel: 'time', yLabel: 'count', buckets,
    series: [{key: 'arrived', name: 'barrier arrivals', cls: 's-arrived'},
      {key: 'completed', name: 'barriers completed', cls: 's-completed'},
      {key: 'timed_out', name: 'barrier timeouts', cls: 's-timeout'},
      {key: 'collective', name: 'collective jobs', cls: 's-collective'}],
    empty: 'No barrier or collective activity in the last 10 minutes (barriers are counted while this page is open).',
  });
}

function totals() {
  const m = state.metrics;
  const waits = Object.entries(m).filter(([k]) => k.startsWith('tessera_barrier_waits_total'));
  if (!waits.length) return null;
  return h('p', {class: 'muted'}, 'Barrier waits since tesserad started: ',
    waits.map(([k, v]) => `${(/outcome="([^"]*)"/.exec(k) || [])[1] || '?'} ${v}`).join(', '), '.');
}

export function createChartsView(ctx) {
  let mesh = '';
  const meshSel = h('select', {onchange: () => {
    mesh = meshSel.value;
    if (mesh) ctx.loader.checkpoints(mesh).catch(() => {});
    update();
  }});
  const body = h('div', {class: 'charts'});
  const el = h('div', {class: 'view'},
    h('div', {class: 'toolbar'}, field('Mesh', meshSel)),
    section('Charts', body));

  function update() {
    const names = state.meshes.map((m) => m.name);
    renderIf(meshSel, names, () => [h('option', {value: ''}, 'all meshes'),
      names.map((n) => h('option', {value: n, selected: n === mesh}, n))]);
    const minute = Math.floor(Date.now() / BUCKET_MS);
    renderIf(body, [mesh, [...state.jobs.values()].filter((j) => j.ended_at || j.kind === 'collective').map((j) => j.id + j.state),
      [...state.checkpoints.entries()], state.barrierEvents.length, state.metrics, minute],
    () => [throughput(mesh), sizes(mesh), activity(mesh), totals()]);
  }
  return {
    el, update,
    refresh: () => Promise.all([ctx.loader.jobs(), ctx.loader.metrics(),
      ...state.meshes.map((m) => ctx.loader.checkpoints(m.name))]),
  };
}
