// --secure-serving: ext_proc over TLS with the given certificate; plaintext clients are refused.
import { afterAll, expect, test } from "bun:test";
import { mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as grpc from "@grpc/grpc-js";
import { loadProtos } from "../src/extproc/protos.ts";
import type { EppHandle } from "../src/main.ts";
import { HOST, body, extProcClient, headers, startTestEpp, type Resp } from "./helpers.ts";
import type { ProcessingRequest } from "../src/extproc/messages.ts";

let epp: EppHandle | undefined;
afterAll(() => epp?.stop({ graceMs: 200 }));

test("with --secure-serving the ext_proc port speaks TLS with the configured certificate", async () => {
  const dir = mkdtempSync(join(tmpdir(), "epp-tls-"));
  const cert = join(dir, "tls.crt");
  const key = join(dir, "tls.key");
  const gen = Bun.spawnSync([
    "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=epp",
    "-addext", "subjectAltName=DNS:epp", "-keyout", key, "-out", cert,
  ]);
  expect(gen.exitCode).toBe(0);
  epp = await startTestEpp([], { flags: ["--secure-serving", "--tls-cert-file", cert, "--tls-key-file", key] });

  const { extProc } = loadProtos();
  const tls = new extProc(`${HOST}:${epp.ports.grpc}`, grpc.credentials.createSsl(readFileSync(cert)), {
    // Node refuses an IP as TLS servername; the certificate names "epp".
    "grpc.ssl_target_name_override": "epp",
  }) as unknown as grpc.Client & {
    Process(): grpc.ClientDuplexStream<ProcessingRequest, Resp>;
  };
  const s = tls.Process();
  const first = new Promise<Resp>((resolve, reject) => {
    s.on("data", resolve);
    s.on("error", reject);
  });
  s.write(headers());
  s.write(body({ prompt: [1, 2, 3] }));
  expect((await first).immediate_response?.status?.code).toBe("ServiceUnavailable"); // no workers: but answered over TLS
  s.end();
  tls.close();

  const plain = extProcClient(epp.ports.grpc);
  const ps = plain.open();
  ps.send(headers());
  await expect(ps.next(3000)).rejects.toThrow();
  plain.close();
});
