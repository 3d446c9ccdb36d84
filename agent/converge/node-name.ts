import os from "node:os";
import type { Host } from "../../host/host.ts";

/** --node-name, else NODE_NAME, else the tree's /etc/hostname (sandbox) or the hostname. */
export async function nodeName(host: Host, flag?: string): Promise<string> {
  if (flag) return flag;
  if (process.env.NODE_NAME) return process.env.NODE_NAME;
  if (host.sandbox) {
    const h = (await host.readText("/etc/hostname"))?.trim();
    if (h) return h;
  }
  return os.hostname();
}
