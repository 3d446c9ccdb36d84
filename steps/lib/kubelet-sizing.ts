// The numbers Deckhouse's 064_configure_kubelet computes from the machine, computed the same
// way so a node keeps the capacity it had when its group moves here:
//
// - resourceReservation Auto: memory graded by the machine's size (8 % of the first 4 GiB, then
//   252 MiB for 4–8 GiB, 246 MiB for 8–16 GiB, 2 % up to 128 GiB, 1 % above: OpenShift's
//   kubelet auto-sizing divided by three), written in bytes; CPU 70m; ephemeral storage 1Gi.
//   Deckhouse does this with `free -m`, awk (which prints at most six significant digits) and
//   Python's Decimal; the steps below round where those do, so the bytes are Deckhouse's bytes.
// - memory eviction: 1 % (hard) and 2 % (soft) of the machine's memory, in bytes.
// - disk eviction: 5 %/10 % of the kubelet's and containerd's filesystems, capped at 20G/40G
//   and 1220k/2440k inodes (what 20 GB of images need), in Deckhouse's integer arithmetic.

/** awk's `print` of a number: integers as such, anything else with OFMT "%.6g". */
function awk(x: number): number {
  return Number.isInteger(x) ? x : Number(x.toPrecision(6));
}

/** Python's Decimal(x).quantize(1): to a whole number, ties to even. */
function roundHalfEven(x: number): number {
  const f = Math.floor(x);
  const d = x - f;
  if (d > 0.5) return f + 1;
  if (d < 0.5) return f;
  return f % 2 === 0 ? f : f + 1;
}

const MI = 1024 * 1024;

/** The machine's memory as `free -m` prints it (MemTotal in whole MiB). */
const totalMiB = (memoryBytes: number) => Math.floor(memoryBytes / MI);

/** resourceReservation Auto: the system's memory reservation in bytes (Deckhouse's dynamic_memory_sizing). */
export function autoReservedMemoryBytes(memoryBytes: number): number {
  let t = totalMiB(memoryBytes);
  let r: number;
  if (t <= 4096) {
    r = awk(t * 0.08);
    t = 0;
  } else {
    r = 333;
    t -= 4096;
  }
  const step = (limit: number, share: number, whole: number) => {
    if (t <= limit) {
      r = awk(r + awk(t * share));
      t = 0;
    } else {
      r = awk(r + whole);
      t -= limit;
    }
  };
  step(4096, 0.06, 252);
  step(8192, 0.03, 246);
  step(114688, 0.02, 2240);
  if (t >= 0) r = awk(r + awk(t * 0.01));
  return roundHalfEven(r * MI);
}

/** The CPU and ephemeral storage Auto reserves, whatever the machine. */
export const AUTO_RESERVED = { cpu: "70m", ephemeralStorage: "1Gi" } as const;

/** evictionHard (1 %) and evictionSoft (2 %) memory.available, in bytes. */
export function memoryEvictionBytes(memoryBytes: number): { hard: number; soft: number } {
  const t = totalMiB(memoryBytes);
  return { hard: roundHalfEven(t * MI * 0.01), soft: roundHalfEven(t * MI * 0.02) };
}

const UNITS: [string, number][] = [
  ["Ki", 1024],
  ["Mi", 1024 ** 2],
  ["Gi", 1024 ** 3],
  ["Ti", 1024 ** 4],
  ["Pi", 1024 ** 5],
  ["Ei", 1024 ** 6],
  ["k", 1000],
  ["M", 1000 ** 2],
  ["G", 1000 ** 3],
  ["T", 1000 ** 4],
  ["P", 1000 ** 5],
  ["E", 1000 ** 6],
  ["m", 0.001],
];

/** A memory quantity in bytes, as Deckhouse converts resourceReservation.static.memory. */
export function quantityBytes(q: string): number {
  for (const [unit, factor] of UNITS) {
    if (q.endsWith(unit)) return roundHalfEven(Number(q.slice(0, -unit.length)) * factor);
  }
  return roundHalfEven(Number(q));
}

/** A filesystem as `df --output=size,itotal` sees it: 1K blocks and inodes. */
export interface FsSize {
  sizeKiB: number;
  inodes: number;
}

export interface DiskEviction {
  hard: { available: string; inodesFree: string };
  soft: { available: string; inodesFree: string };
}

/** Deckhouse's caps: more free space than 20 GB (and the inodes 20 GB of images use) is never asked for. */
const MAX_RESERVED_G = 20;
const INODES_FREE_K = Math.trunc((MAX_RESERVED_G * 61046) / 1000);

/** nodefs (the kubelet's root dir) or imagefs (containerd's root) thresholds; percentages without a size. */
export function diskEviction(fs: FsSize | undefined): DiskEviction {
  const out: DiskEviction = {
    hard: { available: "5%", inodesFree: "5%" },
    soft: { available: "10%", inodesFree: "10%" },
  };
  if (!fs) return out;
  // Bash integer arithmetic, left to right, as in 064: $((size/(1000*1000)*5/100)). 064 tests
  // the soft cap as `5 % × 2 > cap × 2`: the same test as the hard one, so one test sets both.
  const sizeG5 = Math.trunc((Math.trunc(fs.sizeKiB / 1_000_000) * 5) / 100);
  if (sizeG5 > MAX_RESERVED_G) {
    out.hard.available = `${MAX_RESERVED_G}G`;
    out.soft.available = `${MAX_RESERVED_G * 2}G`;
  }
  const inodesK5 = Math.trunc((Math.trunc(fs.inodes / 1000) * 5) / 100);
  if (inodesK5 > INODES_FREE_K) {
    out.hard.inodesFree = `${INODES_FREE_K}k`;
    out.soft.inodesFree = `${INODES_FREE_K * 2}k`;
  }
  return out;
}
