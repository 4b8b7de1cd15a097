// k6 (k6/ws) load for a WebSocket echo through a server: 64 connections (VUS), each with one
// 32-byte message in flight; counts echoes in 'echoed'. The backend is expected to send one
// greeting first (server/tests/e2e/wsclient.py echo-server does).
// Usage: SECS=10 URL=ws://127.0.0.1:8080/chat k6 run loadtest/websocket-echo.js
import ws from 'k6/ws';
import { Counter } from 'k6/metrics';
const echoed = new Counter('echoed');
const msg = 'x'.repeat(32);
export const options = { vus: 64, duration: __ENV.SECS ? __ENV.SECS + 's' : '10s' };
export default function () {
  ws.connect(__ENV.URL, {}, function (socket) {
    let hello = true;
    socket.on('open', () => socket.send(msg));
    socket.on('message', () => {
      if (hello) { hello = false; return; }
      echoed.add(1);
      socket.send(msg);
    });
    socket.setTimeout(() => socket.close(), (parseInt(__ENV.SECS || '10') - 1) * 1000);
  });
}
