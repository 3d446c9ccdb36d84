// One logger for the whole agent: pino JSON lines (journald keeps them as-is) or, on a
// terminal, a compact human form. Secrets are redacted here, where they enter the log.
import { pino, type Logger, type DestinationStream } from "pino";

export type { Logger };
export type LogFormat = "json" | "pretty";

export interface LogOptions {
  format?: LogFormat | undefined;
  level?: string | undefined;
  /** Where log lines go. Commands whose stdout is their result log to stderr. */
  to?: "stdout" | "stderr";
}

/** Field names whose values never reach a log line, at any depth pino's redact covers. */
const REDACT = [
  "token",
  "*.token",
  "password",
  "passwordHash",
  "*.passwordHash",
  "authorization",
  "*.authorization",
  "headers.authorization",
  "key",
  "*.key",
  "clientKey",
  "bootstrapToken",
  "*.bootstrapToken",
];

/** Formats pino's JSON line as `HH:MM:SS LEVEL msg key=value…` for people at a terminal. */
export function prettyLine(json: string): string {
  let rec: Record<string, unknown>;
  try {
    rec = JSON.parse(json) as Record<string, unknown>;
  } catch {
    return json;
  }
  const { time, level, msg, pid: _pid, hostname: _host, ...rest } = rec;
  const clock = typeof time === "number" ? new Date(time).toISOString().slice(11, 19) : "";
  const lvl = String(level).toUpperCase().padEnd(5);
  const fields = Object.entries(rest)
    .map(([k, v]) => `${k}=${typeof v === "string" && !/\s/.test(v) ? v : JSON.stringify(v)}`)
    .join(" ");
  return `${clock} ${lvl} ${msg ?? ""}${fields ? `  ${fields}` : ""}\n`;
}

function prettyDestination(fd: 1 | 2): DestinationStream {
  const out = fd === 1 ? process.stdout : process.stderr;
  return { write: (line: string) => void out.write(prettyLine(line)) };
}

export function createLogger(opts: LogOptions = {}): Logger {
  const fd = opts.to === "stderr" ? 2 : 1;
  const format = opts.format ?? ((fd === 1 ? process.stdout : process.stderr).isTTY ? "pretty" : "json");
  const dest = format === "pretty" ? prettyDestination(fd) : pino.destination({ fd, sync: true });
  return pino(
    {
      level: opts.level ?? process.env.BASHIBLE_LOG_LEVEL ?? "info",
      base: undefined,
      redact: { paths: REDACT, censor: "[redacted]" },
      formatters: { level: (label) => ({ level: label }) },
    },
    dest,
  );
}
