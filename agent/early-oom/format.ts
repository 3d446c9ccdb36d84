// Figures as people read them in logs, Events and `bashible early-oom status`.

export function bytes(n: number): string {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = n;
  let i = 0;
  while (Math.abs(v) >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${i === 0 ? v : Number(v.toFixed(v >= 100 ? 0 : 1))} ${units[i]}`;
}

/** A 0..1 share as a percentage. */
export const pct = (share: number) => `${(share * 100).toFixed(share * 100 >= 10 ? 0 : 1)}%`;
