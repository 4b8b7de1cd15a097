// Shared pieces of Tern's k6 scripts: the requests every script sends, checks on bodies and on
// the Server-Timing header, per-phase Trends parsed from it, and a summary writer.
// (Written here: remote jslib imports are not available everywhere k6 runs.)
import http from 'k6/http';
import { check } from 'k6';
import { Trend, Counter } from 'k6/metrics';

export const BASE = __ENV.BASE_URL || 'http://127.0.0.1:8080';
export const OUT = __ENV.OUT_DIR || '.';

const PHASES = ['route', 'queue', 'instantiate', 'run', 'teardown', 'total'];
// Server-side phase durations in ms, one Trend per phase (Server-Timing `dur` is in ms).
const phaseTrends = Object.fromEntries(
  PHASES.map((p) => [p, new Trend(`tern_server_${p}_ms`, true)]),
);
const missingTiming = new Counter('tern_missing_server_timing');

/** Records each phase of a response's Server-Timing header into its Trend. */
export function recordServerTiming(res) {
  const header = res.headers['Server-Timing'] || res.headers['server-timing'];
  if (!header) {
    missingTiming.add(1);
    return false;
  }
  for (const part of header.split(',')) {
    const [name, ...params] = part.trim().split(';');
    const dur = params.find((p) => p.trim().startsWith('dur='));
    if (dur && phaseTrends[name]) phaseTrends[name].add(parseFloat(dur.split('=')[1]));
  }
  return true;
}

/** The demo tenants' requests, with checks on status, body and Server-Timing. */
export const requests = {
  hello() {
    const res = http.get(`${BASE}/hello`, { tags: { tenant: 'hello' } });
    check(res, {
      'hello: 200': (r) => r.status === 200,
      'hello: greeting': (r) => r.body === 'Hello from Tern!\n',
      'hello: Server-Timing has every phase': (r) => recordServerTiming(r)
        && PHASES.every((p) => (r.headers['Server-Timing'] || '').includes(`${p};dur=`)),
    });
    return res;
  },
  counter() {
    const res = http.get(`${BASE}/counter`, { tags: { tenant: 'counter' } });
    check(res, {
      'counter: 200': (r) => r.status === 200,
      'counter: always 1 (fresh instance)': (r) => r.body === '1\n',
    });
    recordServerTiming(res);
    return res;
  },
  json() {
    const res = http.post(`${BASE}/json`, JSON.stringify({ item: 'k6', n: [1, 2, 3] }), {
      headers: { 'Content-Type': 'application/json' },
      tags: { tenant: 'json' },
    });
    check(res, {
      'json: 200': (r) => r.status === 200,
      'json: transformed': (r) => {
        try {
          const v = JSON.parse(r.body);
          return v.kind === 'object' && v.keys.length === 2 && v.echo.item === 'k6';
        } catch (e) {
          return false;
        }
      },
    });
    recordServerTiming(res);
    return res;
  },
  echo() {
    const res = http.post(`${BASE}/echo/k6`, 'ping', { tags: { tenant: 'echo' } });
    check(res, {
      'echo: 200': (r) => r.status === 200,
      'echo: body echoed': (r) => r.body.startsWith('POST /echo/k6') && r.body.endsWith('ping'),
    });
    recordServerTiming(res);
    return res;
  },
};

/** Picks a demo tenant's request in proportion hello 50 %, json 20 %, echo 20 %, counter 10 %. */
export function mixed() {
  const x = Math.random();
  if (x < 0.5) return requests.hello();
  if (x < 0.7) return requests.json();
  if (x < 0.9) return requests.echo();
  return requests.counter();
}

/** Thresholds shared by the scripts: few errors, every check passing, a bounded p99. */
export function thresholds(p99ms) {
  return {
    http_req_failed: ['rate<0.01'],
    checks: ['rate>0.99'],
    http_req_duration: [`p(99)<${p99ms}`],
    tern_missing_server_timing: ['count<1'],
  };
}

export const summaryTrendStats = ['avg', 'min', 'med', 'p(90)', 'p(99)', 'max'];

function fmt(v) {
  return typeof v === 'number' ? (Math.abs(v) >= 100 ? v.toFixed(0) : v.toFixed(3)) : String(v);
}

/** A plain-text summary: every metric's values and every threshold's verdict. */
export function textSummary(data, name) {
  const lines = [`Tern k6 ${name}: ${new Date().toISOString()}`, ''];
  const names = Object.keys(data.metrics).sort();
  for (const m of names) {
    const metric = data.metrics[m];
    const values = Object.entries(metric.values).map(([k, v]) => `${k}=${fmt(v)}`).join(' ');
    lines.push(`${m.padEnd(34)} ${values}`);
    for (const [expr, t] of Object.entries(metric.thresholds || {})) {
      lines.push(`  ${t.ok ? 'PASS' : 'FAIL'} threshold ${expr}`);
    }
  }
  return `${lines.join('\n')}\n`;
}

/** handleSummary for a script: JSON and text files in OUT_DIR, text on stdout. */
export function summaryWriter(name) {
  return (data) => {
    const text = textSummary(data, name);
    return {
      stdout: text,
      [`${OUT}/${name}-summary.json`]: JSON.stringify(data, null, 2),
      [`${OUT}/${name}-summary.txt`]: text,
    };
  };
}
