// Global DP ranks: a worker's ranks start at its start rank, and its KV ports follow the global rank
// as vLLM's offset_endpoint_port does; the rank header numbers them as the worker's API server does.
import { expect, test } from "bun:test";
import type { V1Pod } from "@kubernetes/client-node";
import { rankSources } from "@kv-epp/protocol";
import { DP_LB_ANNOTATION, DP_START_RANK_ANNOTATION, podDpLb, podWorker } from "./kubernetes.ts";
import { serving } from "./registry.ts";
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

test("the rank header follows the worker's DP load-balancing mode: global under internal LB, the server's own numbering under hybrid and external", () => {
  const entry = { id: "node-b", address: "10.0.0.2:8000", kvEvents: "tcp://10.0.0.2:5557", dpSize: 2, dpStartRank: 2, kvEventsBind: false } as const;
  const headers = (dpLb?: "internal" | "hybrid" | "external", dpSize = 2) => {
    const [spec] = staticWorkers([{ ...entry, dpSize, dpLb }]);
    return rankSources(spec!).map((r) => [r.dpRank, serving(spec!, r.dpRank, dpSize)]);
  };
  const at = (rankHeader: number | undefined) => ({ endpoint: "10.0.0.2:8000", rankHeader });
  expect(headers()).toEqual([[2, at(2)], [3, at(3)]]);
  expect(headers("internal")).toEqual([[2, at(2)], [3, at(3)]]);
  expect(headers("hybrid")).toEqual([[2, at(0)], [3, at(1)]]);
  expect(headers("external", 1)).toEqual([[2, at(undefined)]]);
  expect(headers("hybrid", 1)).toEqual([[2, at(undefined)]]);
});

test("a pod's LB mode comes from its annotation; without one, a pod with a later start rank runs hybrid LB (only the head node serves under internal LB)", () => {
  const pod = (annotations: Record<string, string>) => ({ metadata: { name: "p", annotations }, status: { podIP: "10.1.0.5" } }) as V1Pod;
  const opts = { kvEventsPort: 5557, dpSize: 2 };
  const header = (annotations: Record<string, string>, rank: number) => serving(podWorker(pod(annotations), opts, [8000]), rank, 2).rankHeader;
  expect(header({ [DP_START_RANK_ANNOTATION]: "2" }, 3)).toBe(1);
  expect(header({ [DP_START_RANK_ANNOTATION]: "2", [DP_LB_ANNOTATION]: "hybrid" }, 3)).toBe(1);
  expect(header({ [DP_START_RANK_ANNOTATION]: "2", [DP_LB_ANNOTATION]: "internal" }, 3)).toBe(3);
  expect(header({}, 1)).toBe(1);
  expect(header({ [DP_LB_ANNOTATION]: "hybrid" }, 1)).toBe(1);
  expect(podDpLb(pod({ [DP_START_RANK_ANNOTATION]: "2", [DP_LB_ANNOTATION]: "Hybrid" }))).toEqual({
    mode: "hybrid",
    invalid: `${DP_LB_ANNOTATION} "Hybrid" is not one of internal, hybrid, external`,
  });
  expect(header({ [DP_START_RANK_ANNOTATION]: "2", [DP_LB_ANNOTATION]: "Hybrid" }, 3)).toBe(1);
});
