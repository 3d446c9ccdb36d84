// lib/sleep.ts: loops sleep on one long-lived signal every few seconds (the fencing check loop,
// leader election, the informers' backoff); each sleep must leave nothing attached to it.
import t from "tap";
import { getEventListeners } from "node:events";
import { sleep } from "../../lib/sleep.ts";

t.test("a sleep that ends on its timer leaves no listener on the signal", async (t) => {
  const ac = new AbortController();
  for (let i = 0; i < 50; i++) await sleep(1, ac.signal);
  t.equal(getEventListeners(ac.signal, "abort").length, 0);
});

t.test("an abort ends the sleep at once; an aborted signal does not sleep at all", async (t) => {
  const ac = new AbortController();
  const slept = sleep(3_600_000, ac.signal);
  ac.abort();
  await slept;
  t.pass("ended by the abort");
  await sleep(3_600_000, ac.signal);
  t.pass("did not wait on an aborted signal");
});
