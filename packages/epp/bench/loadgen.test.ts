// bench/loadgen.c against an in-process EPP (TLS, its default): every request of a short run is routed, in both modes.
// Skipped where the generator does not build (no C compiler, no libnghttp2 or OpenSSL headers), as the bench
// then falls back to bench/loadgen.ts.
import { afterAll, expect, test } from "bun:test";
import { join } from "node:path";
import { startTestEpp } from "../test/helpers.ts";
import { requestsFile, type Mode } from "./requests.ts";
import { LOOPBACK, tempDir } from "@kv-epp/testkit";

const dir = tempDir("loadgen-c-");
const bin = join(dir, "loadgen");
const built = (() => {
  try {
    return Bun.spawnSync(["cc", "-O2", "-o", bin, `${import.meta.dir}/loadgen.c`, "-lnghttp2", "-lssl", "-lcrypto"], { stderr: "pipe" }).exitCode === 0;
  } catch {
    return false;
  }
})();

const HOST = `${LOOPBACK}.4.230`;
const epp = built
  ? await startTestEpp(
      Array.from({ length: 4 }, (_, w) => ({ id: `w${w}`, address: `${LOOPBACK}.4.${231 + w}:8000`, kvEvents: `tcp://${LOOPBACK}.4.${231 + w}:1` })),
      { host: HOST },
    )
  : undefined;
afterAll(() => epp?.stop({ graceMs: 0 }));

if (!built) console.warn("loadgen.test.ts: bench/loadgen.c does not build here (Debian: apt-get install gcc libnghttp2-dev libssl-dev); skipped");

test.skipIf(!built)("the C generator's runs over TLS: every request answered with a route, in full duplex and BUFFERED mode", async () => {
  for (const mode of ["full-duplex", "buffered"] as Mode[]) {
    const file = join(dir, `requests-${mode}.bin`);
    await Bun.write(file, requestsFile(mode, 3));
    const latencies = join(dir, `latencies-${mode}.txt`);
    const p = Bun.spawn([bin, "--target", `${HOST}:${epp!.ports.grpc}`, "--requests", file, "--rate", "200", "--duration-ms", "500", "--warmup-ms", "100", "--mode", mode, "--tls",
      "--latencies", latencies], {
      stdout: "pipe",
    });
    const r = JSON.parse(await new Response(p.stdout).text());
    expect(await p.exited).toBe(0);
    expect(r.sent).toBe(100);
    expect({ mode, completed: r.completed, errors: r.errors, unfinished: r.unfinished }).toEqual({ mode, completed: 100, errors: 0, unfinished: 0 });
    expect(r.endpoints).toBeGreaterThan(1);
    expect(r.p50).toBeGreaterThan(0);
    expect(r.max).toBeGreaterThanOrEqual(r.p99);
    // Each measured request once: its index in the file (sent in turn, the first 20 in the warm-up) and its latency.
    const lines = (await Bun.file(latencies).text()).trim().split("\n").map((l) => l.split(" ").map(Number) as [number, number]);
    expect(lines.map(([i]) => i).sort((a, b) => a - b)).toEqual(Array.from({ length: 100 }, (_, k) => 20 + k));
    expect(lines.every(([, ms]) => ms > 0 && ms <= r.max)).toBe(true);
  }
});
