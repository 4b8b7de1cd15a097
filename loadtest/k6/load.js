// Load test: a ramping arrival rate across the demo tenants (open model: requests keep arriving
// even if the server slows down, so queueing shows up in the latencies).
// k6 run -e RATE=2000 loadtest/k6/load.js
import { mixed, thresholds, summaryTrendStats, summaryWriter } from './lib.js';

const RATE = parseInt(__ENV.RATE || '1000', 10);

export const options = {
  scenarios: {
    ramp: {
      executor: 'ramping-arrival-rate',
      startRate: Math.max(1, Math.floor(RATE / 10)),
      timeUnit: '1s',
      preAllocatedVUs: 50,
      maxVUs: 400,
      stages: [
        { target: RATE, duration: '1m' },
        { target: RATE, duration: '3m' },
        { target: 0, duration: '30s' },
      ],
    },
  },
  thresholds: thresholds(50),
  summaryTrendStats,
};

export default function () {
  mixed();
}

export const handleSummary = summaryWriter('load');
