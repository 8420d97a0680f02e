// Checkpoints of a mesh, persisted and in the workers' memory: the table (with each
// one's tiers), one checkpoint's detail (tensors and layouts), and the actions on
// persisted ones: save now, restore to a chosen mesh, verify, delete and retention; a
// memory-only one can be persisted now.
// Destructive ones ask first.

import {checkpointHref, jobCard, tierBadges} from '../components.js';
import {h, renderIf, table} from '../dom.js';
import * as endpoints from '../endpoints.js';
import * as fmt from '../format.js';
import {finished, persisted, sortedJobs, state} from '../store.js';
import {act, badge, confirmThenAct, field, section, showNotice} from '../ui.js';

// How a memory checkpoint's redundancy is kept, e.g. "replica, 1 copy".
function redundancy(c) {
  if (c.redundancy === 'replica') return `replica, ${fmt.plural(c.replicas ?? 1, 'copy', 'copies')}`;
  return c.redundancy === 'parity' ? `parity, groups of ${c.group}` : c.redundancy;
}

// The steps retention would delete now (the service's StepsToPrune).
function stepsToPrune(steps, keepLast, every) {
  if (!(keepLast > 0)) return [];
  return steps.slice(0, Math.max(0, steps.length - keepLast)).filter((s) => !(every > 0 && s % every === 0));
}

// What a save wrote itself: an incremental one's other chunks are earlier checkpoints'.
function written(c) {
  return c.stored_bytes === undefined ? undefined : c.stored_bytes - (c.referenced_bytes || 0);
}

function checkpointsTable(mesh, list, selected) {
  return table({
    caption: `Checkpoints of ${mesh}`,
    columns: [{label: 'Step', num: true}, {label: 'State'}, {label: 'Tiers'}, {label: 'Tensors', num: true},
      {label: 'Logical', num: true}, {label: 'Stored', num: true}, {label: 'Written', num: true},
      {label: 'Ratio', num: true}, {label: 'Duration', num: true}, {label: 'Created'}],
    rows: list.map((c) => [
      h('a', {href: checkpointHref(mesh, c.step), dataset: {key: `step-${c.step}`},
        'aria-current': c.step === selected ? 'true' : undefined}, String(c.step)),
      h('span', null, badge(c.state), c.error && c.error.message ? h('small', {class: 'row-error'}, ` ${c.error.message}`) : null),
      tierBadges(c.tiers),
      c.tensors,
      // A checkpoint only in memory has its bytes, and nothing stored.
      fmt.bytes(c.logical_bytes ?? c.bytes),
      fmt.bytes(c.stored_bytes),
      fmt.bytes(written(c)),
      fmt.ratio(c.logical_bytes, c.stored_bytes),
      fmt.duration(c.duration_ms),
      fmt.clock(c.created_at),
    ]),
    rowClass: (i) => (list[i].step === selected ? 'row-selected' : undefined),
    empty: 'No checkpoint yet. Push tensors from the trainers, then save one above.',
  });
}

export function createCheckpointsView(ctx) {
  let mesh = '';
  let step = null;
  let stepEdited = false;
  let retentionFor = null;
  let restoreTo = null;  // the chosen target mesh, kept across re-renders

  const meshSel = h('select', {dataset: {key: 'ckpt-mesh'}, onchange: () => ctx.navigate(checkpointHref(meshSel.value))});
  const stepInput = h('input', {type: 'number', min: 0, required: true, oninput: () => { stepEdited = true; }});
  const compression = h('select', null, h('option', {value: 'zstd'}, 'zstd'), h('option', {value: 'none'}, 'none'));
  const saveButton = h('button', {type: 'submit', class: 'btn btn-primary'}, 'Save now');
  const saveForm = h('form', {class: 'inline-form', 'aria-label': 'Save a checkpoint now',
    onsubmit: (e) => {
      e.preventDefault();
      const s = Number(stepInput.value);
      act(saveButton, `Save step ${s} of ${mesh}`, async () => {
        const r = await ctx.api.post(endpoints.checkpoints(mesh), {step: s, compression: compression.value});
        showNotice(`Save of step ${s} started (job ${r.job})`);
        stepEdited = false;
        await Promise.all([ctx.loader.jobs(), ctx.loader.checkpoints(mesh)]);
      });
    }},
  field('Step', stepInput), field('Compression', compression), saveButton);

  const keepLast = h('input', {type: 'number', min: 0, placeholder: 'all'});
  const keepEvery = h('input', {type: 'number', min: 0, placeholder: 'none'});
  const retentionButton = h('button', {type: 'submit', class: 'btn'}, 'Apply retention…');
  const retentionForm = h('form', {class: 'inline-form', 'aria-label': 'Retention policy',
    onsubmit: async (e) => {
      e.preventDefault();
      const body = {keep_last: Number(keepLast.value || 0), keep_every_n_steps: Number(keepEvery.value || 0)};
      const steps = (state.checkpoints.get(mesh) || []).filter(persisted)
        .map((c) => c.step).sort((a, b) => a - b);
      const doomed = stepsToPrune(steps, body.keep_last, body.keep_every_n_steps);
      await confirmThenAct(retentionButton, {
        title: `Apply retention to ${mesh}?`, danger: doomed.length > 0,
        confirm: doomed.length ? `Apply and delete ${fmt.plural(doomed.length, 'checkpoint')}` : 'Apply',
        content: [h('p', null, `Keep the last ${body.keep_last || 'all'} checkpoints`,
          body.keep_every_n_steps ? `, and every step divisible by ${body.keep_every_n_steps}` : '', '.'),
        h('p', {class: doomed.length ? 'strong' : null}, doomed.length
          ? `This deletes step${doomed.length > 1 ? 's' : ''} ${doomed.join(', ')} now.`
          : 'No checkpoint is deleted now.')]},
      `Retention of ${mesh}`, async () => {
        await ctx.api.put(endpoints.retention(mesh), body);
        showNotice(`Retention of ${mesh} set`);
        await Promise.all([ctx.loader.meshes(), ctx.loader.checkpoints(mesh)]);
      });
    }},
  field('Keep last', keepLast), field('Keep every N steps', keepEvery), retentionButton);
  const retentionHint = h('p', {class: 'hint'}, 'Keep last: the newest N committed checkpoints stay (empty or 0: all). ',
    'Keep every N steps: steps divisible by N stay as well. Older ones are deleted when a save commits, ',
    'and at once when you apply.');

  const jobsBox = h('div', {class: 'job-list'});
  const tableBox = h('div');
  const detailBox = h('div');
  const el = h('div', {class: 'view'},
    h('div', {class: 'toolbar'}, field('Mesh', meshSel)),
    section('Save now', saveForm, jobsBox),
    section('Checkpoints', tableBox),
    detailBox,
    section('Retention', retentionForm, retentionHint));

  function detail(c, lastVerify) {
    const key = `${mesh}@${step}`;
    const d = state.details.get(key);
    const target = h('select', {dataset: {key: 'restore-target'}, onchange: () => { restoreTo = target.value; }},
      state.meshes.map((m) => h('option', {value: m.name, selected: m.name === (restoreTo ?? mesh)}, m.name)));
    const restoreButton = h('button', {type: 'submit', class: 'btn btn-primary', dataset: {key: 'restore'}}, 'Restore…');
    const restoreForm = h('form', {class: 'inline-form', 'aria-label': 'Restore this checkpoint',
      onsubmit: async (e) => {
        e.preventDefault();
        const to = target.value;
        await confirmThenAct(restoreButton, {title: `Restore step ${step} of ${mesh} onto ${to}?`, confirm: 'Restore',
          content: h('p', null, `The workers of ${to} replace the tensors they hold with the saved ones.`)},
        `Restore step ${step} onto ${to}`, async () => {
          const r = await ctx.api.post(endpoints.restore(mesh, step), {target_mesh: to});
          showNotice(`Restore started (job ${r.job})`);
          await ctx.loader.jobs();
        });
      }},
    field('Target mesh', target), restoreButton);
    const verifyButton = h('button', {type: 'button', class: 'btn', dataset: {key: 'verify'},
      onclick: (e) => act(e.currentTarget, `Verify step ${step} of ${mesh}`, async () => {
        const r = await ctx.api.post(endpoints.verify(mesh, step));
        showNotice(`Verify started (job ${r.job})`);
        await ctx.loader.jobs();
      })}, 'Verify');
    const deleteButton = h('button', {type: 'button', class: 'btn btn-danger', dataset: {key: 'delete'},
      onclick: (e) => confirmThenAct(e.currentTarget, {title: `Delete step ${step} of ${mesh}?`, danger: true,
        confirm: 'Delete', content: h('p', null, 'The checkpoint directory is removed from disk. This cannot be undone.')},
      `Delete step ${step} of ${mesh}`, async () => {
        await ctx.api.del(endpoints.checkpoint(mesh, step));
        showNotice(`Step ${step} of ${mesh} deleted`);
        ctx.navigate(checkpointHref(mesh));
        await ctx.loader.checkpoints(mesh);
      })}, 'Delete…');
    const committed = c.state === 'committed';
    // Only in the workers' memory: the trainers restore it themselves (restore()), and
    // its workers free it when newer ones commit.
    const memoryOnly = committed && !persisted(c);
    let actions;
    if (memoryOnly) {
      // Persisting writes each worker's share from its RAM as a save job (docs/memory-tier.md).
      const persistButton = h('button', {type: 'button', class: 'btn', dataset: {key: 'persist'},
        onclick: (e) => act(e.currentTarget, `Persist step ${step} of ${mesh}`, async () => {
          const r = await ctx.api.post(endpoints.persist(mesh, step), {});
          showNotice(`Persist started (job ${r.job})`);
          await ctx.loader.jobs();
        })}, 'Persist now');
      actions = h('div', {class: 'action-row'},
        h('p', {class: 'muted', dataset: {memoryOnly: ''}}, 'In the workers\' memory only: the trainers restore it ',
          'with restore(), and the workers free it as newer ones commit. Persist it to keep it in the ',
          'checkpoint root; restore, verify and delete here apply to persisted checkpoints.'),
        h('div', {class: 'actions'}, persistButton));
    } else if (committed) {
      actions = h('div', {class: 'action-row'}, restoreForm, h('div', {class: 'actions'}, verifyButton, deleteButton));
    } else {
      actions = h('div', {class: 'actions'}, h('p', {class: 'muted'}, 'Only committed checkpoints can be restored or verified.'), deleteButton);
    }
    return section(`Step ${step} of ${mesh}`,
      h('dl', {class: 'facts'},
        h('dt', null, 'State'), h('dd', null, badge(c.state)),
        h('dt', null, 'Tiers'), h('dd', null, tierBadges(c.tiers)),
        c.redundancy ? [h('dt', null, 'Redundancy'), h('dd', null, redundancy(c))] : null,
        memoryOnly ? [h('dt', null, 'Size'), h('dd', null, `${fmt.bytes(c.bytes)} in the workers' memory`)] : [
          h('dt', null, 'Size'), h('dd', null, `${fmt.bytes(c.logical_bytes)} logical, ${fmt.bytes(c.stored_bytes)} stored (${fmt.ratio(c.logical_bytes, c.stored_bytes)})` +
            (c.referenced_bytes > 0 ? `; incremental: ${fmt.bytes(written(c))} written, ${fmt.bytes(c.referenced_bytes)} in earlier checkpoints' files` : '')),
          h('dt', null, 'Saved'), h('dd', null, `${fmt.clock(c.created_at)} in ${fmt.duration(c.duration_ms)}`),
          h('dt', null, 'Job'), h('dd', null, h('code', null, c.job || '—'))]),
      actions,
      lastVerify ? h('div', {class: 'job-list'}, jobCard(lastVerify, ctx)) : null,
      h('h3', null, 'Tensors'),
      d ? table({
        caption: `Tensors of step ${step}`,
        columns: [{label: 'Name'}, {label: 'Dtype'}, {label: 'Shape'}, {label: 'Layout'},
          {label: 'Logical', num: true}, {label: 'Stored', num: true}, {label: 'Ratio', num: true}],
        rows: (d.tensors || []).map((t) => [h('code', null, t.name), t.dtype, fmt.shape(t.shape),
          fmt.layout(t.layout), fmt.bytes(t.logical_bytes), fmt.bytes(t.stored_bytes),
          fmt.ratio(t.logical_bytes, t.stored_bytes)]),
        empty: 'No tensors.',
      }) : h('p', {class: 'muted'}, 'Loading…'),
      d && d.metadata && Object.keys(d.metadata).length
        ? [h('h3', null, 'Metadata'), h('pre', {class: 'metadata'}, JSON.stringify(d.metadata, null, 2))] : null);
  }

  function update() {
    if (!mesh && state.meshes.length) mesh = state.meshes[0].name;
    const names = state.meshes.map((m) => m.name);
    renderIf(meshSel, [names, mesh], () => (names.length
      ? names.map((n) => h('option', {value: n, selected: n === mesh}, n))
      : h('option', {value: ''}, 'no mesh registered')));
    const meshDoc = state.meshes.find((m) => m.name === mesh);
    saveButton.disabled = !meshDoc;
    const list = state.checkpoints.get(mesh) || [];
    if (!stepEdited) stepInput.value = list.length ? Math.max(...list.map((c) => c.step)) + 1 : 1;
    if (meshDoc && retentionFor !== mesh) {
      retentionFor = mesh;
      const r = meshDoc.retention || {};
      keepLast.value = r.keep_last ?? '';
      keepEvery.value = r.keep_every_n_steps ?? '';
    }
    const jobs = sortedJobs().filter((j) => j.mesh === mesh && j.kind !== 'mesh_init');
    const shown = jobs.filter((j) => !finished(j)).concat(jobs.filter((j) => finished(j) && ['save', 'restore'].includes(j.kind)).slice(0, 1));
    const workerStates = state.workers.map((w) => w.state);
    renderIf(jobsBox, [shown, workerStates], () => shown.map((j) => jobCard(j, ctx)));
    renderIf(tableBox, [!!meshDoc, mesh, list, step, names.length], () => (meshDoc ? checkpointsTable(mesh, list, step)
      : h('p', {class: 'empty'}, names.length ? `No mesh named ${mesh}: pick one above.` : 'Register a mesh first.')));
    const c = list.find((x) => x.step === step);
    const lastVerify = sortedJobs().find((j) => j.kind === 'verify' && j.mesh === mesh && j.step === step);
    renderIf(detailBox, [mesh, c, state.details.get(`${mesh}@${step}`), names, lastVerify, restoreTo],
      () => (c ? detail(c, lastVerify) : null));
  }

  function show(params) {
    const [m, s] = params;
    if (m !== undefined && m !== mesh) {
      mesh = m;
      stepEdited = false;
    }
    const next = s !== undefined && s !== '' ? Number(s) : null;
    if (next !== step) restoreTo = null;
    step = next;
    if (mesh) {
      ctx.loader.checkpoints(mesh).catch(() => {});
      if (step !== null) ctx.loader.checkpoint(mesh, step).catch(() => {});
    }
  }

  return {
    el, update, show,
    refresh: () => Promise.all([ctx.loader.meshes(), ctx.loader.jobs(),
      mesh ? ctx.loader.checkpoints(mesh) : null]),
    current: () => ({mesh, step}),
  };
}
