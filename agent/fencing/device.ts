// The watchdog as fencing uses it: arming (softdog set up, the real timeout read from sysfs and
// checked against what the cluster side assumes, then the open), one pet with its metrics, and
// the two ways to let go: the magic close ('V', the timer stops) or a release without 'V' (a
// fence in progress completes although the agent goes away). Whether a pet may go out is not
// decided here (decision.ts, pet-timer.ts).
import path from "node:path";
import type { Logger } from "../../lib/log/log.ts";
import { DEFAULT_WATCHDOG_TIMEOUT_SECONDS } from "../../bundles/fencing.ts";
import type { Clock } from "./clock.ts";
import type { FencingMetrics } from "./metrics.ts";
import { setupSoftdog } from "./softdog.ts";
import { readWatchdogInfo, Watchdog, type WatchdogInfo } from "./watchdog.ts";

export interface DeviceOptions {
  root: string;
  /** Device path under root. */
  device: string;
  /** The longest timeout the cluster side is set up for; a longer device is not armed. */
  timeoutLimitSeconds?: number | undefined;
  log: Logger;
  metrics: FencingMetrics;
  now: Clock;
}

export class FencingDevice {
  private readonly o: DeviceOptions;
  private readonly watchdog: Watchdog;
  /** What sysfs told at the last arming. */
  info: WatchdogInfo | undefined;
  /** Why the device is not armed although the mode asks for it. */
  problem: string | undefined;
  lastPetAt: number | undefined;
  private lastPetHr: bigint | undefined;

  constructor(o: DeviceOptions) {
    this.o = o;
    this.watchdog = new Watchdog(path.join(o.root, o.device));
  }

  get path(): string {
    return this.watchdog.device;
  }

  get isOpen(): boolean {
    return this.watchdog.isOpen;
  }

  get petCount(): number {
    return this.watchdog.petCount;
  }

  /** The timeout the node states on its Node: the device's, or the limit when sysfs does not say. */
  get timeoutSeconds(): number {
    return this.info?.timeoutSeconds ?? this.limit;
  }

  private get limit(): number {
    return this.o.timeoutLimitSeconds ?? DEFAULT_WATCHDOG_TIMEOUT_SECONDS;
  }

  /**
   * Sets softdog up and opens the device, unless its timeout is longer than the cluster side
   * assumes. `wanted` is asked again once the open returns: fencing may have stopped meanwhile.
   * Never throws: a failure is the `problem`, in the status and the log.
   */
  async arm(wanted: () => boolean): Promise<void> {
    if (this.watchdog.isOpen || !wanted()) return;
    const { log } = this.o;
    try {
      const limit = this.limit;
      const setup = await setupSoftdog(this.o.root, this.o.device, limit, this.o.now);
      if (setup.changed.length) log.info({ files: setup.changed, load: setup.load }, "softdog set up");
      this.info = await readWatchdogInfo(this.o.root, this.o.device);
      if (this.info.timeoutSeconds !== undefined && this.info.timeoutSeconds > limit) {
        // The controller counts on the node being dead `limit` seconds after the last pet.
        this.problem = `watchdog timeout ${this.info.timeoutSeconds} s (${this.info.source}) is longer than the ${limit} s the cluster side is set up for; not arming`;
        log.error(this.problem);
        return;
      }
      await this.watchdog.arm();
      if (!wanted()) {
        // Stopped while the device was opening.
        this.watchdog.disarm();
        return;
      }
      this.problem = undefined;
      // The open counts as a pet.
      this.lastPetAt = this.o.now();
      this.lastPetHr = process.hrtime.bigint();
      this.o.metrics.armed.set(1);
      log.info(
        {
          device: this.watchdog.device,
          timeoutSeconds: this.info.timeoutSeconds ?? limit,
          timeoutFrom:
            this.info.timeoutSeconds === undefined ? "softdog soft_margin (not readable here)" : this.info.source,
          identity: this.info.identity,
        },
        "watchdog armed",
      );
    } catch (err) {
      this.problem = (err as Error).message;
      log.error({ err: this.problem }, "cannot arm the watchdog");
    }
  }

  /** One pet, counted and timed; a failed write is logged and counted (the next tick tries again). */
  pet(): void {
    const m = this.o.metrics;
    try {
      this.watchdog.pet();
    } catch (err) {
      m.petErrors.inc();
      this.o.log.error({ err: (err as Error).message }, "pet failed");
      return;
    }
    const hr = process.hrtime.bigint();
    if (this.lastPetHr !== undefined) m.gap.observe(Number(hr - this.lastPetHr) / 1e9);
    this.lastPetHr = hr;
    this.lastPetAt = this.o.now();
    m.pets.inc();
    m.petting.set(1);
  }

  /** The magic close while fencing goes on (maintenance, a broken check loop); a failure is logged. */
  disarm(why: string): void {
    if (!this.watchdog.isOpen) return;
    try {
      this.watchdog.disarm();
      this.o.log.info({ why }, "watchdog disarmed (magic close)");
    } catch (err) {
      this.o.log.error({ err: (err as Error).message, why }, "magic close failed; the device is closed");
    }
    this.notArmed();
  }

  /**
   * Lets go as fencing stops: the magic close, except during a fence in progress, when the
   * device is closed without 'V' so stopping the agent cannot cancel the fence.
   */
  close(why: string, fenceInProgress: boolean): void {
    try {
      if (fenceInProgress) {
        this.watchdog.release();
        this.o.log.warn({ why }, "watchdog released without disarming: a fence is in progress");
      } else if (this.watchdog.isOpen) {
        this.watchdog.disarm();
        this.o.log.info({ why }, "watchdog disarmed (magic close)");
      }
    } finally {
      this.notArmed();
    }
  }

  private notArmed(): void {
    this.o.metrics.armed.set(0);
    this.o.metrics.petting.set(0);
  }
}
