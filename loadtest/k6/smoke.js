// Smoke test: one user calls every demo tenant a few times; every check and threshold must pass.
// k6 run loadtest/k6/smoke.js   (BASE_URL=http://127.0.0.1:8080, OUT_DIR=.)
import { sleep } from 'k6';
import { requests, thresholds, summaryTrendStats, summaryWriter } from './lib.js';

export const options = {
  vus: 1,
  iterations: 20,
  thresholds: thresholds(500),
  summaryTrendStats,
};

export default function () {
  requests.hello();
  requests.counter();
  requests.json();
  requests.echo();
  sleep(0.05);
}

export const handleSummary = summaryWriter('smoke');
