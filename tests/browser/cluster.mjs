// A local cluster of real processes for the browser tests: tesserad and N
// tessera-workers on 127.0.0.1, each on a free port (read from its first line
// of output), as examples/01_start_cluster.sh starts them.

import {spawn} from 'node:child_process';
import {randomBytes} from 'node:crypto';
import {mkdtempSync, openSync, readFileSync, rmSync} from 'node:fs';
import {tmpdir} from 'node:os';
import {join} from 'node:path';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function until(what, fn, timeoutMs) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn().catch(() => undefined);
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(50);
  }
}

export class Cluster {
  constructor(bin, workers = 4) {
    this.bin = bin;
    this.numWorkers = workers;
    this.dir = mkdtempSync(join(tmpdir(), 'tessera-browser-'));
    this.token = randomBytes(16).toString('hex');
    this.procs = new Map(); // name → ChildProcess
  }

  // Spawns a program with its output in <dir>/<name>.log; resolves with the URL it listens on.
  async spawn(name, program, args) {
    const log = join(this.dir, `${name}.log`);
    const fd = openSync(log, 'a');
    // The token goes in the environment, which only this user can read in /proc.
    const child = spawn(join(this.bin, program), args,
      {stdio: ['ignore', fd, fd], env: {...process.env, TESSERA_TOKEN: this.token}});
    this.procs.set(name, child);
    return until(`${name} to listen (see ${log})`, async () => {
      if (child.exitCode !== null) throw new Error(`${name} exited: ${readFileSync(log, 'utf8')}`);
      return /listening on (http:\/\/[0-9.:]+)/.exec(readFileSync(log, 'utf8'))?.[1];
    }, 15000);
  }

  async start() {
    // TESSERA_WEB_DIR=<repo>/web serves the dashboard from disk (tesserad --web-dir):
    // edits to web/ are tested without rebuilding tesserad.
    const webDir = process.env.TESSERA_WEB_DIR ? ['--web-dir', process.env.TESSERA_WEB_DIR] : [];
    this.url = await this.spawn('tesserad', 'tesserad', ['--listen', '127.0.0.1:0',
      '--data-dir', join(this.dir, 'data'),
      '--heartbeat-ms', '200', '--lease-ms', '1500', ...webDir]);
    for (let i = 0; i < this.numWorkers; i++) {
      await this.spawn(`host${i}`, 'tessera-worker', ['--server', this.url,
        '--name', `host${i}`, '--local-listen', '127.0.0.1:0', '--data-listen', '127.0.0.1:0']);
    }
    await until(`${this.numWorkers} workers alive`, async () =>
      (await this.api('GET', '/api/v1/cluster')).workers.alive === this.numWorkers, 15000);
    return this;
  }

  async api(method, path, body) {
    const res = await fetch(this.url + path, {method, headers: {Authorization: `Bearer ${this.token}`,
      'Content-Type': 'application/json'}, body: body === undefined ? undefined : JSON.stringify(body)});
    const text = await res.text();
    if (!res.ok) throw new Error(`${method} ${path}: ${res.status} ${text}`);
    return text ? JSON.parse(text) : null;
  }

  // What a trainer does: PUT each device's local shard to the worker that owns the device.
  // shard(device) → Buffer of that device's local shard.
  async push(mesh, name, {dtype, shape, layout}, shard) {
    const m = await this.api('GET', `/api/v1/meshes/${mesh}`);
    const workers = await this.api('GET', '/api/v1/workers');
    for (const d of m.devices) {
      const local = workers.find((w) => w.id === d.worker).local_api;
      const q = `mesh=${mesh}&device=${d.device}&dtype=${dtype}&shape=${shape.join(',')}&layout=${layout.join(',')}`;
      // The worker's local credential: a file only this user can read, named after the port.
      const port = new URL(local).port;
      const credential = readFileSync(`/tmp/tessera-${process.getuid()}/local-${port}.key`, 'utf8').trim();
      const res = await fetch(`${local}/v1/tensors/${name}?${q}`,
                              {method: 'PUT', body: shard(d.device), headers: {Authorization: `Bearer ${credential}`}});
      if (res.status !== 204) throw new Error(`push ${name} device ${d.device}: ${res.status} ${await res.text()}`);
    }
  }

  kill(name) {
    this.procs.get(name).kill('SIGKILL');
  }

  async stop() {
    const exits = [];
    for (const child of this.procs.values()) {
      if (child.exitCode === null && child.signalCode === null) {
        exits.push(new Promise((r) => child.once('exit', r)));
        child.kill('SIGKILL');
      }
    }
    await Promise.all(exits);
    rmSync(this.dir, {recursive: true, force: true});
  }

  log(name) {
    try {
      return readFileSync(join(this.dir, `${name}.log`), 'utf8');
    } catch {
      return '';
    }
  }
}
