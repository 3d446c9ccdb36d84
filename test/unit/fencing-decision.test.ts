// The fencing state machine (agent/fencing/decision.ts) over many rounds, with time passed in:
// when the pets stop and resume, what the kubelet rule learns and forgets, what survives an
// agent restart, and that the pet timer's kubelet bound keeps the last pet inside the kubelet
// window the node states (the K of T > W + K + M). The single-round rule is in
// fencing-decide.test.ts; the same machine runs in real agents in fencing-agents.test.ts.
import t from "tap";
import {
  checked,
  type FencingState,
  initialState,
  kubeletAgeMs,
  next,
  petAllowed,
  resumed,
  type Round,
  rulesOf,
  starting,
  stopped,
} from "../../agent/fencing/decision.ts";
import type { ApiCheck, ApiResult } from "../../agent/fencing/health.ts";
import type { PeerOutcome } from "../../agent/fencing/peers.ts";
import { peerReport } from "../../agent/fencing/peer-endpoint.ts";
import { continuationOf, type FencingStatus } from "../../agent/fencing/status-file.ts";
import { DEFAULT_AGENT_TIMINGS, kubeletWindowMs, verdictMaxAgeMs } from "../../bundles/fencing.ts";

const T = DEFAULT_AGENT_TIMINGS; // check 5 s, API 4 s, peers 3 s, 3 rounds, kubelet 20 s
const BOOT = 1_000_000_000_000; // when this boot started (epoch ms)
const fresh = () => initialState(rulesOf(T, { fenceWithoutPeers: false, bootedAt: BOOT }));

/** A check at `at` whose answer came at once; `renewedAt` is the kubelet Lease's renewTime. */
function api(result: ApiResult, at: number, renewedAt?: number): ApiCheck {
  const reached = result === "ok" || result === "auth" || result === "no-lease";
  return {
    result,
    reached,
    at,
    durationMs: 0,
    ...(renewedAt === undefined
      ? {}
      : { kubeletLeaseRenewedAt: renewedAt, kubeletLeaseAgeSeconds: Math.round((at - renewedAt) / 1000) }),
  };
}
const round = (check: ApiCheck, ...peers: PeerOutcome[]): Round => ({
  api: check,
  answers: check.reached ? undefined : peers.map((outcome, i) => ({ node: `n${i}`, outcome })),
  knownPeers: check.reached ? 2 : peers.length,
});

/** Runs rounds at `at`, `at + check`, …; returns the state and each round's change. */
function rounds(s: FencingState, from: number, make: (at: number) => Round, count: number) {
  const changes: (string | undefined)[] = [];
  let at = from;
  for (let i = 0; i < count; i++, at += T.checkIntervalMs) {
    const step = next(checked(s, make(at).api), make(at), at);
    s = step.state;
    changes.push(step.change);
  }
  return { s, changes, at };
}

t.test(
  "pets stop on the third bad verdict in a row, not the first, and one healthy verdict resumes them",
  async (t) => {
    const s0 = starting(fresh(), BOOT + 10_000);
    t.same(petAllowed(s0, BOOT + 10_000), { ok: true }, "the start-up verdict lets the first pet out");
    const cut = rounds(s0, BOOT + 10_000, (at) => round(api("timeout", at), "reaches-api", "reaches-api"), 3);
    t.same(cut.changes, [undefined, undefined, "fenced"]);
    t.equal(cut.s.badRounds, 3);
    t.match(petAllowed(cut.s, cut.at), { ok: false, why: "fencing" });
    const back = next(cut.s, round(api("ok", cut.at)), cut.at);
    t.equal(back.change, "recovered");
    t.same([back.state.fencing, back.state.badRounds], [false, 0]);
    t.same(petAllowed(back.state, cut.at), { ok: true });
  },
);

t.test("an outage seen by the peers never counts as a bad round, however long it lasts", async (t) => {
  const out = rounds(fresh(), BOOT, (at) => round(api("timeout", at), "no-api", "no-api"), 100);
  t.same([out.s.fencing, out.s.badRounds], [false, 0]);
  t.ok(out.changes.every((c) => c === undefined));
  t.same(petAllowed(out.s, out.at - T.checkIntervalMs), { ok: true });
});

t.test("peers reachable but with old views: neither a bad round nor a reset", async (t) => {
  const two = rounds(fresh(), BOOT, (at) => round(api("timeout", at), "no-answer"), 2).s;
  t.equal(two.badRounds, 2);
  const held = next(two, round(api("timeout", BOOT + 10_000), "stale"), BOOT + 10_000).state;
  t.equal(held.badRounds, 2, "not reset by an inconclusive round");
  t.equal(held.verdict?.kind, "inconclusive");
  const third = next(held, round(api("timeout", BOOT + 15_000), "no-answer"), BOOT + 15_000);
  t.equal(third.change, "fenced", "the next bad round is the third");
});

t.test("a check loop that stops deciding stops the pets: a verdict older than the limit is not trusted", async (t) => {
  const at = BOOT + 60_000;
  const s = next(fresh(), round(api("ok", at)), at).state;
  const limit = verdictMaxAgeMs(T);
  t.same(petAllowed(s, at + limit), { ok: true }, "at the limit");
  t.match(petAllowed(s, at + limit + 1), { ok: false, why: "stale-verdict", reason: /check loop stopped deciding/ });
  t.match(petAllowed(fresh(), at), { ok: false, why: "no-verdict" }, "no verdict yet: no pet");
});

t.test("the kubelet rule starts only once the kubelet renewed its Lease since this boot", async (t) => {
  const at = BOOT + 30_000;
  // A Lease from before the boot, young enough to pass for alive: it is the previous boot's.
  const before = next(fresh(), round(api("ok", at, BOOT - 1_000)), at);
  t.same([before.kubeletWatched, before.state.kubelet.seenAlive], [false, false]);
  const old = next(before.state, round(api("ok", at + 5_000, BOOT - 1_000)), at + 5_000);
  t.equal(old.verdict.kind, "api", "an old Lease of the previous boot counts for nothing");
  const renewed = next(old.state, round(api("ok", at + 10_000, at + 9_000)), at + 10_000);
  t.equal(renewed.kubeletWatched, true, "said once, when first seen");
  t.equal(next(renewed.state, round(api("ok", at + 15_000, at + 14_000)), at + 15_000).kubeletWatched, false);
});

t.test("a kubelet that stops renewing: bad rounds once its Lease is older than the limit", async (t) => {
  const at = BOOT + 60_000;
  let s = next(fresh(), round(api("ok", at, at)), at).state;
  t.equal(s.kubelet.seenAlive, true);
  const lastRenewal = at;
  const stale = rounds(s, at + T.checkIntervalMs, (now) => round(api("ok", now, lastRenewal)), 8);
  s = stale.s;
  t.equal(s.verdict?.kind, "kubelet-stale");
  t.equal(s.fencing, true);
  // 20 s is the limit: rounds at 5..20 s are fine, 25, 30, 35 s are the three bad ones.
  t.same(stale.changes, [undefined, undefined, undefined, undefined, undefined, undefined, "fenced", undefined]);
});

t.test("after an outage the Lease's age counts from when the API came back, not from the last renewal", async (t) => {
  const at = BOOT + 60_000;
  const alive = next(fresh(), round(api("ok", at, at)), at).state;
  // Five minutes of outage: the kubelet could not renew, every Lease is old.
  const out = rounds(alive, at + 5_000, (now) => round(api("timeout", now), "no-api", "no-api"), 60);
  t.equal(out.s.kubelet.apiReachableSince, undefined, "an outage resets the API-back time");
  const back = out.at;
  const first = next(out.s, round(api("ok", back, at)), back);
  t.equal(first.verdict.kind, "api", `Lease ${first.state.lastCheck?.kubeletLeaseAgeSeconds} s old, API back 0 s`);
  t.equal(first.state.kubelet.apiReachableSince, back);
  const later = rounds(first.state, back + 5_000, (now) => round(api("ok", now, at)), 3);
  t.equal(later.s.verdict?.kind, "api", "15 s after the API came back: within the 20 s limit");
  t.equal(next(later.s, round(api("ok", later.at + 5_000, at)), later.at + 5_000).verdict.kind, "kubelet-stale");
});

t.test("a node cut off alone does not reset the API-back time: the cluster keeps counting", async (t) => {
  const at = BOOT + 60_000;
  const alive = next(fresh(), round(api("ok", at, at)), at).state;
  const cut = rounds(alive, at + 5_000, (now) => round(api("timeout", now), "reaches-api", "reaches-api"), 2).s;
  t.equal(cut.kubelet.apiReachableSince, at);
  const lone = next(alive, round(api("timeout", at + 5_000)), at + 5_000).state;
  t.equal(lone.verdict?.kind, "no-peers");
  t.equal(lone.kubelet.apiReachableSince, undefined, "no one to ask: counted as an outage");
});

t.test("the pet timer's kubelet bound: no pet once the Lease is older than the kubelet window", async (t) => {
  const K = kubeletWindowMs(T) ?? 0;
  t.equal(K, 35_000);
  const at = BOOT + 60_000;
  let s = next(fresh(), round(api("ok", at, at)), at).state;
  // Rounds slower than the window assumes (every 9 s: an API at its deadline and a label patch),
  // the kubelet silent from `at` on. Pets every second; the last one that goes out:
  let lastPet = at;
  let nextRound = at + 9_000;
  for (let now = at; now <= at + 120_000; now += 1_000) {
    if (now === nextRound) {
      s = next(s, round(api("ok", now, at)), now).state;
      nextRound += 9_000;
    }
    if (petAllowed(s, now).ok) lastPet = now;
  }
  t.ok(lastPet - at <= K, `last pet ${lastPet - at} ms after the last renewal (window ${K} ms)`);
  t.match(petAllowed(s, at + K + 1_000), { ok: false });
  // One bad round only (not fenced), its verdict fresh: the bound alone holds the pet back.
  const alive = next(fresh(), round(api("ok", at, at)), at).state;
  const oneBad = next(alive, round(api("ok", at + 34_000, at)), at + 34_000).state;
  t.same([oneBad.verdict?.kind, oneBad.fencing], ["kubelet-stale", false]);
  t.same(petAllowed(oneBad, at + K), { ok: true }, "at the window");
  t.match(petAllowed(oneBad, at + K + 1), {
    ok: false,
    why: "kubelet-window",
    kubeletAgeMs: K + 1,
    kubeletWindowMs: K,
  });
});

t.test("the kubelet bound needs a check of this process that read the Lease", async (t) => {
  const at = BOOT + 60_000;
  const s = next(fresh(), round(api("ok", at, at)), at).state;
  const late = at + 100_000;
  t.equal(kubeletAgeMs(s, late), 100_000);
  // A restarted agent knows the kubelet facts but has not checked yet: its first pet goes out.
  const restarted = starting(resumed(fresh(), undefined, s.kubelet), late);
  t.equal(kubeletAgeMs(restarted, late), undefined);
  t.same(petAllowed(restarted, late), { ok: true });
  // No Lease (404) or a 401: the cluster side has nothing to count either.
  t.equal(kubeletAgeMs(checked(s, api("no-lease", late)), late), undefined);
  t.equal(kubeletAgeMs(checked(s, api("auth", late)), late), undefined);
  const off = next(
    initialState(rulesOf({ ...T, kubeletStaleMs: 0 }, { fenceWithoutPeers: false, bootedAt: BOOT })),
    round(api("ok", at, at)),
    at,
  );
  t.equal(kubeletAgeMs(off.state, late), undefined, "the rule off");
  t.equal(off.state.kubelet.seenAlive, false);
});

t.test(
  "an agent restart continues a fence and the count of bad rounds; a stop resets them unless a fence is in progress",
  async (t) => {
    const held = resumed(fresh(), { fencing: true, badRounds: 3 }, undefined);
    t.same([held.fencing, held.badRounds], [true, 3]);
    t.same(starting(held, BOOT), held, "no start-up verdict during a fence: the device stays closed");
    t.equal(resumed(fresh(), { fencing: false, badRounds: 2 }, undefined).badRounds, 2);
    const kubelet = { seenAlive: true, apiReachableSince: BOOT + 5, renewSeenAt: BOOT + 7 };
    t.same(resumed(fresh(), undefined, kubelet).kubelet, kubelet);
    t.same(stopped(held, true), held, "a fence in progress stays one");
    t.same([stopped(held, false).fencing, stopped(held, false).badRounds], [false, 0]);
  },
);

t.test("next() reads no clock: the same round at the same time gives the same state", async (t) => {
  const s = starting(fresh(), BOOT);
  const r = round(api("timeout", BOOT + 1), "no-answer");
  t.same(next(s, r, BOOT + 2), next(s, r, BOOT + 2));
  t.equal(next(s, r, BOOT + 2).state.verdict?.at, BOOT + 2, "the verdict is stamped with the time passed in");
  t.equal(s.verdict?.at, BOOT, "the previous state is left as it was");
});

t.test("what a peer is told: the last check and its age, or 'pending' while a check hangs", async (t) => {
  const last = api("ok", 1_000);
  t.same(peerReport("a", last, undefined, 4_000, 3_000), { node: "a", reachedApi: true, result: "ok", ageMs: 2_000 });
  t.same(peerReport("a", last, 5_000, 4_000, 7_000), { node: "a", reachedApi: true, result: "ok", ageMs: 6_000 });
  t.same(peerReport("a", last, 5_000, 4_000, 7_001), { node: "a", reachedApi: false, result: "pending", ageMs: 0 });
  t.same(peerReport("a", undefined, undefined, 4_000, 1), {
    node: "a",
    reachedApi: false,
    result: "no-client",
    ageMs: Number.MAX_SAFE_INTEGER,
  });
});

t.test("what a restarted agent takes over from the status file", async (t) => {
  const now = BOOT + 100_000;
  const saved = {
    node: "n1",
    nodeGroup: "g",
    bootId: "boot-1",
    fencing: true,
    badRounds: 3,
    peers: [{ name: "n2", address: "10.0.0.2" }],
    kubeletSeenAlive: true,
    apiReachableSince: new Date(BOOT + 1_000).toISOString(),
    kubeletRenewSeenAt: new Date(BOOT + 2_000).toISOString(),
    updatedAt: new Date(now - 5_000).toISOString(),
  } as FencingStatus;
  const o = { node: "n1", group: "g", bootId: "boot-1", now, watchdogMs: 60_000, recentMs: 31_000 };
  t.same(continuationOf(saved, o), {
    peers: saved.peers,
    previous: { fencing: true, badRounds: 3 },
    kubelet: { seenAlive: true, apiReachableSince: BOOT + 1_000, renewSeenAt: BOOT + 2_000 },
  });
  t.same(continuationOf(saved, { ...o, now: now + 40_000 }).previous, undefined, "too old to say anything about now");
  t.ok(continuationOf(saved, { ...o, now: now + 40_000 }).kubelet, "kubelet facts: younger than the watchdog timeout");
  t.same(
    continuationOf(saved, { ...o, now: now + 60_000 }).kubelet,
    undefined,
    "away longer than the watchdog timeout",
  );
  t.same(continuationOf(saved, { ...o, bootId: "boot-2" }).kubelet, undefined, "another boot");
  t.same(continuationOf(saved, { ...o, group: "h" }).peers, [], "another group's peers are not ours");
  t.same(continuationOf(saved, { ...o, node: "n9" }), { peers: [] }, "another node's file");
  t.same(continuationOf(undefined, o), { peers: [] });
});
