// Soak test: a steady arrival rate for a long time (DURATION, default 1h): latency and memory
// must stay flat. Watch tern_pool_resident_bytes and process_resident_memory_bytes meanwhile.
// k6 run -e RATE=500 -e DURATION=4h loadtest/k6/soak.js
import { mixed, thresholds, summaryTrendStats, summaryWriter } from './lib.js';

export const options = {
  scenarios: {
    soak: {
      executor: 'constant-arrival-rate',
      rate: parseInt(__ENV.RATE || '500', 10),
      timeUnit: '1s',
      duration: __ENV.DURATION || '1h',
      preAllocatedVUs: 50,
      maxVUs: 300,
    },
  },
  thresholds: thresholds(50),
  summaryTrendStats,
};

export default function () {
  mixed();
}

export const handleSummary = summaryWriter('soak');
