// Jobs: every job, filtered by state, kind and mesh, each as a job card
// (components.js): live progress (bytes, per-worker progress, phase, rate, ETA)
// and, for a failed job, its error with the culprit named in its details.

import {jobCard} from '../components.js';
import {h, render, renderIf} from '../dom.js';
import {sortedJobs, state} from '../store.js';
import {field, section} from '../ui.js';

export function createJobsView(ctx) {
  const stateSel = h('select', {dataset: {key: 'jobs-state'}},
    ['', 'running', 'queued', 'succeeded', 'failed', 'cancelled'].map((s) => h('option', {value: s}, s || 'any')));
  const kindSel = h('select', null,
    ['', 'save', 'restore', 'verify', 'export', 'import', 'collective', 'mesh_init'].map((s) => h('option', {value: s}, s || 'any')));
  const meshSel = h('select', null);
  const list = h('div', {class: 'job-list'});
  for (const s of [stateSel, kindSel, meshSel]) s.addEventListener('change', () => update());
  const el = h('div', {class: 'view'},
    section('Jobs',
      h('form', {class: 'filters', onsubmit: (e) => e.preventDefault()},
        field('State', stateSel), field('Kind', kindSel), field('Mesh', meshSel)),
      list));

  function update() {
    const mesh = meshSel.value;
    const names = state.meshes.map((m) => m.name);
    renderIf(meshSel, names, () => [h('option', {value: ''}, 'any'),
      names.map((n) => h('option', {value: n, selected: n === mesh}, n))]);
    const jobs = sortedJobs().filter((j) => (!stateSel.value || j.state === stateSel.value) &&
      (!kindSel.value || j.kind === kindSel.value) && (!meshSel.value || j.mesh === meshSel.value));
    render(list, jobs.length ? jobs.map((j) => jobCard(j, ctx)) : h('p', {class: 'empty'}, 'No jobs match.'));
  }
  return {el, update, refresh: () => ctx.loader.jobs()};
}
