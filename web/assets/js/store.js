// What the dashboard knows about the cluster, loaded from the REST API and kept
// current by the event stream. Views read `state` and re-render on change();
// only this module writes it, through the functions below.

import * as endpoints from './endpoints.js';

const JOB_LIMIT = 100;                      // jobs loaded at a time, newest first
const KEEP_BARRIER_EVENTS_MS = 15 * 60 * 1000;

export const state = {
  live: 'connecting',       // connecting | live | reconnecting
  unreachable: null,        // message while tesserad does not answer
  takeover: null,           // {standby, leader} while the page's tesserad stands by (leader: URL or null)
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

// ---------------------------------------------------------------- updates

// Callers call changed() when they are done, so that a burst of updates renders once.

export function setLive(status) {
  state.live = status;
}

// null once tesserad answers again.
export function setUnreachable(message) {
  state.unreachable = message;
}

// {standby, leader} while the page's tesserad stands by; null once it answers as the leader.
export function setTakeover(takeover) {
  state.takeover = takeover;
}

// A worker from an event: added, replaced, or gone once deregistered.
export function upsertWorker(worker) {
  const i = workerIndex(worker.id);
  if (worker.state === 'deregistered') {
    if (i >= 0) state.workers.splice(i, 1);
  } else if (i >= 0) {
    state.workers[i] = worker;
  } else {
    state.workers.push(worker);
  }
}

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

// A checkpoint summary from an event: the list is right at once, before any reload.
export function upsertCheckpoint(summary) {
  if (!state.checkpoints.has(summary.mesh)) return; // not loaded yet: the load brings it
  const old = (state.checkpoints.get(summary.mesh) || []).find((c) => c.step === summary.step);
  const list = (state.checkpoints.get(summary.mesh) || []).filter((c) => c.step !== summary.step);
  if (summary.state !== 'deleted') list.push({...summary, tiers: eventTiers(summary, old)});
  list.sort((a, b) => b.step - a.step);
  state.checkpoints.set(summary.mesh, list);
}

// An event's summary carries no tiers: the memory tier stays as the list had it (until
// the reload that follows), and a committed one is persisted.
function eventTiers(summary, old) {
  if (summary.tiers) return summary.tiers;
  const memory = old && old.tiers && old.tiers.includes('memory') ? ['memory'] : [];
  return memory.concat(summary.state === 'committed' ? ['persisted'] : []);
}

// A deleted checkpoint's detail must not be shown again from memory.
export function forgetCheckpointDetail(mesh, step) {
  state.details.delete(`${mesh}@${step}`);
}

// Barrier events are not kept by tesserad: the activity chart counts those seen
// while the page is open, over the last minutes.
export function recordBarrierEvent({action, name}) {
  const now = Date.now();
  state.barrierEvents.push({t: now, action, name});
  while (state.barrierEvents.length && now - state.barrierEvents[0].t > KEEP_BARRIER_EVENTS_MS) {
    state.barrierEvents.shift();
  }
}

// ---------------------------------------------------------------- reading

export const finished = (job) => ['succeeded', 'failed', 'cancelled'].includes(job.state);

// Whether a checkpoint is committed in the checkpoint root (tiers holds "persisted"),
// rather than only in the workers' memory: only those can be restored, verified,
// deleted or pruned from here.
export const persisted = (c) => (c.tiers ? c.tiers.includes('persisted') : c.state === 'committed');

export function sortedJobs() {
  return [...state.jobs.values()].sort((a, b) => (b.created_at || 0) - (a.created_at || 0));
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
      if (state.unreachable || state.takeover) {
        setUnreachable(null);
        setTakeover(null);
        changed();
      }
    } catch (e) {
      if (e.status === 0) {
        setUnreachable(e.message);
        changed();
      }
      if (e.status === 401 || e.status === 0) throw e;
      // Anything else (a mesh deleted meanwhile, a standby's 503) is cleared by the next load.
    }
  }

  async cluster() {
    state.cluster = await this.api.get(endpoints.CLUSTER);
    changed();
  }

  async workers() {
    state.workers = await this.api.get(endpoints.WORKERS);
    changed();
  }

  async meshes() {
    state.meshes = await this.api.get(endpoints.MESHES);
    for (const name of state.checkpoints.keys()) {
      if (!state.meshes.some((m) => m.name === name)) state.checkpoints.delete(name);
    }
    changed();
  }

  async jobs() {
    const list = await this.api.get(endpoints.jobs(JOB_LIMIT));
    const ids = new Set(list.map((j) => j.id));
    for (const job of list) upsertJob(job);
    // Keep jobs that fell off the list only while they run.
    for (const [id, job] of state.jobs) if (!ids.has(id) && finished(job)) state.jobs.delete(id);
    changed();
  }

  async checkpoints(mesh) {
    state.checkpoints.set(mesh, await this.api.get(endpoints.checkpoints(mesh)));
    changed();
  }

  async checkpoint(mesh, step) {
    const detail = await this.api.get(endpoints.checkpoint(mesh, step));
    state.details.set(`${mesh}@${step}`, detail);
    changed();
    return detail;
  }

  async barriers() {
    state.barriers = await this.api.get(endpoints.BARRIERS);
    changed();
  }

  async preemption(mesh) {
    state.preemption.set(mesh, await this.api.get(endpoints.preemption(mesh)));
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
