// The local metrics endpoint as a local user could attack it: idle and slow sockets by the
// hundred must not keep a scrape from being answered, and are closed within the listener's
// timeouts; a taken address is reported with its holder and retried until it is free, while the
// root-only unix socket serves all along; what early OOM status reads is checked, never trusted.
import t from "tap";
import { chmod, mkdtemp, rm, stat } from "node:fs/promises";
import { connect, createServer, type Socket } from "node:net";
import os from "node:os";
import path from "node:path";
import { Registry } from "../../lib/prometheus.ts";
import {
  LISTENER_LIMITS,
  METRICS_SOCKET,
  METRICS_STATE,
  metricsStatusLine,
  printable,
  readMetricsState,
  startMetricsEndpoint,
  startMetricsServer,
} from "../../agent/metrics-server.ts";
import { getOverSocket, parseAgentStatus, untrustedSocket } from "../../agent/early-oom/status-client.ts";
import { captureLogger } from "../../scripts/lib/early-oom.ts";
import { until } from "../../scripts/lib/until.ts";

function registry(): Registry {
  const r = new Registry();
  r.gauge("test_up", "1").set(1);
  return r;
}

/** Opens n TCP connections and resolves once each is connected (or refused at once). */
async function openSockets(port: number, n: number, send?: string): Promise<Socket[]> {
  return Promise.all(
    Array.from(
      { length: n },
      () =>
        new Promise<Socket>((resolve) => {
          const s = connect(port, "127.0.0.1");
          s.on("error", () => undefined);
          s.once("connect", () => {
            if (send) s.write(send);
            resolve(s);
          });
          s.once("close", () => resolve(s));
        }),
    ),
  );
}

t.test("200 idle and 50 slow sockets: a scrape is still answered, and the listener closes them all", async (t) => {
  const s = await startMetricsServer({ registry: registry(), address: "127.0.0.1:0", log: captureLogger() });
  t.teardown(() => s.close());
  const idle = await openSockets(s.port, 200);
  // Slowloris: a request line and one header, the rest never comes.
  const slow = await openSockets(s.port, 50, "GET /metrics HTTP/1.1\r\nHost: localhost\r\n");
  const attackers = [...idle, ...slow];
  const open = () => attackers.filter((c) => !c.destroyed && c.readyState === "open").length;
  await until(
    `the listener to hold at most ${LISTENER_LIMITS.maxConnections} of them`,
    () => open() <= LISTENER_LIMITS.maxConnections,
  );
  const r = await fetch(`http://127.0.0.1:${s.port}/metrics`);
  t.equal(r.status, 200, "the scrape is answered beside them");
  t.match(await r.text(), /test_up 1/);
  // The rest go by the idle and header timeouts.
  await until("every attacking socket closed by the listener", () => open() === 0, 30_000);
  t.pass("idle and slow sockets were closed");
  const again = await fetch(`http://127.0.0.1:${s.port}/metrics`);
  t.equal(again.status, 200);
});

t.test("a taken address: the holder is named, the socket serves, and the port is taken once free", async (t) => {
  const root = await mkdtemp(path.join(os.tmpdir(), "metrics-endpoint-"));
  t.teardown(() => rm(root, { recursive: true, force: true }));
  const squatter = createServer((c) => c.end("HTTP/1.1 200 OK\r\n\r\n\u001b]0;owned\u0007"));
  await new Promise<void>((r) => squatter.listen(0, "127.0.0.1", r));
  const port = (squatter.address() as { port: number }).port;
  const log = captureLogger();
  const ep = await startMetricsEndpoint({
    registry: registry(),
    address: `127.0.0.1:${port}`,
    root,
    log,
    json: { "/early-oom": () => ({ hello: "from the agent" }) },
    retry: { baseMs: 50, maxMs: 200 },
  });
  t.teardown(() => ep.close());
  await ep.firstAttempt;
  const st = ep.state();
  t.equal(st.listening, false);
  t.equal(st.error, "EADDRINUSE");
  t.equal(st.holder?.pid, process.pid, "the holder's pid, from /proc");
  t.equal(st.holder?.uid, process.getuid?.());
  const line = log.lines.find((l) => l.level === "error");
  t.match(
    line?.msg,
    new RegExp(`^metrics endpoint not listening: 127\\.0\\.0\\.1:${port} is taken by pid ${process.pid} \\(`),
  );
  t.match(line?.msg, /The agent goes on .* --metrics-address HOST:PORT/);
  const recorded = await until("the state recorded for bashible status", () => readMetricsState(root, process.pid));
  t.equal(recorded.listening, false);
  t.match(
    metricsStatusLine(recorded),
    new RegExp(`^NOT listening on 127\\.0\\.0\\.1:${port} since .*: held by pid ${process.pid}`),
  );
  t.equal(await readMetricsState(root, process.pid + 1), undefined, "another daemon's state is not shown");

  // The root-only socket serves meanwhile, mode 0600, and early OOM status trusts it.
  const sock = path.join(root, METRICS_SOCKET);
  t.equal((await stat(sock)).mode & 0o777, 0o600);
  t.equal(await untrustedSocket(sock), undefined);
  t.same(JSON.parse(await getOverSocket(sock, "/early-oom")), { hello: "from the agent" });

  const retries = st.attempts;
  await new Promise<void>((r) => squatter.close(() => r()));
  await until("the agent to listen once the port is free", () => ep.state().listening);
  t.ok(ep.state().attempts > retries, "it kept retrying");
  t.equal((await fetch(`http://127.0.0.1:${port}/metrics`)).status, 200);
  t.match(
    metricsStatusLine(ep.state()),
    new RegExp(`^http://127\\.0\\.0\\.1:${port}/metrics \\(and ${METRICS_SOCKET}\\)$`),
  );
  await until("the state file to follow", async () => (await readMetricsState(root, process.pid))?.listening);
  t.ok(log.lines.some((l) => l.msg === `metrics endpoint listening on 127.0.0.1:${port} at last`));
  t.same(
    log.lines.filter((l) => l.level === "error").map((l) => l.msg.slice(0, 400)),
    [line?.msg.slice(0, 400)],
    "one error line, not one per retry",
  );
  t.ok(METRICS_STATE.startsWith("/run/bashible/"));
});

t.test("what early OOM status reads: a socket others could reach or replace is not asked", async (t) => {
  const dir = await mkdtemp(path.join(os.tmpdir(), "metrics-trust-"));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  const sock = path.join(dir, "agent.sock");
  const server = createServer((c) => c.end());
  await new Promise<void>((r) => server.listen(sock, r));
  t.teardown(() => server.close());
  await chmod(sock, 0o600);
  t.equal(await untrustedSocket(sock), undefined);
  await chmod(sock, 0o666);
  t.match(await untrustedSocket(sock), /has mode 666: others can reach it/);
  await chmod(sock, 0o600);
  await chmod(dir, 0o777);
  t.match(await untrustedSocket(sock), /has mode 777: others can replace what is in it/);
  await chmod(dir, 0o700);
  t.match(await untrustedSocket(path.join(dir, "none.sock")), /ENOENT/);
  t.match(await untrustedSocket(dir), /is not a socket/);

  t.throws(() => parseAgentStatus("\u001b[2J"), /not JSON/);
  t.throws(() => parseAgentStatus(JSON.stringify({ enabled: true })), /dryRun is not true or false/);
  t.throws(
    () =>
      parseAgentStatus(JSON.stringify({ enabled: true, dryRun: false, psi: "x", config: { fullStallPercent: 400 } })),
    /fullStallPercent must be a number from 0\.1 to 100/,
  );
  t.equal(printable("web\u001b]0;owned\u0007\u202e"), "web\\u001b]0;owned\\u0007\\u202e");
});
