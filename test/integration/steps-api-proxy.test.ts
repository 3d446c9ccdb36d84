// kubernetes-api-proxy in a sandbox tree, with the real nginx running on what the step wrote and
// three TLS upstreams on loopback: requests keep succeeding while an upstream is down, a changed
// upstream list is picked up by a reload while a watch stays open, every change is checked with
// nginx -t first, and the engine reloads the unit (never restarts it), only when the
// configuration changed.
import t from "tap";
import { copyFile, lstat, mkdir, mkdtemp, readFile, rm } from "node:fs/promises";
import { existsSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { freePort } from "../../scripts/lib/control-plane.ts";
import { get, startNginx, startUpstreams, watch } from "../../scripts/lib/api-proxy.ts";
import { stepEnv } from "../fixtures/steps.ts";
import { CONFIG, NGINX } from "../../steps/kubernetes-api-proxy.ts";
import type { BundleStep } from "../../bundles/types.ts";
import { PATHS } from "../../bundles/paths.ts";

const NGINX_BIN = NGINX.debian.binary;
const MODULE = NGINX.debian.streamModule;
const missing = [NGINX_BIN, MODULE, "/usr/bin/systemd-analyze"].filter((p) => !existsSync(p));
const skip =
  process.getuid?.() !== 0
    ? "needs root (files are written root-owned)"
    : missing.length
      ? `needs ${missing.join(", ")} (apt-get install nginx-light libnginx-mod-stream systemd)`
      : false;

const proxyStep = (listen: string, upstreams: string[]): BundleStep => ({
  name: "000_configure_kubernetes_api_proxy",
  kind: "KubernetesApiProxy",
  spec: { listen, upstreams },
});

t.test(
  "kubernetes-api-proxy: balances, survives a stopped upstream, reloads without dropping a watch",
  { skip },
  async (t) => {
    const env = await stepEnv(t);
    const dir = await mkdtemp(path.join(os.tmpdir(), "api-proxy-"));
    t.teardown(() => rm(dir, { recursive: true, force: true }));
    for (const p of [NGINX_BIN, MODULE]) {
      await mkdir(path.dirname(path.join(env.root, p)), { recursive: true });
      await copyFile(p, path.join(env.root, p));
    }
    const ups = await startUpstreams(dir, ["a", "b", "c"]);
    t.teardown(() => ups.close());
    const listen = `127.0.0.1:${await freePort()}`;
    const actions = async () =>
      (await readFile(path.join(env.root, PATHS.sandboxActions), "utf8").catch(() => ""))
        .split("\n")
        .filter(Boolean)
        .map((l) => l.replace(/^\S+ /, ""));

    // From scratch.
    const first = proxyStep(
      listen,
      ups.list.map((u) => u.endpoint),
    );
    const plan = await env.plan(first);
    t.same(plan.problems, []);
    t.same(
      plan.changes.map((c) => c.summary.replace(/ \(.*$/, "")),
      [
        "create /etc/kubernetes",
        "create /etc/kubernetes/kubernetes-api-proxy",
        "create /etc/kubernetes/kubernetes-api-proxy/nginx.conf",
        "create /etc/systemd/system/kubernetes-api-proxy.service",
        "systemctl daemon-reload",
        "enable kubernetes-api-proxy.service",
        "start kubernetes-api-proxy.service",
      ],
    );
    t.equal((await env.apply(first)).outcome, "changed");
    const config = await readFile(path.join(env.root, CONFIG), "utf8");
    t.match(config, /least_conn;/);
    t.match(config, new RegExp(`listen ${listen};`));
    t.match(config, /proxy_connect_timeout 1s;/);
    t.match(config, /max_fails=2 fail_timeout=10s/);
    t.match(config, `load_module ${MODULE};`, "the stream module is loaded when it is a module");
    t.ok(
      (
        await lstat(path.join(env.root, "etc/systemd/system/multi-user.target.wants/kubernetes-api-proxy.service"))
      ).isSymbolicLink(),
      "enabled",
    );
    t.same(await actions(), [
      "systemctl daemon-reload",
      "systemctl start kubernetes-api-proxy.service",
      "systemctl reload kubernetes-api-proxy.service",
    ]);

    // A second run changes nothing and reloads nothing.
    t.same((await env.plan(first)).changes, [], "a second run plans nothing");
    t.equal((await env.apply(first)).outcome, "unchanged");
    t.equal((await actions()).length, 3, "nothing reloaded or restarted");

    // The real nginx on that configuration.
    const nginx = await startNginx(NGINX_BIN, path.join(env.root, CONFIG), listen, dir);
    t.teardown(() => nginx.stop());
    const seen = new Set<string>();
    for (let i = 0; i < 30; i++) seen.add(await get(listen, ups.ca));
    t.same([...seen].sort(), ["a", "b", "c"], "requests are spread over every upstream");

    // One upstream stops: every request still succeeds.
    const b = ups.list.find((u) => u.name === "b")!;
    await b.stop();
    const after: string[] = [];
    for (let i = 0; i < 30; i++) after.push(await get(listen, ups.ca));
    t.equal(after.length, 30, "no request failed while b is down");
    t.notOk(after.includes("b"));

    // A watch stays open across a reload that swaps b for d.
    const w = await watch(listen, ups.ca);
    t.teardown(() => w.close());
    await w.next();
    const d = await ups.start("d");
    const second = proxyStep(
      listen,
      ups.list.filter((u) => u.name !== "b").map((u) => u.endpoint),
    );
    const replan = (await env.planRun([second]))[0]!;
    const file = replan.changes.find((c) => c.kind === "file");
    const diff = file?.kind === "file" ? file.diff : "";
    t.match(diff, `\n-    server ${b.endpoint} `, "the diff shows the upstream that goes");
    t.match(diff, `\n+    server ${d.endpoint} `, "and the one that comes");
    const svc = replan.changes.find((c) => c.kind === "service");
    t.same(
      svc && { action: svc.kind === "service" && svc.action, why: svc.kind === "service" && svc.why },
      {
        action: "reload",
        why: [CONFIG],
      },
      "the plan says: reload, because nginx.conf changed",
    );
    t.equal((await env.apply(second)).outcome, "changed");
    t.same((await actions()).slice(3), ["systemctl reload kubernetes-api-proxy.service"], "reloaded, not restarted");
    const before = w.lines.length;
    nginx.reload(); // what the unit's ExecReload does
    let reachedD = false;
    for (let i = 0; i < 200 && !reachedD; i++) reachedD = (await get(listen, ups.ca)) === "d";
    t.ok(reachedD, "new connections reach the new upstream after the reload");
    await w.next();
    t.ok(w.lines.length > before, "the watch kept receiving after the reload");
    t.notOk(w.ended, "and is still open");

    // A configuration nginx refuses is never installed.
    const good = await readFile(path.join(env.root, CONFIG), "utf8");
    const bad = proxyStep(listen, ["upstream-that-does-not-resolve.invalid:6443"]);
    const failed = await env.apply(bad);
    t.equal(failed.outcome, "failed");
    t.match(failed.error, /host not found in upstream "upstream-that-does-not-resolve\.invalid:6443"/);
    t.equal(await readFile(path.join(env.root, CONFIG), "utf8"), good, "the live configuration is untouched");
    t.equal((await actions()).length, 4, "and nothing was reloaded");
  },
);

t.test(
  "kubernetes-api-proxy: no endpoints is a problem, not a change; no nginx is a clear error",
  { skip },
  async (t) => {
    const env = await stepEnv(t);
    const none = await env.plan(proxyStep("127.0.0.1:6445", []));
    t.same(none.changes, []);
    t.match(none.problems[0]?.message, /no API server endpoints/);
    await t.rejects(env.plan(proxyStep("127.0.0.1:6445", ["127.0.0.1:6443"])), {
      name: "NginxMissingError",
      message: /\/usr\/sbin\/nginx is not installed \(install nginx-light and libnginx-mod-stream\)/,
    });
  },
);
