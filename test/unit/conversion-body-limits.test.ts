// The conversion webhook's body bounds (cluster/listener-limits.ts readBoundedBody) through the
// handler on a real HTTP server: a body streamed past the limit without a Content-Length is cut
// at the limit with 413, a body that stalls gets 408, a good review is converted, and a body
// that is not a ConversionReview gets 400 naming why.
import t from "tap";
import http from "node:http";
import net from "node:net";
import type { AddressInfo } from "node:net";
import { pino } from "pino";
import { handleConversion } from "../../cluster/server/conversion-webhook.ts";

const limits = { maxBytes: 4096, timeoutMs: 300 };
const server = http.createServer((req, res) => {
  void handleConversion(req, res, { limits, log: pino({ level: "silent" }) });
});
await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
t.teardown(() => new Promise<void>((r) => server.close(() => r())));
const port = (server.address() as AddressInfo).port;

/** Sends raw HTTP/1.1 and resolves with the status line and body of the answer. */
function raw(request: string, keepOpen = false): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const s = net.connect(port, "127.0.0.1");
    let got = "";
    s.on("data", (c) => {
      got += c.toString();
    });
    s.on("close", () => {
      const status = Number(got.match(/^HTTP\/1\.1 (\d{3})/)?.[1] ?? 0);
      resolve({ status, body: got.slice(got.indexOf("\r\n\r\n") + 4) });
    });
    s.on("error", reject);
    s.write(request);
    if (!keepOpen) s.end();
  });
}

t.test("a chunked body past the limit is refused with 413", async (t) => {
  const chunk = "x".repeat(1000);
  const chunks = Array.from({ length: 6 }, () => `${chunk.length.toString(16)}\r\n${chunk}\r\n`).join("");
  const res = await raw(
    `POST /convert HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n${chunks}0\r\n\r\n`,
  );
  t.equal(res.status, 413);
  t.match(res.body, /ConversionReview: the body is over 4096 bytes/);
});

t.test("a body that stops arriving is refused with 408", async (t) => {
  const res = await raw(`POST /convert HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"kind":`, true);
  t.equal(res.status, 408);
  t.match(res.body, /did not arrive within 300 ms/);
});

t.test("a good review is converted; a body that is not one gets 400", async (t) => {
  const review = JSON.stringify({
    apiVersion: "apiextensions.k8s.io/v1",
    kind: "ConversionReview",
    request: {
      uid: "u1",
      desiredAPIVersion: "deckhouse.io/v1",
      objects: [
        {
          apiVersion: "deckhouse.io/v1alpha2",
          kind: "NodeGroup",
          metadata: { name: "a" },
          spec: { nodeType: "Cloud" },
        },
      ],
    },
  });
  const ok = await raw(
    `POST /convert HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${review.length}\r\nConnection: close\r\n\r\n${review}`,
  );
  t.equal(ok.status, 200);
  const answer = JSON.parse(ok.body) as {
    response: { uid: string; convertedObjects: { spec: { nodeType: string } }[] };
  };
  t.equal(answer.response.uid, "u1");
  t.equal(answer.response.convertedObjects[0]?.spec.nodeType, "CloudEphemeral");

  const bad = '{"kind":"Pod"}';
  const res = await raw(
    `POST /convert HTTP/1.1\r\nHost: x\r\nContent-Length: ${bad.length}\r\nConnection: close\r\n\r\n${bad}`,
  );
  t.equal(res.status, 400);
  t.match(res.body, /the body is not a ConversionReview/);
});
