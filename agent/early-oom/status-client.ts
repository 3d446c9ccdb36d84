// How `bashible early-oom status` asks the running agent for its trigger state and settings:
// over the unix socket in the root-only /run/bashible, never over the TCP metrics port, which
// any local user can bind before the agent does. The socket and every directory above it must
// be root's (or this user's) alone, and the answer is parsed field by field: nothing that does
// not parse is used or printed.
import type { IncomingMessage } from "node:http";
import { lstat, realpath } from "node:fs/promises";
import path from "node:path";
import { type EarlyOomConfig, resolveEarlyOomConfig } from "./config.ts";
import type { TriggerPhase } from "./trigger.ts";

/** What the command uses of the agent's status() document, checked. */
export interface AgentView {
  enabled: boolean;
  dryRun: boolean;
  psi: string;
  config: EarlyOomConfig | undefined;
  sampling?: { intervalMs: number; calm: boolean; reason: string };
  trigger: { phase: TriggerPhase; reason: string; aboveForSeconds: number; cooldownRemainingSeconds: number };
  pods: { source: string; synced: boolean; count: number };
  actions: Record<"kill" | "dry-run" | "sysrq" | "none", number>;
  lastAction?: { at: string; action: string; pod?: string; result?: string };
}

export class AgentStatusError extends Error {
  override name = "AgentStatusError";
}

/** Why the socket cannot be trusted, or undefined when it can. */
export async function untrustedSocket(file: string): Promise<string | undefined> {
  const me = process.geteuid?.() ?? 0;
  const ours = (uid: number) => uid === 0 || uid === me;
  const st = await lstat(file).catch((err: NodeJS.ErrnoException) => err.code ?? err.message);
  if (typeof st === "string") return `${file}: ${st}`;
  if (!st.isSocket()) return `${file} is not a socket`;
  if (!ours(st.uid)) return `${file} belongs to uid ${st.uid}, not root`;
  if (st.mode & 0o077) return `${file} has mode ${(st.mode & 0o777).toString(8)}: others can reach it`;
  // Every directory above it: owned by root (or us), and writable by no one else unless sticky
  // (then no one else can replace our entries).
  let dir = await realpath(path.dirname(file));
  for (;;) {
    const d = await lstat(dir);
    if (!ours(d.uid)) return `${dir} belongs to uid ${d.uid}`;
    if (d.mode & 0o022 && !(d.mode & 0o1000))
      return `${dir} has mode ${(d.mode & 0o7777).toString(8)}: others can replace what is in it`;
    const up = path.dirname(dir);
    if (up === dir) return undefined;
    dir = up;
  }
}

const MAX_BYTES = 1 << 20;

/** GET urlPath over the unix socket: the body, at most 1 MiB, within timeoutMs. */
export function getOverSocket(file: string, urlPath: string, timeoutMs = 2000): Promise<string> {
  const { request } = process.getBuiltinModule("node:http");
  return new Promise((resolve, reject) => {
    const req = request({ socketPath: file, path: urlPath, timeout: timeoutMs }, (res: IncomingMessage) => {
      if (res.statusCode !== 200) {
        res.resume();
        reject(new AgentStatusError(`${file}${urlPath}: HTTP ${res.statusCode}`));
        return;
      }
      const chunks: Buffer[] = [];
      let size = 0;
      res.on("data", (c: Buffer) => {
        size += c.length;
        if (size > MAX_BYTES) {
          req.destroy(new AgentStatusError(`${file}${urlPath}: answer larger than ${MAX_BYTES} bytes`));
          return;
        }
        chunks.push(c);
      });
      res.on("end", () => resolve(Buffer.concat(chunks).toString("utf8")));
      res.on("error", reject);
    });
    req.on("timeout", () => req.destroy(new AgentStatusError(`${file}${urlPath}: no answer within ${timeoutMs} ms`)));
    req.on("error", reject);
    req.end();
  });
}

const PHASES = new Set<TriggerPhase>(["calm", "building", "met", "cooldown"]);

function field<T>(o: unknown, key: string, check: (v: unknown) => v is T, what: string): T {
  const v = (o as Record<string, unknown> | null)?.[key];
  if (!check(v)) throw new AgentStatusError(`the agent's status: ${key} is not ${what}`);
  return v;
}
const isStr = (v: unknown): v is string => typeof v === "string";
const isNum = (v: unknown): v is number => typeof v === "number" && Number.isFinite(v);
const isBool = (v: unknown): v is boolean => typeof v === "boolean";
const isObj = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v);
const optional =
  <T>(check: (v: unknown) => v is T) =>
  (v: unknown): v is T | undefined =>
    v === undefined || v === null || check(v);

/** The agent's /early-oom document, checked field by field (AgentStatusError otherwise). */
export function parseAgentStatus(text: string): AgentView {
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch (err) {
    throw new AgentStatusError(`the agent's status is not JSON: ${(err as Error).message}`);
  }
  if (!isObj(doc)) throw new AgentStatusError("the agent's status is not an object");
  const enabled = field(doc, "enabled", isBool, "true or false");
  const dryRun = field(doc, "dryRun", isBool, "true or false");
  const psi = field(doc, "psi", isStr, "a string");
  const rawConfig = doc.config;
  let config: EarlyOomConfig | undefined;
  if (rawConfig !== undefined && rawConfig !== null) {
    if (!isObj(rawConfig)) throw new AgentStatusError("the agent's status: config is not an object");
    config = resolveEarlyOomConfig(rawConfig as Partial<EarlyOomConfig>);
  }
  const trigger = field(doc, "trigger", isObj, "an object");
  const phase = field(trigger, "phase", isStr, "a string");
  if (!PHASES.has(phase as TriggerPhase)) throw new AgentStatusError(`the agent's status: unknown phase ${phase}`);
  const pods = field(doc, "pods", isObj, "an object");
  const actions = field(doc, "actions", isObj, "an object");
  const sampling = field(doc, "sampling", optional(isObj), "an object");
  const last = field(doc, "lastAction", optional(isObj), "an object");
  return {
    enabled,
    dryRun,
    psi,
    config,
    sampling: sampling
      ? {
          intervalMs: field(sampling, "intervalMs", isNum, "a number"),
          calm: field(sampling, "calm", isBool, "true or false"),
          reason: field(sampling, "reason", isStr, "a string"),
        }
      : undefined,
    trigger: {
      phase: phase as TriggerPhase,
      reason: field(trigger, "reason", isStr, "a string"),
      aboveForSeconds: field(trigger, "aboveForSeconds", isNum, "a number"),
      cooldownRemainingSeconds: field(trigger, "cooldownRemainingSeconds", isNum, "a number"),
    },
    pods: {
      source: field(pods, "source", isStr, "a string"),
      synced: field(pods, "synced", isBool, "true or false"),
      count: field(pods, "count", isNum, "a number"),
    },
    actions: {
      kill: field(actions, "kill", isNum, "a number"),
      "dry-run": field(actions, "dry-run", isNum, "a number"),
      sysrq: field(actions, "sysrq", isNum, "a number"),
      none: field(actions, "none", isNum, "a number"),
    },
    lastAction: last
      ? {
          at: field(last, "at", isStr, "a string"),
          action: field(last, "action", isStr, "a string"),
          pod: field(last, "pod", optional(isStr), "a string") ?? undefined,
          result: field(last, "result", optional(isStr), "a string") ?? undefined,
        }
      : undefined,
  };
}

/** The running agent's view, or why there is none. */
export async function askAgent(socket: string): Promise<{ agent?: AgentView; problem?: string }> {
  const why = await untrustedSocket(socket);
  if (why) return { problem: why.endsWith("ENOENT") ? `no agent socket at ${socket}` : `not asked: ${why}` };
  try {
    return { agent: parseAgentStatus(await getOverSocket(socket, "/early-oom")) };
  } catch (err) {
    return { problem: `${socket}: ${(err as Error).message}` };
  }
}
