// One pass over a controller's pending work for a burst of events: a pass is queued at most once
// (50 ms later, so a rollout touching many objects makes one pass), and a request while a pass
// runs makes exactly one more after it, never two at once. The kubelet CSR approvers use it.
export class CoalescedPass {
  private queued = false;
  private running = false;
  private again = false;

  private readonly pass: () => Promise<void>;
  private readonly onError: (err: Error) => void;
  private readonly stopped: () => boolean;

  constructor(pass: () => Promise<void>, onError: (err: Error) => void, stopped: () => boolean) {
    this.pass = pass;
    this.onError = onError;
    this.stopped = stopped;
  }

  /** Asks for a pass soon. */
  queue(): void {
    if (this.queued || this.stopped()) return;
    this.queued = true;
    setTimeout(() => {
      this.queued = false;
      void this.run();
    }, 50).unref();
  }

  private async run(): Promise<void> {
    if (this.running) {
      this.again = true;
      return;
    }
    this.running = true;
    try {
      do {
        this.again = false;
        await this.pass().catch((err: Error) => this.onError(err));
      } while (this.again && !this.stopped());
    } finally {
      this.running = false;
    }
  }
}
