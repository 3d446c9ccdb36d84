// One logger for the whole agent: pino JSON lines (journald keeps them as-is) or, on a
// terminal, a compact human form. Secrets are redacted here, where they enter the log.
import { pino, type Logger, type DestinationStream } from "pino";
import { prettyLine, REDACT_KEYS, redactFields } from "./format.ts";

export type { Logger };
export type LogFormat = "json" | "pretty";

export interface LogOptions {
  format?: LogFormat | undefined;
  level?: string | undefined;
  /** Where log lines go. Commands whose stdout is their result log to stderr. */
  to?: "stdout" | "stderr";
}

export { prettyLine };

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
      // The same redaction as the light logger (format.ts), at any depth, fields and bindings.
      formatters: {
        level: (label) => ({ level: label }),
        log: (obj) => redactFields(obj) as Record<string, unknown>,
      },
      // Child bindings do not pass through formatters.log; serializers do apply to them.
      serializers: Object.fromEntries([...REDACT_KEYS].map((k) => [k, () => "[redacted]"])) as Record<
        string,
        (v: unknown) => unknown
      >,
    },
    dest,
  );
}
