// The REST client of docs/openapi.json: the bearer token, JSON in and out, and every
// non-2xx answer turned into an ApiError carrying docs/openapi.json's {code, message, details}.

import {METRICS} from './endpoints.js';

const TOKEN_KEY = 'tessera.token';

export class ApiError extends Error {
  constructor({status, code, message, details, method, path}) {
    super(message);
    this.name = 'ApiError';
    this.status = status;
    this.code = code;
    this.details = details || {};
    this.method = method;
    this.path = path;
  }
}

// The token lives in sessionStorage: asked once per tab, gone when the tab closes.
export const tokenStore = {
  get() {
    return sessionStorage.getItem(TOKEN_KEY) || '';
  },
  set(token) {
    sessionStorage.setItem(TOKEN_KEY, token);
  },
  clear() {
    sessionStorage.removeItem(TOKEN_KEY);
  },
  // Takes "#token=..." from the address, keeps it, and removes it from the
  // address bar and history so it is not shared with a copied link.
  takeFromFragment() {
    const match = /^#token=([^&]*)/.exec(location.hash);
    if (!match) return false;
    this.set(decodeURIComponent(match[1]));
    history.replaceState(null, '', `${location.pathname}${location.search}#overview`);
    return true;
  },
};

// A standby's answer to every /api call: 503 with details.reason "not_leader", naming
// the leader (details.leader, header X-Tessera-Leader) once it knows one.
export const isNotLeader = (e) => e instanceof ApiError && e.status === 503 && e.details.reason === 'not_leader';

export class Api {
  // onUnauthorized(error) runs on every 401, after the stored token is dropped;
  // onNotLeader(error) on every answer of a standby (isNotLeader).
  constructor({onUnauthorized, onNotLeader}) {
    this.onUnauthorized = onUnauthorized;
    this.onNotLeader = onNotLeader;
  }

  async request(method, path, body) {
    const headers = {Authorization: `Bearer ${tokenStore.get()}`};
    const init = {method, headers, cache: 'no-store'};
    if (body !== undefined) {
      headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    let res;
    try {
      res = await fetch(path, init);
    } catch (e) {
      throw new ApiError({status: 0, code: 'unavailable', method, path,
        message: `tesserad did not answer (${e.message})`});
    }
    const text = await res.text();
    let json = null;
    try {
      json = text ? JSON.parse(text) : null;
    } catch {
      json = null;
    }
    if (res.ok) return json;
    const err = json && json.error ? json.error : {};
    const error = new ApiError({
      status: res.status,
      code: err.code || `http_${res.status}`,
      message: err.message || `${res.status} ${res.statusText || 'error'}`,
      details: err.details,
      method,
      path,
    });
    if (res.status === 401) {
      tokenStore.clear();
      this.onUnauthorized(error);
    }
    if (isNotLeader(error)) {
      error.details.leader = error.details.leader || res.headers.get('X-Tessera-Leader') || null;
      this.onNotLeader(error);
    }
    throw error;
  }

  get(path) { return this.request('GET', path); }
  post(path, body = {}) { return this.request('POST', path, body); }
  put(path, body = {}) { return this.request('PUT', path, body); }
  del(path) { return this.request('DELETE', path); }

  // /metrics is open and plain text: {"name{labels}": value}.
  async metrics() {
    const res = await fetch(METRICS, {cache: 'no-store'});
    const out = {};
    if (!res.ok) return out;
    for (const line of (await res.text()).split('\n')) {
      if (!line || line.startsWith('#')) continue;
      const space = line.lastIndexOf(' ');
      out[line.slice(0, space)] = Number(line.slice(space + 1));
    }
    return out;
  }
}
