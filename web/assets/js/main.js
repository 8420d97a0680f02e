// The dashboard's entry point: the token prompt, the sections (hash routes),
// the header (counts, live state, dead workers, takeovers), polling and live events.

import {Api, isNotLeader, tokenStore} from './api.js';
import {h, render, renderIf} from './dom.js';
import * as fmt from './format.js';
import {connectEvents} from './live.js';
import {
  Loader, changed, finished, forgetCheckpointDetail, onChange, recordBarrierEvent, setLive, setTakeover, setUnreachable,
  state, upsertCheckpoint, upsertJob, upsertWorker, workerCounts,
} from './store.js';
import {createChartsView} from './views/charts.js';
import {createCheckpointsView} from './views/checkpoints.js';
import {createClusterView} from './views/cluster.js';
import {createCoordinationView} from './views/coordination.js';
import {createJobsView} from './views/jobs.js';
import {createMeshesView} from './views/meshes.js';

const SECTIONS = [
  {id: 'overview', label: 'Overview', create: createClusterView},
  {id: 'meshes', label: 'Meshes', create: createMeshesView},
  {id: 'checkpoints', label: 'Checkpoints', create: createCheckpointsView},
  {id: 'jobs', label: 'Jobs', create: createJobsView},
  {id: 'charts', label: 'Charts', create: createChartsView},
  {id: 'coordination', label: 'Coordination', create: createCoordinationView},
];
const POLL_MS = 2000;       // workers' heartbeat ages and the counts
const REFRESH_MS = 10000;   // the open section, in case an event was missed

const $ = (id) => document.getElementById(id);

const api = new Api({
  onUnauthorized: () => showLogin('The token was refused (401 unauthenticated). Enter it again.'),
  onNotLeader,
});
const loader = new Loader(api);
const ctx = {
  api,
  loader,
  navigate(hash) {
    if (location.hash === hash) route();
    else location.hash = hash;
  },
};
const views = new Map(SECTIONS.map((s) => [s.id, s.create(ctx)]));
let current = null;
let events = null;
let timers = [];
let leaving = false; // on the way to the leader's page

// ---------------------------------------------------------------- routing

function parseHash() {
  try {
    return location.hash.replace(/^#/, '').split('/').map(decodeURIComponent);
  } catch {
    return ['overview'];
  }
}

function route() {
  const [name, ...params] = parseHash();
  const id = views.has(name) ? name : 'overview';
  const view = views.get(id);
  if (current !== id) {
    current = id;
    render($('main'), view.el);
    for (const a of document.querySelectorAll('#tabs a')) {
      if (a.getAttribute('href') === `#${id}`) a.setAttribute('aria-current', 'page');
      else a.removeAttribute('aria-current');
    }
    document.title = `${SECTIONS.find((s) => s.id === id).label} · Tessera`;
  }
  if (view.show) view.show(params);
  view.update();
  loader.quietly(view.refresh).catch(() => {});
}

// ---------------------------------------------------------------- header

function header() {
  const w = state.cluster ? workerCounts() : null;
  renderIf($('counts'), [w, state.cluster && state.cluster.running_jobs], () => (w ? [
    h('a', {href: '#overview', class: 'pill pill-alive'}, `${w.alive} alive`),
    w.suspect ? h('a', {href: '#overview', class: 'pill pill-suspect'}, `${w.suspect} suspect`) : null,
    w.dead ? h('a', {href: '#overview', class: 'pill pill-dead'}, `${w.dead} dead`) : null,
    h('span', {class: 'pill'}, fmt.plural(state.cluster.running_jobs, 'running job')),
  ] : null));

  const live = state.unreachable ? ['down', `tesserad unreachable: ${state.unreachable}`]
    : state.live === 'live' ? ['up', 'live'] : ['wait', state.live === 'connecting' ? 'connecting…' : 'reconnecting…'];
  renderIf($('live'), live, () => h('span', {class: `live-${live[0]}`}, live[1]));

  const dead = state.workers.filter((x) => x.state === 'dead');
  const suspect = state.workers.filter((x) => x.state === 'suspect');
  const affected = state.meshes.filter((m) => (m.workers || []).some((id) => dead.some((d) => d.id === id)));
  const banner = $('dead-banner');
  banner.hidden = !dead.length && !suspect.length;
  banner.className = dead.length ? 'banner banner-dead' : 'banner banner-suspect';
  renderIf(banner, [dead.map((x) => x.id), suspect.map((x) => x.id), affected.map((m) => m.name)], () => [
    dead.length ? h('p', null, h('strong', null, `✕ ${dead.length === 1 ? '1 worker is' : `${dead.length} workers are`} dead: `),
      dead.map((x) => x.id).join(', '), '. ',
      affected.length ? `Meshes that use ${dead.length === 1 ? 'it' : 'them'} cannot save or restore: ${affected.map((m) => m.name).join(', ')}. `
        : 'Jobs that need it fail. ',
      h('a', {href: '#overview'}, 'See workers')) : null,
    suspect.length ? h('p', null, h('strong', null, `▲ ${suspect.length === 1 ? '1 worker is' : `${suspect.length} workers are`} suspect`),
      ` (missed heartbeats): ${suspect.map((x) => x.id).join(', ')}.`) : null,
  ]);
  takeoverBanner();
}

// ---------------------------------------------------------------- leadership

// The origin of the leader a standby names, if it is an http(s) URL other than
// this page's own (which would only reload this page).
function leaderOrigin(url) {
  try {
    const u = new URL(url);
    return ['http:', 'https:'].includes(u.protocol) && u.origin !== location.origin ? u.origin : null;
  } catch {
    return null;
  }
}

// The tesserad this page came from stands by since a takeover: open the same page
// on the leader it names. While it names none, the banner says so and polling goes on.
// The token is not passed on: the leader's origin asks for it (sessionStorage is per origin).
function onNotLeader(error) {
  const leader = leaderOrigin(error.details.leader);
  setUnreachable(null);
  setTakeover({standby: error.details.standby || location.origin, leader});
  changed();
  if (!leader || leaving) return;
  leaving = true;
  stop();
  location.assign(`${leader}${location.pathname}${location.search}${location.hash}`);
}

function takeoverBanner() {
  const t = state.takeover;
  const banner = $('takeover-banner');
  banner.hidden = !t;
  renderIf(banner, t, () => t && h('p', null, t.leader ? [
    h('strong', null, 'The leader is now '), h('code', null, t.leader), '. Opening its dashboard…',
  ] : [
    h('strong', null, 'Takeover under way: waiting for a leader.'),
    ' This tesserad (', h('code', null, t.standby), ') stands by; the page moves to the leader once one is named.',
  ]));
}

// ---------------------------------------------------------------- live events

function onEvent(type, data) {
  switch (type) {
    case 'worker':
      upsertWorker(data);
      loader.soon('cluster', () => loader.cluster());
      break;
    case 'mesh':
      loader.soon('meshes', () => loader.meshes());
      break;
    case 'job':
      upsertJob(data);
      if (finished(data)) loader.soon('cluster', () => loader.cluster());
      break;
    case 'checkpoint': {
      upsertCheckpoint(data);
      loader.soon(`checkpoints:${data.mesh}`, () => loader.checkpoints(data.mesh), 1000);
      const key = `${data.mesh}@${data.step}`;
      if (data.state === 'deleted') forgetCheckpointDetail(data.mesh, data.step);
      else if (state.details.has(key) || data.state === 'committed') {
        loader.soon(`detail:${key}`, () => loader.checkpoint(data.mesh, data.step));
      }
      loader.soon('cluster', () => loader.cluster());
      break;
    }
    case 'memory_checkpoint':
      // Rank 0's report: the mesh's memory tier and its workers' memory bytes changed.
      loader.soon(`checkpoints:${data.mesh}`, () => loader.checkpoints(data.mesh));
      loader.soon('workers', () => loader.workers());
      break;
    case 'barrier':
      recordBarrierEvent(data);
      loader.soon('barriers', () => loader.barriers());
      break;
    case 'preemption':
      loader.soon(`preemption:${data.mesh}`, () => loader.preemption(data.mesh));
      break;
    default:
      return;
  }
  changed();
}

// ---------------------------------------------------------------- start, stop, token

function stop() {
  if (events) events.close();
  events = null;
  for (const t of timers) clearInterval(t);
  timers = [];
}

function showLogin(message) {
  stop();
  $('app').hidden = true;
  $('login').hidden = false;
  const msg = $('login-message');
  msg.textContent = message || '';
  msg.hidden = !message;
  $('token-input').value = '';
  $('token-input').focus();
}

async function start() {
  if (!tokenStore.get()) {
    showLogin('');
    return;
  }
  try {
    await loader.cluster();
  } catch (e) {
    if (e.status === 401) return; // showLogin ran
    if (!isNotLeader(e)) setUnreachable(e.message); // else onNotLeader ran
  }
  if (leaving) return;
  $('login').hidden = true;
  $('app').hidden = false;
  stop();
  events = connectEvents(tokenStore.get(), {
    onEvent,
    onStatus(s) {
      setLive(s);
      changed();
      // After a drop, events may have been missed: reload what is shown.
      if (s === 'live' && current) loader.quietly(views.get(current).refresh).catch(() => {});
    },
  });
  const poll = () => loader.quietly(() => Promise.all([loader.workers(), loader.cluster()])).catch(() => {});
  timers.push(setInterval(poll, POLL_MS));
  timers.push(setInterval(() => {
    loader.quietly(() => Promise.all([loader.jobs(), loader.meshes(), views.get(current).refresh()])).catch(() => {});
  }, REFRESH_MS));
  await loader.quietly(() => loader.all()).catch(() => {});
  route();
}

function init() {
  render($('tabs'), SECTIONS.map((s) => h('a', {href: `#${s.id}`}, s.label)));
  $('login-form').addEventListener('submit', (e) => {
    e.preventDefault();
    const token = $('token-input').value.trim();
    if (!token) return;
    tokenStore.set(token);
    start();
  });
  $('change-token').addEventListener('click', () => {
    tokenStore.clear();
    showLogin('');
  });
  window.addEventListener('hashchange', () => {
    if (tokenStore.takeFromFragment()) start();
    else if (!$('app').hidden) route();
  });
  onChange(() => {
    header();
    if (current) views.get(current).update();
  });
  tokenStore.takeFromFragment();
  start();
}

init();
