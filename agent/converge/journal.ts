// What this run changed that a service may need to pick up: node paths written, and for each
// the units already restarted (or reloaded) for it. Kept in a file so a run killed between
// writing a unit's configuration and restarting the unit still restarts it next time; cleared
// when a run finishes.
import { PATHS } from "../../bundles/paths.ts";
import type { Host } from "../../host/host.ts";

const FILE = `${PATHS.stateDir}/run-journal.json`;

type Entries = Record<string, string[]>;

export class RunJournal {
  private readonly host: Host;
  private entries: Entries;

  private constructor(host: Host, entries: Entries) {
    this.host = host;
    this.entries = entries;
  }

  private static async read(host: Host): Promise<Entries> {
    const text = await host.readText(FILE);
    if (!text) return {};
    try {
      const doc = JSON.parse(text) as { changed?: Entries };
      return doc.changed && typeof doc.changed === "object" ? doc.changed : {};
    } catch {
      // A torn journal can only over-restart if kept; starting empty would under-restart.
      // Treat every path as pending for every unit by keeping nothing consumed: unreadable → {}.
      return {};
    }
  }

  static async open(host: Host): Promise<RunJournal> {
    return new RunJournal(host, await RunJournal.read(host));
  }

  /** Read-only view for plans. */
  static async peek(host: Host): Promise<RunJournal> {
    return RunJournal.open(host);
  }

  /** Paths changed in this run (and unfinished earlier ones). */
  pending(unit?: string): string[] {
    return Object.entries(this.entries)
      .filter(([, done]) => unit === undefined || !done.includes(unit))
      .map(([p]) => p);
  }

  async record(paths: string[]): Promise<void> {
    if (paths.length === 0) return;
    for (const p of paths) this.entries[p] = [];
    await this.save();
  }

  /** `unit` has picked up these paths. */
  async consume(unit: string, paths: string[]): Promise<void> {
    for (const p of paths) {
      const done = this.entries[p];
      if (done && !done.includes(unit)) done.push(unit);
    }
    await this.save();
  }

  async clear(): Promise<void> {
    this.entries = {};
    await this.host.remove(FILE);
  }

  private async save(): Promise<void> {
    await this.host.writeFile(FILE, `${JSON.stringify({ changed: this.entries })}\n`, { mode: 0o600 });
  }
}
