// Swap (003_disable_swap). NoSwap (the default): what turns swap on is taken away and swap is
// turned off: swap lines of /etc/fstab (Ubuntu's /swap.img), swap units of their own (masked),
// systemd-gpt-auto-generator (masked: it turns on any swap partition in the GPT), the swap file
// Deckhouse's LimitedSwap made; then `swapoff -a` while /proc/swaps lists any. LimitedSwap: the
// swap file /var/lib/swapfile of exactly the size asked (recreated when it differs), its fstab
// line, and swapon. vm.swappiness is 041_configure_sysctl_tuner's (one owner for vm.* values).
//
// What this step turns off is recorded in /var/lib/bashible/swap-off (`fstab-removed <line>`,
// `fstab-added <line>`, `masked <unit>`), so cleanup_static_node.sh can put the machine's swap
// back as it was. Active swap is the running kernel's: under a sandbox root only the files count.
import { HOST_PREP, PATHS } from "../bundles/paths.ts";
import type { Host } from "../host/host.ts";
import { planAbsent, planFile, planSymlink } from "../host/file-plan.ts";
import { activeSwaps } from "./lib/kernel.ts";
import type { Primitive, Problem, Step } from "./types.ts";

const FSTAB = "/etc/fstab";
const SWAP_FILE = HOST_PREP.swapFile;
export const SWAP_FILE_LINE = `${SWAP_FILE} none swap sw 0 0`;
const GENERATOR = "systemd-gpt-auto-generator";
const GENERATOR_DIRS = ["/lib/systemd/system-generators", "/usr/lib/systemd/system-generators"];
/** Where swap units of their own live (fstab's are generated into /run/systemd/generator). */
const UNIT_DIRS = ["/lib/systemd/system", "/usr/lib/systemd/system", PATHS.unitDir];

/** A non-comment fstab line whose type (third field) is swap. */
export function isSwapLine(line: string): boolean {
  const t = line.trim();
  return t !== "" && !t.startsWith("#") && t.split(/\s+/)[2] === "swap";
}

/** The record with these lines added (each once, in order). */
function withRecord(record: string, add: string[]): string {
  const lines = record.split("\n").filter(Boolean);
  for (const l of add) if (!lines.includes(l)) lines.push(l);
  return lines.length ? `${lines.join("\n")}\n` : "";
}

async function swapUnits(host: Host): Promise<{ unit: string; dir: string }[]> {
  const out: { unit: string; dir: string }[] = [];
  for (const dir of UNIT_DIRS) {
    for (const f of await host.listDir(dir)) if (f.endsWith(".swap")) out.push({ unit: f, dir });
  }
  return out;
}

const step: Step<"Swap"> = {
  kind: "Swap",
  async plan(spec, host) {
    const changes: Primitive[] = [];
    const problems: Problem[] = [];
    const record: string[] = [];
    const fstab = (await host.readText(FSTAB)) ?? "";
    const lines = fstab.split("\n");
    let newFstab = fstab;
    let reload = false;
    const active = host.sandbox ? [] : await activeSwaps();

    if (spec.swapBehavior === "NoSwap") {
      const removed = lines.filter(isSwapLine);
      if (removed.length) {
        newFstab = lines.filter((l) => !isSwapLine(l)).join("\n");
        record.push(...removed.filter((l) => l.trim().split(/\s+/)[0] !== SWAP_FILE).map((l) => `fstab-removed ${l}`));
      }
      for (const dir of GENERATOR_DIRS) {
        if (!(await host.stat(`${dir}/${GENERATOR}`))?.isFile) continue;
        const mask = await planSymlink(host, HOST_PREP.gptAutoGeneratorMask, "/dev/null");
        if (mask)
          changes.push({ ...mask, summary: `${mask.summary} (${GENERATOR} would turn on GPT swap partitions)` });
        reload ||= mask !== undefined;
        break;
      }
      for (const { unit, dir } of await swapUnits(host)) {
        if (dir === PATHS.unitDir) {
          // The administrator's own unit file (or our mask of one): masking it would replace
          // their file. swapoff below turns it off for now; they have to remove it for good.
          if ((await host.stat(`${dir}/${unit}`))?.isSymlink) continue;
          problems.push({
            subject: unit,
            message: `a swap unit of the administrator's (${dir}/${unit}) turns swap on at boot, which the kubelet refuses; remove it (swap is turned off until then)`,
          });
          continue;
        }
        const mask = await planSymlink(host, `${PATHS.unitDir}/${unit}`, "/dev/null");
        if (mask) {
          changes.push({ ...mask, summary: `mask ${unit} (a swap unit)` });
          record.push(`masked ${unit}`);
          reload = true;
        }
      }
      if (active.length) {
        changes.push({ kind: "command", argv: ["swapoff", "-a"], summary: `turn swap off (${active.join(", ")})` });
      }
      const file = await planAbsent(host, SWAP_FILE);
      if (file) changes.push({ ...file, summary: `delete ${SWAP_FILE} (the LimitedSwap file)` });
    } else {
      const size = (spec.limitedSwapSizeGiB ?? 0) * 1024 ** 3;
      const st = await host.stat(SWAP_FILE);
      const isActive = active.includes(SWAP_FILE);
      if (!st?.isFile || st.size !== size) {
        if (isActive)
          changes.push({
            kind: "command",
            argv: ["swapoff", SWAP_FILE],
            summary: `turn ${SWAP_FILE} off to resize it`,
          });
        if (st) {
          const del = await planAbsent(host, SWAP_FILE);
          if (del) changes.push(del);
        }
        const make = (argv: string[], summary: string): Primitive => ({
          kind: "command",
          argv,
          recordInSandbox: true,
          summary,
        });
        changes.push(
          make(
            ["fallocate", "-l", `${spec.limitedSwapSizeGiB}G`, host.path(SWAP_FILE)],
            `make ${SWAP_FILE} (${spec.limitedSwapSizeGiB} GiB)`,
          ),
          make(["chmod", "0600", host.path(SWAP_FILE)], `${SWAP_FILE}: mode 0600`),
          make(["mkswap", host.path(SWAP_FILE)], `mkswap ${SWAP_FILE}`),
        );
      }
      if (!lines.some((l) => isSwapLine(l) && l.trim().split(/\s+/)[0] === SWAP_FILE)) {
        newFstab = `${fstab}${fstab === "" || fstab.endsWith("\n") ? "" : "\n"}${SWAP_FILE_LINE}\n`;
        record.push(`fstab-added ${SWAP_FILE_LINE}`);
      }
      if (!host.sandbox && (!isActive || !st || st.size !== size)) {
        changes.push({ kind: "command", argv: ["swapon", SWAP_FILE], summary: `turn swap on (${SWAP_FILE})` });
      }
    }

    if (newFstab !== fstab) {
      const st = await host.stat(FSTAB);
      const f = await planFile(host, { path: FSTAB, content: newFstab, mode: st?.mode ?? 0o644 });
      if (f) changes.unshift(f);
      reload = true;
    }
    if (record.length) {
      const current = (await host.readText(PATHS.swapRecord)) ?? "";
      const f = await planFile(host, { path: PATHS.swapRecord, content: withRecord(current, record), mode: 0o644 });
      if (f) changes.unshift(f);
    }
    if (reload) {
      // systemd regenerates fstab's swap units and drops masked ones from its view.
      const at = changes.findIndex((c) => c.kind === "command");
      const dr: Primitive = {
        kind: "unit",
        unit: "",
        action: "daemon-reload",
        summary: "systemctl daemon-reload (swap units changed)",
      };
      if (at < 0) changes.push(dr);
      else changes.splice(at, 0, dr);
    }
    return { changes, problems };
  },
};

export default step;
