// The one list + watch loop (lib/informer.ts) against a real kube-apiserver: what its owners
// rely on. The bundle server renders from informers and, as a new leader, resyncs them with a
// quorum list before it writes; a resync that fails must not leave the inputs frozen.
import t from "tap";
import { pino } from "pino";
import { Informer, type InformerEvent } from "../../lib/informer.ts";
import { KubeClient } from "../../lib/kube/client.ts";
import { loadKubeconfig } from "../../lib/kube/kubeconfig.ts";
import { isForbidden } from "../../lib/kube/errors.ts";
import type { KubeObject } from "../../lib/kube/api.ts";
import { withControlPlane } from "../../scripts/lib/control-plane-fixture.ts";
import { until } from "../../scripts/lib/until.ts";

const log = pino({ level: process.env.TEST_LOG ? "debug" : "silent" });
const NS = "informer-test";
const PATH = `/api/v1/namespaces/${NS}/configmaps`;

const cp = await withControlPlane(t);
await cp.kubectl(["create", "namespace", NS]);
const kc = (args: string[], input?: string) => cp.kubectl(args, input === undefined ? {} : { input });
const configMap = (name: string, value: string) =>
  JSON.stringify({ apiVersion: "v1", kind: "ConfigMap", metadata: { name, namespace: NS }, data: { v: value } });
const data = (o: KubeObject | undefined) => (o as { data?: { v?: string } } | undefined)?.data?.v;

t.test("keeps the collection current and says what each event replaced", async (t) => {
  await kc(["apply", "-f", "-"], configMap("a", "1"));
  const events: InformerEvent<KubeObject>[] = [];
  const inf = new Informer({ client: cp.admin, path: PATH, log, onEvent: (ev) => events.push(ev) });
  t.teardown(() => inf.stop());
  await inf.start();
  t.equal(data(inf.objects.get(`${NS}/a`)), "1", "the first list, keyed namespace/name");
  t.same(
    events.map((e) => e.type),
    ["SYNC"],
  );

  await kc(["apply", "-f", "-"], configMap("a", "2"));
  const modified = await until("MODIFIED a", () => events.find((e) => e.type === "MODIFIED"));
  t.equal(modified.type !== "SYNC" && data(modified.previous), "1", "previous: what the collection held before");
  t.equal(modified.type !== "SYNC" && data(modified.object), "2");

  await kc(["apply", "-f", "-"], configMap("b", "1"));
  const added = await until("ADDED b", () => events.find((e) => e.type === "ADDED"));
  t.equal(added.type !== "SYNC" && added.previous, undefined, "nothing before an ADDED");
  await kc(["delete", "configmap", "-n", NS, "b"]);
  await until("DELETED b", () => events.find((e) => e.type === "DELETED"));
  t.notOk(inf.objects.has(`${NS}/b`), "deleted from the collection");
});

t.test("resync lists afresh; when that list fails, watching resumes on its own", async (t) => {
  // A user allowed to read this namespace's ConfigMaps by a RoleBinding the test takes away.
  const reader = await cp.mintNode("reader-1");
  const client = new KubeClient(await loadKubeconfig(reader.kubeconfig));
  t.teardown(() => client.close());
  await kc(["create", "role", "-n", NS, "cm-reader", "--verb=get,list,watch", "--resource=configmaps"]);
  const grant = () =>
    kc(["create", "rolebinding", "-n", NS, "cm-reader", "--role=cm-reader", "--user=system:node:reader-1"]);
  await grant();

  const inf = new Informer({ client, path: PATH, log });
  t.teardown(() => inf.stop());
  await until("the reader may list", async () => {
    await inf.start();
    return true;
  });
  await kc(["apply", "-f", "-"], configMap("c", "1"));
  await until("c seen through the watch", () => inf.objects.has(`${NS}/c`));

  await inf.resync();
  t.equal(data(inf.objects.get(`${NS}/c`)), "1", "a resync lists what is there");

  await kc(["delete", "rolebinding", "-n", NS, "cm-reader"]);
  const refused = await until("a resync refused", async () => {
    try {
      await inf.resync();
      return undefined;
    } catch (err) {
      return isForbidden(err) ? err : undefined;
    }
  });
  t.ok(refused, "the failed list is thrown to the caller");

  await grant();
  await kc(["apply", "-f", "-"], configMap("d", "1"));
  await until("d seen after the grant came back", () => inf.objects.has(`${NS}/d`), 60_000);
  t.pass("the informer listed again by itself and keeps watching");
  await kc(["apply", "-f", "-"], configMap("d", "2"));
  await until("d's change seen through the watch", () => data(inf.objects.get(`${NS}/d`)) === "2");
});
