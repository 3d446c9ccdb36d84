// The shell scripts the server renders parse as bash, and cleanup refuses to run without its
// confirmation flag (so a stray invocation destroys nothing).
import t from "tap";
import { execFile } from "node:child_process";
import { mkdtemp, writeFile, rm, readdir } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { loadConfigDir } from "../../cluster/sources/directory.ts";
import { renderGroup } from "../../cluster/render/render.ts";
import { manualBootstrapData } from "../../cluster/server/bootstrap-secrets.ts";
import type { RenderInputs } from "../../cluster/render/inputs.ts";

const run = promisify(execFile);
const EXAMPLE = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../examples/cluster");
const inputs = (await loadConfigDir(EXAMPLE)).snapshot.inputs as RenderInputs;
const rendered = renderGroup(inputs.nodeGroups[0]!, inputs, Date.now());
const manual = manualBootstrapData("worker", inputs.context, {
  token: "abcdef.0123456789abcdef",
  expiration: "2030-01-01T00:00:00Z",
});
const tmp = await mkdtemp(path.join(os.tmpdir(), "bashible-scripts-"));
t.teardown(() => rm(tmp, { recursive: true, force: true }));

const scripts: Record<string, string> = {
  "cleanup_static_node.sh": (rendered.bashible.data as Record<string, string>)["cleanup_static_node.sh"]!,
  "bootstrap-phase2.sh": rendered.bootstrap.bootstrap as string,
  "bootstrap.sh": manual["bootstrap.sh"],
};

for (const [name, text] of Object.entries(scripts)) {
  t.test(`${name} is valid bash`, async (t) => {
    const file = path.join(tmp, name);
    await writeFile(file, text);
    await run("bash", ["-n", file]);
    t.match(text, /^#!\/bin\/bash\n/);
  });
}

t.test("cleanup_static_node.sh refuses to run without the confirmation flag (in a sealed namespace)", async (t) => {
  if (process.getuid?.() !== 0) {
    t.comment("skipped: needs root (the script runs in its own mount and PID namespace, every mount read-only)");
    return;
  }
  const file = path.join(tmp, "cleanup.sh");
  await writeFile(file, scripts["cleanup_static_node.sh"]!);
  const before = await readdir(tmp);
  // Never on the CI host as it is: in a private mount namespace with every mount read-only and a
  // PID namespace of its own, a script that failed to refuse could neither delete nor kill.
  const sealed = `for m in $(awk '{print $2}' /proc/self/mounts | sort -r); do mount -o remount,bind,ro "$m" 2>/dev/null; done; touch /root/.writable-probe 2>/dev/null && { echo "not sealed" >&2; exit 99; }; exec bash ${file} --yes`;
  const err = await run("unshare", [
    "--mount",
    "--propagation",
    "private",
    "--pid",
    "--fork",
    "--mount-proc",
    "sh",
    "-c",
    sealed,
  ]).catch((e) => e);
  t.equal(err.code, 1, "exits 1: refused");
  t.match(err.stderr, /--yes-i-am-sane-and-i-understand-what-i-am-doing/);
  t.notMatch(err.stderr, /Read-only file system/, "it tried to change nothing");
  t.same(await readdir(tmp), before);
});

t.test("bootstrap.sh embeds the CA and token, and never skips TLS verification", async (t) => {
  const s = scripts["bootstrap.sh"]!;
  t.match(s, /-----BEGIN CERTIFICATE-----/);
  t.match(s, /abcdef\.0123456789abcdef/);
  t.notMatch(s, /--insecure|-k /);
  t.notMatch(scripts["bootstrap-phase2.sh"]!, /--insecure|-k /);
  t.match(manual["cloud-config"], /path: \/var\/lib\/bashible\/bootstrap-token/);
});

t.test("phase 2 reads the agent package from the served bashibles JSON without jq", async (t) => {
  const { serialize } = await import("../../cluster/render/render.ts");
  const file = path.join(tmp, "bashibles.json");
  await writeFile(file, serialize(rendered.bashible));
  const phase2 = scripts["bootstrap-phase2.sh"]!;
  const fieldFn = phase2.split("\n").find((l) => l.startsWith("field() {"))!;
  t.ok(fieldFn, "the script defines field()");
  const probe = `STATE=${tmp}; mv() { :; }\n${fieldFn.replace("$STATE/bashibles.json", file)}\nfor k in agent.package agent.digest agent.repository; do echo "$(field $k)"; done`;
  const { stdout } = await run("bash", ["-c", probe]);
  const data = rendered.bashible.data as Record<string, string>;
  t.same(stdout.trim().split("\n"), [data["agent.package"], data["agent.digest"], data["agent.repository"]]);
});

t.test("no curl command line carries a token (argv is readable by every user in ps)", async (t) => {
  const proxyToken = inputs.context.packagesProxy.token;
  for (const [name, text] of Object.entries(scripts)) {
    // One logical line per command: backslash continuations joined.
    const commands = text.replace(/\\\n\s*/g, " ").split("\n");
    const curls = commands.filter((l) => /\bcurl\b/.test(l) && !l.trim().startsWith("#"));
    if (name !== "cleanup_static_node.sh") t.ok(curls.length > 0, `${name} runs curl`);
    for (const c of curls) {
      t.notMatch(c, /Bearer|abcdef\.0123456789abcdef|\$TOKEN/, `${name}: ${c.trim().slice(0, 60)}…`);
      if (proxyToken) t.notOk(c.includes(proxyToken), `${name}: the proxy token is not on the command line`);
      if (/Authori[sz]ation|-H @/.test(c)) t.match(c, /-H @"\$(STATE|tmp)\/[a-z-]+"/, "the header comes from a file");
    }
  }
});

t.test("phase 2 leaves the agent's package unmarked, so step 007 never removes it", async (t) => {
  // 007 removes unlisted packages marked installed-by; the agent's own is never in its list.
  t.notMatch(scripts["bootstrap-phase2.sh"]!, />\s*"?\$PKG_DIR\/installed-by/);
  t.match(
    scripts["bootstrap-phase2.sh"]!,
    /bashible once --log-format pretty --node-group worker/,
    "progress for people",
  );
});

t.test("bootstrap.sh stops at once on a token that expired, and says so", async (t) => {
  const s = scripts["bootstrap.sh"]!;
  t.match(s, /date -u -d '2030-01-01T00:00:00Z' \+%s/, "compares the clock with the token's expiration");
  t.match(s, /the bootstrap token in this script expired at 2030-01-01T00:00:00Z/);
  t.match(s, /get a fresh bootstrap\.sh from Secret d8-cloud-instance-manager\/manual-bootstrap-for-worker/);
});

t.test("cleanup removes the agent's restart unit and CAs, and reboots when it says", async (t) => {
  const s = scripts["cleanup_static_node.sh"]!;
  t.match(s, /UNITS=\([^)]*bashible-restart\.service/);
  t.match(s, /\/usr\/local\/share\/ca-certificates\/bashible-\*\.crt/);
  t.match(s, /update-ca-certificates --fresh/);
  t.match(s, /\/usr\/libexec\/kubernetes/, "the kubelet's FlexVolume directory");
  t.match(s, /setsid -f sh -c 'sleep 5; shutdown -r now'/);
  t.notMatch(s, /^\s*shutdown -r -t/m, "systemd's shutdown ignores -t and waits a minute");
});
