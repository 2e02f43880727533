// grpc.health.v1 states, gated on recovery: NOT_SERVING (and /dump 503) while a dump is in flight.
import { afterAll, expect, test } from "bun:test";
import { waitFor, LOOPBACK } from "@kv-epp/testkit";
import { EXT_PROC_SERVICE } from "../src/extproc/protos.ts";
import { HOST, body, checkHealth, extProcClient, headers, healthClient, listHealth, setHeader, startTestEpp } from "./helpers.ts";

const cleanups: (() => unknown)[] = [];
afterAll(async () => {
  for (const c of cleanups.reverse()) await c();
});

test("readiness and ext_proc stay NOT_SERVING until recovery ends, liveness serves throughout", async () => {
  // A serving peer whose dump stalls until released: recovery is held in its attempt.
  let release!: () => void;
  const released = new Promise<void>((r) => (release = r));
  const peer = Bun.serve({
    hostname: HOST,
    port: 0,
    fetch: async (req) => {
      if (req.method === "HEAD") return new Response(null, { status: 200 });
      await released;
      return new Response("{}", { headers: { "content-type": "application/json" } });
    },
  });
  cleanups.push(() => peer.stop(true));
  const epp = await startTestEpp([], { peers: [`http://${HOST}:${peer.port}`], waitReady: false });
  cleanups.push(() => epp.stop({ graceMs: 500 }));
  const h = healthClient(epp.ports.grpcHealth);
  cleanups.push(() => h.close());

  const watch = h.Watch({ service: "readiness" });
  const seen: string[] = [];
  watch.on("data", (r) => seen.push(r.status));
  watch.on("error", () => {});
  cleanups.push(() => watch.cancel());

  expect(await checkHealth(h, "liveness")).toBe("SERVING");
  expect(await checkHealth(h, "")).toBe("NOT_SERVING"); // a load balancer's overall check: readiness
  expect(await checkHealth(h, "readiness")).toBe("NOT_SERVING");
  expect(await checkHealth(h, EXT_PROC_SERVICE)).toBe("NOT_SERVING");
  expect(await checkHealth(h, "inference-extension")).toBe("NOT_SERVING"); // what GAIE's chart and conformance probe
  expect(await listHealth(h)).toEqual({ [EXT_PROC_SERVICE]: "NOT_SERVING" });
  expect((await fetch(`http://${HOST}:${epp.ports.selection}/dump`)).status).toBe(503);

  release();
  expect((await epp.ready).kind).toBe("recovered");
  expect(await checkHealth(h, "")).toBe("SERVING");
  expect(await checkHealth(h, "readiness")).toBe("SERVING");
  expect(await checkHealth(h, EXT_PROC_SERVICE)).toBe("SERVING");
  expect(await checkHealth(h, "inference-extension")).toBe("SERVING");
  expect(await listHealth(h)).toEqual({ [EXT_PROC_SERVICE]: "SERVING" });
  expect((await fetch(`http://${HOST}:${epp.ports.selection}/dump`)).status).toBe(200);
  await waitFor(() => seen.length >= 2, { message: "watch saw the transition" });
  expect(seen.slice(0, 2)).toEqual(["NOT_SERVING", "SERVING"]);

  // Shutdown: NOT_SERVING first.
  const stopping = epp.stop({ graceMs: 500 });
  await waitFor(() => seen.at(-1) === "NOT_SERVING", { message: "watch saw the drain" });
  await stopping;
});

test("any other service name answers readiness, as llm-d's router without leader election; no peers configured means recovery_disabled and ready", async () => {
  const epp = await startTestEpp([], { waitReady: false });
  cleanups.push(() => epp.stop({ graceMs: 500 }));
  const h = healthClient(epp.ports.grpcHealth);
  cleanups.push(() => h.close());
  const watch = h.Watch({ service: "nope" });
  const seen: string[] = [];
  watch.on("data", (r) => seen.push(r.status));
  watch.on("error", () => {});
  cleanups.push(() => watch.cancel());
  await epp.ready;
  expect(await checkHealth(h, "nope")).toBe("SERVING");
  expect(await checkHealth(h, "readiness")).toBe("SERVING");
  await waitFor(() => seen.at(-1) === "SERVING", { message: "a watch of an unknown name follows readiness" });
  epp.health.drain();
  expect(await checkHealth(h, "nope")).toBe("NOT_SERVING");
  expect(await checkHealth(h, "liveness")).toBe("SERVING");
  await waitFor(() => seen.at(-1) === "NOT_SERVING", { message: "and its drain" });
  const text = await (await fetch(`http://${HOST}:${epp.ports.metrics}/metrics`)).text();
  expect(text).toContain('dynamo_epp_kv_recovery_state{state="recovery_disabled"} 1');
  expect(text).toContain('dynamo_epp_kv_recovery_state{state="recovered"} 0');
});

test("during --shutdown-delay-ms the replica reports NOT_SERVING but still routes new requests", async () => {
  const epp = await startTestEpp([{ id: "w", address: `${LOOPBACK}.4.19:8000`, kvEvents: `tcp://${LOOPBACK}.4.19:1` }], { flags: ["--shutdown-delay-ms", "3000"] });
  const h = healthClient(epp.ports.grpcHealth);
  const c = extProcClient(epp.ports.grpc);
  cleanups.push(() => c.close(), () => h.close());
  const stopping = epp.stop({ graceMs: 200 });
  expect(await checkHealth(h, "readiness")).toBe("NOT_SERVING");
  expect(await checkHealth(h, "")).toBe("NOT_SERVING");
  // Liveness is the process: draining is alive (a failing liveness probe would kill it mid-drain).
  expect(await checkHealth(h, "liveness")).toBe("SERVING");
  const s = c.open();
  s.send(headers());
  s.send(body({ prompt: [1, 2, 3] }));
  expect(setHeader((await s.next()).request_headers?.response, "x-gateway-destination-endpoint")).toBe(`${LOOPBACK}.4.19:8000`);
  s.end();
  await stopping;
});

test("a stop while the replica is still getting ready keeps it NOT_SERVING (recovery ending meanwhile)", async () => {
  // The listener never connects: readiness waits --subscribe-wait-ms, then recovery (no peers) ends at once.
  const epp = await startTestEpp([{ id: "w", address: `${LOOPBACK}.4.19:8000`, kvEvents: `tcp://${LOOPBACK}.4.19:1` }], {
    flags: ["--subscribe-wait-ms", "1000", "--shutdown-delay-ms", "5000"],
    waitReady: false,
  });
  const settled = epp.ready.then(() => {}, () => {});
  const h = healthClient(epp.ports.grpcHealth);
  cleanups.push(() => h.close());
  const stopping = epp.stop({ graceMs: 200 });
  await settled; // past the subscribe wait and recovery, inside the shutdown delay
  expect(await checkHealth(h, "readiness")).toBe("NOT_SERVING");
  expect(await checkHealth(h, EXT_PROC_SERVICE)).toBe("NOT_SERVING");
  await stopping;
});

test("--health-checking also answers grpc.health.v1 Check and List on the ext_proc port, over its TLS, with the same rules", async () => {
  const epp = await startTestEpp([], { flags: ["--health-checking"] });
  cleanups.push(() => epp.stop({ graceMs: 500 }));
  const h = healthClient(epp.ports.grpc, HOST, { tls: true });
  cleanups.push(() => h.close());
  for (const service of ["", "liveness", "readiness", "inference-extension", EXT_PROC_SERVICE, "nope"]) expect(await checkHealth(h, service)).toBe("SERVING");
  expect(await listHealth(h)).toEqual({ [EXT_PROC_SERVICE]: "SERVING" });
  const code = (e: { code?: number }) => e.code;
  epp.health.drain();
  expect(await checkHealth(h, "inference-extension")).toBe("NOT_SERVING");
  expect(await checkHealth(h, "nope")).toBe("NOT_SERVING");
  expect(await checkHealth(h, "liveness")).toBe("SERVING");
  expect(await listHealth(h)).toEqual({ [EXT_PROC_SERVICE]: "NOT_SERVING" });

  // Without the flag the ext_proc port serves ext_proc alone.
  const plain = await startTestEpp([]);
  cleanups.push(() => plain.stop({ graceMs: 500 }));
  const p = healthClient(plain.ports.grpc, HOST, { tls: true });
  cleanups.push(() => p.close());
  expect(await checkHealth(p, "").catch(code)).toBe(12); // UNIMPLEMENTED
});
