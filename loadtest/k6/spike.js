// Spike test: a quiet baseline, a sudden burst to SPIKE requests/s, and back; the server must
// shed load with 503 + Retry-After rather than fail, and recover at once.
// k6 run -e SPIKE=5000 loadtest/k6/spike.js
import { check } from 'k6';
import { mixed, summaryTrendStats, summaryWriter } from './lib.js';

const SPIKE = parseInt(__ENV.SPIKE || '5000', 10);

export const options = {
  scenarios: {
    spike: {
      executor: 'ramping-arrival-rate',
      startRate: 50,
      timeUnit: '1s',
      preAllocatedVUs: 100,
      maxVUs: 1000,
      stages: [
        { target: 50, duration: '30s' },
        { target: SPIKE, duration: '10s' },
        { target: SPIKE, duration: '1m' },
        { target: 50, duration: '10s' },
        { target: 50, duration: '1m' },
      ],
    },
  },
  thresholds: {
    // Overload answers are allowed during the spike; anything else is a failure.
    checks: ['rate>0.99'],
    http_req_duration: ['p(99)<2000'],
  },
  summaryTrendStats,
};

export default function () {
  const res = mixed();
  check(res, {
    'spike: success or clean overload': (r) => r.status === 200
      || (r.status === 503 && r.headers['Retry-After'] === '1'),
  });
}

export const handleSummary = summaryWriter('spike');
