// What both loggers share: the keys that are always redacted and the terminal line format.

/** Field names whose values never reach a log line. */
export const REDACT_KEYS = new Set([
  "token",
  "password",
  "passwordHash",
  "authorization",
  "key",
  "clientKey",
  "bootstrapToken",
]);

/**
 * The one redaction both loggers apply to every field object, at any depth: a value under a
 * REDACT_KEYS name becomes "[redacted]"; errors keep their type and message.
 */
export function redactFields(value: unknown, depth = 0): unknown {
  if (value === null || typeof value !== "object" || depth > 6) return value;
  if (value instanceof Error) return { type: value.name, message: value.message };
  if (Array.isArray(value)) return value.map((v) => redactFields(v, depth + 1));
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(value)) out[k] = REDACT_KEYS.has(k) ? "[redacted]" : redactFields(v, depth + 1);
  return out;
}

/**
 * Control characters shown, not sent: a message may quote what a script printed or a file a
 * user wrote, and an escape sequence there would drive root's terminal (or fake a line).
 */
export function visible(text: string): string {
  // biome-ignore lint/suspicious/noControlCharactersInRegex: matching them is the point
  return text.replace(/[\u0000-\u0008\u000a-\u001f\u007f-\u009f]/g, (c) =>
    c === "\n" ? "\\n" : `\\x${c.charCodeAt(0).toString(16).padStart(2, "0")}`,
  );
}

/** Formats a JSON log line as `HH:MM:SS LEVEL msg key=value…` for people at a terminal. */
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
    .map(([k, v]) => `${k}=${typeof v === "string" && !/\s/.test(v) ? visible(v) : JSON.stringify(v)}`)
    .join(" ");
  return `${clock} ${lvl} ${visible(String(msg ?? ""))}${fields ? `  ${fields}` : ""}\n`;
}
