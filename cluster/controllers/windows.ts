// Maintenance windows of spec.disruptions.automatic.windows: `{from: "HH:MM", to: "HH:MM",
// days?: [Mon…Sun]}`, in UTC as Deckhouse reads them. A window opens at `from` on each listed
// day (every day when `days` is absent) and closes at `to`; a `to` at or before `from` closes
// on the next day, so 22:00–02:00 on Fri is Friday night into Saturday. No windows at all
// means "always". Pure functions of a clock value, so tests drive them with any time.

export interface MaintenanceWindow {
  from: string;
  to: string;
  days?: string[];
}

const DAYS = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"] as const;
const DAY_MS = 86_400_000;
const HHMM = /^([01]?\d|2[0-3]):([0-5]\d)$/;

/** Minutes after midnight, or an error naming the field. */
function minutes(v: string, what: string): number {
  const m = HHMM.exec(v);
  if (!m) throw new Error(`${what} '${v}' is not HH:MM (UTC)`);
  return Number(m[1]) * 60 + Number(m[2]);
}

interface Parsed {
  fromMin: number;
  lengthMs: number;
  days: Set<number>;
}

/** Checks every window; throws with the index and field of the first bad one. */
export function parseWindows(windows: readonly MaintenanceWindow[]): Parsed[] {
  return windows.map((w, i) => {
    const fromMin = minutes(w.from, `windows[${i}].from`);
    const toMin = minutes(w.to, `windows[${i}].to`);
    const days = new Set<number>();
    for (const d of w.days ?? DAYS) {
      const n = DAYS.indexOf(d as (typeof DAYS)[number]);
      if (n < 0) throw new Error(`windows[${i}].days: '${d}' is not one of ${DAYS.join(", ")}`);
      days.add(n);
    }
    const length = toMin > fromMin ? toMin - fromMin : toMin + 1440 - fromMin;
    return { fromMin, lengthMs: length * 60_000, days };
  });
}

/** Start times (ms) of the window's occurrences that could contain or follow `now`. */
function* starts(w: Parsed, now: number): Generator<number> {
  const midnight = Math.floor(now / DAY_MS) * DAY_MS;
  // Yesterday's occurrence can still be open (overnight windows); then the next 7 days.
  for (let d = -1; d <= 7; d++) {
    const day = midnight + d * DAY_MS;
    if (w.days.has(new Date(day).getUTCDay())) yield day + w.fromMin * 60_000;
  }
}

export interface WindowState {
  open: boolean;
  /** When it next changes (closes if open, opens if closed); undefined: never (no windows). */
  nextChange: number | undefined;
}

export function windowState(windows: readonly MaintenanceWindow[] | undefined, now: number): WindowState {
  if (!windows?.length) return { open: true, nextChange: undefined };
  const parsed = parseWindows(windows);
  let closesAt: number | undefined;
  let opensAt: number | undefined;
  for (const w of parsed) {
    for (const s of starts(w, now)) {
      const e = s + w.lengthMs;
      if (s <= now && now < e) closesAt = Math.max(closesAt ?? 0, e);
      else if (s > now) opensAt = Math.min(opensAt ?? Number.POSITIVE_INFINITY, s);
    }
  }
  if (closesAt !== undefined) return { open: true, nextChange: closesAt };
  return { open: false, nextChange: opensAt };
}

export const formatUtc = (ms: number) => new Date(ms).toISOString().replace(/:\d\d\.\d+Z$/, " UTC");
