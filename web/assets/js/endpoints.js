// Every path of tesserad the dashboard calls, in one place: the routes of
// docs/openapi.json under /api/v1, the event stream and /metrics.

const V1 = '/api/v1';

export function encodeName(name) {
  // Names may contain '/', which the routes accept as-is.
  return String(name).split('/').map(encodeURIComponent).join('/');
}

// ---------------------------------------------------------------- cluster

export const CLUSTER = `${V1}/cluster`;
export const WORKERS = `${V1}/workers`;
export const BARRIERS = `${V1}/barriers`;

// Open and plain text, outside /api/v1.
export const METRICS = '/metrics';

// The token goes in the query: EventSource cannot send headers (see live.js).
export const events = (token) => `${V1}/events?token=${encodeURIComponent(token)}`;

// ---------------------------------------------------------------- jobs

export const jobs = (limit) => `${V1}/jobs?limit=${limit}`;
// Job ids are tesserad's own ("j-" and hex digits): nothing to encode.
export const jobCancel = (id) => `${V1}/jobs/${id}/cancel`;

// ---------------------------------------------------------------- meshes

export const MESHES = `${V1}/meshes`;
export const mesh = (name) => `${MESHES}/${encodeName(name)}`;
export const retention = (name) => `${mesh(name)}/retention`;
export const preemption = (name) => `${mesh(name)}/preemption`;

// ---------------------------------------------------------------- checkpoints

export const checkpoints = (name) => `${mesh(name)}/checkpoints`;
export const checkpoint = (name, step) => `${checkpoints(name)}/${step}`;
export const restore = (name, step) => `${checkpoint(name, step)}/restore`;
export const verify = (name, step) => `${checkpoint(name, step)}/verify`;
export const persist = (name, step) => `${checkpoint(name, step)}/persist`;
