// Run flags in Deckhouse's place, /var/lib/bashible/.bb-workspace/flag/<name>: a file per flag,
// holding why it was set. Steps set them through the context, NodeGroupConfiguration scripts
// through bb-flag-set, and the engine acts on them (reboot at the end, disruption approval,
// restarts). Files, so a flag survives a killed run and the next run still acts on it.
import { PATHS } from "../bundles/paths.ts";
import type { Host } from "./host.ts";

/** Deckhouse's run flags (/var/lib/bashible/.bb-workspace/flag): reboot, disruption, …. */
export interface Flags {
  has(name: string): Promise<boolean>;
  set(name: string, why: string): Promise<void>;
  unset(name: string): Promise<void>;
  list(): Promise<string[]>;
}

const FLAG_NAME = /^[a-z0-9][a-z0-9._-]{0,100}$/;

function check(name: string): string {
  if (!FLAG_NAME.test(name)) throw new Error(`invalid flag name '${name}'`);
  return `${PATHS.flags}/${name}`;
}

export function hostFlags(host: Host): Flags {
  return {
    async has(name) {
      return (await host.stat(check(name))) !== undefined;
    },
    async set(name, why) {
      await host.writeFile(check(name), `${why}\n`, { mode: 0o644 });
    },
    async unset(name) {
      await host.remove(check(name));
    },
    async list() {
      return (await host.listDir(PATHS.flags)).filter((n) => FLAG_NAME.test(n));
    },
  };
}

/** Deckhouse's flag names. */
export const FLAG = {
  reboot: "reboot",
  disruption: "disruption",
  /** `<service>-need-restart`: a restart a script or an earlier run asked for. */
  needRestart: (unit: string) => `${unit.replace(/\.service$/, "")}-need-restart`,
} as const;
