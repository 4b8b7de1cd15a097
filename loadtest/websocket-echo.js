// k6 (k6/ws) load for a WebSocket echo through a server: 64 connections (VUS), each with one
// 32-byte message in flight; counts echoes in 'echoed' and their round trips in 'rtt' (ms,
// k6's clock). The server is expected to send one greeting first (the benchmark's backends,
// origins and guests do; server/tests/e2e/wsclient.py echo-server too).
// Usage: SECS=10 URL=ws://127.0.0.1:8080/chat k6 run loadtest/websocket-echo.js
import ws from 'k6/ws';
import { Counter, Trend } from 'k6/metrics';
const echoed = new Counter('echoed');
const rtt = new Trend('rtt', true);
const msg = 'x'.repeat(32);
export const options = {
  vus: parseInt(__ENV.VUS || '64'),
  duration: __ENV.SECS ? __ENV.SECS + 's' : '10s',
  summaryTrendStats: ['avg', 'med', 'p(90)', 'p(99)', 'max'],
};
export default function () {
  ws.connect(__ENV.URL, {}, function (socket) {
    let hello = true;
    let sent = 0;
    const send = () => { sent = Date.now(); socket.send(msg); };
    socket.on('open', send);
    socket.on('message', () => {
      if (hello) { hello = false; return; }
      echoed.add(1);
      rtt.add(Date.now() - sent);
      send();
    });
    socket.setTimeout(() => socket.close(), (parseInt(__ENV.SECS || '10') - 1) * 1000);
  });
}
