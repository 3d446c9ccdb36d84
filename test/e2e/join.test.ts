// End to end, as an operator runs it (issue 15): a bare Debian machine (minbase with systemd, as a
// cloud image has it: no curl, sudo, nginx; issue 21) joins a real control plane through
// bootstrap.sh, installing what it needs from its distribution's mirror (a local one the test
// serves), changes apply, and cleanup_static_node.sh leaves no trace.
//
// Real parts only: etcd, kube-apiserver, kube-controller-manager (signs and approves the kubelet's
// CSR), `bashible server` as the aggregated API with its controllers, run from the server image
// (`npm run image`, built from this checkout) by containerd as the Deployment runs it, a real
// OCI registry behind the registry-packages proxy holding what `npm run package` builds, and a
// Debian machine booted with systemd-nspawn (systemd as PID 1) on its own network, reaching the
// API server and the proxy over a veth. The machine gets bootstrap.sh from Secret
// d8-cloud-instance-manager/manual-bootstrap-for-worker and runs it; containerd, the API proxy
// (nginx), the kubelet and the agent run as its units. The one stand-in is the watchdog: there
// is no /dev/watchdog here, so a FIFO with the same protocol sits at /dev/watchdog inside the
// machine (what the agent writes to it is read by this test).
//
// What this machine cannot offer, and how the node is given it (scripts/lib/nspawn-node.ts):
// containerd's overlay snapshots need a real filesystem (the node's root is a copy, not an
// overlay); the kubelet sets kernel-wide sysctls (the node gets its own stand-in files for
// those six, so the host is untouched); a reboot ends nspawn (the node is started again on the
// same disk, as systemd-nspawn@.service does).
import t from "tap";
import { readFile } from "node:fs/promises";
import path from "node:path";
import { BOOTSTRAP_GROUP, BOOTSTRAP_GROUP_PREFIX } from "../../cluster/server/auth.ts";
import { manualBootstrapData } from "../../cluster/server/bootstrap-secrets.ts";
import type { RenderInputs } from "../../cluster/render/inputs.ts";
import { EVENTS, NODE_KEYS } from "../../bundles/names.ts";
import { PATHS } from "../../bundles/paths.ts";
import { DENY_STARTS_MARKER, POLICY_RC_D } from "../../bundles/os-families.ts";
import { FakeWatchdog } from "../../scripts/lib/watchdog.ts";
import type { NodeDiff, NspawnNode } from "../../scripts/lib/nspawn-node.ts";
import { GROUP, nodeGroup, nodeUser, NODE_USER, POD_SUBNET, sshPublicKey } from "../../scripts/lib/e2e/cluster.ts";
import { BUSYBOX_IMAGE } from "../../scripts/lib/e2e/images.ts";
import {
  CALM_AFTER_RESTART,
  e2eContainer,
  e2ePod,
  THRASHER_EARLY_OOM,
  THRASHING,
  thrasherPod,
} from "../../scripts/lib/e2e/thrasher.ts";
import {
  getNode as getNodeOf,
  importImages,
  joinMachine,
  runScript,
  type ScriptRun,
  startWorld,
  type World,
  worldSkip,
} from "../../scripts/lib/e2e/world.ts";
import { until } from "../../scripts/lib/until.ts";

const skip = worldSkip();

const CLEANUP_FLAG = "--yes-i-am-sane-and-i-understand-what-i-am-doing";
// Every wait below is bounded by its own `until`; the file's timeout is only the net under them.
// A bare machine installs its distribution packages twice over (join, then cleanup purges them):
// ~8 minutes on a loaded 2-core CI machine, past the suites' default 10 minutes with a margin.
t.setTimeout(30 * 60_000);

t.test(
  "a fresh Debian machine joins, changes apply, cleanup leaves no trace",
  { skip, timeout: 30 * 60_000 },
  async (t) => {
    const world: World = await startWorld({
      log: (l) => t.comment(l),
      keepWork: () => process.env.BASHIBLE_E2E_KEEP === "1" || !t.passing(),
    });
    t.teardown(() => world.stop());
    const { cluster } = world;
    const { cp } = cluster;
    const machine = await world.machine("e2e-worker-1");
    const name = machine.name;
    const sh = (script: string) => machine.mustExec(["sh", "-c", script]).then((r) => r.stdout);
    const runs: Record<string, ScriptRun> = {};
    /** The machine's packages and their versions. */
    const versions = async () =>
      new Map(
        // biome-ignore lint/suspicious/noTemplateCurlyInString: dpkg-query's own format syntax
        (await sh("dpkg-query -W -f '${Package} ${Version}\\n'"))
          .trim()
          .split("\n")
          .map((l) => l.split(" ") as [string, string]),
      );
    const bareVersions = await versions();
    t.teardown(async () => {
      if (t.passing()) return;
      // What an operator would look at first.
      const tail = async (f: string) => (await readFile(f, "utf8").catch(() => "")).slice(-4000);
      t.comment(`work dir kept: ${world.work}`);
      t.comment(`bashible-server log:\n${await tail(cluster.serverLog)}`);
      for (const [k, r] of Object.entries(runs)) t.comment(`${k} (exit ${r.exitCode}):\n${r.output.slice(-4000)}`);
      const j = await machine.exec(["journalctl", "-q", "--no-pager", "-n", "150", "-u", "bashible", "-u", "kubelet"]);
      t.comment(`journal:\n${j.stdout.slice(-8000)}`);
    });

    const getNode = () => getNodeOf(cluster, name);
    const mainPid = async (unit: string) => (await sh(`systemctl show -p MainPID --value ${unit}`)).trim();
    const status = async () => JSON.parse(await sh(`cat ${PATHS.status}`));
    /** The FIFO at /dev/watchdog inside the machine (its /dev is new every boot). */
    const watchdog = () => new FakeWatchdog(`/proc/${machine.pid}/root/dev/watchdog`);

    await t.test("bootstrap.sh with an expired token says so and stops", async (t) => {
      const token = await cp.mintBootstrapToken({
        ttlSeconds: -600,
        extraGroups: [BOOTSTRAP_GROUP, `${BOOTSTRAP_GROUP_PREFIX}${GROUP}`],
      });
      const secret = await cp.admin.request<{ data: Record<string, string> }>(
        "GET",
        `/api/v1/namespaces/kube-system/secrets/bootstrap-token-${token.split(".")[0]}`,
      );
      const expiration = Buffer.from(secret.data.expiration as string, "base64").toString();
      // A copy of bootstrap.sh saved hours ago: the same script, its token since expired.
      const ctx = { clusterCA: await readFile(cp.ca.cert, "utf8"), apiserverEndpoints: [cluster.apiEndpoint] };
      const stale = manualBootstrapData(GROUP, ctx as RenderInputs["context"], { token, expiration })["bootstrap.sh"];
      const run = await runScript(machine, "bootstrap.sh", stale, [], { timeoutMs: 120_000 });
      runs["expired bootstrap.sh"] = run;
      t.equal(run.exitCode, 1, "it fails");
      t.match(run.output, /HTTP 401/, "the API server refused the token");
      t.match(
        run.output,
        `the bootstrap token in this script expired at ${expiration}`,
        "and it says the token expired",
      );
      t.match(
        run.output,
        `get a fresh bootstrap.sh from Secret d8-cloud-instance-manager/manual-bootstrap-for-${GROUP}`,
      );
      t.ok(run.endedAt - run.startedAt < 30_000, "without retrying for minutes");
    });

    let fifo = watchdog();
    t.teardown(() => fifo.close());
    let joined = false;
    const join: { bootstrapMs?: number; readyMs?: number; steps?: { name: string; durationMs: number }[] } = {};

    await t.test("join: bootstrap.sh from the Secret, run on the machine", async (t) => {
      const script = await cluster.bootstrapScript();
      t.match(script, /^#!\/bin\/bash/, "the Secret carries bootstrap.sh");
      // The Node is watched from bootstrap.sh's start: the join time is start → Ready.
      const { run, readyMs, node } = await joinMachine(cluster, machine, script);
      runs["bootstrap.sh"] = run;
      t.equal(run.exitCode, 0, "bootstrap.sh succeeds");
      join.bootstrapMs = run.endedAt - run.startedAt;
      join.readyMs = readyMs;
      // Progress: every step as it ends, k of n, with the time so far.
      const progress = run.lines.filter((l) =>
        /step \d+ of \d+ \S+: \w+ in [\d.]+ s \([\d.]+ s elapsed\)/.test(l.text),
      );
      const n = Number(/of (\d+)/.exec(progress[0]?.text ?? "")?.[1]);
      t.ok(n >= 10, `bootstrap printed progress for ${n} steps`);
      t.equal(progress.length, n, "one line per step");
      t.match(run.output, new RegExp(`bootstrap of node group ${GROUP} complete in \\d+ s`));
      t.ok(node, "the Node became Ready");
      t.comment(
        `join: bootstrap.sh ${(join.bootstrapMs / 1000).toFixed(1)} s, Node Ready ${(readyMs / 1000).toFixed(1)} s after its start`,
      );
      t.equal(node?.metadata.labels?.[NODE_KEYS.group], GROUP, "the Node carries the group label");
      t.equal(node?.metadata.labels?.[NODE_KEYS.nodeType], "Static", "and the node type");
      const unit = await sh("cat /etc/systemd/system/kubelet.service");
      t.notMatch(
        unit,
        "e2e.bashible.test/role",
        "the NodeGroup's template is not the kubelet's (the cluster side keeps it)",
      );

      const st = await status();
      // The daemon may have checked again since (an in-sync run): what matters is what was applied.
      t.equal(st.appliedChecksum, await cluster.groupChecksum(), "the first converge applied the bundle");
      t.match(st.lastRun?.outcome, /^(applied|in-sync)$/, "and nothing failed since");
      t.ok(
        st.steps.every((s: { outcome: string }) => s.outcome === "changed" || s.outcome === "unchanged"),
        "every step converged",
      );
      join.steps = st.steps.map((s: { name: string; durationMs: number }) => ({
        name: s.name,
        durationMs: s.durationMs,
      }));

      for (const unit of ["containerd-deckhouse", "kubernetes-api-proxy", "kubelet", "bashible"]) {
        t.equal((await machine.exec(["systemctl", "is-active", unit])).stdout.trim(), "active", `${unit} runs`);
      }
      const version = JSON.parse(
        await sh("curl -sS --max-time 10 --cacert /etc/kubernetes/pki/ca.crt https://127.0.0.1:6445/version"),
      );
      t.match(version.gitVersion, /^v1\.34\./, "the API proxy answers on 127.0.0.1:6445 with the API server behind it");
      t.equal(
        (await machine.exec(["test", "-s", "/var/lib/kubelet/pki/kubelet-client-current.pem"])).exitCode,
        0,
        "the kubelet has its client certificate",
      );
      const csrs = await cp.admin.request<{
        items: {
          spec: { signerName: string; username: string };
          status: { conditions?: { type: string }[]; certificate?: string };
        }[];
      }>("GET", "/apis/certificates.k8s.io/v1/certificatesigningrequests");
      const client = csrs.items.find((c) => c.spec.signerName === "kubernetes.io/kube-apiserver-client-kubelet");
      t.match(client?.spec.username, /^system:bootstrap:/, "requested with the bootstrap token");
      t.ok(
        client?.status.conditions?.some((c) => c.type === "Approved") && client.status.certificate,
        "approved and signed by kube-controller-manager",
      );

      const checksum = await cluster.groupChecksum();
      t.ok(checksum, "the checksums Secret has the group");
      await until(
        "the checksum annotation",
        async () => (await getNode())?.metadata.annotations?.[NODE_KEYS.checksum] === checksum,
        60_000,
      );
      t.pass(`the Node's checksum annotation equals the Secret's ${checksum?.slice(0, 12)}`);

      await until(
        "the bashible-uninitialized taint to go",
        async () => {
          const n = await getNode();
          return n && !n.spec?.taints?.some((x) => x.key === NODE_KEYS.uninitializedTaint);
        },
        60_000,
      );
      t.pass("the first run finished: the cluster removed the taint the kubelet registered with");

      // The bare machine got what it needs from its mirror; bootstrap's credentials are gone.
      for (const p of ["curl", "nginx-light", "sudo", "iptables"]) {
        t.equal((await machine.exec(["dpkg-query", "-W", p])).exitCode, 0, `${p} installed from the mirror`);
      }
      t.ok(
        world.mirrorServers.get(name)?.served.some((p) => p.startsWith("/nginx-light_")),
        "served by the machine's mirror",
      );
      t.equal(
        (await sh(`cat ${PATHS.discoveredNodeIp}`)).trim(),
        machine.address,
        "the node's address in the cluster's internal network (bb-d8-node-ip, the kubelet's --node-ip)",
      );
      for (const f of [PATHS.bootstrapToken, PATHS.bootstrapCA, PATHS.bootstrapAuthHeader]) {
        t.equal((await machine.exec(["test", "-e", f])).exitCode, 1, `${f} removed after the join (098_cleanup)`);
      }
      // The kubelet set kernel.panic=10 when it started; the tuner, started with it, puts 0 back.
      await until("kernel.panic 0", async () => (await sh("cat /proc/sys/kernel/panic")).trim() === "0", 180_000);
      t.pass("a fencing group: kernel.panic 0 after the kubelet started (the node's stand-in file)");

      const pw = (await sh(`getent passwd ${NODE_USER}`)).trim().split(":");
      t.equal(pw[2], "1901", "the NodeUser exists with its uid");
      t.match(await sh(`cat ${pw[5]}/.ssh/authorized_keys`), cluster.userKey, "and its key");
      t.match(await sh(`id -nG ${NODE_USER}`), /\bnodeadmin\b/, "and is a sudoer (nodeadmin)");
      joined = true;
    });

    await t.test(
      "the node runs a pod (bridge CNI from the bundle, images imported into containerd)",
      { skip: !joined && "no join" },
      async (t) => {
        await importImages(world, machine);
        await cluster.apply({
          apiVersion: "v1",
          kind: "Pod",
          metadata: { name: "hello", namespace: "default" },
          spec: {
            nodeName: name,
            containers: [
              {
                name: "hello",
                image: BUSYBOX_IMAGE,
                imagePullPolicy: "Never",
                command: ["/bin/sh", "-c", 'echo "hello from $(hostname)"; exec sleep 3600'],
              },
            ],
          },
        });
        const pod = await until(
          "the pod to run",
          async () => {
            const p = await cp.admin.request<{ status: { phase: string; podIP?: string } }>(
              "GET",
              "/api/v1/namespaces/default/pods/hello",
            );
            return p.status.phase === "Running" && p;
          },
          120_000,
        );
        t.equal(pod.status.phase, "Running");
        t.match(
          pod.status.podIP,
          new RegExp(`^${POD_SUBNET.split(".").slice(0, 3).join("\\.")}\\.`),
          `its address is from the bridge network ${POD_SUBNET}`,
        );
        // Through the API server, as an operator reads it: the API server reaches the kubelet
        // and verifies its serving certificate (approved by the bundle server's approver,
        // signed by kube-controller-manager).
        const log = await until(
          "kubectl logs",
          async () => {
            const text = await cp.kubectl(["logs", "hello"]);
            return text.includes("hello from hello") && text;
          },
          60_000,
        );
        t.match(log, "hello from hello", "kubectl logs: the container ran its command");
        t.match(await cp.kubectl(["exec", "hello", "--", "cat", "/proc/1/cmdline"]), "sleep", "kubectl exec");
        // /etc/crictl.yaml (032) names containerd's socket: crictl needs no flags.
        t.match(
          await sh("/opt/deckhouse/bin/crictl ps --name hello -o json"),
          /"name": "hello"/,
          "crictl works without flags",
        );
        // Graceful node shutdown: the kubelet holds logind's delay lock, within the delay 064 gave
        // logind (the kubelet did not have to write its own 99-kubelet.conf to get it).
        t.match(
          await sh("systemd-inhibit --list --no-pager --no-legend"),
          /kubelet.*shutdown.*Kubelet needs time to handle node shutdown.*delay/,
          "the kubelet holds a shutdown delay inhibitor",
        );
        t.match(
          await sh(
            "busctl get-property org.freedesktop.login1 /org/freedesktop/login1 org.freedesktop.login1.Manager InhibitDelayMaxUSec",
          ),
          /^t 120000000$/m,
          "logind waits up to the kubelet's 2 minutes",
        );
        t.equal(
          (await machine.exec(["test", "-e", "/etc/systemd/logind.conf.d/99-kubelet.conf"])).exitCode,
          1,
          "and the kubelet did not need to rewrite logind's configuration",
        );
        const serving = await cp.admin.request<{
          items: { spec: { username: string; signerName: string }; status: { conditions?: { type: string }[] } }[];
        }>("GET", "/apis/certificates.k8s.io/v1/certificatesigningrequests");
        t.ok(
          serving.items.some(
            (c) =>
              c.spec.signerName === "kubernetes.io/kubelet-serving" &&
              c.spec.username === `system:node:${name}` &&
              c.status.conditions?.some((x) => x.type === "Approved"),
          ),
          "the kubelet's serving CSR was approved",
        );
      },
    );

    await t.test("early OOM and fencing run on the node", { skip: !joined && "no join" }, async (t) => {
      // The agent's service restarts once after the first converge: wait for its endpoint.
      const eo = await until(
        "the agent's early OOM endpoint",
        async () => JSON.parse(await sh("curl -sS --max-time 5 http://127.0.0.1:9650/early-oom")),
        60_000,
      );
      t.equal(eo.enabled, true, "early OOM is on");
      t.equal(eo.dryRun, false, "and acts");
      t.equal(eo.psi, "available", "it reads memory pressure (PSI)");
      await until(
        "the fencing label",
        async () => (await getNode())?.metadata.labels?.[NODE_KEYS.fencingEnabled] !== undefined,
        60_000,
      );
      t.pass("the Node is labelled for fencing");
      await fifo.nextPets(2, 30_000);
      t.pass("the agent pets the watchdog");
      t.match(
        await sh("cat /etc/modprobe.d/bashible-softdog.conf"),
        /soft_margin=60/,
        "softdog is configured for the next boot",
      );
      const fs = await machine.exec(["/opt/deckhouse/bin/bashible", "fencing", "status"]);
      t.match(fs.stdout + fs.stderr, /armed/i, "`bashible fencing status` says armed");
    });

    await t.test(
      "a forced re-run on the joined node changes nothing and restarts nothing",
      { skip: !joined && "no join" },
      async (t) => {
        const units = ["kubelet", "containerd-deckhouse", "kubernetes-api-proxy", "bashible", "systemd-journald"];
        const before = Object.fromEntries(await Promise.all(units.map(async (u) => [u, await mainPid(u)])));
        const served = world.mirrorServers.get(name)?.served.length;
        const removedAt = Date.now();
        await sh(`rm -f ${PATHS.configurationChecksum}`);
        // The daemon notices at its next check (the minute tick at the latest) and runs everything.
        const st = await until(
          "the daemon's forced run",
          async () => {
            const s = await status();
            if (Date.parse(s.lastRun?.finishedAt ?? "") > removedAt && s.lastRun.outcome !== "applied") {
              // Quoted if the wait gives up: what the daemon did instead.
              throw new Error(`last run ${s.lastRun.outcome}: ${s.lastRun.reason} ${s.lastRun.error ?? ""}`);
            }
            return Date.parse(s.lastRun?.finishedAt ?? "") > removedAt && s;
          },
          180_000,
        );
        const changed = st.steps
          .filter((s: { kind: string; outcome: string }) => s.outcome !== "unchanged" && s.kind !== "Script")
          .map((s: { name: string }) => s.name);
        t.same(changed, [], "no built-in step changed anything (custom scripts run on a forced run, as in Deckhouse)");
        const after = Object.fromEntries(await Promise.all(units.map(async (u) => [u, await mainPid(u)])));
        t.same(after, before, "nothing restarted");
        t.equal(world.mirrorServers.get(name)?.served.length, served, "nothing fetched from the mirror");
      },
    );

    await t.test(
      "change: a kubelet setting and the NodeUser apply within seconds, only the kubelet restarts",
      { skip: !joined && "no join" },
      async (t) => {
        const units = ["kubelet", "containerd-deckhouse", "kubernetes-api-proxy", "bashible"];
        const before = Object.fromEntries(await Promise.all(units.map(async (u) => [u, await mainPid(u)])));
        const oldChecksum = await cluster.groupChecksum();
        const secondKey = sshPublicKey("e2e-operator@second");
        const editedAt = Date.now();
        await cluster.apply(nodeGroup({ maxPods: 60 }));
        await cluster.apply(nodeUser([cluster.userKey, secondKey]));
        // Two edits, so maybe two bundles: wait until the node has applied the one with both.
        const newChecksum = await until(
          "the node to apply both edits",
          async () => {
            const c = await cluster.groupChecksum();
            if (!c || c === oldChecksum || (await getNode())?.metadata.annotations?.[NODE_KEYS.checksum] !== c) {
              const s = await status();
              throw new Error(
                `not yet; the node's last run: ${s.lastRun?.outcome} ${s.lastRun?.reason ?? ""} ${s.lastRun?.error ?? ""}`,
              );
            }
            const keys = await sh(`cat /home/deckhouse/${NODE_USER}/.ssh/authorized_keys`);
            const config = await sh("cat /var/lib/kubelet/config.yaml");
            return keys.includes(secondKey) && /^maxPods: 60$/m.test(config) && c;
          },
          120_000,
        );
        const st = await status();
        const appliedMs = Date.parse(st.lastRun.finishedAt) - editedAt;
        t.comment(`change: edit → applied on the node ${(appliedMs / 1000).toFixed(1)} s`);
        t.equal(st.lastRun.checksum, newChecksum, "the node applied the new bundle");
        t.match(
          await sh("cat /var/lib/kubelet/config.yaml"),
          /^maxPods: 60$/m,
          "the kubelet's configuration has the new maxPods",
        );
        t.match(
          await sh(`cat /home/deckhouse/${NODE_USER}/.ssh/authorized_keys`),
          secondKey,
          "the NodeUser has its new key",
        );
        const after = Object.fromEntries(await Promise.all(units.map(async (u) => [u, await mainPid(u)])));
        t.not(after.kubelet, before.kubelet, "the kubelet restarted");
        for (const u of units.slice(1)) t.equal(after[u], before[u], `${u} did not`);
        await until(
          "the kubelet to report 60 pods",
          async () => (await getNode())?.status?.capacity?.pods === "60",
          60_000,
        );
        t.pass("the Node's capacity says 60 pods");
        const pod = await cp.admin.request<{
          status: { phase: string; containerStatuses: { restartCount: number }[] };
        }>("GET", "/api/v1/namespaces/default/pods/hello");
        t.equal(pod.status.containerStatuses[0]?.restartCount, 0, "the pod kept running");
      },
    );

    await t.test(
      "early OOM under real memory pressure in a pod: the pod the kubelet would evict first is killed and restarts",
      { skip: !joined && "no join" },
      async (t) => {
        // Real pods under the real kubelet, in the node's cgroup v1 tree: a Burstable pod whose
        // 64 MiB limit is below the 160 MiB file its readers keep re-reading thrashes (the
        // stall shows in /proc/pressure/memory); beside it a Guaranteed pod, a
        // system-node-critical pod holding memory far above its request, and the BestEffort
        // `hello`. The thrasher keeps a marker in its emptyDir, so after its restart it stays calm.
        type PodStatus = {
          metadata: { uid: string };
          status: {
            phase: string;
            containerStatuses?: {
              restartCount: number;
              ready: boolean;
              lastState?: { terminated?: { reason?: string; exitCode?: number } };
            }[];
          };
        };
        const pods = [
          e2ePod(name, "default", "eo-calm", {
            containers: [
              e2eContainer("exec sleep 3600", {
                requests: { cpu: "50m", memory: "32Mi" },
                limits: { cpu: "50m", memory: "32Mi" },
              }),
            ],
          }),
          e2ePod(name, "kube-system", "eo-critical", {
            priorityClassName: "system-node-critical",
            containers: [
              e2eContainer("head -c 41943040 /dev/zero >/dev/shm/held && exec sleep 3600", {
                requests: { memory: "8Mi" },
              }),
            ],
          }),
          thrasherPod(name),
        ];
        const at = (p: { metadata: { name: string; namespace: string } }) =>
          `/api/v1/namespaces/${p.metadata.namespace}/pods/${p.metadata.name}`;
        t.teardown(async () => {
          for (const p of pods)
            await cp.admin.request("DELETE", `${at(p)}?gracePeriodSeconds=0`).catch(() => undefined);
        });
        const calmGroup = nodeGroup({ maxPods: 60 });
        for (const p of pods.slice(0, 2)) await cluster.apply(p);
        const get = (p: (typeof pods)[number]) => cp.admin.request<PodStatus>("GET", at(p));
        for (const p of pods.slice(0, 2)) {
          await until(`${p.metadata.name} running`, async () => (await get(p)).status.phase === "Running", 120_000);
        }
        const thrasher = pods[2] as (typeof pods)[number];
        await cluster.apply(thrasher);
        await until(
          "the thrasher to thrash",
          async () => (await cp.kubectl(["logs", "eo-thrasher"])).includes(THRASHING),
          120_000,
        );
        const uid = (await get(thrasher)).metadata.uid;
        // Only now the group's thresholds for this busy machine (docs/testing.md: one thrashing
        // cgroup is a few percent of the node-wide stall here, not the 30% a whole node
        // thrashing reaches): with the thrasher already running, no earlier trigger can pick
        // another pod for want of it.
        const before = await cluster.groupChecksum();
        await cluster.apply(nodeGroup({ maxPods: 60 }, { earlyOom: THRASHER_EARLY_OOM }));
        const earlyOom = () => sh("curl -sS --max-time 5 http://127.0.0.1:9650/early-oom").then((x) => JSON.parse(x));
        await until(
          "the agent to follow the group's early OOM settings",
          async () => (await cluster.groupChecksum()) !== before && (await earlyOom()).config?.fullStallPercent === 2,
          120_000,
        );
        const configuredAt = Date.now();
        const killed = await until(
          "early OOM to kill the thrasher",
          async () => {
            const s = await earlyOom();
            return s.lastAction?.action === "kill" && s;
          },
          180_000,
          250,
        );
        const a = killed.lastAction;
        t.comment(
          `early OOM: ${a.trigger}; ${a.result} (${((Date.parse(a.at) - configuredAt) / 1000).toFixed(1)} s after the settings applied)`,
        );
        t.equal(a.pod, "default/eo-thrasher", "the victim is the thrashing pod");
        t.equal(a.uid, uid, "that very pod");
        t.match(a.trigger, /full stall .* held 2\.\d+ s/, "the trigger held its duration");
        const events = await until(
          "the EarlyOOMKilled Event",
          async () => {
            const e = await cp.admin.request<{ items: { involvedObject: { name: string; uid: string } }[] }>(
              "GET",
              `/api/v1/events?fieldSelector=${encodeURIComponent(`reason=${EVENTS.earlyOomKilled}`)}`,
            );
            return e.items.length > 0 && e.items;
          },
          60_000,
        );
        t.same(
          events.map((e) => e.involvedObject.name),
          ["eo-thrasher"],
          `${EVENTS.earlyOomKilled}: on the thrasher, on no other pod`,
        );
        const restarted = await until(
          "the thrasher to restart and be Ready",
          async () => {
            const st = (await get(thrasher)).status.containerStatuses?.[0];
            return st && st.restartCount >= 1 && st.ready && st;
          },
          120_000,
        );
        t.equal(restarted.restartCount, 1, "it restarted once (restartPolicy Always)");
        t.not(restarted.lastState?.terminated?.reason, "OOMKilled", "the kernel's OOM killer never acted");
        t.equal(restarted.lastState?.terminated?.exitCode, 137, "its processes died of SIGKILL");
        t.match(await cp.kubectl(["logs", "eo-thrasher"]), CALM_AFTER_RESTART, "and it runs calm");
        for (const p of pods.slice(0, 2)) {
          const st = (await get(p)).status.containerStatuses?.[0];
          t.equal(st?.restartCount, 0, `${p.metadata.name} was left alone`);
        }
        const hello = await cp.admin.request<PodStatus>("GET", "/api/v1/namespaces/default/pods/hello");
        t.equal(hello.status.containerStatuses?.[0]?.restartCount, 0, "hello (BestEffort, tiny) was left alone");
        t.equal((await earlyOom()).actions?.kill, 1, "one kill in all");

        // Back to the defaults, and the pods gone, for the scenarios after this one.
        for (const p of pods) await cp.admin.request("DELETE", `${at(p)}?gracePeriodSeconds=0`);
        const tuned = await cluster.groupChecksum();
        await cluster.apply(calmGroup);
        await until(
          "the node to apply the group without the test's thresholds",
          async () => {
            const c = await cluster.groupChecksum();
            return c !== tuned && (await getNode())?.metadata.annotations?.[NODE_KEYS.checksum] === c;
          },
          120_000,
        );
      },
    );

    await t.test("cleanup_static_node.sh", { skip: !joined && "no join" }, async (t) => {
      const script = await sh(`cat ${PATHS.stateDir}/cleanup_static_node.sh`);
      const refused = await runScript(machine, "cleanup_static_node.sh", script);
      runs["cleanup without the flag"] = refused;
      t.equal(refused.exitCode, 1, "without its flag it refuses");
      t.match(refused.output, `Run it with ${CLEANUP_FLAG} to proceed`);
      t.equal(
        (await machine.exec(["systemctl", "is-active", "bashible"])).stdout.trim(),
        "active",
        "and changed nothing",
      );

      // Deckhouse's procedure: take the node out of the cluster, then clean the machine.
      await cp.kubectl(["drain", name, "--ignore-daemonsets", "--delete-emptydir-data", "--force", "--timeout=120s"]);
      await cp.kubectl(["delete", "node", name]);
      // As if an install had been killed under the package step's policy-rc.d: cleanup takes it
      // too (the machine diff below would show it).
      await machine.writeFile(POLICY_RC_D, `#!/bin/sh\n${DENY_STARTS_MARKER}\nexit 101\n`);
      const bootsBefore = machine.boots;
      const vBefore = fifo.count("V");
      const run = await runScript(machine, "cleanup_static_node.sh", script, [CLEANUP_FLAG]);
      runs.cleanup = run;
      t.equal(run.exitCode, 0, "with its flag it cleans up");
      t.match(run.output, "cleanup complete; rebooting in 5 seconds");
      t.ok(fifo.count("V") > vBefore, "stopping the agent disarmed the watchdog (magic close)");
      // systemd itself opens /dev/watchdog while it reboots (RebootWatchdogSec): the stand-in
      // stays readable until the old boot is gone, as a device would.
      await machine.waitBoot(bootsBefore + 1, 120_000).catch(async (err) => {
        const r = await machine.exec(["sh", "-c", "ps -eo pid,stat,args; systemctl list-jobs --no-pager"]);
        throw new Error(`${(err as Error).message}\n${r.stdout}${r.stderr}\n${(await machine.bootLog()).slice(-3000)}`);
      });
      fifo.close();
      t.pass("the machine rebooted");
      t.equal(await getNode(), undefined, "the Node object is gone and nothing brought it back");

      const again = await runScript(machine, "cleanup_static_node.sh", script, [CLEANUP_FLAG]);
      runs["cleanup again"] = again;
      t.equal(again.exitCode, 0, "cleanup twice is safe");
      await machine.waitBoot(bootsBefore + 2, 120_000);

      // What is left: this machine against the root it came from, and against a machine from
      // the same root that never joined (what booting and the operator's /etc/hosts change alone).
      const ours = await machine.diff();
      const norm = async (node: NspawnNode, d: NodeDiff) => {
        const id = (await readFile(path.join(node.rootfs, "etc/machine-id"), "utf8")).trim();
        return d.entries.map(
          (e) =>
            `${e.kind} ${e.path.replaceAll(id, "<machine-id>").replace(/systemd-private-[0-9a-f]+-(.+)-[A-Za-z0-9]+/, "systemd-private-*-$1-*")}`,
        );
      };
      const pristine = await world.machine("e2e-never-joined");
      const baseline = await pristine.diff();
      const base = new Set(await norm(pristine, baseline));
      await pristine.dispose();
      const all = await norm(machine, ours);
      t.comment(`the machine against its root (${all.length} differences):\n  ${all.join("\n  ")}`);
      const traces = all.filter((e) => !base.has(e));
      t.comment(`not on a machine that never joined:\n  ${traces.join("\n  ") || "(none)"}`);
      // useradd/userdel keep the previous version of each account file as FILE-: they still
      // hold the removed NodeUser's line (the live files are byte for byte the originals).
      const shadowBackups = /^(changed|added) \/etc\/(passwd|group|shadow|gshadow|subuid|subgid)-$/;
      // The package manager's own bookkeeping after installing and purging the packages the
      // agent installed: its lists and caches, its logs, dpkg's database and backups of it,
      // debconf's and the dynamic linker's caches. No file of the packages themselves.
      const packageBookkeeping =
        /^(changed|added|deleted) \/(var\/lib\/apt|var\/cache\/apt|var\/log\/apt|var\/lib\/dpkg|var\/cache\/debconf|var\/cache\/ldconfig|var\/log\/dpkg\.log|var\/log\/alternatives\.log|etc\/ld\.so\.cache)(\/|$)/;
      // Packages the machine had that an install upgraded (a newer libssl3 for curl, say) stay
      // upgraded: their files may differ, nothing else may.
      const now = await versions();
      const upgraded = [...bareVersions].filter(([p, v]) => now.has(p) && now.get(p) !== v).map(([p]) => p);
      t.same([...now.keys()].sort(), [...bareVersions.keys()].sort(), "the machine has exactly the packages it had");
      const upgradedFiles = new Set(
        upgraded.length
          ? (await sh(`dpkg -L ${upgraded.join(" ")}`))
              .trim()
              .split("\n")
              .map((f) => `changed ${f}`)
          : [],
      );
      t.comment(`upgraded while joined: ${upgraded.join(", ") || "none"}`);
      t.same(
        traces.filter((e) => !shadowBackups.test(e) && !packageBookkeeping.test(e) && !upgradedFiles.has(e)),
        [],
        "no file of the agent, Kubernetes or the packages the agent installed is left",
      );
      t.same(ours.users, { added: [], removed: [], changed: [] }, "users as before");
      t.same(ours.groups, { added: [], removed: [], changed: [] }, "groups as before");
      t.same(ours.units, baseline.units, "units as before");
    });

    await t.test("bootstrap again: the machine rejoins", { skip: !joined && "no join" }, async (t) => {
      fifo = watchdog();
      const { run, readyMs, node } = await joinMachine(cluster, machine, await cluster.bootstrapScript());
      runs["bootstrap again"] = run;
      t.equal(run.exitCode, 0, "bootstrap.sh succeeds again");
      t.ok(node, `the Node is Ready again (${(readyMs / 1000).toFixed(1)} s after bootstrap.sh started)`);
      t.equal(node?.metadata.labels?.[NODE_KEYS.group], GROUP, "with its group");
      const checksum = await cluster.groupChecksum();
      await until(
        "the checksum annotation",
        async () => (await getNode())?.metadata.annotations?.[NODE_KEYS.checksum] === checksum,
        60_000,
      );
      t.pass("and the current checksum");
    });
  },
);
