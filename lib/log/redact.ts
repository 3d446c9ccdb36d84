// Secret values out of text: what a command printed, an error message, a plan line. The
// logger's field redaction (format.ts) covers keys; this covers values the program knows are
// secret (a bundle's tokens, a password hash) wherever they appear in free text.

/** `text` with every secret of at least 4 characters replaced by "[redacted]". */
export function redact(text: string, secrets: readonly string[] = []): string {
  let out = text;
  for (const s of secrets) if (s.length >= 4) out = out.split(s).join("[redacted]");
  return out;
}
