import { describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { tempDir } from "@kv-epp/testkit";
import { layout, writeEppConfig } from "./cluster.ts";
import { parseDemoArgs } from "./options.ts";
import { pdSummaryRows } from "./pd-figures.ts";

describe("bun run demo --pd", () => {
  test("--pd is a switch: half the workers prefill, the rest decode behind a sidecar on the port the gateway calls", () => {
    const o = parseDemoArgs(["--pd", "--requests", "10"]);
    expect(o.pd).toBe(true);
    expect(o.requests).toBe(10);
    expect(parseDemoArgs([]).pd).toBe(false);
    const l = layout({ ...o, subnet: "127.0.61" });
    expect(l.workers.map((w) => [w.id, w.role, w.httpPort, w.enginePort])).toEqual([
      ["prefill-0", "prefill", 8000, undefined],
      ["prefill-1", "prefill", 8000, undefined],
      ["decode-0", "decode", 8000, 8200],
      ["decode-1", "decode", 8000, 8200],
    ]);
    expect(layout({ ...parseDemoArgs([]), subnet: "127.0.61" }).workers.every((w) => w.role === undefined && w.enginePort === undefined)).toBe(true);
  });

  test("the EPPs' static config names each worker's role and, for a decode worker, its sidecar's address", () => {
    const l = layout({ ...parseDemoArgs(["--pd"]), subnet: "127.0.61" });
    const config = JSON.parse(readFileSync(writeEppConfig(l, "epp-a", [], tempDir("pd-demo-")), "utf8")) as { workers: { id: string; role?: string; address: string; kvEvents: string }[] };
    expect(config.workers.find((w) => w.id === "prefill-0")).toMatchObject({ role: "prefill", address: "127.0.61.11:8000", kvEvents: "tcp://127.0.61.11:5557" });
    expect(config.workers.find((w) => w.id === "decode-1")).toMatchObject({ role: "decode", address: "127.0.61.14:8000", kvEvents: "tcp://127.0.61.14:5557" });
  });

  test("the summary says where the prompts ran, and a scrape that failed says so", () => {
    const rows = pdSummaryRows({
      disaggregated: 8, local: 2, sidecarFailures: 0,
      workers: [
        { id: "prefill-0", role: "prefill", computed: 600, cacheHit: 400, transferred: 0, blocks: 60 },
        { id: "decode-0", role: "decode", computed: 30, cacheHit: 0, transferred: 970, blocks: 61 },
      ],
    }, []);
    expect(rows[0]).toEqual(["P/D requests", "8 prefilled on a prefill worker, 2 kept on their decode worker, 0 failed in a sidecar (the decode workers' P/D sidecars)"]);
    expect(rows[1]![1]).toStartWith("40.0% of the prefill workers' prompt tokens");
    expect(pdSummaryRows({ failed: "http://x/metrics: HTTP 500" }, [])[0]).toEqual(["P/D pool", "not scraped: http://x/metrics: HTTP 500"]);
  });
});
