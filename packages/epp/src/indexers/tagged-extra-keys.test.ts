// Domain-tagged extra keys, as open vLLM PRs would publish them (#44706 and #51899: ("lora", name),
// ("cache_salt", salt); #48352: ("lora_identity", digest) beside the name). Not merged: the index folds a
// tagged entry as its bare form, leaves version labels out, and counts what it did not know. The
// payloads are written by the vllm encoder, which kv-events' producers.test.ts checks byte for byte
// against msgspec's bytes for this shape (Python tuples become msgpack arrays).
import type { WorkerRef } from "@kv-epp/protocol";
import { expect, test } from "bun:test";
import { computeBlockHashes, requestBlockExtras } from "@kv-epp/index-wasm";
import { findMatches } from "@kv-epp/index-wasm/helpers";
import { decodeBatch, encodeBatch, type ExtraKeys } from "@kv-epp/kv-events";
import { Indexers } from "./indexers.ts";
import { createMetrics } from "../metrics.ts";

const BS = 4;
const tokens = [1, 2, 3, 4, 5, 6, 7, 8];
const w: WorkerRef = { workerId: "w", dpRank: 0 };

/** A vLLM BlockStored map (omit_defaults) of two blocks with the given per-block extra_keys. */
function payload(extraKeys: ExtraKeys, hashes = [0x51n, 0x52n]): Uint8Array {
  return encodeBatch({
    ts: 2.5,
    dataParallelRank: 0,
    events: [{
      type: "BlockStored", blockHashes: hashes, parentBlockHash: null, tokenIds: tokens, blockSize: BS, loraId: 3,
      medium: "GPU", loraName: "sql", extraKeys,
    }],
  });
}

function rig() {
  const metrics = createMetrics();
  const ixs = new Indexers(metrics);
  const ix = ixs.models.register("m", "default", BS);
  let seq = 0n;
  const apply = (bytes: Uint8Array) => ixs.live.apply("m:default", w, { kind: "batch", seq: seq++, batch: decodeBatch(bytes) });
  const overlap = (r: Parameters<typeof requestBlockExtras>[2]) =>
    findMatches(ix.index, computeBlockHashes(Uint32Array.from(tokens), BS, requestBlockExtras(2, BS, r))).scores.get("w\u00000") ?? 0;
  const unknownFields = async () => Number((await metrics.registry.metrics()).split("\n").find((l) => l.startsWith("dynamo_epp_kv_unknown_fields_total "))?.split(" ")[1] ?? 0);
  return { apply, overlap, unknownFields };
}

test("tagged LoRA and salt entries match the request that named that adapter and salt", async () => {
  const r = rig();
  r.apply(payload([[["lora", "sql"], ["cache_salt", "t1"]], [["lora", "sql"]]]));
  expect(r.overlap({ loraName: "sql", cacheSalt: "t1" })).toBe(2);
  expect(r.overlap({ loraName: "sql" })).toBe(0);
  expect(r.overlap({ cacheSalt: "t1" })).toBe(0);
  expect(await r.unknownFields()).toBe(0);
});

test("tagged and bare forms of the same keys are one identity", () => {
  const tagged = rig();
  tagged.apply(payload([[["lora", "sql"], ["mm", ["img", -1]]], [["lora", "sql"]]]));
  const bare = rig();
  bare.apply(payload([["sql", ["img", -1]], ["sql"]]));
  const req = { loraName: "sql", mmItems: [{ mmId: "img", offset: -1, length: 2 }] };
  expect(tagged.overlap(req)).toBe(2);
  expect(bare.overlap(req)).toBe(2);
});

test("an adapter's version label is left out of identity and counted: the EPP cannot know which version a worker loaded", async () => {
  const r = rig();
  r.apply(payload([[["lora", "sql"], ["lora_identity", "9f2c"]], [["lora", "sql"], ["lora_identity", "9f2c"]]]));
  expect(r.overlap({ loraName: "sql" })).toBe(2);
  expect(await r.unknownFields()).toBe(2);
});

test("an entry with a label nobody knows keeps its block apart from every request, is counted, and the batch still applies", async () => {
  const r = rig();
  r.apply(payload([[["lora", "sql"], ["tenant_scope", "x"]], [["lora", "sql"]]]));
  // Block 0 has an identity no request produces, so its chain matches nothing.
  expect(r.overlap({ loraName: "sql" })).toBe(0);
  expect(await r.unknownFields()).toBe(1);
  // Nothing else is lost: a plain chain of the same tokens applies next to it.
  r.apply(payload([["sql"], ["sql"]], [0x61n, 0x62n]));
  expect(r.overlap({ loraName: "sql" })).toBe(2);
});
