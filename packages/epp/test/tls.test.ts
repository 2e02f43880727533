// Secure serving as GAIE's EPP: TLS (ALPN h2) by default with a certificate made at start, given PEM
// files reloaded when they change, h2c only with --secure-serving=false. Every handshake is real.
import { afterEach, expect, test } from "bun:test";
import { renameSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { connect, type PeerCertificate } from "node:tls";
import { tempDir } from "@kv-epp/testkit";
import { selfSignedCertificate } from "../src/extproc/tls.ts";
import type { EppHandle } from "../src/main.ts";
import { HOST, body, extProcClient, headers, scrapeMetric, startTestEpp } from "./helpers.ts";

let epp: EppHandle | undefined;
afterEach(async () => {
  await epp?.stop({ graceMs: 200 });
  epp = undefined;
});

/** The certificate and ALPN protocol a TLS client offering h2 and http/1.1 gets from the port. */
function handshake(port: number): Promise<{ alpn: string | false; cert: PeerCertificate }> {
  return new Promise((resolve, reject) => {
    const s = connect({ host: HOST, port, servername: "dynamo-epp", rejectUnauthorized: false, ALPNProtocols: ["h2", "http/1.1"] }, () => {
      resolve({ alpn: s.alpnProtocol ?? false, cert: s.getPeerCertificate() });
      s.destroy();
    });
    s.on("error", reject);
  });
}

/** One ext_proc exchange: with no workers the EPP answers 503, which proves the stream was served. */
async function answered(port: number, tls: boolean): Promise<string | number | undefined> {
  const c = extProcClient(port, HOST, { tls });
  try {
    const s = c.open();
    s.send(headers());
    s.send(body({ prompt: [1, 2, 3] }));
    return (await s.next(5000)).immediate_response?.status?.code;
  } finally {
    c.close();
  }
}

test("by default the ext_proc port serves TLS with a self-signed certificate, ALPN h2 only; plaintext is refused", async () => {
  epp = await startTestEpp([]);
  const { alpn, cert } = await handshake(epp.ports.grpc);
  expect(alpn).toBe("h2");
  expect(cert.subject.CN).toBe("dynamo-epp");
  expect(cert.issuer.CN).toBe("dynamo-epp"); // self-signed
  expect(await answered(epp.ports.grpc, true)).toBe("ServiceUnavailable");
  await expect(answered(epp.ports.grpc, false)).rejects.toThrow();
});

test("--secure-serving=false serves h2c; a TLS client is refused", async () => {
  epp = await startTestEpp([], { flags: ["--secure-serving=false"] });
  expect(await answered(epp.ports.grpc, false)).toBe("ServiceUnavailable");
  await expect(answered(epp.ports.grpc, true)).rejects.toThrow();
});

test("given certificate files are served, and a replaced pair is served to new connections without a restart", async () => {
  const dir = tempDir("epp-tls-");
  const cert = join(dir, "tls.crt");
  const key = join(dir, "tls.key");
  const first = await selfSignedCertificate("first.example");
  writeFileSync(cert, first.cert);
  writeFileSync(key, first.key);
  epp = await startTestEpp([], { flags: ["--tls-cert-file", cert, "--tls-key-file", key] });
  expect((await handshake(epp.ports.grpc)).cert.subject.CN).toBe("first.example");
  expect(await answered(epp.ports.grpc, true)).toBe("ServiceUnavailable");
  const metrics = `http://${HOST}:${epp.ports.metrics}`;

  // A half-written pair (a key that does not match) is refused; the first certificate stays.
  const second = await selfSignedCertificate("second.example");
  writeFileSync(cert, second.cert);
  for (let i = 0; i < 200 && !((await scrapeMetric(metrics, 'dynamo_epp_tls_certificate_reloads_total{result="error"}')) ?? 0); i++) await Bun.sleep(25);
  expect(await scrapeMetric(metrics, 'dynamo_epp_tls_certificate_reloads_total{result="error"}')).toBeGreaterThan(0);
  expect((await handshake(epp.ports.grpc)).cert.subject.CN).toBe("first.example");

  // The key arrives the way a Secret volume updates: written aside, then moved into place.
  writeFileSync(`${key}.tmp`, second.key);
  renameSync(`${key}.tmp`, key);
  let cn = "";
  for (let i = 0; i < 200 && cn !== "second.example"; i++) {
    await Bun.sleep(25);
    cn = String((await handshake(epp.ports.grpc)).cert.subject.CN);
  }
  expect(cn).toBe("second.example");
  expect(await scrapeMetric(metrics, 'dynamo_epp_tls_certificate_reloads_total{result="ok"}')).toBe(1);
  expect(await answered(epp.ports.grpc, true)).toBe("ServiceUnavailable");
});

test("unreadable certificate files stop the start with a clear error", async () => {
  await expect(startTestEpp([], { flags: ["--tls-cert-file", "/nonexistent/tls.crt", "--tls-key-file", "/nonexistent/tls.key"] })).rejects.toThrow(
    /cannot load --tls-cert-file/,
  );
});
