// Global DP ranks: a worker's ranks start at its start rank, and its KV ports follow the global rank
// as vLLM's offset_endpoint_port does.
import { expect, test } from "bun:test";
import type { V1Pod } from "@kubernetes/client-node";
import { rankSources } from "@kv-epp/protocol";
import { DP_START_RANK_ANNOTATION, podWorker } from "./kubernetes.ts";
import { staticWorkers } from "./static.ts";

test("ranks start..start+dpSize-1 on the KV (and replay) port + the global rank", () => {
  const [spec] = staticWorkers([{ id: "node-b", address: "10.0.0.2:8000", kvEvents: "tcp://10.0.0.2:5557", replay: "tcp://10.0.0.2:5600", dpSize: 2, dpStartRank: 2, kvEventsBind: false }]);
  expect(rankSources(spec!)).toEqual([
    { dpRank: 2, kvEvents: "tcp://10.0.0.2:5559", replay: "tcp://10.0.0.2:5602" },
    { dpRank: 3, kvEvents: "tcp://10.0.0.2:5560", replay: "tcp://10.0.0.2:5603" },
  ]);
  const [first] = staticWorkers([{ id: "node-a", address: "10.0.0.1:8000", kvEvents: "tcp://10.0.0.1:5557", dpSize: 2, dpStartRank: 0, kvEventsBind: false }]);
  expect(rankSources(first!).map((r) => [r.dpRank, r.kvEvents])).toEqual([[0, "tcp://10.0.0.1:5557"], [1, "tcp://10.0.0.1:5558"]]);
});

test("a pod's start rank comes from its annotation (every target port's ranks shift with it); a value that is not a rank counts as none", () => {
  const pod = (annotations?: Record<string, string>) =>
    ({ metadata: { name: "p", annotations }, status: { podIP: "10.1.0.5" } }) as V1Pod;
  const opts = { kvEventsPort: 5557, dpSize: 2 };
  expect(rankSources(podWorker(pod({ [DP_START_RANK_ANNOTATION]: "4" }), opts, [8000])).map((r) => [r.dpRank, r.kvEvents])).toEqual([
    [4, "tcp://10.1.0.5:5561"], [5, "tcp://10.1.0.5:5562"],
  ]);
  const multi = podWorker(pod({ [DP_START_RANK_ANNOTATION]: "4" }), { kvEventsPort: 5557, dpSize: 1 }, [8000, 8001]);
  expect(multi.servers).toEqual([{ address: "10.1.0.5:8000", ranks: [4] }, { address: "10.1.0.5:8001", ranks: [5] }]);
  expect(rankSources(multi).map((r) => r.kvEvents)).toEqual(["tcp://10.1.0.5:5561", "tcp://10.1.0.5:5562"]);
  for (const bad of [undefined, {} as Record<string, string>, { [DP_START_RANK_ANNOTATION]: "-1" }, { [DP_START_RANK_ANNOTATION]: "x" }, { [DP_START_RANK_ANNOTATION]: "5000" }])
    expect(rankSources(podWorker(pod(bad), opts, [8000]))[0]!.dpRank).toBe(0);
});
