// npm run bench -- steps [--samples N] [--connections N] [--reloads N]
//
// 1. `bashible plan` of a fully converged node with every built-in step (the API proxy,
//    NodeUsers, CA certificates, PATH, registry packages, containerd, the kubelet, the kubelet
//    start, the agent's own service): wall time and CPU (user + system of the process), medians
//    of N runs of the shipped dist/bashible, side by side with `bashible version` (the process
//    floor: runtime start and the command table). Goal: plan ≤ 300 ms wall. The node is a sandbox
//    tree converged once by `bashible once` with the real nginx, containerd and kubelet binaries.
// 2. nginx reloads under long-lived connections: N watches open through the proxy configuration
//    the step writes, the upstream list changed and nginx reloaded R times; connections dropped
//    (goal 0), and how long until new connections reach a new upstream.
// Needs root (files are root-owned), nginx with the stream module, containerd, the kubelet.
import { execFileSync, spawnSync } from "node:child_process";
import { copyFile, cp, link, mkdir, mkdtemp, readFile, rm, symlink, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { parseArgs } from "node:util";
import { buildDist } from "../build.ts";
import { makeBundle, sandbox } from "../lib/bundle.ts";
import { get, startNginx, startUpstreams, watch } from "../lib/api-proxy.ts";
import { freePort } from "../lib/control-plane.ts";
import { createCA } from "../lib/pki.ts";
import { renderConfig } from "../../steps/kubernetes-api-proxy.ts";
import { LAUNCHER_CONTENT } from "../../steps/bashible-service.ts";
import { PATHS } from "../../bundles/paths.ts";
import type { BundleStep } from "../../bundles/types.ts";

const { values } = parseArgs({
  options: {
    samples: { type: "string", default: "15" },
    connections: { type: "string", default: "100" },
    reloads: { type: "string", default: "5" },
  },
});
const SAMPLES = Number(values.samples);
const CONNECTIONS = Number(values.connections);
const RELOADS = Number(values.reloads);
if (process.getuid?.() !== 0) {
  console.error("bench steps: needs root (the sandbox tree is root-owned, as a node's files are)");
  process.exit(1);
}

const KUBELET = path.join(process.env.BASHIBLE_TEST_CACHE ?? "/var/cache/bashible-test", "k8s-v1.34.4/kubelet");
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? Number.NaN;
const f0 = (x: number) => x.toFixed(0);

const work = await mkdtemp(path.join(os.tmpdir(), "bench-steps-"));
try {
  const dist = path.join(work, "dist");
  await buildDist(dist);
  const BIN = path.join(dist, "bashible");

  // ---- a converged node ----
  const root = await sandbox('ID=debian\nVERSION_ID="12"\n', "bench-node");
  for (const f of ["passwd", "group", "shadow", "gshadow"]) await copyFile(`/etc/${f}`, path.join(root, "etc", f));
  const put = async (src: string, dest: string) => {
    await mkdir(path.dirname(path.join(root, dest)), { recursive: true });
    await link(src, path.join(root, dest)).catch(() => copyFile(src, path.join(root, dest)));
  };
  await put("/usr/sbin/nginx", "/usr/sbin/nginx");
  await put("/usr/lib/nginx/modules/ngx_stream_module.so", "/usr/lib/nginx/modules/ngx_stream_module.so");
  await put("/usr/bin/containerd", `${PATHS.binDir}/containerd`);
  await put(KUBELET, `${PATHS.binDir}/kubelet`);
  await cp(dist, path.join(root, PATHS.agentDir), { recursive: true });
  await writeFile(path.join(root, PATHS.agentLauncher), LAUNCHER_CONTENT, { mode: 0o755 });
  const digest = (c: string) => `sha256:${c.repeat(64)}`;
  const packages = [
    { name: "bashible", digest: digest("a") },
    { name: "containerd", digest: digest("c") },
    { name: "kubelet", digest: digest("b") },
  ];
  for (const p of packages) {
    await mkdir(path.join(root, PATHS.packageStore, p.name), { recursive: true });
    await writeFile(path.join(root, PATHS.packageStore, p.name, "digest"), `${p.digest}\n`);
  }
  await mkdir(path.join(root, "var/lib/kubelet/pki"), { recursive: true });
  await writeFile(path.join(root, "var/lib/kubelet/pki/kubelet-client-2026.pem"), "joined\n");
  await symlink("kubelet-client-2026.pem", path.join(root, PATHS.kubeletClientPem));
  const ca = await readFile((await createCA(work, "cluster-ca")).cert, "utf8");
  const refs = packages.map((p) => ({ ...p, repository: "deckhouse/packages" }));
  const steps: BundleStep[] = [
    {
      name: "000_configure_kubernetes_api_proxy",
      kind: "KubernetesApiProxy",
      spec: { listen: "127.0.0.1:6445", upstreams: ["10.0.0.1:6443", "10.0.0.2:6443", "10.0.0.3:6443"] },
    },
    { name: "000_node_users", kind: "NodeUsers", spec: { users: [] } },
    {
      name: "003_ca_certificates",
      kind: "CACertificates",
      spec: { certificates: [{ name: "kubernetes-ca", pem: ca }] },
    },
    { name: "004_deckhouse_path", kind: "DeckhousePath", spec: {} },
    {
      name: "007_registry_packages",
      kind: "RegistryPackages",
      spec: { packages: refs.filter((r) => r.name !== "bashible") },
    },
    {
      name: "032_configure_containerd",
      kind: "Containerd",
      spec: {
        cgroupDriver: "systemd",
        sandboxImage: "registry.k8s.io/pause:3.10",
        snapshotter: "overlayfs",
        maxConcurrentDownloads: 3,
        registries: [
          {
            host: "registry.example.com",
            scheme: "https",
            auth: Buffer.from("u:secret-pw").toString("base64"),
            mirrors: [],
          },
        ],
        package: "containerd",
      },
    },
    {
      name: "064_configure_kubelet",
      kind: "Kubelet",
      spec: {
        cgroupDriver: "systemd",
        clusterDNS: ["10.222.0.10"],
        clusterDomain: "cluster.local",
        maxPods: 120,
        containerLogMaxSize: "50Mi",
        containerLogMaxFiles: 4,
        nodeStatusUpdateFrequencySeconds: 10,
        providerID: "static://",
        resourceReservation: { mode: "Auto" },
        featureGates: {},
        registerLabels: { "node.deckhouse.io/group": "worker", "node.deckhouse.io/type": "Static" },
        registerTaints: [{ key: "node.deckhouse.io/bashible-uninitialized", effect: "NoSchedule" }],
        apiServer: "https://127.0.0.1:6445",
        package: "kubelet",
      },
    },
    { name: "069_start_kubelet", kind: "KubeletStart", spec: { clientCertTimeoutSeconds: 60 } },
    {
      name: "080_setup_bashible_service",
      kind: "BashibleService",
      spec: { agent: refs.find((r) => r.name === "bashible")!, cleanupScript: "#!/bin/bash\necho cleanup\n" },
    },
  ];
  const bundleFile = path.join(work, "bundle.json");
  await writeFile(bundleFile, JSON.stringify(makeBundle(steps, { context: { clusterCA: ca } })));
  const args = ["--root", root, "--bundle", bundleFile, "--node-name", "bench-node", "--log-level", "error"];
  const once = spawnSync(BIN, ["once", ...args], { encoding: "utf8" });
  if (once.status !== 0) throw new Error(`bench: the first converge failed:\n${once.stdout}${once.stderr}`);
  const check = spawnSync(BIN, ["plan", ...args], { encoding: "utf8" });
  if (check.status !== 0)
    throw new Error(`bench: the node is not converged (plan exit ${check.status}):\n${check.stdout}`);

  /** Wall and CPU (user + system) of one run, from bash's `times` for its child. */
  const timed = (argv: string[]) => {
    const out = execFileSync(
      "bash",
      [
        "-c",
        's=$(date +%s%N); "$@" >/dev/null 2>&1; e=$(date +%s%N); echo $(( (e - s) / 1000 )); times',
        "bench",
        ...argv,
      ],
      { encoding: "utf8" },
    ).split("\n");
    const sec = (x: string) => {
      const m = x.match(/(\d+)m([\d.]+)s/);
      return m ? Number(m[1]) * 60 + Number(m[2]) : 0;
    };
    const [cu, cs] = (out[2] ?? "").trim().split(/\s+/);
    return { wallMs: Number(out[0]) / 1000, cpuMs: (sec(cu ?? "") + sec(cs ?? "")) * 1000 };
  };
  const plan: { wallMs: number; cpuMs: number }[] = [];
  const version: { wallMs: number; cpuMs: number }[] = [];
  timed([BIN, "version"]); // warm the page cache
  for (let i = 0; i < SAMPLES; i++) {
    version.push(timed([BIN, "version"]));
    plan.push(timed([BIN, "plan", ...args]));
  }
  const pw = median(plan.map((x) => x.wallMs));
  const pc = median(plan.map((x) => x.cpuMs));
  const vw = median(version.map((x) => x.wallMs));
  const vc = median(version.map((x) => x.cpuMs));
  console.log(`plan of a converged node, ${steps.length} built-in steps (median of ${SAMPLES}, dist/bashible):`);
  console.log(
    `  bashible plan      ${f0(pw)} ms wall, ${f0(pc)} ms CPU   (goal ≤ 300 ms wall: ${pw <= 300 ? "met" : "NOT met"})`,
  );
  console.log(`  bashible version   ${f0(vw)} ms wall, ${f0(vc)} ms CPU   (the process floor)`);
  console.log(
    `  plan − floor       ${f0(pw - vw)} ms wall, ${f0(pc - vc)} ms CPU; plan/floor ${(pw / vw).toFixed(2)}× wall`,
  );
  console.log(
    `  (loadavg ${os
      .loadavg()
      .map((l) => l.toFixed(2))
      .join(" ")}, ${os.availableParallelism()} CPUs)`,
  );

  // ---- nginx reloads under long-lived connections ----
  const ups = await startUpstreams(work, ["u1", "u2", "u3", "u4"]);
  const listen = `127.0.0.1:${await freePort()}`;
  const config = path.join(work, "nginx.conf");
  const sets = [
    [0, 1, 2],
    [1, 2, 3],
    [0, 2, 3],
  ].map((idx) => idx.map((i) => ups.list[i]!.endpoint));
  const write = (n: number) =>
    writeFile(
      config,
      renderConfig({ listen, upstreams: sets[n % sets.length]! }, "/usr/lib/nginx/modules/ngx_stream_module.so"),
    );
  await write(0);
  const nginx = await startNginx("/usr/sbin/nginx", config, listen, work);
  try {
    const watches = await Promise.all(Array.from({ length: CONNECTIONS }, () => watch(listen, ups.ca)));
    await Promise.all(watches.map((w) => w.next()));
    const pickup: number[] = [];
    for (let r = 1; r <= RELOADS; r++) {
      await write(r);
      const wanted = new Set(sets[r % sets.length]!.map((e) => ups.list.find((u) => u.endpoint === e)!.name));
      const gone = ups.list.find((u) => !wanted.has(u.name))!.name;
      const t0 = performance.now();
      nginx.reload();
      // New connections reach only the new set once the new workers run: wait for a few in a row.
      let streak = 0;
      while (streak < 6) {
        streak = (await get(listen, ups.ca)) === gone ? 0 : streak + 1;
        if (performance.now() - t0 > 30_000) throw new Error("nginx did not pick up the new upstreams in 30 s");
      }
      pickup.push(performance.now() - t0);
    }
    const counts = watches.map((w) => w.lines.length);
    await Promise.all(watches.map((w) => w.next()));
    const dropped = watches.filter((w, i) => w.ended || w.lines.length <= (counts[i] ?? 0)).length;
    console.log(`nginx reload under ${CONNECTIONS} open watches, ${RELOADS} reloads with a changed upstream list:`);
    console.log(`  connections dropped: ${dropped} (goal 0)`);
    console.log(
      `  new upstreams in use after a reload: median ${f0(median(pickup))} ms, max ${f0(Math.max(...pickup))} ms`,
    );
    for (const w of watches) w.close();
  } finally {
    await nginx.stop();
    await ups.close();
  }
  await rm(root, { recursive: true, force: true });
} finally {
  await rm(work, { recursive: true, force: true });
}
