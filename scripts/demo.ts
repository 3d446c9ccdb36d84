// npm run demo: the main job on the embedded default, end to end on this machine.
//
// A real OCI registry (Debian's docker-registry) with two registry packages, the
// registry-packages proxy in front of it, and the bundle server (standalone) on the example
// cluster (examples/cluster) with its context pointed at them. The agent, as node worker-1,
// fetches group worker's bundle through the server's API and converges a sandbox root: plan,
// once, status, plan again. Nothing outside the sandbox is changed. Needs root (users are
// created in the sandbox's /etc/passwd with the shadow tools). The Debian packages it needs
// (scripts/demo-prerequisites.ts) are installed first when missing.
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { ensurePrerequisites } from "./demo-prerequisites.ts";
import { cp, mkdir, mkdtemp, readFile, writeFile, readdir } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { parse, stringify } from "yaml";
import { createCA, issueCert } from "./lib/pki.ts";
import { freePort } from "./lib/control-plane.ts";
import { agentStandIn, binaryPackage, buildLayer, startRegistry } from "./lib/registry.ts";

const REPO = path.resolve(import.meta.dirname, "..");
const MAIN = path.join(REPO, "agent/main.ts");
const children: ChildProcess[] = [];
// Bold on a terminal only: piped into a file or a test, the headings stay plain text.
const say = (s: string) => console.log(process.stdout.isTTY ? `\n\x1b[1m== ${s}\x1b[0m` : `\n== ${s}`);

function cleanupAndExit(code: number): never {
  for (const c of children) c.kill("SIGTERM");
  process.exit(code);
}
process.on("SIGINT", () => cleanupAndExit(130));

/** Starts `bashible <args>` in the background; resolves with the first log record matching. */
function background(
  args: string[],
  ready: (rec: Record<string, unknown>) => boolean,
): Promise<Record<string, unknown>> {
  const child = spawn(process.execPath, [MAIN, ...args, "--log-format", "json"], {
    stdio: ["ignore", "pipe", "inherit"],
  });
  children.push(child);
  return new Promise((resolve, reject) => {
    let buf = "";
    child.stdout?.on("data", (d: Buffer) => {
      buf += d.toString();
      for (const line of buf.split("\n").slice(0, -1)) {
        try {
          const rec = JSON.parse(line) as Record<string, unknown>;
          if (ready(rec)) resolve(rec);
        } catch {
          // not JSON
        }
      }
      buf = buf.slice(buf.lastIndexOf("\n") + 1);
    });
    child.once("exit", (code) => reject(new Error(`bashible ${args[0]} exited with ${code}`)));
  });
}

function agent(args: string[]): number {
  console.log(`$ bashible ${args.join(" ")}`);
  const r = spawnSync(process.execPath, [MAIN, ...args], { stdio: "inherit" });
  return r.status ?? 1;
}

async function main(): Promise<void> {
  // Every program the demo and its steps run, installed up front (as root) or named: a step
  // must never be the first to find one missing.
  ensurePrerequisites();
  if (process.geteuid?.() !== 0) {
    // Before anything starts, not at the first file: the sandbox's accounts are copied from
    // /etc/shadow and the agent sets root ownership on what it writes.
    console.error(
      `npm run demo needs root (it copies /etc/shadow into its sandbox and runs the agent, which sets owners); this is uid ${process.geteuid?.()}: run it with sudo`,
    );
    process.exit(1);
  }
  const work = await mkdtemp(path.join(os.tmpdir(), "bashible-demo-"));
  console.log(`demo: working in ${work} (kept afterwards for a look around)`);

  say("a registry with two packages, and the registry-packages proxy in front of it");
  const registry = await startRegistry({ parentDir: work });
  children.push({ kill: () => void registry.stop() } as unknown as ChildProcess);
  console.log(`registry on ${registry.url} (loopback only)`);
  const pkgs: Record<string, { digest: string; repository: string }> = {};
  for (const [name, version] of [
    ["bashible", "0.1.0"],
    ["hello", "1.0.0"],
  ] as const) {
    const { digest } = await registry.pushPackage(
      "deckhouse/packages",
      name,
      // The agent's package as step 080 expects it (its release is checked before it is used).
      await buildLayer(name === "bashible" ? agentStandIn(version) : binaryPackage(name, version)),
    );
    pkgs[name] = { digest, repository: "deckhouse/packages" };
    console.log(`pushed ${name} ${version}: ${digest.slice(0, 19)}…`);
  }
  const pki = path.join(work, "pki");
  await mkdir(pki);
  const clusterCA = await createCA(pki, "cluster-ca", "demo-cluster-ca");
  const proxyCert = await issueCert(pki, "proxy", clusterCA, { cn: "registry-packages-proxy", ips: ["127.0.0.1"] });
  const token = `demo-token-${Math.random().toString(36).slice(2)}`;
  await writeFile(path.join(pki, "proxy-token"), token, { mode: 0o600 });
  const proxyPort = await freePort();
  await background(
    [
      "packages-proxy",
      "--upstream",
      registry.url,
      "--tls-cert",
      proxyCert.cert,
      "--tls-key",
      proxyCert.key,
      "--token-file",
      path.join(pki, "proxy-token"),
      "--listen",
      `127.0.0.1:${proxyPort}`,
      "--cache-dir",
      path.join(work, "proxy-cache"),
    ],
    (r) => /listening/.test(String(r.msg)),
  );
  console.log(`packages proxy on 127.0.0.1:${proxyPort}`);

  say("the bundle server on the example cluster (examples/cluster), context pointed at the proxy");
  const configDir = path.join(work, "cluster");
  await cp(path.join(REPO, "examples/cluster"), configDir, { recursive: true });
  const ctx = parse(await readFile(path.join(configDir, "context.yaml"), "utf8")) as Record<string, unknown>;
  ctx.clusterCA = await readFile(clusterCA.cert, "utf8");
  ctx.packagesProxy = { endpoints: [`127.0.0.1:${proxyPort}`], token };
  ctx.packages = pkgs;
  await writeFile(path.join(configDir, "context.yaml"), stringify(ctx));
  const certs = path.join(work, "server-certs");
  const listening = await background(
    ["server", "--standalone", "--config-dir", configDir, "--address", "127.0.0.1", "--port", "0", "--cert-dir", certs],
    (r) => r.msg === "bundle server listening",
  );
  const server = `https://127.0.0.1:${listening.port}`;
  console.log(`bundle server on ${server}, serving groups ${JSON.stringify(listening.groups)}`);

  // The node's identity: a client certificate like a kubelet's, from the server's CA.
  const node = await issueCert(
    pki,
    "worker-1",
    { cert: path.join(certs, "ca.crt"), key: path.join(certs, "ca.key") },
    {
      cn: "system:node:worker-1",
      orgs: ["system:nodes"],
      client: true,
    },
  );
  const kubeconfig = path.join(work, "worker-1.kubeconfig");
  await writeFile(
    kubeconfig,
    stringify({
      apiVersion: "v1",
      kind: "Config",
      clusters: [{ name: "demo", cluster: { server, "certificate-authority": path.join(certs, "ca.crt") } }],
      users: [{ name: "worker-1", user: { "client-certificate": node.cert, "client-key": node.key } }],
      contexts: [{ name: "demo", context: { cluster: "demo", user: "worker-1" } }],
      "current-context": "demo",
    }),
  );

  say("a sandbox root standing in for node worker-1's /");
  const root = path.join(work, "node-root");
  await mkdir(path.join(root, "etc"), { recursive: true });
  await writeFile(
    path.join(root, "etc/os-release"),
    'ID=debian\nVERSION_ID="12"\nPRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\n',
  );
  await writeFile(path.join(root, "etc/hostname"), "worker-1\n");
  for (const f of ["passwd", "group", "shadow", "gshadow"]) await cp(`/etc/${f}`, path.join(root, "etc", f));
  await mkdir(path.join(root, "var/lib/bashible"), { recursive: true });
  await writeFile(path.join(root, "var/lib/bashible/first_run"), "");
  console.log(root);

  // The standalone server is not a Kubernetes API (no Node objects or Events): name the group
  // and keep the agent's log to errors.
  const common = ["--root", root, "--kubeconfig", kubeconfig, "--node-name", "worker-1", "--node-group", "worker"];
  const quiet = [...common, "--log-level", "error"];
  say("plan: what a converge would change (exit 2: changes pending)");
  const p1 = agent(["plan", ...quiet]);
  say(
    "once: converge (the standalone server is no Kubernetes API: Node reads, Events and annotations are refused, so those warnings are expected here)",
  );
  const o = agent(["once", ...common, "--log-format", "pretty", "--log-level", "info"]);
  say("status");
  agent(["status", "--root", root]);
  say("plan again: nothing left to do (exit 0)");
  const p2 = agent(["plan", ...quiet]);
  say("what the converge left in the sandbox");
  const interesting = [
    "etc/profile.d",
    "etc/sudoers.d",
    "etc/sysctl.d",
    "home/deckhouse",
    "opt/deckhouse/bin",
    "usr/local/share/ca-certificates",
    "var/cache/registrypackages",
  ];
  for (const dir of interesting) {
    const entries = await readdir(path.join(root, dir)).catch(() => []);
    console.log(`  /${dir}: ${entries.join(", ") || "(empty)"}`);
  }
  const ok = p1 === 2 && o === 0 && p2 === 0;
  console.log(
    `\ndemo ${ok ? "finished" : "FAILED"}: plan exit ${p1}, once exit ${o}, second plan exit ${p2}; files in ${work}`,
  );
  cleanupAndExit(ok ? 0 : 1);
}

main().catch((err) => {
  console.error(`demo: ${(err as Error).message}`);
  cleanupAndExit(1);
});
