// `bashible run`'s fencing flags, and the wiring that starts fencing beside the converge daemon,
// kept here so the run command only spreads the options and calls startFencing().
import type { Logger } from "../../lib/log/log.ts";
import type { KubeClient } from "../../lib/kube/client.ts";
import { UsageError, type OptionSpec, type ParsedValues } from "../../lib/cli.ts";
import { Registry } from "../../lib/prometheus.ts";
import { type AgentTimings, DEFAULT_AGENT_TIMINGS, detectionWindowMs, kubeletWindowMs } from "../../bundles/fencing.ts";
import type { Fencing, FencingConfig } from "./fencing.ts";
import type { PeerTls } from "./peers.ts";
import { followAppliedFencingConfig } from "./config-source.ts";

export const FENCING_OPTIONS: OptionSpec = {
  "watchdog-device": { type: "string" },
  "fencing-port": { type: "string" },
  "fencing-address": { type: "string" },
  "fencing-listen-port": { type: "string" },
  "fencing-timings": { type: "string" },
  "fencing-without-peers": { type: "boolean" },
  "fencing-peer-min-age": { type: "string" },
};

const d = DEFAULT_AGENT_TIMINGS;
export const FENCING_HELP = `Fencing (when the node group has spec.fencing.mode Watchdog or Notify; see docs/fencing.md):
      --watchdog-device PATH  watchdog device under --root (default /dev/watchdog)
      --fencing-port N        port the agents of a group ask each other on (default 4227)
      --fencing-address IP    this node's address for that endpoint: listen on it and ask
                              from it (default: listen on all addresses)
      --fencing-listen-port N listen on N instead of --fencing-port (a proxy or NAT in front
                              forwards the group's port to it; default: --fencing-port)
      --fencing-timings LIST  seconds: pet=${d.petIntervalMs / 1000},check=${d.checkIntervalMs / 1000},api=${d.apiTimeoutMs / 1000},peer=${d.peerTimeoutMs / 1000},rounds=${d.badRounds},kubelet=${d.kubeletStaleMs / 1000}
                              (detection window = check + rounds x max(check, api + peer)
                              = ${detectionWindowMs(d) / 1000} s by default; the cluster's threshold must exceed it
                              + the watchdog timeout + a margin. kubelet: a kubelet Lease older
                              than this is a bad check once the kubelet renewed it since boot;
                              kubelet window = kubelet + rounds x max(check, api) = ${(kubeletWindowMs(d) ?? 0) / 1000} s,
                              which the threshold must exceed the same way; kubelet=0: off)
      --fencing-without-peers in a group with no other fencing node, stop petting when the
                              API is lost (default: keep the node)
      --fencing-peer-min-age S
                              a Node of the group counts as a peer once it is S seconds old
                              (default 600: fake members must sit in the cluster that long)`;

const KEYS: Record<string, keyof AgentTimings> = {
  pet: "petIntervalMs",
  check: "checkIntervalMs",
  api: "apiTimeoutMs",
  peer: "peerTimeoutMs",
  rounds: "badRounds",
  kubelet: "kubeletStaleMs",
};

export function parseTimings(s: string | undefined): Partial<AgentTimings> {
  const out: Partial<AgentTimings> = {};
  for (const part of (s ?? "").split(",").filter(Boolean)) {
    const [k, v] = part.split("=");
    const key = KEYS[k?.trim() ?? ""];
    const n = Number(v);
    // kubelet=0 turns the kubelet rule off; every other timing must be positive.
    if (!key || !Number.isFinite(n) || n < 0 || (n === 0 && key !== "kubeletStaleMs"))
      throw new UsageError(
        `--fencing-timings: '${part}' is not one of pet|check|api|peer|rounds|kubelet=<positive number> (kubelet=0: off)`,
      );
    out[key] = key === "badRounds" ? Math.round(n) : Math.round(n * 1000);
  }
  return out;
}

function port(v: unknown, flag: string, dflt: number): number {
  if (v === undefined) return dflt;
  const n = Number(v);
  if (!Number.isInteger(n) || n < 1 || n > 65535) throw new UsageError(`--${flag} '${v}' is not a port`);
  return n;
}

/** Validates the flags; throws UsageError before anything starts. */
export function fencingSettings(values: ParsedValues) {
  return {
    device: (values["watchdog-device"] as string | undefined) ?? "/dev/watchdog",
    peerPort: port(values["fencing-port"], "fencing-port", 4227),
    listenPort:
      values["fencing-listen-port"] === undefined
        ? undefined
        : port(values["fencing-listen-port"], "fencing-listen-port", 0),
    peerAddress: values["fencing-address"] as string | undefined,
    timings: parseTimings(values["fencing-timings"] as string | undefined),
    fenceWithoutPeers: values["fencing-without-peers"] === true,
    peerMinAgeMs: seconds(values["fencing-peer-min-age"], "fencing-peer-min-age"),
  };
}

function seconds(v: unknown, flag: string): number | undefined {
  if (v === undefined) return undefined;
  const n = Number(v);
  if (!Number.isFinite(n) || n < 0) throw new UsageError(`--${flag} '${v}' is not a number of seconds`);
  return Math.round(n * 1000);
}

/** TLS for the peer endpoint from a client's credentials: the kubelet's certificate and the cluster CA. */
const tlsCache = new WeakMap<KubeClient, PeerTls>();
export function peerTlsOf(client: KubeClient | undefined): PeerTls | undefined {
  if (!client?.connection.cert || !client.connection.key) return undefined;
  let tls = tlsCache.get(client);
  if (!tls) {
    tls = { cert: client.connection.cert, key: client.connection.key, ca: client.connection.ca };
    tlsCache.set(client, tls);
  }
  return tls;
}

/**
 * Starts fencing beside the daemon: follows the applied bundle's fencing setting. The fencing
 * code (watchdog, peer endpoint, API checks) is loaded the first time a node group turns it on,
 * so nodes without fencing do not carry it. Returns the stop function (call it before the
 * daemon closes its clients, so the label can be removed).
 */
export function startFencing(o: {
  values: ParsedValues;
  root: string;
  log: Logger;
  nodeName: string;
  kube: () => KubeClient | undefined;
  /** The resident process's registry (served at /metrics). */
  metrics?: Registry;
}): { current(): Fencing | undefined; refresh(): void; stop(): Promise<void> } {
  const s = fencingSettings(o.values);
  let fencing: Fencing | undefined;
  // Serialises loading and configuring: settings apply in the order the follower saw them.
  let chain: Promise<void> = Promise.resolve();
  const apply = (cfg: FencingConfig | undefined) => {
    chain = chain
      .then(async () => {
        if (!fencing && !cfg) return;
        if (!fencing) {
          const { Fencing } = await import("./fencing.ts");
          fencing = new Fencing({
            root: o.root,
            device: s.device,
            nodeName: o.nodeName,
            log: o.log,
            kube: o.kube,
            metrics: o.metrics ?? new Registry(),
            peerTls: () => peerTlsOf(o.kube()),
            peerPort: s.peerPort,
            listenPort: s.listenPort,
            peerAddress: s.peerAddress,
            timings: s.timings,
            fenceWithoutPeers: s.fenceWithoutPeers,
            ...(s.peerMinAgeMs === undefined ? {} : { peerMinAgeMs: s.peerMinAgeMs }),
          });
        }
        await fencing.configure(cfg);
      })
      .catch((err) => o.log.error({ err: (err as Error).message }, "fencing: configure failed"));
  };
  const follower = followAppliedFencingConfig(o.root, apply, (err) =>
    o.log.warn({ err: err.message }, "fencing: cannot read the applied bundle"),
  );
  return {
    current: () => fencing,
    refresh: () => follower.refresh(),
    async stop() {
      follower.close();
      await chain;
      await fencing?.stop();
    },
  };
}
