// Meshes: axes, a device grid coloured by worker, and the registration form.

import {checkpointHref} from '../components.js';
import {h, render, renderIf} from '../dom.js';
import * as endpoints from '../endpoints.js';
import * as fmt from '../format.js';
import {state, workerIndex} from '../store.js';
import {act, badge, confirmThenAct, field, section, showNotice} from '../ui.js';

const PALETTE = 10; // .wc-0 … .wc-9 in app.css

function workerClass(id) {
  const i = workerIndex(id);
  return i < 0 ? 'wc-none' : `wc-${i % PALETTE}`;
}

function workerStateOf(id) {
  const w = state.workers.find((x) => x.id === id);
  return w ? w.state : 'unknown';
}

// Columns of the device grid: the last axis (it varies fastest, as device ids do).
const gridColumns = (mesh) => (mesh.axes && mesh.axes.length ? mesh.axes.at(-1).size : 1);

// Devices laid out as rows × the last axis.
export function deviceGrid(mesh) {
  const axes = mesh.axes || [];
  const cols = gridColumns(mesh);
  const cells = (mesh.devices || []).map((d) => {
    const ws = workerStateOf(d.worker);
    const coords = (d.coords || []).map((c, i) => `${axes[i].name}=${c}`).join(' ');
    return h('li', {class: ['device', workerClass(d.worker), ws === 'dead' ? 'device-dead' : null,
      ws === 'suspect' ? 'device-suspect' : null],
    'aria-label': `device ${d.device}, ${coords}, worker ${d.worker} rank ${d.rank}${ws !== 'alive' ? `, ${ws}` : ''}`,
    title: `device ${d.device} (${coords}) on ${d.worker}, rank ${d.rank}, local index ${d.local_index}`},
    h('span', {class: 'device-id'}, `d${d.device}`),
    h('span', {class: 'device-worker'}, d.worker),
    h('span', {class: 'device-coords'}, coords),
    ws === 'dead' ? h('span', {class: 'device-state'}, '✕ dead') : null);
  });
  const axisNote = axes.length > 1
    ? `rows: ${axes.slice(0, -1).map((a) => a.name).join(' × ')} · columns: ${axes.at(-1).name}`
    : axes.length ? `columns: ${axes[0].name}` : '';
  return h('figure', {class: 'grid-figure'},
    // Scrolls sideways when very wide, so it is focusable for keyboard scrolling.
    h('ul', {class: 'device-grid', style: {gridTemplateColumns: `repeat(${cols}, minmax(4.6rem, 1fr))`},
      tabindex: 0, 'aria-label': `Devices of mesh ${mesh.name}`}, cells),
    h('figcaption', {class: 'muted'}, axisNote));
}

function legend(mesh) {
  return h('ul', {class: 'legend', 'aria-label': `Workers of mesh ${mesh.name}`},
    (mesh.workers || []).map((id, rank) => h('li', {class: ['legend-item', workerClass(id)]},
      h('span', {class: 'swatch', 'aria-hidden': 'true'}), `rank ${rank}: ${id} `, badge(workerStateOf(id)))));
}

function meshCard(mesh, ctx) {
  const name = mesh.name;
  return h('article', {class: ['mesh-card', gridColumns(mesh) > 4 ? 'mesh-wide' : null], dataset: {mesh: name},
    'aria-label': `Mesh ${name}`},
    h('header', {class: 'mesh-head'},
      h('h3', null, name),
      h('span', {class: 'axes'}, fmt.axes(mesh.axes)),
      h('span', {class: 'muted'}, `${fmt.plural(mesh.num_devices, 'device')}, ${mesh.devices_per_worker} per worker`)),
    deviceGrid(mesh),
    legend(mesh),
    h('div', {class: 'actions mesh-actions'},
      h('a', {class: 'btn btn-small', href: checkpointHref(name)}, 'Checkpoints'),
      h('button', {type: 'button', class: 'btn btn-small btn-danger-quiet', dataset: {key: `delete-mesh-${name}`},
        onclick: (e) => confirmThenAct(e.currentTarget, {title: `Delete mesh ${name}?`, danger: true,
          confirm: 'Delete mesh', content: h('p', null, 'The mesh is forgotten by tesserad. Its checkpoints stay ',
            'on disk. This fails while a job runs on it.')},
        `Delete mesh ${name}`, async () => {
          await ctx.api.del(endpoints.mesh(name));
          showNotice(`Mesh ${name} deleted`);
          await ctx.loader.meshes();
        })}, 'Delete mesh…')));
}

// ---------------------------------------------------------------- registration

function registerForm(ctx) {
  const nameInput = h('input', {type: 'text', required: true, autocomplete: 'off', spellcheck: false,
    pattern: '[A-Za-z0-9._\\/\\-]{1,200}', placeholder: 'e.g. train'});
  const axesBox = h('div', {class: 'axes-rows'});
  const dpw = h('input', {type: 'number', min: 1, value: 1, required: true});
  const workersBox = h('fieldset', {class: 'workers-pick'});
  const selfTest = h('input', {type: 'checkbox', checked: true});
  const result = h('div', {class: 'form-result', 'aria-live': 'polite'});
  let axisCount = 0;

  function addAxis(name = '', size = 2) {
    axisCount++;
    const n = h('input', {type: 'text', required: true, value: name, autocomplete: 'off',
      class: 'axis-name', pattern: '[A-Za-z0-9._\\-]{1,200}'});
    const s = h('input', {type: 'number', required: true, min: 1, value: size, class: 'axis-size'});
    const row = h('div', {class: 'axis-row'},
      field(`Axis ${axisCount} name`, n), field(`Axis ${axisCount} size`, s),
      h('button', {type: 'button', class: 'btn btn-small', 'aria-label': `Remove axis ${axisCount}`,
        onclick: () => {
          if (axesBox.children.length > 1) row.remove();
        }}, 'Remove'));
    axesBox.append(row);
  }
  addAxis('data', 2);

  function pickable() {
    const checked = new Set([...workersBox.querySelectorAll('input:checked')].map((i) => i.value));
    renderIf(workersBox, state.workers.map((w) => [w.id, w.state]), () => [ h('legend', null, 'Workers, in rank order (optional)'),
      h('p', {class: 'hint'}, 'None ticked: the first alive workers in registration order.'),
      state.workers.map((w) => h('label', {class: ['check', w.state !== 'alive' ? 'muted' : null]},
        h('input', {type: 'checkbox', value: w.id, checked: checked.has(w.id), disabled: w.state === 'dead',
          dataset: {key: `pick-${w.id}`}}),
        ` ${w.id} `, badge(w.state)))]);
  }

  const submit = h('button', {type: 'submit', class: 'btn btn-primary'}, 'Register mesh');
  const form = h('form', {class: 'register-form', 'aria-label': 'Register a mesh',
    onsubmit: (e) => {
      e.preventDefault();
      const name = nameInput.value.trim();
      const body = {
        axes: [...axesBox.querySelectorAll('.axis-row')].map((row) => ({
          name: row.querySelector('.axis-name').value.trim(),
          size: Number(row.querySelector('.axis-size').value),
        })),
        devices_per_worker: Number(dpw.value),
      };
      const picked = [...workersBox.querySelectorAll('input:checked')].map((i) => i.value);
      if (picked.length) body.workers = picked;
      if (!selfTest.checked) body.self_test = false;
      render(result, h('p', {class: 'muted'}, 'Registering… (the workers run a self-test all-reduce)'));
      act(submit, `Register mesh ${name}`, async () => {
        try {
          const mesh = await ctx.api.put(endpoints.mesh(name), body);
          const st = mesh.self_test;
          render(result, h('p', {class: 'verify-ok', dataset: {registered: name}},
            `✓ Mesh ${name} registered: ${fmt.plural(mesh.devices.length, 'device')} on `,
            `${fmt.plural(new Set(mesh.devices.map((d) => d.worker)).size, 'worker')}. `,
            st && typeof st === 'object' ? `Self-test passed in ${fmt.duration(st.ms)} (job ${st.job}).`
              : 'Self-test skipped.'));
          nameInput.value = '';
          await ctx.loader.meshes();
        } catch (err) {
          render(result);
          throw err;
        }
      });
    }},
  h('div', {class: 'form-grid'},
    field('Name', nameInput, 'Letters, digits and . _ / -'),
    field('Devices per worker', dpw, 'Must equal each worker\'s --devices')),
  h('fieldset', null, h('legend', null, 'Axes (the last one varies fastest)'), axesBox,
    h('button', {type: 'button', class: 'btn btn-small', onclick: () => addAxis(`axis${axisCount}`, 2)}, 'Add axis')),
  workersBox,
  h('label', {class: 'check'}, selfTest, ' Run the self-test all-reduce (recommended)'),
  h('div', {class: 'actions'}, submit),
  result);
  return {form, pickable};
}

export function createMeshesView(ctx) {
  const list = h('div', {class: 'mesh-list'});
  const reg = registerForm(ctx);
  const el = h('div', {class: 'view view-meshes'},
    section('Meshes', list),
    section('Register a mesh', reg.form));

  function update() {
    renderIf(list, [state.meshes, state.workers.map((w) => [w.id, w.state])], () => (state.meshes.length
      ? state.meshes.map((m) => meshCard(m, ctx)) : h('p', {class: 'empty'}, 'No mesh yet: register one below.')));
    reg.pickable();
  }
  return {el, update, refresh: () => Promise.all([ctx.loader.meshes(), ctx.loader.workers()])};
}
