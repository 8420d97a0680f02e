// Coordination: open barriers with the ranks that arrived and those still
// missing, and the preemption state of every mesh.

import {h, renderIf, table} from '../dom.js';
import * as endpoints from '../endpoints.js';
import * as fmt from '../format.js';
import {state} from '../store.js';
import {confirmThenAct, field, section, showNotice} from '../ui.js';

function ranks(list, cls) {
  if (!list || !list.length) return h('span', {class: 'muted'}, 'none');
  return h('span', {class: 'ranks'}, list.map((r) => h('span', {class: `rank ${cls}`}, String(r))));
}

function barriersTable() {
  return table({
    caption: 'Open barriers',
    columns: [{label: 'Barrier'}, {label: 'World', num: true}, {label: 'Generation', num: true},
      {label: 'Arrived ranks'}, {label: 'Missing ranks'}, {label: 'Waiting', num: true}],
    rows: state.barriers.map((b) => [h('code', null, b.name), b.world, b.generation,
      ranks(b.arrived_ranks, 'rank-arrived'), ranks(b.missing_ranks, 'rank-missing'), fmt.duration(b.waiting_ms)]),
    empty: 'No barrier is open: nobody is waiting.',
  });
}

function preemptionTable(ctx) {
  const rows = state.meshes.map((m) => {
    const p = state.preemption.get(m.name) || {};
    const reported = Object.entries(p.reported_steps || {}).map(([w, s]) => `${w}: ${s}`).join(', ');
    const notice = h('button', {type: 'button', class: 'btn btn-small', dataset: {key: `notice-${m.name}`},
      onclick: (e) => {
        const reason = h('input', {type: 'text', value: 'maintenance', autocomplete: 'off'});
        return confirmThenAct(e.currentTarget, {title: `Record a preemption notice for ${m.name}?`,
          confirm: 'Record notice', content: [h('p', null, 'Every worker of the mesh then agrees on a step to stop at ',
            '(reached_preemption_sync_point).'), field('Reason', reason)]},
        `Preemption notice for ${m.name}`, async () => {
          await ctx.api.post(endpoints.preemption(m.name), {reason: reason.value});
          showNotice(`Preemption notice recorded for ${m.name}`);
          await ctx.loader.preemption(m.name);
        });
      }}, 'Notice…');
    const clear = h('button', {type: 'button', class: 'btn btn-small btn-danger-quiet', dataset: {key: `clear-${m.name}`},
      onclick: (e) => confirmThenAct(e.currentTarget, {title: `Clear the preemption notice of ${m.name}?`,
        danger: true, confirm: 'Clear notice',
        content: h('p', null, 'Do this for the restarted job: the sync step is forgotten.')},
      `Clear preemption of ${m.name}`, async () => {
        await ctx.api.del(endpoints.preemption(m.name));
        showNotice(`Preemption notice of ${m.name} cleared`);
        await ctx.loader.preemption(m.name);
      })}, 'Clear…');
    return [m.name,
      p.noticed ? h('span', {class: 'badge state-suspect'}, '▲ noticed') : h('span', {class: 'muted'}, 'no notice'),
      p.reason || '—', p.noticed_at ? fmt.clock(p.noticed_at) : '—',
      p.sync_step ?? '—', reported || '—',
      h('span', {class: 'actions'}, p.noticed ? clear : notice)];
  });
  return table({
    caption: 'Preemption by mesh',
    columns: [{label: 'Mesh'}, {label: 'Notice'}, {label: 'Reason'}, {label: 'Noticed at'},
      {label: 'Sync step', num: true}, {label: 'Reported steps'}, {label: 'Action'}],
    rows,
    empty: 'No mesh registered.',
  });
}

export function createCoordinationView(ctx) {
  const barriers = h('div');
  const preemption = h('div');
  const el = h('div', {class: 'view'},
    section('Open barriers', barriers),
    section('Preemption', preemption));

  function update() {
    renderIf(barriers, state.barriers, barriersTable);
    renderIf(preemption, [state.meshes.map((m) => m.name), [...state.preemption.entries()]],
      () => preemptionTable(ctx));
  }
  return {
    el, update,
    refresh: () => Promise.all([ctx.loader.barriers(), ctx.loader.meshes().then(() => ctx.loader.allPreemption())]),
  };
}
