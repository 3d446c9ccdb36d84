// A minimal client for QEMU's machine protocol (QMP) over its unix socket: commands in order,
// events kept. The VM harness (scripts/lib/vm-node.ts) uses it to learn why QEMU stopped (the
// SHUTDOWN event says guest-shutdown for a poweroff, guest-reset for a reboot under -no-reboot)
// and to ask the machine's state.
import { connect, type Socket } from "node:net";

export interface QmpEvent {
  event: string;
  data?: Record<string, unknown>;
  timestamp?: { seconds: number; microseconds: number };
}

export interface Qmp {
  /** Runs a command; rejects with QEMU's error. */
  execute(command: string, args?: Record<string, unknown>): Promise<unknown>;
  /** Every event since the connection was made, oldest first. */
  events: QmpEvent[];
  /** Resolves when QEMU closes the connection (it exited). */
  closed: Promise<void>;
  close(): void;
}

/** Connects and negotiates capabilities; fails if the socket does not answer. */
export async function connectQmp(socketPath: string): Promise<Qmp> {
  const sock: Socket = connect(socketPath);
  const events: QmpEvent[] = [];
  const pending: { resolve(v: unknown): void; reject(e: Error): void; command: string }[] = [];
  let greeted: (() => void) | undefined;
  const greeting = new Promise<void>((resolve, reject) => {
    greeted = resolve;
    sock.once("error", reject);
  });
  const closed = new Promise<void>((resolve) => sock.once("close", () => resolve()));
  void closed.then(() => {
    for (const p of pending.splice(0)) p.reject(new Error(`qmp: QEMU closed the connection during ${p.command}`));
  });
  let buf = "";
  sock.setEncoding("utf8");
  sock.on("data", (chunk: string) => {
    buf += chunk;
    for (let nl = buf.indexOf("\n"); nl >= 0; nl = buf.indexOf("\n")) {
      const line = buf.slice(0, nl).trim();
      buf = buf.slice(nl + 1);
      if (!line) continue;
      const msg = JSON.parse(line) as {
        QMP?: unknown;
        event?: string;
        return?: unknown;
        error?: { class: string; desc: string };
      };
      if (msg.QMP) greeted?.();
      else if (msg.event) events.push(msg as QmpEvent);
      else if ("return" in msg || msg.error) {
        const p = pending.shift();
        if (msg.error) p?.reject(new Error(`qmp: ${p.command}: ${msg.error.class}: ${msg.error.desc}`));
        else p?.resolve(msg.return);
      }
    }
  });
  sock.on("error", () => undefined);
  const execute = (command: string, args?: Record<string, unknown>) =>
    new Promise<unknown>((resolve, reject) => {
      if (sock.destroyed) return reject(new Error(`qmp: not connected (${command})`));
      pending.push({ resolve, reject, command });
      sock.write(`${JSON.stringify(args ? { execute: command, arguments: args } : { execute: command })}\n`);
    });
  await greeting;
  await execute("qmp_capabilities");
  return { execute, events, closed, close: () => sock.destroy() };
}
