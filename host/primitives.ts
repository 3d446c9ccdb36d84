// How the engine carries out each primitive change. Steps never do these themselves, so every
// write is confined and atomic, every command is logged and killable, and every unit action
// goes through one place that a sandbox can record.
import type { Host } from "./host.ts";
import type { Primitive } from "./changes.ts";
import type { Flags } from "./flags.ts";

export interface ApplyContext {
  logFile?: string;
  secrets: string[];
  signal?: AbortSignal;
  flags: Flags;
}

export async function applyPrimitive(host: Host, c: Primitive, ctx: ApplyContext): Promise<void> {
  switch (c.kind) {
    case "file": {
      if (c.action === "delete") return host.remove(c.path);
      if (c.content === undefined || c.mode === undefined) throw new Error(`file change for ${c.path} has no content`);
      const check = c.check;
      await host.writeFile(
        c.path,
        c.content,
        { mode: c.mode, uid: c.uid, gid: c.gid },
        check
          ? {
              check: async (candidate) => {
                await host.mustRun(
                  check.map((a) => (a === "{}" ? candidate : a)),
                  { logFile: ctx.logFile, secrets: ctx.secrets, signal: ctx.signal, timeoutMs: 60_000 },
                );
              },
            }
          : {},
      );
      return;
    }
    case "dir":
      return host.mkdir(c.path, { mode: c.mode, uid: c.uid ?? 0, gid: c.gid ?? 0 });
    case "symlink":
      if (c.action === "delete") return host.remove(c.path);
      return host.symlink(c.path, c.target);
    case "command":
      if (c.recordInSandbox && host.sandbox) return host.recordSandboxAction(c.argv.join(" "));
      await host.mustRun(c.argv, {
        input: c.input,
        env: c.env,
        cwd: c.cwd,
        timeoutMs: c.timeoutMs ?? 10 * 60_000,
        logFile: ctx.logFile,
        secrets: [...ctx.secrets, ...(c.secrets ?? [])],
        signal: ctx.signal,
      });
      return;
    case "unit":
      await host.systemctl(c.action, c.action === "daemon-reload" ? undefined : c.unit);
      return;
    case "service":
      await host.systemctl(c.action, c.unit);
      return;
    case "flag":
      if (c.action === "set") await ctx.flags.set(c.name, c.why);
      else await ctx.flags.unset(c.name);
      return;
  }
}
