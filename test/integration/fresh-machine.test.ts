// The README's Quick start on a fresh machine, as a new user runs it: a debootstrapped bookworm
// root (minbase) where the README's prerequisite line is run as written and nothing else is
// installed; then, in a copy of this checkout, the README's first command as written
// (`npm ci && npm run demo`) passes, every EBADENGINE warning npm prints is for a range the
// pinned Node 24 satisfies, the demo leaves docker-registry's own service off, `npm start --`
// runs the agent; and of the second (`bash .ci/run`) its check: it names what is missing (Go)
// before installing anything, says an old Go is too old, and passes once Go is there.
//
// The root shares the host's network (npm reaches registry.npmjs.org, apt the mirror); apt's
// downloads and npm's cache are kept outside the repository, under $BASHIBLE_TEST_CACHE.
import t from "tap";
import { execFileSync } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdir, readFile, writeFile, chmod } from "node:fs/promises";
import path from "node:path";
import { CACHE_ROOT, debianRoot, MINIMAL_PACKAGES } from "../../scripts/lib/debian-root.ts";
import { rootSandbox } from "../../scripts/lib/nspawn-node.ts";

const REPO = path.resolve(import.meta.dirname, "../..");
const PINNED_NODE = (
  JSON.parse(await readFile(path.join(REPO, "package.json"), "utf8")) as {
    devDependencies: { node: string };
  }
).devDependencies.node;

/** The Quick start's shell lines, as the README writes them (comments dropped). */
export async function quickStart(): Promise<{ prerequisites: string; commands: string[] }> {
  const readme = await readFile(path.join(REPO, "README.md"), "utf8");
  const section = readme.slice(
    readme.indexOf("## Quick start"),
    readme.indexOf("\n## ", readme.indexOf("## Quick start") + 3),
  );
  const blocks = [...section.matchAll(/```sh\n([\s\S]*?)```/g)].map((m) =>
    (m[1] ?? "")
      .split("\n")
      .map((l) => l.replace(/\s+#.*$/, "").trim())
      .filter(Boolean),
  );
  const prerequisites = blocks.find((b) => b.some((l) => l.includes("apt-get install")))?.join(" && ");
  const commands = blocks.find((b) => b.some((l) => l.startsWith("npm ci")));
  if (!prerequisites || !commands) throw new Error("README.md's Quick start has no prerequisite line or no commands");
  return { prerequisites, commands };
}

/** Whether a version satisfies an npm engines range (the forms packages use: ||, >= > < <= =, ^, ~, x, *). */
export function satisfies(version: string, range: string): boolean {
  const parse = (v: string) =>
    v
      .replace(/^[v=]/, "")
      .split(".")
      .map((p) => (/^\d+$/.test(p) ? Number(p) : Number.NaN));
  const cmp = (a: number[], b: number[]) => {
    for (let i = 0; i < 3; i++) if ((a[i] ?? 0) !== (b[i] ?? 0)) return (a[i] ?? 0) - (b[i] ?? 0);
    return 0;
  };
  const v = parse(version);
  return range.split("||").some((alt) =>
    alt
      .trim()
      .replace(/(>=|<=|>|<|=|\^|~)\s+/g, "$1")
      .split(/\s+/)
      .filter(Boolean)
      .every((c) => {
        const m = /^(>=|<=|>|<|=|\^|~)?(.*)$/.exec(c);
        const op = m?.[1] ?? "";
        const raw = (m?.[2] ?? "").replace(/\.[x*]/gi, "");
        if (raw === "*" || raw === "x" || raw === "") return true;
        const want = parse(raw);
        if (want.some(Number.isNaN)) throw new Error(`cannot read engines range '${range}'`);
        const [maj = 0, min = 0] = want;
        const d = cmp(v, want);
        switch (op) {
          case ">=":
            return d >= 0;
          case ">":
            return d > 0;
          case "<":
            return d < 0;
          case "<=":
            return d <= 0;
          case "^":
            return d >= 0 && (maj > 0 ? (v[0] ?? 0) === maj : (v[1] ?? 0) === min);
          case "~":
            return d >= 0 && (v[0] ?? 0) === maj && (want.length < 2 || (v[1] ?? 0) === min);
          default:
            // "18" or "18.2": that major (and minor); "18.2.1": exactly.
            return want.every((p, i) => v[i] === p);
        }
      }),
  );
}

t.test("the engines range reader", async (t) => {
  t.ok(satisfies("24.21.0", ">=24 <25"));
  t.notOk(satisfies("18.19.0", ">=24 <25"));
  t.ok(satisfies("24.21.0", "^20.17.0 || >=22.9.0"));
  t.notOk(satisfies("18.19.0", "^20.17.0 || >=22.9.0"));
  t.ok(satisfies("24.21.0", ">= 18"));
  t.notOk(satisfies("24.21.0", "^22.0.0"));
  t.ok(satisfies("24.21.0", "24.x"));
  t.throws(() => satisfies("24.21.0", ">=banana"));
});

if (process.getuid?.() !== 0) {
  t.comment("the machine itself needs root (debootstrap, overlayfs, systemd-nspawn)");
} else {
  t.setTimeout(60 * 60_000);
  const { prerequisites, commands } = await quickStart();
  const fresh = await debianRoot({ packages: MINIMAL_PACKAGES, log: (l) => t.comment(l) });
  const sb = await rootSandbox(fresh.dir);
  t.teardown(() => sb.dispose());
  const caches = {
    apt: path.join(CACHE_ROOT, "fresh-machine/apt-archives"),
    npm: path.join(CACHE_ROOT, "fresh-machine/npm"),
  };
  for (const d of Object.values(caches)) await mkdir(d, { recursive: true });
  const rwBinds = [`${caches.apt}:/var/cache/apt/archives`, `${caches.npm}:/root/.npm`];
  // The machine's own network trust goes in as its resolv.conf does: where HTTPS leaves through a
  // TLS-inspecting proxy (this test machine's), npm needs that proxy's CA. That is the network's
  // doing, not a prerequisite of the project; a machine on an open network needs none of it.
  const hostCA = process.env.NODE_EXTRA_CA_CERTS;
  const networkTrust: { binds: string[]; env: Record<string, string> } =
    hostCA && existsSync(hostCA)
      ? {
          binds: [`${hostCA}:/etc/bashible-test-network-ca.crt`],
          env: {
            NODE_EXTRA_CA_CERTS: "/etc/bashible-test-network-ca.crt",
            npm_config_cafile: "/etc/bashible-test-network-ca.crt",
          },
        }
      : { binds: [], env: {} };
  const CHECKOUT = "/root/bashible";
  const sh = (script: string, o: { binds?: string[]; timeoutMs?: number } = {}) =>
    sb.run(["sh", "-c", script], {
      rwBinds,
      binds: [...networkTrust.binds, ...(o.binds ?? [])],
      cwd: CHECKOUT,
      env: {
        DEBIAN_FRONTEND: "noninteractive",
        HOME: "/root",
        PATH: "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        ...networkTrust.env,
      },
      timeoutMs: o.timeoutMs ?? 10 * 60_000,
    });
  const installed = async (pkg: string) =>
    (await sh(`dpkg-query -W -f='\${Status}' ${pkg} 2>/dev/null`)).stdout.includes("install ok installed");

  // The checkout as a user has it: every file git knows or would add, nothing it ignores.
  const files = execFileSync("git", ["ls-files", "-z", "--cached", "--others", "--exclude-standard"], { cwd: REPO })
    .toString()
    .split("\0")
    .filter((f) => f && existsSync(path.join(REPO, f)));
  await mkdir(path.join(sb.rootfs, CHECKOUT), { recursive: true });
  execFileSync(
    "sh",
    ["-c", `tar -C "$1" --null -T - -cf - | tar -C "$2" -xf -`, "sh", REPO, path.join(sb.rootfs, CHECKOUT)],
    {
      input: files.join("\0"),
    },
  );

  t.test(`the README's prerequisites install as written: ${prerequisites}`, async (t) => {
    t.notOk(await installed("nodejs"), "a fresh minbase machine has no Node");
    const r = await sh(prerequisites, { timeoutMs: 30 * 60_000 });
    t.equal(r.exitCode, 0, (r.stderr || r.stdout).slice(-3000));
    const v = await sh("node --version && npm --version");
    t.equal(v.exitCode, 0);
    t.comment(`the machine's Node and npm: ${v.stdout.trim().replace("\n", ", ")}`);
  });

  const first = commands[0] as string;
  t.test(`the README's first command runs as written: ${first}`, async (t) => {
    t.equal(first, "npm ci && npm run demo");
    // After it, in the same machine: is anything serving :5000, which Debian's docker-registry
    // service would (LISTEN is state 0A in /proc/net/tcp*), and what do its boot-time links say?
    const r = await sh(
      `${first}; rc=$?; echo "after: port-5000-listeners=$(grep -ci ':1388 [0-9A-F:]* 0A' /proc/net/tcp /proc/net/tcp6 | awk -F: '{s+=$2} END {print s}')"; echo "after: rc-links=$(ls /etc/rc2.d | grep docker-registry)"; echo "after: systemd=$(systemctl is-enabled docker-registry.service 2>&1)"; echo "after: policy-rc.d $(test -e /usr/sbin/policy-rc.d && echo present || echo absent)"; exit $rc`,
      { timeoutMs: 40 * 60_000 },
    );
    const out = `${r.stdout}\n${r.stderr}`;
    t.equal(r.exitCode, 0, out.slice(-4000));
    t.match(r.stdout, /demo finished: plan exit 2, once exit 0, second plan exit 0/);

    await t.test("every EBADENGINE warning is for a range the pinned Node satisfies", async (t) => {
      const warned = [
        ...out.matchAll(/package: '([^']+)',\s*npm warn EBADENGINE\s+required: \{ node: '([^']+)'/gi),
      ].map((m) => ({ pkg: m[1] as string, range: m[2] as string }));
      const all = out.match(/EBADENGINE Unsupported engine/gi)?.length ?? 0;
      t.comment(`${all} EBADENGINE warnings from npm ci on the machine's Node`);
      t.equal(warned.length, all, "each is about the node version (none about something else)");
      for (const w of warned)
        t.ok(satisfies(PINNED_NODE, w.range), `${w.pkg} needs node ${w.range}: Node ${PINNED_NODE} satisfies it`);
      t.notMatch(out, /npm (ERR|error)/, "and npm reported no error");
    });

    await t.test(
      "docker-registry's own service stays off: nothing serves :5000, nothing starts it at boot",
      async (t) => {
        t.match(out, "policy-rc.d denied execution of start", "the install started no service");
        t.match(out, "demo: left docker-registry's own service disabled and stopped");
        t.match(r.stdout, "after: port-5000-listeners=0");
        t.match(r.stdout, /after: rc-links=K\d\ddocker-registry\n/, "its sysv link is a stop link");
        t.match(r.stdout, "after: systemd=disabled");
        t.match(r.stdout, "after: policy-rc.d absent", "the demo's policy-rc.d is gone again");
      },
    );
  });

  t.test("npm start -- <command> runs the agent on the pinned Node", async (t) => {
    const r = await sh("npm -s start -- version");
    t.equal(r.exitCode, 0, r.stderr);
    t.match(r.stdout, new RegExp(`^bashible \\d+\\.\\d+\\.\\d+ \\(node v${PINNED_NODE.replace(/\./g, "\\.")},`));
    const x = await sh("npx node agent/main.ts version");
    t.equal(x.exitCode, 0, x.stderr);
  });

  const second = commands[1] as string;
  t.test(`the README's second command checks first: ${second}`, async (t) => {
    t.equal(second, "bash .ci/run");
    await t.test("without Go it names Go and how to get it, and installs nothing", async (t) => {
      const r = await sh(second, { timeoutMs: 60_000 });
      t.equal(r.exitCode, 1);
      t.match(
        r.stderr,
        "ci: this machine lacks what .ci/run cannot install itself:\n  go: builds the Kubernetes test binaries and crictl; install Go >= 1.24 from https://go.dev/dl",
      );
      t.notMatch(r.stderr, /^\s+(node|npm|root|apt-get):/m, "node, npm, root and apt-get are there");
      t.notOk(await installed("debootstrap"), "nothing of .ci/run's apt line was installed");
      const check = await sh(`${second} --check`);
      t.equal(check.exitCode, 1);
      t.equal(check.stderr, r.stderr, "--check says the same");
    });
    await t.test("a Go older than 1.24 (Debian 12's golang-go is 1.19) is named as too old", async (t) => {
      const fake = path.join(sb.rootfs, "usr/local/bin/go");
      await writeFile(fake, '#!/bin/sh\n[ "$1 $2" = "env GOVERSION" ] && echo go1.19.8\n');
      await chmod(fake, 0o755);
      const r = await sh(`${second} --check`);
      t.equal(r.exitCode, 1);
      t.match(r.stderr, "go: /usr/local/bin/go is go1.19.8, older than 1.24 (Debian 12's golang-go is 1.19)");
    });
    const hostGo = "/usr/local/go";
    await t.test(
      "with Go from go.dev in /usr/local/go the check passes",
      { skip: !existsSync(`${hostGo}/bin/go`) && `no ${hostGo} on this machine` },
      async (t) => {
        const r = await sh(`${second} --check`, { binds: [`${hostGo}:${hostGo}`] });
        t.equal(r.exitCode, 0, r.stderr);
        t.match(
          r.stdout,
          /^ci: prerequisites present: root, apt-get, node v\d+\.\d+\.\d+, npm \d+\.\d+\.\d+, go1\.\d+/,
        );
      },
    );
  });
}
