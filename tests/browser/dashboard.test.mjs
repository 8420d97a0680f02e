// The dashboard in a real browser (Debian's chromium, headless, driven by
// playwright-core) against a real tesserad and 4 workers: the token prompt,
// workers, registering a mesh, a save watched to the end, the checkpoint, its
// verification, restore, retention, API errors, the memory tier (a rank 0 report:
// the checkpoints' tiers and the workers' memory bytes), a killed worker turning dead,
// a save that fails naming it, a narrow screen and the keyboard. Then an HA group
// (etcd, a leader and a standby): the page names the leader, the standby's address
// leads to it, and after a takeover the page follows the new leader.
// Screenshots go to $TESSERA_ARTIFACTS (default build/web-artifacts).
//
//   TESSERA_BIN=build/bin node --test tests/browser/dashboard.test.mjs

import assert from 'node:assert/strict';
import {existsSync, mkdirSync, readFileSync, readdirSync, writeFileSync} from 'node:fs';
import {dirname, join, resolve} from 'node:path';
import {after, before, describe, test} from 'node:test';
import {fileURLToPath} from 'node:url';

import {Cluster, until} from './cluster.mjs';

const here = dirname(fileURLToPath(import.meta.url));
const root = resolve(here, '../..');
const bin = process.env.TESSERA_BIN || join(root, 'build/bin');
const artifacts = process.env.TESSERA_ARTIFACTS || join(root, 'build/web-artifacts');
const chromiumPath = process.env.CHROMIUM || '/usr/bin/chromium';

let chromium;
try {
  ({chromium} = await import('playwright-core'));
} catch {
  throw new Error(`playwright-core is missing: run 'npm ci' in ${here} (tools/setup.sh does)`);
}
assert.ok(existsSync(chromiumPath), `${chromiumPath} is missing: apt-get install chromium (tools/setup.sh does)`);
assert.ok(existsSync(join(bin, 'tesserad')), `${bin}/tesserad is missing: build first`);

const WAIT = 30000; // upper bound for anything the page waits for; never a timing assertion

describe('dashboard', () => {
  let cluster;
  let browser;
  let page;
  const pageErrors = [];

  const shot = (name) => page.screenshot({path: join(artifacts, `${name}.png`), fullPage: true});
  const tab = (label) => page.locator('#tabs').getByRole('link', {name: label, exact: true}).click();
  const jobCard = (title) => page.locator('main .job-card').filter({has: page.getByRole('heading', {name: title, exact: true})});
  // Clears the message stack before a screenshot (notices may also go away by themselves meanwhile).
  const dismissMessages = async () => {
    const buttons = page.locator('#messages').getByRole('button', {name: 'Dismiss message'});
    for (let i = 0; i < 10 && await buttons.count(); i++) await buttons.first().click({timeout: 1000}).catch(() => {});
  };
  const dialogButton = (name) => page.locator('dialog[open]').getByRole('button', {name, exact: true});

  before(async () => {
    mkdirSync(artifacts, {recursive: true});
    cluster = new Cluster(bin, 4); // assigned first: after() stops what a failed start left
    await cluster.start();
    browser = await chromium.launch({executablePath: chromiumPath, headless: true,
      args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage']});
    page = await browser.newPage({viewport: {width: 1280, height: 800}});
    page.setDefaultTimeout(WAIT);
    page.on('pageerror', (e) => pageErrors.push(e.message));
  });

  after(async () => {
    if (browser) await browser.close();
    if (cluster) await cluster.stop();
  });

  test('asks for the token; a wrong one is refused and leads back to the prompt', async () => {
    await page.goto(`${cluster.url}/`);
    await page.getByLabel('Access token').waitFor();
    assert.equal(await page.locator('#app').isHidden(), true);
    await page.getByLabel('Access token').fill('not-the-token');
    await page.getByRole('button', {name: 'Open the dashboard'}).click();
    await page.locator('#login-message', {hasText: '401'}).waitFor();
    assert.equal(await page.evaluate(() => sessionStorage.getItem('tessera.token')), null);
    await shot('01-token-refused');
    await page.getByLabel('Access token').fill(cluster.token);
    await page.getByRole('button', {name: 'Open the dashboard'}).click();
    await page.locator('#workers tbody tr').first().waitFor();
  });

  test('opens with #token=, keeps it in the tab and shows 4 workers alive', async () => {
    await page.evaluate(() => sessionStorage.clear());
    await page.goto(`${cluster.url}/#token=${cluster.token}`);
    await page.waitForFunction(() => document.querySelectorAll('#workers tbody tr.row-alive').length === 4);
    assert.equal(await page.evaluate(() => sessionStorage.getItem('tessera.token')), cluster.token);
    assert.ok(!page.url().includes(cluster.token), `the token stays out of the address: ${page.url()}`);
    const ids = await page.locator('#workers tbody tr .worker-id').allTextContents();
    assert.deepEqual(ids.sort(), ['w-host0', 'w-host1', 'w-host2', 'w-host3']);
    await page.locator('#live', {hasText: 'live'}).waitFor();
    assert.equal(await page.locator('#dead-banner').isHidden(), true);
    // Without --ha, the one tesserad leads the root's first epoch.
    const line = page.locator(`#leadership[data-leader="${cluster.url}"]`);
    assert.match(await line.textContent(), /^Single tesserad http:\/\/127\.0\.0\.1:\d+ since .+ · epoch 1 · no HA$/);
    await shot('02-overview');
  });

  test('registers a {data:2, model:2} mesh from the form and shows its device grid', async () => {
    await tab('Meshes');
    await page.getByLabel('Name', {exact: true}).fill('web');
    await page.getByLabel('Axis 1 name').fill('data');
    await page.getByLabel('Axis 1 size').fill('2');
    await page.getByRole('button', {name: 'Add axis'}).click();
    await page.getByLabel('Axis 2 name').fill('model');
    await page.getByLabel('Axis 2 size').fill('2');
    await page.getByRole('button', {name: 'Register mesh'}).click();
    await page.locator('[data-registered="web"]', {hasText: 'Self-test passed'}).waitFor();
    const card = page.locator('article[data-mesh="web"]');
    await card.locator('.device').nth(3).waitFor();
    assert.equal(await card.locator('.device').count(), 4);
    // Each device is coloured by its worker: 4 workers, 4 colours.
    const classes = await card.locator('.device').evaluateAll((els) => els.map((e) => [...e.classList].find((c) => c.startsWith('wc-'))));
    assert.equal(new Set(classes).size, 4, classes.join(' '));
    const mesh = await cluster.api('GET', '/api/v1/meshes/web');
    assert.deepEqual(mesh.axes, [{name: 'data', size: 2}, {name: 'model', size: 2}]);
    await shot('03-mesh-registered');
  });

  test('a save started from the page is watched to done, and its checkpoint appears', async () => {
    // The trainers' part: every worker gets its devices' shards through its local API.
    await cluster.push('web', 'layers/0/w', {dtype: 'float32', shape: [2048, 2048], layout: ['data', 'model']},
      (d) => Buffer.from(new Float32Array(1024 * 1024).map((_, i) => Math.sin(i * 0.37 + d)).buffer));
    await cluster.push('web', 'layers/0/b', {dtype: 'float32', shape: [512], layout: ['unsharded']},
      () => Buffer.from(new Float32Array(512).fill(0.5).buffer));
    await cluster.push('web', 'embedding', {dtype: 'int32', shape: [2048, 256], layout: ['data', 'unsharded']},
      (d) => Buffer.from(new Int32Array(1024 * 256).map((_, i) => (i % 17) + (d >> 1)).buffer));

    await tab('Checkpoints');
    await page.getByLabel('Step', {exact: true}).fill('100');
    await page.getByRole('button', {name: 'Save now'}).click();
    const card = jobCard('save · web · step 100');
    await card.waitFor();
    await shot('04-save-started'); // whatever phase it is in by now
    await card.and(page.locator('[data-state="succeeded"]')).waitFor();
    assert.equal(await card.getByRole('progressbar').getAttribute('aria-valuenow'), '100');
    assert.equal(await card.locator('[data-phase]').textContent(), 'done');
    // Its workers, each with what its join said it wrote: all joined, none waiting.
    await card.locator('summary', {hasText: 'Workers ('}).click();
    const joined = card.locator('table .badge', {hasText: 'joined'});
    await joined.first().waitFor();
    assert.ok(await joined.count() >= 2, `joined workers: ${await joined.count()}`);
    assert.equal(await card.locator('table .badge', {hasText: 'waiting'}).count(), 0);
    const row = page.locator('main table tbody tr').filter({has: page.getByRole('link', {name: '100', exact: true})});
    await row.locator('.badge', {hasText: 'committed'}).waitFor();
    const cells = await row.locator('td').allTextContents();
    assert.equal(cells[1], 'persisted', `tiers: ${cells}`);
    assert.equal(cells[2], '3', `tensors: ${cells}`);
    await shot('05-save-done');
  });

  test('the checkpoint detail lists tensors and layouts, and verify passes', async () => {
    await page.getByRole('link', {name: '100', exact: true}).click();
    const detail = page.locator('section', {has: page.getByRole('heading', {name: 'Step 100 of web'})});
    const w = detail.locator('tr', {hasText: 'layers/0/w'});
    await w.waitFor();
    assert.match(await w.textContent(), /float32.*\[2048, 2048\].*data, model/);
    assert.match(await detail.locator('tr', {hasText: 'embedding'}).textContent(), /data, unsharded/);
    await detail.getByRole('button', {name: 'Verify'}).click();
    await detail.locator('[data-verify="ok"]').waitFor();
    assert.match(await detail.locator('[data-verify="ok"]').textContent(), /every checksum matches/);
    await shot('06-verified');
  });

  test('restores onto a chosen mesh after confirming', async () => {
    await cluster.api('PUT', '/api/v1/meshes/web4', {axes: [{name: 'data', size: 4}]});
    await page.getByLabel('Target mesh').selectOption('web4');
    await page.getByRole('button', {name: 'Restore…'}).click();
    await dialogButton('Restore').click();
    await jobCard('restore · web · step 100 → web4').and(page.locator('[data-state="succeeded"]')).waitFor();
  });

  test('an API error is shown with its message', async () => {
    await page.getByLabel('Step', {exact: true}).fill('100');
    await page.getByRole('button', {name: 'Save now'}).click();
    const error = page.locator('#messages .message-error').first();
    await error.waitFor();
    assert.match(await error.textContent(), /conflict/);
    assert.match(await error.textContent(), /100/);
    await shot('07-api-error');
    await error.getByRole('button', {name: 'Dismiss message'}).click();
  });

  test('retention asks first, names the steps it deletes, then deletes them', async () => {
    await page.getByLabel('Step', {exact: true}).fill('200');
    await page.getByRole('button', {name: 'Save now'}).click();
    await page.locator('main table tbody tr', {has: page.getByRole('link', {name: '200', exact: true})})
      .locator('.badge', {hasText: 'committed'}).waitFor();
    // Nothing changed since step 100: the save is incremental, its chunks are step 100's.
    await page.getByRole('link', {name: '200', exact: true}).click();
    const detail = page.locator('section', {has: page.getByRole('heading', {name: 'Step 200 of web'})});
    await detail.getByText(/incremental: .* written, .* in earlier checkpoints' files/).waitFor();
    await shot('08-incremental');
    await page.getByLabel('Keep last').fill('1');
    await page.getByRole('button', {name: 'Apply retention…'}).click();
    await page.locator('dialog[open]', {hasText: 'This deletes step 100 now.'}).waitFor();
    await dialogButton('Cancel').click();
    assert.deepEqual((await cluster.api('GET', '/api/v1/meshes/web/checkpoints')).map((c) => c.step), [200, 100]);
    await page.getByRole('button', {name: 'Apply retention…'}).click();
    await dialogButton('Apply and delete 1 checkpoint').click();
    await page.getByRole('link', {name: '100', exact: true}).waitFor({state: 'detached'});
    assert.deepEqual((await cluster.api('GET', '/api/v1/meshes/web/checkpoints')).map((c) => c.step), [200]);
  });

  test('the memory tier: tiers per checkpoint and each worker\'s memory bytes', async () => {
    // Rank 0's report, as a worker sends it with the cluster's token: step 200 (persisted
    // above) is also in memory, step 250 only there.
    const mesh = await cluster.api('GET', '/api/v1/meshes/web');
    const GiB = 1024 ** 3;
    const memoryBytes = [3 * GiB, 2.5 * GiB, 1536 * 1024 ** 2, 768 * 1024 ** 2];
    const ack = await cluster.api('PUT', '/api/v1/meshes/web/memory-checkpoints', {
      step: 250, redundancy: 'replica', replicas: 1, group: 4, keep: 2, steps: [200, 250],
      bytes: 4 * GiB, persisted: 200,
      tensors: [{name: 'layers/0/w', dtype: 'float32', shape: [2048, 2048]},
        {name: 'layers/0/b', dtype: 'float32', shape: [512]}, {name: 'embedding', dtype: 'int32', shape: [2048, 256]}],
      workers: mesh.workers.map((worker, rank) => ({worker, rank, memory_bytes: memoryBytes[rank]})),
    });
    assert.deepEqual(ack, {acknowledged: true});

    // The table follows the memory_checkpoint event: 250 in memory, 200 in both.
    await tab('Checkpoints');
    const row = (step) => page.locator('main table tbody tr').filter({has: page.getByRole('link', {name: String(step), exact: true})});
    await row(250).locator('[data-tiers="memory"]').waitFor();
    await row(200).locator('[data-tiers="memory persisted"]').waitFor();
    assert.deepEqual(await row(200).locator('.tiers .badge').allTextContents(), ['memory', 'persisted']);
    const cells = await row(250).locator('td').allTextContents();
    assert.equal(cells[0], '✓ committed', `state: ${cells}`);
    assert.equal(cells[2], '3', `tensors: ${cells}`);
    assert.equal(cells[3], '4 GiB', `bytes: ${cells}`);
    // Its detail: the report's tensors, its redundancy, and no action of persisted ones.
    await page.getByRole('link', {name: '250', exact: true}).click();
    const detail = page.locator('section', {has: page.getByRole('heading', {name: 'Step 250 of web'})});
    await detail.locator('tr', {hasText: 'layers/0/w'}).waitFor();
    assert.match(await detail.locator('tr', {hasText: 'layers/0/w'}).textContent(), /float32.*\[2048, 2048\]/);
    assert.match(await detail.locator('dl').textContent(), /replica, 1 copy/);
    await detail.locator('[data-memory-only]').waitFor();
    assert.equal(await detail.getByRole('button', {name: 'Verify'}).count(), 0);
    await dismissMessages();
    await shot('09-memory-tier-checkpoints');
    await page.locator('main').screenshot({path: join(artifacts, 'dashboard-memory-tier.png')});

    // Persist now: a save job whose workers write their shares from their RAM. These
    // workers never held step 250 (the report above was the test's own), so the job
    // starts and then fails, naming a worker that does not hold it.
    await detail.getByRole('button', {name: 'Persist now'}).click();
    const notice = page.locator('#messages', {hasText: /Persist started \(job /});
    await notice.waitFor();
    const persistJob = /job ([^)\s]+)\)/.exec(await notice.textContent())[1];
    let job = await cluster.api('GET', `/api/v1/jobs/${persistJob}`);
    for (let i = 0; i < 30 && !['succeeded', 'failed', 'cancelled'].includes(job.state); i++) {
      job = await cluster.api('GET', `/api/v1/jobs/${persistJob}?wait_ms=2000`);
    }
    assert.equal(job.kind, 'save');
    assert.equal(job.request.from_memory, true);
    assert.equal(job.state, 'failed');
    assert.match(job.error.message, /holds no memory checkpoint of step 250/);
    await dismissMessages();

    // The workers' memory bytes, in human units (and '—' for none).
    await tab('Overview');
    for (const [rank, text] of ['3 GiB', '2.50 GiB', '1.50 GiB', '768 MiB'].entries()) {
      const cell = page.locator('#workers tbody tr', {hasText: mesh.workers[rank]}).locator(`[data-memory-bytes="${memoryBytes[rank]}"]`);
      await cell.waitFor();
      assert.equal(await cell.textContent(), text);
    }
    await shot('10-memory-tier-workers');
  });

  test('a killed worker turns dead, everywhere', async () => {
    cluster.kill('host3');
    await tab('Overview');
    const row = page.locator('#workers tbody tr', {hasText: 'w-host3'});
    await row.and(page.locator('.row-dead')).waitFor();
    assert.match(await row.locator('.badge').textContent(), /dead/);
    const banner = page.locator('#dead-banner');
    await banner.getByText('w-host3').waitFor();
    assert.match(await banner.textContent(), /1 worker is dead/);
    await page.locator('#counts', {hasText: '1 dead'}).waitFor();
    await dismissMessages();
    assert.match(await page.locator('main .stat-dead').textContent(), /Workers dead\s*1/i);
    await shot('10-worker-dead');
    await tab('Meshes');
    await page.locator('article[data-mesh="web"] .device-dead').first().waitFor();
    await shot('11-mesh-with-dead-worker');
  });

  test('a save that needs the dead worker fails, naming it', async () => {
    await tab('Checkpoints');
    await page.getByLabel('Step', {exact: true}).fill('300');
    await page.getByRole('button', {name: 'Save now'}).click();
    // Refused at once (503) or failed as a job: either way the culprit is named.
    const culprit = page.locator('[data-detail="worker"]', {hasText: 'w-host3'}).first();
    await culprit.waitFor();
    await shot('12-save-fails-naming-the-worker');
  });

  test('a corrupt checkpoint fails verify, naming the tensor and the file', async () => {
    // Flip bytes in the middle of a shard file step 200 uses, behind tesserad's back:
    // its own, or (incremental, nothing changed) retired step 100's.
    const dirs = ['step-200', 'step-100'].map((d) => join(cluster.dir, 'data/checkpoints/web', d));
    const dir = dirs.find((d) => existsSync(d) && readdirSync(d).some((f) => f.startsWith('shard-')));
    const shard = readdirSync(dir).find((f) => f.startsWith('shard-'));
    const bytes = readFileSync(join(dir, shard));
    for (let i = 0; i < 64; i++) bytes[Math.floor(bytes.length / 3) + i] ^= 0xff;
    writeFileSync(join(dir, shard), bytes);

    await page.getByRole('link', {name: '200', exact: true}).click();
    await page.getByRole('button', {name: 'Verify'}).click();
    const card = jobCard('verify · web · step 200').and(page.locator('[data-state="failed"]'));
    await card.waitFor();
    assert.match(await card.locator('.error-code').textContent(), /data_loss/);
    assert.match(await card.locator('.job-error').textContent(), new RegExp(shard.replace('.', '\\.')));
    await shot('13-verify-finds-corruption');
    await tab('Overview');
    await page.locator('main .job-card[data-state="failed"]', {hasText: 'verify · web · step 200'}).waitFor();
  });

  test('coordination shows open barriers with arrived and missing ranks', async () => {
    // Rank 0 of 3 waits at a barrier; nobody else comes (the call ends with the cluster).
    cluster.api('POST', '/api/v1/barriers/step-300', {rank: 0, world: 3, timeout_ms: 60000}).catch(() => null);
    await tab('Coordination');
    const row = page.locator('main tr', {hasText: 'step-300'});
    await row.waitFor();
    assert.deepEqual(await row.locator('.rank-arrived').allTextContents(), ['0']);
    assert.deepEqual(await row.locator('.rank-missing').allTextContents(), ['1', '2']);
    await shot('14-coordination');
  });

  test('charts draw throughput, sizes and barrier activity', async () => {
    await tab('Charts');
    await page.locator('figure.chart svg').first().waitFor();
    await dismissMessages();
    assert.ok(await page.locator('.s-save circle').count() >= 2, 'a point per save');
    assert.ok(await page.locator('.s-logical circle').count() >= 1, 'a point per checkpoint');
    // The barrier arrival of the test before came in as a live event.
    assert.ok(await page.locator('rect.bar.s-arrived').count() >= 1, 'a bar of barrier arrivals');
    await shot('15-charts');
  });

  test('on a narrow screen nothing overflows sideways', async () => {
    await page.setViewportSize({width: 390, height: 844});
    for (const [label, name] of [['Overview', '16-narrow-overview'], ['Meshes', '17-narrow-meshes'],
      ['Checkpoints', '18-narrow-checkpoints'], ['Charts', '19-narrow-charts']]) {
      await tab(label);
      await page.locator('main .panel').first().waitFor();
      await shot(name);
      const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
      assert.ok(overflow <= 0, `${label} is ${overflow}px wider than the screen`);
    }
    await page.setViewportSize({width: 1280, height: 800});
  });

  test('the sections are reachable from the keyboard', async () => {
    await page.goto(`${cluster.url}/#overview`);
    await page.reload(); // a fresh page: the focus starts at the top
    await page.locator('#workers tbody tr').first().waitFor();
    let reached = false;
    for (let i = 0; i < 15 && !reached; i++) {
      await page.keyboard.press('Tab');
      reached = await page.evaluate(() => document.activeElement.textContent === 'Jobs' &&
        document.activeElement.closest('#tabs') !== null);
    }
    assert.ok(reached, 'Tab reaches the Jobs link');
    await page.keyboard.press('Enter');
    await page.waitForFunction(() => location.hash === '#jobs');
    await page.getByRole('heading', {name: 'Jobs', exact: true}).waitFor();
    await shot('20-jobs');
  });

  test('the page raised no script error', () => {
    assert.deepEqual(pageErrors, []);
  });
});

// An HA group (docs/ha.md): a throwaway etcd, a leader and one standby tesserad on one
// checkpoint root, and 2 workers given both URLs.
describe('dashboard of an HA group', () => {
  let cluster;
  let browser;
  let page;
  const pageErrors = [];

  const shot = (name, p = page) => p.screenshot({path: join(artifacts, `${name}.png`), fullPage: true});
  const newPage = async () => {
    const p = await browser.newPage({viewport: {width: 1280, height: 800}}); // a context of its own
    p.setDefaultTimeout(WAIT);
    p.on('pageerror', (e) => pageErrors.push(e.message));
    return p;
  };
  // The Overview's leadership line, once it names `leader` at `epoch`.
  const leadership = async (p, leader, epoch) => {
    const line = p.locator(`#leadership[data-leader="${leader}"][data-epoch="${epoch}"]`);
    await line.waitFor();
    return line.textContent();
  };
  // What the page shows for leader_since_ms (format.js's clock).
  const clock = (p, ms) => p.evaluate(async (t) => (await import('/assets/js/format.js')).clock(t), ms);
  const aliveRows = (p, n) => p.waitForFunction((k) => document.querySelectorAll('#workers tbody tr.row-alive').length === k, n);

  before(async () => {
    mkdirSync(artifacts, {recursive: true});
    cluster = new Cluster(bin, 2, {standbys: 1});
    await cluster.start();
    browser = await chromium.launch({executablePath: chromiumPath, headless: true,
      args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage']});
    page = await newPage();
  });

  after(async () => {
    if (browser) await browser.close();
    if (cluster) await cluster.stop();
  });

  test("the leader's page says that it leads, since when, at which epoch and through which etcd", async () => {
    await page.goto(`${cluster.url}/#token=${cluster.token}`);
    await aliveRows(page, 2);
    const health = await cluster.health(cluster.url);
    assert.equal(health.role, 'leader');
    assert.equal(health.epoch, 1);
    assert.equal(await leadership(page, cluster.url, 1),
      `Leader ${cluster.url} since ${await clock(page, health.leader_since_ms)} · epoch 1 · HA ${cluster.etcd}`);
    await shot('22-ha-leader');
  });

  test("the standby's address opens the leader's page", async () => {
    const standby = cluster.standbyUrls[0];
    assert.equal((await cluster.health(standby)).role, 'standby');
    const tab = await newPage();
    try {
      const res = await tab.goto(`${standby}/#token=${cluster.token}`);
      // The standby answered 307 to the leader; the fragment, with the token, went along.
      assert.equal(res.request().redirectedFrom()?.url(), `${standby}/`);
      assert.equal(new URL(tab.url()).origin, cluster.url);
      assert.match(await leadership(tab, cluster.url, 1), /^Leader /);
      await aliveRows(tab, 2);
      await shot('23-ha-standby-redirects', tab);
    } finally {
      await tab.close();
    }
  });

  test('a standby that knows no leader yet: a banner, and the page keeps asking', async () => {
    // The page's tesserad answers as a standby in the middle of a takeover would.
    const asStandby = (url) => url.pathname.startsWith('/api/v1/') && url.pathname !== '/api/v1/events';
    const refuse = (route) => route.fulfill({status: 503, contentType: 'application/json',
      body: JSON.stringify({error: {code: 'unavailable', message: 'this tesserad is a standby',
        details: {reason: 'not_leader', leader: null, standby: cluster.url}}})});
    await page.route(asStandby, refuse);
    const banner = page.locator('#takeover-banner');
    try {
      await banner.getByText('Takeover under way: waiting for a leader').waitFor();
      const text = await banner.textContent();
      assert.ok(text.includes(`This tesserad (${cluster.url}) stands by`), text);
      // Two more polls: it keeps asking, and stays where it is.
      for (let i = 0; i < 2; i++) await page.waitForRequest((r) => r.url().endsWith('/api/v1/cluster'));
      assert.equal(new URL(page.url()).origin, cluster.url);
      await shot('24-ha-waiting-for-a-leader');
    } finally {
      await page.unroute(asStandby, refuse);
    }
    // It leads again (it won the takeover): the banner goes.
    await banner.waitFor({state: 'hidden'});
    await leadership(page, cluster.url, 1);
  });

  test('the leader killed: the standby takes over at epoch 2, and the page follows it', async () => {
    const [old, next] = [cluster.url, cluster.standbyUrls[0]];
    await page.locator('#tabs').getByRole('link', {name: 'Meshes', exact: true}).click();
    await cluster.kill('tesserad');
    await page.locator('#live', {hasText: 'unreachable'}).waitFor();
    assert.equal((await cluster.waitForRole(next, 'leader')).epoch, 2);
    // The old leader comes back on its address, as a standby that names the new one.
    await cluster.restart('tesserad');
    await until('the old leader to name the new one', async () => (await cluster.health(old)).leader === next, WAIT);
    // The page's next poll meets it and opens the same page on the new leader, whose
    // origin asks for the token again (it is kept per origin).
    await page.waitForURL((url) => url.origin === next);
    assert.equal(new URL(page.url()).hash, '#meshes');
    await page.getByLabel('Access token').fill(cluster.token);
    await page.getByRole('button', {name: 'Open the dashboard'}).click();
    await page.locator('#tabs').getByRole('link', {name: 'Overview', exact: true}).click();
    const health = await cluster.health(next);
    assert.equal(await leadership(page, next, 2),
      `Leader ${next} since ${await clock(page, health.leader_since_ms)} · epoch 2 · HA ${cluster.etcd}`);
    // The workers follow the leader too.
    await aliveRows(page, 2);
    assert.equal(await page.locator('#takeover-banner').isHidden(), true);
    await shot('25-ha-new-leader');
  });

  test('the pages raised no script error', () => {
    assert.deepEqual(pageErrors, []);
  });
});
