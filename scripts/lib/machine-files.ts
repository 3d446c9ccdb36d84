// Files into a test machine (an nspawn node or a VM) through the one way both run a command
// inside: tar on this side, tar in the machine, so modes are kept and the file lands in the
// machine's own mounts (/tmp, /run), not in the root on disk below them.
import { type ChildProcess, spawn } from "node:child_process";
import { stat } from "node:fs/promises";
import path from "node:path";
import type { ExecOptions, ExecResult } from "./nspawn-node.ts";

/** Runs argv inside the machine: the process (its stdin piped when asked) and its result. */
export type Inside = (
  argv: string[],
  o?: ExecOptions & { pipeStdin?: boolean },
) => { child: ChildProcess; done: Promise<ExecResult> };

/** Copies a file or a directory's contents from this machine to `dest` inside. */
export async function copyInto(inside: Inside, name: string, src: string, dest: string): Promise<void> {
  const st = await stat(src);
  const [cdir, what] = st.isDirectory() ? [src, "."] : [path.dirname(src), path.basename(src)];
  const target = st.isDirectory() ? dest : path.dirname(dest);
  const tar = spawn("tar", ["-C", cdir, "-cf", "-", what], { stdio: ["ignore", "pipe", "pipe"] });
  const untar = inside(
    [
      "sh",
      "-c",
      st.isDirectory()
        ? 'mkdir -p "$1" && tar -C "$1" -xf - --no-same-owner'
        : 'mkdir -p "$1" && tar -C "$1" -xf - --no-same-owner && if [ "$2" != "$3" ]; then mv -f "$1/$2" "$1/$3"; fi',
      "sh",
      target,
      what,
      path.basename(dest),
    ],
    { pipeStdin: true },
  );
  tar.stdout.pipe(untar.child.stdin as NodeJS.WritableStream);
  const [r, tarCode] = await Promise.all([
    untar.done,
    new Promise<number>((res) => tar.once("close", (code) => res(code ?? 1))),
  ]);
  if (tarCode !== 0 || r.exitCode !== 0) throw new Error(`${name}: copy ${src} → ${dest} failed: ${r.stderr}`);
}

/** Writes `content` to `dest` inside (parents made), with `mode`. */
export async function writeInto(inside: Inside, name: string, dest: string, content: string | Buffer, mode = 0o644) {
  const r = await inside(
    ["sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1" && chmod "$2" "$1"', "sh", dest, mode.toString(8)],
    { input: content },
  ).done;
  if (r.exitCode !== 0) throw new Error(`${name}: write ${dest} failed: ${r.stderr}`);
}
