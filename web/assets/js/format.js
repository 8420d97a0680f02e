// Numbers as people read them.

const UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];

export function bytes(n) {
  if (n === null || n === undefined || Number.isNaN(n)) return '—';
  let v = Number(n);
  let u = 0;
  while (Math.abs(v) >= 1024 && u < UNITS.length - 1) {
    v /= 1024;
    u++;
  }
  // Whole numbers stay whole: "2 MiB", not "2.00 MiB".
  const text = u === 0 || Number.isInteger(v) ? String(v) : v.toFixed(v < 10 ? 2 : v < 100 ? 1 : 0);
  return `${text} ${UNITS[u]}`;
}

export function rate(bytesPerSecond) {
  return bytesPerSecond > 0 && Number.isFinite(bytesPerSecond) ? `${bytes(bytesPerSecond)}/s` : '—';
}

export function duration(ms) {
  if (ms === null || ms === undefined || Number.isNaN(ms) || ms < 0) return '—';
  if (ms < 1000) return `${Math.round(ms)} ms`;
  const s = ms / 1000;
  if (s < 60) return `${s.toFixed(s < 10 ? 1 : 0)} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min ${Math.round(s % 60)} s`;
  return `${Math.floor(m / 60)} h ${m % 60} min`;
}

export function ago(ms) {
  return ms === null || ms === undefined ? '—' : `${duration(ms)} ago`;
}

// A wall-clock time from epoch milliseconds, e.g. "14:03:21" (with the date when not today).
export function clock(epochMs) {
  if (!epochMs) return '—';
  const d = new Date(epochMs);
  const today = new Date().toDateString() === d.toDateString();
  return today ? d.toLocaleTimeString() : d.toLocaleString();
}

export function ratio(logical, stored) {
  if (!(logical > 0 && stored > 0)) return '—';
  const r = logical / stored;
  return `${r.toFixed(r < 100 ? 2 : 0)}×`;
}

export function percent(done, total) {
  if (!total) return 0;
  return Math.max(0, Math.min(100, (100 * done) / total));
}

export function shape(dims) {
  return Array.isArray(dims) ? `[${dims.join(', ')}]` : '—';
}

export function layout(dims) {
  return Array.isArray(dims) ? dims.map((d) => d ?? 'unsharded').join(', ') : '—';
}

export function axes(list) {
  return (list || []).map((a) => `${a.name} ${a.size}`).join(' × ');
}

export function plural(n, word, many = `${word}s`) {
  return `${n} ${n === 1 ? word : many}`;
}
