// The decision part of the secure metrics listener: which header carries a token, which review
// answers let a scrape through, and the cache that bounds what a flood of tokens can hold.
import t from "tap";
import {
  accessReview,
  accessVerdict,
  authenticatedUser,
  bearerToken,
  DecisionCache,
  MetricsAuthorizer,
  nodeMetricsAccess,
  nonResourceAccess,
} from "../../lib/metrics-auth.ts";

t.test("the bearer token, and nothing else, is taken from the header", async (t) => {
  t.equal(bearerToken("Bearer abc.def-ghi_1"), "abc.def-ghi_1");
  t.equal(bearerToken("bearer abc"), "abc", "the scheme is case-insensitive (RFC 7235)");
  for (const h of [
    undefined,
    "",
    "Bearer",
    "Bearer ",
    "Basic dXNlcjpwYXNz",
    "Bearer a b",
    "Bearer a\u00e9",
    "Token abc",
  ])
    t.equal(bearerToken(h), undefined, `refused: ${JSON.stringify(h)}`);
});

t.test("only an authenticated user with a name is asked about; only allowed: true serves", async (t) => {
  const user = {
    username: "system:serviceaccount:d8-monitoring:prometheus",
    uid: "u1",
    groups: ["system:serviceaccounts"],
  };
  t.same(authenticatedUser({ authenticated: true, user }), user);
  t.equal(authenticatedUser({ authenticated: false, user }), undefined);
  t.equal(authenticatedUser({ authenticated: true, user: {} }), undefined, "no username: 401");
  t.equal(authenticatedUser(undefined), undefined);
  t.equal(accessVerdict({ allowed: true }), 200);
  t.equal(accessVerdict({ allowed: false }), 403);
  t.equal(accessVerdict(undefined), 403, "no answer denies");
  const sar = accessReview(user, nodeMetricsAccess("worker-1"));
  t.same(sar.spec.resourceAttributes, {
    verb: "get",
    group: "",
    resource: "nodes",
    subresource: "metrics",
    name: "worker-1",
  });
  t.same([sar.spec.user, sar.spec.uid, sar.spec.groups], [user.username, "u1", user.groups], "asked for that user");
  const server = accessReview(user, nonResourceAccess("/metrics"));
  t.same(server.spec.nonResourceAttributes, { verb: "get", path: "/metrics" }, "the bundle server's: get /metrics");
  t.equal(server.spec.resourceAttributes, undefined);
});

t.test("the cache holds at most its bound, for its time", async (t) => {
  let now = 0;
  const c = new DecisionCache<number>(3, 60_000, () => now);
  for (let i = 0; i < 10; i++) c.set(`k${i}`, i);
  t.equal(c.size, 3, "a flood of tokens holds no more than the bound");
  t.equal(c.get("k0"), undefined, "the oldest went first");
  t.equal(c.get("k9"), 9);
  now = 59_999;
  t.equal(c.get("k9"), 9, "within the minute");
  now = 60_000;
  t.equal(c.get("k9"), undefined, "not after it");
});

t.test("no API connection: 503, and not remembered; no token: 401 without asking", async (t) => {
  let asked = 0;
  const cache = new DecisionCache<Promise<200 | 401 | 403 | 503>>();
  const a = new MetricsAuthorizer({
    kube: () => {
      asked++;
      return undefined;
    },
    access: nodeMetricsAccess("n"),
    cache,
  });
  t.equal(await a.check(undefined), 401);
  t.equal(asked, 0, "no token, no review");
  t.equal(await a.check("Bearer tok"), 503);
  t.equal(cache.size, 0, "a failure to decide is asked again next time");
  t.equal(await a.check("Bearer tok"), 503);
  t.equal(asked, 2);
});
