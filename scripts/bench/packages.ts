// npm run bench -- packages [--packages N] [--size MiB] [--rounds R] [--nodes K]
//
// Registry packages end to end against a real docker-registry and the real proxy:
//  1. install N packages into a fresh sandbox with a cold proxy cache, then with a warm one,
//     then the converged re-run (all skipped, nothing downloaded);
//  2. K concurrent identical requests for one big blob on a cold proxy: wall time and how many
//     upstream fetches they caused (must be 1);
//  3. proxy throughput from its warm cache vs. the registry served directly (reference).
// Figures are medians over R rounds, measured side by side in this run.
import { createHash } from "node:crypto";
import https from "node:https";
import http from "node:http";
import os from "node:os";
import { rm } from "node:fs/promises";
import { parseArgs } from "node:util";
import { Host } from "../../host/host.ts";
import { osProfile } from "../../agent/converge/converge.ts";
import { createLogger } from "../../lib/log/log.ts";
import { applySteps, planSteps } from "../../agent/converge/engine.ts";
import { hostFlags } from "../../host/flags.ts";
import type { RegistryPackageRef } from "../../bundles/types.ts";
import { makeBundle, sandbox } from "../lib/bundle.ts";
import { startProxyFixture } from "../lib/packages-proxy.ts";
import { binaryPackage, buildLayer, randomish } from "../lib/registry.ts";

const { values } = parseArgs({
  options: {
    packages: { type: "string", default: "20" },
    size: { type: "string", default: "2" },
    rounds: { type: "string", default: "5" },
    nodes: { type: "string", default: "50" },
    big: { type: "string", default: "64" },
  },
});
const N = Number(values.packages);
const SIZE = Number(values.size) * 1024 * 1024;
const ROUNDS = Number(values.rounds);
const NODES = Number(values.nodes);
const BIG = Number(values.big) * 1024 * 1024;

const log = createLogger({ level: "silent" });
const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)] as number;
};
const ms = (t0: bigint) => Number(process.hrtime.bigint() - t0) / 1e6;

const f = await startProxyFixture();
try {
  console.log(
    `machine: ${os.cpus().length} vCPU, ${Math.round(os.totalmem() / 2 ** 30)} GiB; ${N} packages of ${values.size} MiB, ${ROUNDS} rounds`,
  );
  // --- 1. install N packages ---
  const refs: RegistryPackageRef[] = [];
  for (let i = 0; i < N; i++) {
    const name = `bench${i}`;
    const layer = await buildLayer(binaryPackage(name, "1", SIZE));
    const { digest } = await f.registry.pushPackage(`bench/${name}`, "1", layer);
    refs.push({ name, digest, repository: `bench/${name}` });
  }
  const spec = { packages: refs };
  async function installOnce(endpoint: string): Promise<{ cold: number; rerun: number; downloads: number }> {
    const root = await sandbox();
    try {
      const host = new Host(root, await osProfile(root));
      const bundle = makeBundle([{ name: "007_fetch_registry_packages", kind: "RegistryPackages", spec }], {
        context: { clusterCA: f.clusterCA, packagesProxy: { endpoints: [endpoint], token: f.token } },
      });
      const base = {
        nodeName: "bench",
        nodeGroup: "worker",
        bundle,
        firstRun: false,
        forced: false,
        bootId: "bench",
        log,
        flags: hostFlags(host),
        agentArgv: [],
        cluster: "local" as const,
      };
      const retry = { retry: { intervalMs: 0, maxAttempts: 1 } };
      let t0 = process.hrtime.bigint();
      const first = await applySteps(host, bundle, base, retry);
      if (!first.ok) throw new Error(first.failed?.error);
      const cold = ms(t0);
      t0 = process.hrtime.bigint();
      const [plan] = await planSteps(host, bundle, base);
      await applySteps(host, bundle, base, retry);
      const rerun = ms(t0);
      const changes = plan?.changes ?? [];
      return { cold, rerun, downloads: changes.length };
    } finally {
      await rm(root, { recursive: true, force: true });
    }
  }
  const coldCache: number[] = [];
  const warmCache: number[] = [];
  const reruns: number[] = [];
  for (let r = 0; r < ROUNDS; r++) {
    const proxy = await f.another(); // empty cache
    const endpoint = `127.0.0.1:${proxy.port}`;
    const c = await installOnce(endpoint);
    coldCache.push(c.cold);
    const w = await installOnce(endpoint);
    warmCache.push(w.cold);
    reruns.push(w.rerun, c.rerun);
    if (proxy.stats.upstreamFetches !== 2 * N)
      throw new Error(
        `expected ${2 * N} upstream fetches (manifest and layer each), saw ${proxy.stats.upstreamFetches}`,
      );
    await proxy.close();
  }
  const c = median(coldCache);
  const w = median(warmCache);
  console.log(
    `install ${N} × ${values.size} MiB, cold proxy cache: ${c.toFixed(0)} ms (${(c / N).toFixed(1)} ms/package)`,
  );
  console.log(
    `install ${N} × ${values.size} MiB, warm proxy cache: ${w.toFixed(0)} ms (${(w / N).toFixed(1)} ms/package); cold/warm ${(c / w).toFixed(2)}×`,
  );
  console.log(`converged re-run (plan + apply, all skipped, 0 downloads): ${median(reruns).toFixed(1)} ms`);

  // --- 2. K identical concurrent requests on a cold proxy ---
  const bigBlob = randomish(BIG, "big");
  const bigDigest = await f.registry.pushBlob("bench/big", bigBlob);
  const want = `sha256:${createHash("sha256").update(bigBlob).digest("hex")}`;
  const get = (url: string, tls: boolean) =>
    new Promise<number>((resolve, reject) => {
      const req = (tls ? https : http).request(
        url,
        tls ? { ca: f.clusterCA, headers: { authorization: `Bearer ${f.token}` } } : {},
        (res) => {
          const h = createHash("sha256");
          let n = 0;
          res.on("data", (d: Buffer) => {
            h.update(d);
            n += d.length;
          });
          res.on("end", () =>
            res.statusCode === 200 && `sha256:${h.digest("hex")}` === want
              ? resolve(n)
              : reject(new Error(`bad answer ${res.statusCode}`)),
          );
          res.on("error", reject);
        },
      );
      req.on("error", reject);
      req.end();
    });
  const burst: number[] = [];
  const fetches: number[] = [];
  for (let r = 0; r < ROUNDS; r++) {
    const proxy = await f.another();
    const url = `${proxy.url}/package?digest=${bigDigest}&repository=bench/big`;
    const t0 = process.hrtime.bigint();
    await Promise.all(Array.from({ length: NODES }, () => get(url, true)));
    burst.push(ms(t0));
    fetches.push(proxy.stats.upstreamFetches);
    await proxy.close();
  }
  console.log(
    `${NODES} concurrent identical requests, ${values.big} MiB blob, cold proxy: ${median(burst).toFixed(0)} ms; upstream fetches per round: ${fetches.join(",")}`,
  );

  // --- 3. throughput: warm proxy vs. registry direct ---
  const proxy = await f.another();
  const purl = `${proxy.url}/package?digest=${bigDigest}&repository=bench/big`;
  await get(purl, true); // warm
  const rurl = `${f.registry.url}/v2/bench/big/blobs/${bigDigest}`;
  const viaProxy: number[] = [];
  const direct: number[] = [];
  for (let r = 0; r < ROUNDS; r++) {
    let t0 = process.hrtime.bigint();
    await get(purl, true);
    viaProxy.push(ms(t0));
    t0 = process.hrtime.bigint();
    await get(rurl, false);
    direct.push(ms(t0));
  }
  const mbps = (t: number) => BIG / 2 ** 20 / (t / 1000);
  const p = median(viaProxy);
  const d = median(direct);
  console.log(
    `one ${values.big} MiB download: proxy (HTTPS, warm cache) ${p.toFixed(0)} ms = ${mbps(p).toFixed(0)} MiB/s; registry direct (HTTP) ${d.toFixed(0)} ms = ${mbps(d).toFixed(0)} MiB/s; proxy/direct time ${(p / d).toFixed(2)}×`,
  );
  await proxy.close();
} finally {
  await f.stop();
}
