// The pet timer: every pet interval, one pet when the device is armed and the decision allows
// it (decision.ts petAllowed). It trusts only a fresh verdict, so when the check loop hangs the
// pets stop and the device fires. Its own timer, apart from the check loop: a slow API or peer
// round never delays a pet. The check loop may start a round right after a tick that falls
// just before the round is due (tickBefore): one wakeup for both instead of two, a round a few
// milliseconds early and never late.
import type { Logger } from "../../lib/log/log.ts";
import type { Clock } from "./clock.ts";
import { type FencingState, petAllowed } from "./decision.ts";
import type { FencingDevice } from "./device.ts";
import type { FencingMetrics } from "./metrics.ts";

export interface PetTimerOptions {
  device: FencingDevice;
  /** The current decision state (the check loop moves it on). */
  state: () => FencingState;
  intervalMs: number;
  now: Clock;
  log: Logger;
  metrics: FencingMetrics;
}

export class PetTimer {
  private readonly o: PetTimerOptions;
  private timer: NodeJS.Timeout | undefined;
  /** When the next tick is due (fencing's clock), while running. */
  private nextAt: number | undefined;
  /** Called right after the next tick. */
  private waiters: (() => void)[] = [];
  /** The kubelet-window stop is logged once per stretch, not on every tick. */
  private kubeletWindowLogged = false;

  constructor(o: PetTimerOptions) {
    this.o = o;
  }

  start(): void {
    clearInterval(this.timer);
    this.nextAt = this.o.now() + this.o.intervalMs;
    this.timer = setInterval(() => {
      this.nextAt = this.o.now() + this.o.intervalMs;
      this.tick();
      this.release();
    }, this.o.intervalMs);
  }

  stop(): void {
    clearInterval(this.timer);
    this.timer = undefined;
    this.nextAt = undefined;
    this.release();
  }

  /**
   * Resolves right after the next tick when that tick is due between `due - slackMs` and `due`
   * (or when the timer stops); undefined when it is not, and the caller waits on its own.
   */
  tickBefore(due: number, slackMs: number): Promise<void> | undefined {
    const at = this.nextAt;
    if (at === undefined || at > due || at < due - slackMs) return undefined;
    return new Promise((resolve) => this.waiters.push(resolve));
  }

  private release(): void {
    const w = this.waiters;
    this.waiters = [];
    for (const f of w) f();
  }

  /** One pet if allowed (also called once right after arming, so the first pet does not wait). */
  tick(): void {
    const { device, log, metrics } = this.o;
    if (!device.isOpen) return;
    const d = petAllowed(this.o.state(), this.o.now());
    const pastKubeletWindow = !d.ok && d.why === "kubelet-window";
    if (pastKubeletWindow && !this.kubeletWindowLogged)
      log.error(
        { kubeletLeaseAgeMs: d.kubeletAgeMs, kubeletWindowMs: d.kubeletWindowMs },
        "stopped petting: the kubelet's Lease is older than the kubelet window; the watchdog fires unless the kubelet recovers",
      );
    this.kubeletWindowLogged = pastKubeletWindow;
    if (!d.ok) {
      metrics.petting.set(0);
      return;
    }
    device.pet();
  }
}
