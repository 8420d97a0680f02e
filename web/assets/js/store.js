// What the dashboard knows about the cluster, loaded from the REST API and kept
// current by the event stream. Views read `state` and re-render on change().

import {encodeName} from './api.js';

export const state = {
  live: 'connecting',       // connecting | live | reconnecting
  unreachable: null,        // message while tesserad does not answer
  cluster: null,
  workers: [],
  meshes: [],
  jobs: new Map(),          // id → job
  checkpoints: new Map(),   // mesh → [summary], newest first
  details: new Map(),       // "mesh@step" → checkpoint detail
  barriers: [],
  preemption: new Map(),    // mesh → preemption document
  barrierEvents: [],        // {t, action, name} from the event stream, for the activity chart
  metrics: {},
  samples: new Map(),       // job id → [{t, done}] of the current phase, for rate and ETA
};

const listeners = new Set();
let scheduled = false;

export function onChange(fn) {
  listeners.add(fn);
}

// Coalesces many changes (a burst of events) into one render per frame.
export function changed() {
  if (scheduled) return;
  scheduled = true;
  requestAnimationFrame(() => {
    scheduled = false;
    for (const fn of listeners) fn();
  });
}

export const finished = (job) => ['succeeded', 'failed', 'cancelled'].includes(job.state);

export function upsertJob(job) {
  const old = state.jobs.get(job.id);
  state.jobs.set(job.id, job);
  const done = job.progress ? job.progress.done_bytes : 0;
  let samples = state.samples.get(job.id) || [];
  // Progress restarts with every phase (snapshot, write, ...): so do the samples.
  if (!old || old.phase !== job.phase || (samples.length && done < samples.at(-1).done)) samples = [];
  if (!finished(job)) {
    samples.push({t: performance.now(), done});
    if (samples.length > 30) samples.shift();
  }
  state.samples.set(job.id, samples);
}

// Bytes per second of a job: measured over the last seconds while it runs,
// over its whole run once it ended.
export function jobRate(job) {
  if (finished(job)) {
    const ms = (job.ended_at || 0) - (job.started_at || 0);
    return ms > 0 ? (job.progress.total_bytes / ms) * 1000 : null;
  }
  const samples = (state.samples.get(job.id) || []).filter((s) => performance.now() - s.t < 10000);
  if (samples.length < 2) return null;
  const first = samples[0];
  const last = samples.at(-1);
  const dt = (last.t - first.t) / 1000;
  return dt > 0.2 && last.done > first.done ? (last.done - first.done) / dt : null;
}

// A checkpoint summary from an event: the list is right at once, before any reload.
export function upsertCheckpoint(summary) {
  if (!state.checkpoints.has(summary.mesh)) return; // not loaded yet: the load brings it
  const list = (state.checkpoints.get(summary.mesh) || []).filter((c) => c.step !== summary.step);
  if (summary.state !== 'deleted') list.push(summary);
  list.sort((a, b) => b.step - a.step);
  state.checkpoints.set(summary.mesh, list);
}

export function sortedJobs() {
  return [...state.jobs.values()].sort((a, b) => (b.created_at || 0) - (a.created_at || 0));
}

// Workers by state, from the worker list (kept current by events, so the counts
// never disagree with the table).
export function workerCounts() {
  const counts = {alive: 0, suspect: 0, dead: 0};
  for (const w of state.workers) counts[w.state] = (counts[w.state] || 0) + 1;
  return counts;
}

export function workerIndex(id) {
  return state.workers.findIndex((w) => w.id === id);
}

// Loads from tesserad into `state`. Background loads report failures through
// `state.unreachable`; user actions get the ApiError thrown.
export class Loader {
  constructor(api) {
    this.api = api;
    this.timers = new Map();
  }

  // Runs fn once, `ms` after the last call with this key (bursts of events → one load).
  soon(key, fn, ms = 150) {
    clearTimeout(this.timers.get(key));
    this.timers.set(key, setTimeout(() => {
      this.timers.delete(key);
      fn().catch(() => {});
    }, ms));
  }

  async quietly(fn) {
    try {
      await fn();
      if (state.unreachable) {
        state.unreachable = null;
        changed();
      }
    } catch (e) {
      if (e.status === 0) {
        state.unreachable = e.message;
        changed();
      }
      if (e.status === 401 || e.status === 0) throw e;
      // Anything else (a mesh deleted meanwhile) is cleared by the next load.
    }
  }

  async cluster() {
    state.cluster = await this.api.get('/api/v1/cluster');
    changed();
  }

  async workers() {
    state.workers = await this.api.get('/api/v1/workers');
    changed();
  }

  async meshes() {
    state.meshes = await this.api.get('/api/v1/meshes');
    for (const name of state.checkpoints.keys()) {
      if (!state.meshes.some((m) => m.name === name)) state.checkpoints.delete(name);
    }
    changed();
  }

  async jobs() {
    const list = await this.api.get('/api/v1/jobs?limit=100');
    const ids = new Set(list.map((j) => j.id));
    for (const job of list) upsertJob(job);
    // Keep jobs that fell off the list only while they run.
    for (const [id, job] of state.jobs) if (!ids.has(id) && finished(job)) state.jobs.delete(id);
    changed();
  }

  async checkpoints(mesh) {
    state.checkpoints.set(mesh, await this.api.get(`/api/v1/meshes/${encodeName(mesh)}/checkpoints`));
    changed();
  }

  async checkpoint(mesh, step) {
    const detail = await this.api.get(`/api/v1/meshes/${encodeName(mesh)}/checkpoints/${step}`);
    state.details.set(`${mesh}@${step}`, detail);
    changed();
    return detail;
  }

  async barriers() {
    state.barriers = await this.api.get('/api/v1/barriers');
    changed();
  }

  async preemption(mesh) {
    state.preemption.set(mesh, await this.api.get(`/api/v1/meshes/${encodeName(mesh)}/preemption`));
    changed();
  }

  async allPreemption() {
    await Promise.all(state.meshes.map((m) => this.preemption(m.name)));
  }

  async metrics() {
    state.metrics = await this.api.metrics();
    changed();
  }

  // Everything, e.g. after the token was accepted.
  async all() {
    await Promise.all([this.cluster(), this.workers(), this.meshes(), this.jobs(), this.barriers()]);
    await Promise.all([this.allPreemption(), ...state.meshes.map((m) => this.checkpoints(m.name))]);
  }
}
