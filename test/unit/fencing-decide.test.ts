import t from "tap";
import { decide } from "../../agent/fencing/decide.ts";
import type { ApiCheck, ApiResult } from "../../agent/fencing/health.ts";
import { classify } from "../../agent/fencing/health.ts";
import type { PeerAnswer, PeerOutcome } from "../../agent/fencing/peers.ts";
import { KubeRefusedError, KubeStatusError, KubeTLSError, KubeTimeoutError } from "../../lib/kube/errors.ts";
import {
  DEFAULT_AGENT_TIMINGS,
  DEFAULT_CONTROLLER_TIMINGS,
  detectionWindowMs,
  formatAgentTimingsAnnotation,
  kubeletWindowMs,
  maintenanceOf,
  parseAgentTimingsAnnotation,
  unsafeTimings,
} from "../../bundles/fencing.ts";

const api = (result: ApiResult, reached = false): ApiCheck => ({ result, reached, at: 0, durationMs: 1 });
const peers = (...o: PeerOutcome[]): PeerAnswer[] => o.map((outcome, i) => ({ node: `n${i}`, outcome }));
const opts = { fenceWithoutPeers: false };

t.test("an API that answers keeps the node, 401/403 included (a rotated certificate is not isolation)", async (t) => {
  t.equal(decide(api("ok", true), undefined, 2, opts).healthy, true);
  const auth = decide(api("auth", true), undefined, 2, opts);
  t.equal(auth.healthy, true);
  t.match(auth.reason, /not isolation/);
});

t.test("a control-plane outage seen by most peers keeps the node", async (t) => {
  const v = decide(api("timeout"), peers("no-api", "no-api", "reaches-api"), 3, opts);
  t.same([v.healthy, v.kind], [true, "outage"]);
  t.equal(decide(api("refused"), peers("no-api", "no-answer"), 2, opts).kind, "outage");
});

t.test("peers that reach the API while this node cannot: cut off", async (t) => {
  const v = decide(api("timeout"), peers("reaches-api", "reaches-api", "no-api"), 3, opts);
  t.same([v.healthy, v.kind], [false, "cut-off"]);
  t.match(v.reason, /2 reach the API, 1 do not/);
  // a tie is not "most peers fail": the API is up for someone who may free this node's pods
  t.equal(decide(api("tls"), peers("reaches-api", "no-api"), 2, opts).healthy, false);
});

t.test("no peer answers: isolated; no peer exists: kept unless told otherwise", async (t) => {
  t.same(decide(api("timeout"), peers("no-answer", "bad-identity"), 2, opts).kind, "isolated");
  t.equal(decide(api("timeout"), peers("no-answer"), 1, opts).healthy, false);
  t.equal(decide(api("timeout"), [], 0, opts).healthy, true);
  t.equal(decide(api("timeout"), [], 0, { fenceWithoutPeers: true }).healthy, false);
  t.equal(decide(api("timeout"), peers("stale"), 1, opts).kind, "inconclusive");
});

t.test("API failures are classified by kind", async (t) => {
  t.equal(classify(new KubeStatusError(401, "Unauthorized", "x", "u")).result, "auth");
  t.equal(classify(new KubeStatusError(403, "Forbidden", "x", "u")).result, "auth");
  t.equal(classify(new KubeStatusError(503, "ServiceUnavailable", "x", "u")).result, "server-error");
  t.equal(classify(new KubeRefusedError("x", "u")).result, "refused");
  t.equal(classify(new KubeTimeoutError("x", "u")).result, "timeout");
  t.equal(classify(new KubeTLSError("x", "u")).result, "tls");
});

t.test("timings: the default detection window and the threshold invariant", async (t) => {
  t.equal(detectionWindowMs(DEFAULT_AGENT_TIMINGS), 26_000);
  t.equal(unsafeTimings(DEFAULT_CONTROLLER_TIMINGS), undefined);
  const deckhouseV1 = {
    thresholdSeconds: 60,
    watchdogTimeoutSeconds: 60,
    detectionWindowSeconds: 26,
    marginSeconds: 20,
  };
  t.match(
    unsafeTimings(deckhouseV1),
    /threshold 60 s is not greater than watchdog timeout 60 s \+ detection window 26 s \+ margin 20 s = 106 s/,
  );
  t.ok(unsafeTimings({ ...deckhouseV1, thresholdSeconds: 106 }), "equal is not greater");
  t.equal(unsafeTimings({ ...deckhouseV1, thresholdSeconds: 107 }), undefined);
});

t.test("maintenance annotations hold fencing down; approved alone does not", async (t) => {
  t.equal(
    maintenanceOf({ "node-manager.deckhouse.io/fencing-disable": "" }),
    "node-manager.deckhouse.io/fencing-disable",
  );
  t.equal(
    maintenanceOf({ "update.node.deckhouse.io/disruption-approved": "" }),
    "update.node.deckhouse.io/disruption-approved",
  );
  t.equal(maintenanceOf({ "update.node.deckhouse.io/approved": "" }), undefined);
  t.ok(maintenanceOf({ "update.node.deckhouse.io/approved": "", "update.node.deckhouse.io/draining": "bashible" }));
});

t.test("a kubelet that stopped renewing its Lease is a bad verdict, once it renewed since boot", async (t) => {
  const withAge = (result: ApiResult, age: number): ApiCheck => ({ ...api(result, true), kubeletLeaseAgeSeconds: age });
  const on = { ...opts, kubeletStaleSeconds: 20, kubeletSeenAlive: true };
  const v = decide(withAge("ok", 21), undefined, 2, on);
  t.same([v.healthy, v.kind], [false, "kubelet-stale"]);
  t.match(v.reason, /not renewed its Lease for 21 s \(21 s while the API answered; limit 20 s\)/);
  t.equal(decide(withAge("ok", 20), undefined, 2, on).healthy, true, "at the limit: still fine");
  t.equal(decide(withAge("ok", 300), undefined, 2, { ...on, kubeletSeenAlive: false }).kind, "api", "not since boot");
  t.equal(decide(withAge("ok", 300), undefined, 2, opts).kind, "api", "the rule off");
  t.equal(decide(withAge("auth", 300), undefined, 2, on).kind, "api", "a 401/403 reads no Lease");
  // After an outage every Lease is old: its age counts from when the API answered again.
  t.equal(decide(withAge("ok", 300), undefined, 2, { ...on, apiReachableForSeconds: 20 }).kind, "api");
  const late = decide(withAge("ok", 300), undefined, 2, { ...on, apiReachableForSeconds: 21 });
  t.equal(late.kind, "kubelet-stale");
  t.match(late.reason, /for 300 s \(21 s while the API answered; limit 20 s\)/);
});

t.test("the kubelet window: stated by the node, checked against the threshold like the detection window", async (t) => {
  t.equal(kubeletWindowMs(DEFAULT_AGENT_TIMINGS), 35_000, "20 s + 3 rounds of 5 s");
  t.equal(kubeletWindowMs({ ...DEFAULT_AGENT_TIMINGS, kubeletStaleMs: 0 }), undefined, "off");
  t.equal(DEFAULT_CONTROLLER_TIMINGS.kubeletWindowSeconds, 35);
  t.equal(unsafeTimings(DEFAULT_CONTROLLER_TIMINGS), undefined, "120 > 60 + 35 + 20");
  t.match(
    unsafeTimings({ ...DEFAULT_CONTROLLER_TIMINGS, kubeletWindowSeconds: 41 }),
    /threshold 120 s is not greater than watchdog timeout 60 s \+ kubelet window 41 s \+ margin 20 s = 121 s/,
  );
  t.equal(unsafeTimings({ ...DEFAULT_CONTROLLER_TIMINGS, kubeletWindowSeconds: undefined }), undefined);
  const a = formatAgentTimingsAnnotation(60, 26, 35);
  t.equal(a, "watchdog=60s,detection=26s,kubelet=35s");
  t.same(parseAgentTimingsAnnotation(a), {
    watchdogTimeoutSeconds: 60,
    detectionWindowSeconds: 26,
    kubeletWindowSeconds: 35,
  });
  t.same(parseAgentTimingsAnnotation("watchdog=60s,detection=26s"), {
    watchdogTimeoutSeconds: 60,
    detectionWindowSeconds: 26,
  });
  t.equal(parseAgentTimingsAnnotation("watchdog=60s,detection=26s,kubelet=x"), undefined);
});

t.test("--fencing-timings: kubelet=0 turns the kubelet rule off; other timings must be positive", async (t) => {
  const { parseTimings } = await import("../../agent/fencing/options.ts");
  t.same(parseTimings("kubelet=0,rounds=2"), { kubeletStaleMs: 0, badRounds: 2 });
  t.same(parseTimings("kubelet=7.5"), { kubeletStaleMs: 7500 });
  t.throws(() => parseTimings("check=0"), /pet\|check\|api\|peer\|rounds\|kubelet/);
  t.throws(() => parseTimings("kubelet=-1"));
});
