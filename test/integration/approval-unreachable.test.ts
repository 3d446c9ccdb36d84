// Asking for an approval while the API is out of reach for a moment (agent/converge/approval.ts),
// against a real kube-apiserver: the node's API proxy is not listening yet when the run asks
// (as when `bashible adopt` has moved Deckhouse's proxy pod aside and the run's own proxy is
// starting): the Node is read again until it answers, then the approval is announced and waited
// for. An answer that is not a transport failure (401 here) fails at once, without retrying.
// Found by test/e2e/adopt.test.ts, where the adoption failed with "connection refused" one time
// in three.
import t from "tap";
import { withControlPlane } from "../../scripts/lib/control-plane-fixture.ts";
import { freePort } from "../../scripts/lib/control-plane.ts";
import { captureLogger } from "../../scripts/lib/early-oom.ts";
import { TcpProxy } from "../../scripts/lib/tcp-proxy.ts";
import { until } from "../../scripts/lib/until.ts";
import { announceAndWait, hasAnnotation } from "../../agent/converge/approval.ts";
import { KubeClient } from "../../lib/kube/client.ts";

const cp = await withControlPlane(t);
const NODE = "approval-node";
const ASKED = "example.test/asked";
const GRANTED = "example.test/granted";

t.test("the API unreachable when the run asks: read again until it answers, then ask", async (t) => {
  await cp.admin.request("POST", "/api/v1/nodes", { body: { metadata: { name: NODE } } });
  // The node's API proxy address, where nothing listens yet.
  const port = await freePort();
  const client = new KubeClient({ ...cp.admin.connection, server: `https://127.0.0.1:${port}` }, { timeoutMs: 5000 });
  t.teardown(() => client.close());
  const log = captureLogger();
  const waited = announceAndWait(client, NODE, log, { [ASKED]: "" }, hasAnnotation(GRANTED), { timeoutMs: 120_000 });

  await until("the run to find the API out of reach", async () => log.lines.some((l) => l.level === "warn"), 30_000);
  // The proxy comes up.
  const proxy = new TcpProxy({
    host: "127.0.0.1",
    port,
    target: { host: "127.0.0.1", port: Number(new URL(cp.server).port) },
  });
  await proxy.start();
  t.teardown(() => proxy.stop());

  const node = () =>
    cp.admin.request<{ metadata: { annotations?: Record<string, string> } }>("GET", `/api/v1/nodes/${NODE}`);
  await until("the run to ask", async () => ASKED in ((await node()).metadata.annotations ?? {}), 60_000);
  await cp.admin.request("PATCH", `/api/v1/nodes/${NODE}`, {
    body: { metadata: { annotations: { [GRANTED]: "" } } },
    contentType: "application/merge-patch+json",
  });
  t.equal(await waited, true, "granted");
  t.match(
    log.lines.find((l) => l.level === "warn"),
    { msg: "the API is out of reach; reading the Node again" },
  );
});

t.test("an answer that is not a transport failure is not retried", async (t) => {
  const client = new KubeClient(
    { ...cp.admin.connection, cert: undefined, key: undefined, token: "nope" },
    { timeoutMs: 5000 },
  );
  t.teardown(() => client.close());
  const log = captureLogger();
  await t.rejects(announceAndWait(client, NODE, log, { [ASKED]: "" }, hasAnnotation(GRANTED), { timeoutMs: 120_000 }), {
    name: "KubeStatusError",
    status: 401,
  });
  t.same(
    log.lines.filter((l) => l.level === "warn"),
    [],
    "no retry",
  );
});
