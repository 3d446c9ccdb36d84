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

t.test(
  "phase 2 verifies the agent package from either proxy: the manifest chain, or the layer bashibles names",
  async (t) => {
    const { createHash } = await import("node:crypto");
    const sha = (b: Buffer | string) => `sha256:${createHash("sha256").update(b).digest("hex")}`;
    const lines = scripts["bootstrap-phase2.sh"]!.split("\n");
    const start = lines.findIndex((l) => l.startsWith("check_package() {"));
    t.ok(start >= 0, "the script defines check_package()");
    const fn = lines.slice(start, lines.indexOf("}", start) + 1).join("\n");
    const blob = Buffer.from("the agent package's layer");
    const manifest = JSON.stringify({ schemaVersion: 2, layers: [{ digest: sha(blob) }] });
    const files = {
      blob: path.join(tmp, "blob"),
      tampered: path.join(tmp, "tampered"),
      withManifest: path.join(tmp, "headers-ours"),
      bare: path.join(tmp, "headers-deckhouse"),
    };
    await writeFile(files.blob, blob);
    await writeFile(files.tampered, Buffer.concat([blob, Buffer.from("!")]));
    const b64 = Buffer.from(manifest).toString("base64");
    await writeFile(files.withManifest, `HTTP/1.1 200 OK\r\nX-Package-Manifest: ${b64}\r\nContent-Length: 25\r\n\r\n`);
    await writeFile(files.bare, `HTTP/1.1 200 OK\r\nContent-Type: application/x-gzip\r\nContent-Length: 25\r\n\r\n`);
    const check = async (headers: string, body: string, layerWanted: string) => {
      const probe = `set -Eeuo pipefail; PKG=bashible; DIGEST='${sha(manifest)}'; LAYER_WANTED='${layerWanted}'\n${fn}\ncheck_package '${headers}' '${body}' '${tmp}/manifest'`;
      return run("bash", ["-c", probe]).then(
        () => ({ ok: true, stderr: "" }),
        (err: { stderr: string }) => ({ ok: false, stderr: err.stderr }),
      );
    };
    t.same(await check(files.withManifest, files.blob, ""), { ok: true, stderr: "" }, "our proxy: the manifest chain");
    t.same(await check(files.bare, files.blob, sha(blob)), { ok: true, stderr: "" }, "Deckhouse's: the named layer");
    const tampered = await check(files.bare, files.tampered, sha(blob));
    t.notOk(tampered.ok, "a tampered layer from Deckhouse's proxy is refused");
    t.match(tampered.stderr, new RegExp(`the layer received has sha256:[0-9a-f]{64}, expected ${sha(blob)}`));
    const unnamed = await check(files.bare, files.blob, "");
    t.notOk(unnamed.ok, "no manifest and no named layer: refused");
    t.match(unnamed.stderr, /sent no X-Package-Manifest header .*set packages\.bashible\.layer in the context Secret/);
    const disagree = await check(files.withManifest, files.blob, sha("another layer"));
    t.notOk(disagree.ok, "a named layer the manifest contradicts is refused");
    t.match(disagree.stderr, /the manifest names layer sha256:[0-9a-f]{64}, bashibles\/worker sha256:/);
  },
);
