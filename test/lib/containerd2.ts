// containerd 2.x for tests: Debian ships containerd 1.x only, so configuration version 3 is proven
// against a containerd 2 built from its Go module (once, into the cache, when Go is present).
import { execFileSync } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, rename, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";

export const CONTAINERD2_VERSION = "v2.1.4";
const CACHE_ROOT = process.env.BASHIBLE_TEST_CACHE ?? "/var/cache/bashible-test";

/** Path of a containerd 2 binary, building it the first time; undefined without Go. */
export async function containerd2(log: (s: string) => void = () => undefined): Promise<string | undefined> {
  const out = path.join(CACHE_ROOT, `containerd-${CONTAINERD2_VERSION}`, "containerd");
  if (existsSync(out)) return out;
  const goPath = [process.env.PATH ?? "", "/usr/local/go/bin"].join(":");
  const go = goPath
    .split(":")
    .map((d) => path.join(d, "go"))
    .find((p) => p.startsWith("/") && existsSync(p));
  if (!go) return undefined;
  log(`building containerd ${CONTAINERD2_VERSION} from its Go module (once; cached in ${path.dirname(out)})`);
  const work = await mkdtemp(path.join(os.tmpdir(), "bashible-containerd2-"));
  try {
    const env = { ...process.env, PATH: goPath, CGO_ENABLED: "0", GOFLAGS: "-mod=mod" };
    const run = (args: string[]) => execFileSync(go, args, { cwd: work, env, stdio: ["ignore", "pipe", "pipe"] });
    run(["mod", "init", "local/containerd2"]);
    run(["get", `github.com/containerd/containerd/v2@${CONTAINERD2_VERSION}`]);
    await mkdir(path.dirname(out), { recursive: true });
    run([
      "build",
      "-trimpath",
      "-tags",
      "no_btrfs no_devmapper no_zfs",
      "-ldflags",
      "-s -w",
      "-o",
      `${out}.tmp`,
      "github.com/containerd/containerd/v2/cmd/containerd",
    ]);
    await rename(`${out}.tmp`, out);
  } finally {
    await rm(work, { recursive: true, force: true });
  }
  return out;
}
