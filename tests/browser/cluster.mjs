// A local cluster of real processes for the browser tests: tesserad and N
// tessera-workers on 127.0.0.1, each on a free port (read from its first line
// of output), as examples/01_start_cluster.sh starts them. With standbys, an HA
// group (docs/ha.md): a throwaway etcd, a leader and its standby tesserads.

import {execFile, spawn} from 'node:child_process';
import {randomBytes} from 'node:crypto';
import {closeSync, mkdtempSync, openSync, readFileSync, rmSync, statSync} from 'node:fs';
import {tmpdir} from 'node:os';
import {dirname, join, resolve} from 'node:path';
import {fileURLToPath} from 'node:url';
import {promisify} from 'node:util';

const ETCD_SH = resolve(dirname(fileURLToPath(import.meta.url)), '../../tools/etcd/etcd.sh');
const HA_LEASE_S = 2; // a standby takes over about this long after the leader is gone

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Polls fn until it returns something truthy, else fails after timeoutMs.
export async function until(what, fn, timeoutMs) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn().catch(() => undefined);
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(50);
  }
}

// tools/etcd/etcd.sh start DIR 0: a throwaway etcd on a free port; resolves with its etcd:// URL.
async function startEtcd(dir) {
  const {stdout} = await promisify(execFile)('bash', [ETCD_SH, 'start', dir, '0']);
  const url = /^export TESSERA_ETCD=(\S+)$/m.exec(stdout)?.[1];
  if (!url) throw new Error(`etcd.sh printed no TESSERA_ETCD: ${stdout}`);
  return url;
}

export class Cluster {
  // standbys > 0: an HA group: etcd (tools/etcd/etcd.sh) in <dir>/etcd, tesserad (the
  // leader) and tesserad-s0... (standbys, at standbyUrls), each with its own data dir
  // and all on one checkpoint root; workers are given every URL.
  constructor(bin, workers = 4, {standbys = 0} = {}) {
    this.bin = bin;
    this.numWorkers = workers;
    this.numStandbys = standbys;
    this.dir = mkdtempSync(join(tmpdir(), 'tessera-browser-'));
    this.token = randomBytes(16).toString('hex');
    this.procs = new Map(); // name → ChildProcess
    this.commands = new Map(); // name → {program, args, url}, for restart()
    this.standbyUrls = [];
  }

  // Spawns a program with its output in <dir>/<name>.log; resolves with the URL it listens on.
  async spawn(name, program, args) {
    const log = join(this.dir, `${name}.log`);
    const fd = openSync(log, 'a');
    const from = statSync(log).size; // a restart appends: read only what this run writes
    // The token goes in the environment, which only this user can read in /proc.
    const child = spawn(join(this.bin, program), args,
      {stdio: ['ignore', fd, fd], env: {...process.env, TESSERA_TOKEN: this.token}});
    closeSync(fd);
    this.procs.set(name, child);
    const output = () => readFileSync(log).subarray(from).toString();
    // A standby's first line is "standby: listening on URL, campaigning in ...".
    const url = await until(`${name} to listen (see ${log})`, async () => {
      if (child.exitCode !== null) throw new Error(`${name} exited: ${output()}`);
      return /listening on (http:\/\/[0-9.:]+)/.exec(output())?.[1];
    }, 15000);
    this.commands.set(name, {program, args, url});
    return url;
  }

  // Starts a killed process again with its arguments, on the port it had.
  async restart(name) {
    const {program, args, url} = this.commands.get(name);
    const listen = args.indexOf('--listen');
    return this.spawn(name, program, args.with(listen + 1, new URL(url).host));
  }

  async start() {
    // TESSERA_WEB_DIR=<repo>/web serves the dashboard from disk (tesserad --web-dir):
    // edits to web/ are tested without rebuilding tesserad.
    const webDir = process.env.TESSERA_WEB_DIR ? ['--web-dir', process.env.TESSERA_WEB_DIR] : [];
    const ha = [];
    if (this.numStandbys > 0) {
      this.etcd = await startEtcd(join(this.dir, 'etcd'));
      ha.push('--ha', this.etcd, '--ha-lease-s', String(HA_LEASE_S), '--checkpoint-root', join(this.dir, 'root'));
    }
    const server = (data) => ['--listen', '127.0.0.1:0', '--data-dir', join(this.dir, data),
      '--heartbeat-ms', '200', '--lease-ms', '1500', ...ha, ...webDir];
    this.url = await this.spawn('tesserad', 'tesserad', server('data'));
    if (this.numStandbys > 0) {
      // The first leads before any other starts, so that which one leads is known.
      await this.waitForRole(this.url, 'leader');
      for (let i = 0; i < this.numStandbys; i++) {
        this.standbyUrls.push(await this.spawn(`tesserad-s${i}`, 'tesserad', server(`data-s${i}`)));
        await this.waitForRole(this.standbyUrls[i], 'standby');
      }
    }
    const servers = [this.url, ...this.standbyUrls].join(',');
    for (let i = 0; i < this.numWorkers; i++) {
      await this.spawn(`host${i}`, 'tessera-worker', ['--server', servers,
        '--name', `host${i}`, '--local-listen', '127.0.0.1:0', '--data-listen', '127.0.0.1:0']);
    }
    await until(`${this.numWorkers} workers alive`, async () =>
      (await this.api('GET', '/api/v1/cluster')).workers.alive === this.numWorkers, 15000);
    return this;
  }

  // GET /healthz of a tesserad (open, no token): its role, the leader, the epoch.
  async health(url) {
    const res = await fetch(`${url}/healthz`);
    if (!res.ok) throw new Error(`${url}/healthz: ${res.status}`);
    return res.json();
  }

  // Resolves with /healthz once the tesserad at `url` has this role (its first
  // answers as an HA member may still be "standby" while it campaigns).
  async waitForRole(url, role, timeoutMs = 10 * HA_LEASE_S * 1000) {
    return until(`${url} to be the ${role}`, async () => {
      const health = await this.health(url);
      return health.role === role ? health : undefined;
    }, timeoutMs);
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

  // SIGKILL; resolves once the process is gone.
  kill(name) {
    const child = this.procs.get(name);
    if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
    const gone = new Promise((r) => child.once('exit', r));
    child.kill('SIGKILL');
    return gone;
  }

  async stop() {
    try {
      await Promise.all([...this.procs.keys()].map((name) => this.kill(name)));
      // Safe whether or not etcd started.
      if (this.numStandbys > 0) await promisify(execFile)('bash', [ETCD_SH, 'stop', join(this.dir, 'etcd')]);
    } finally {
      rmSync(this.dir, {recursive: true, force: true});
    }
  }

  log(name) {
    try {
      return readFileSync(join(this.dir, `${name}.log`), 'utf8');
    } catch {
      return '';
    }
  }
}
