// The resident daemon's logger: the same JSON lines as pino (level label, time, msg, fields;
// the same redaction), in a few lines of code. Measured: pino costs the resident process
// about 4 MB RSS (docs/benchmarks.md); the daemon logs a handful of lines an hour, so it does
// without. Commands and the converge child use pino (lib/log/log.ts).
import type { Logger } from "pino";
import { prettyLine, redactFields } from "./format.ts";

const LEVELS = { trace: 10, debug: 20, info: 30, warn: 40, error: 50, fatal: 60 } as const;
type Level = keyof typeof LEVELS;

const redact = redactFields;

export function createLightLogger(opts: {
  format: "json" | "pretty";
  level: string;
  bindings?: Record<string, unknown>;
}): Logger {
  const min = LEVELS[opts.level as Level] ?? LEVELS.info;
  const write = (level: Level, a: unknown, b?: unknown) => {
    if (LEVELS[level] < min) return;
    const fields = typeof a === "object" && a !== null ? (redact(a) as Record<string, unknown>) : {};
    const msg = typeof a === "string" ? a : typeof b === "string" ? b : undefined;
    const line = `${JSON.stringify({ level, time: Date.now(), ...opts.bindings, ...fields, msg })}\n`;
    process.stdout.write(opts.format === "pretty" ? prettyLine(line) : line);
  };
  const logger = {
    level: opts.level,
    child: (bindings: Record<string, unknown>) =>
      createLightLogger({ ...opts, bindings: { ...opts.bindings, ...(redact(bindings) as Record<string, unknown>) } }),
    isLevelEnabled: (l: string) => (LEVELS[l as Level] ?? 0) >= min,
  } as Record<string, unknown>;
  for (const l of Object.keys(LEVELS) as Level[]) logger[l] = (a: unknown, b?: unknown) => write(l, a, b);
  // Only the methods above exist; the daemon uses no other part of pino's API.
  return logger as unknown as Logger;
}
