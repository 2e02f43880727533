// A stored event's blocks and a request's blocks hash alike exactly when vLLM's extra keys agree.
import { expect, test } from "bun:test";
import { computeBlockHashes, requestBlockExtras } from "@kv-epp/index-wasm";
import type { BlockStored } from "@kv-epp/kv-events";
import { storedBlockExtras } from "./event-identity.ts";

const BS = 4;
const tokens = Uint32Array.from({ length: 12 }, (_, i) => i + 1);
const ev = (o: Partial<BlockStored>): BlockStored => ({
  type: "BlockStored", blockHashes: [1n, 2n, 3n], parentBlockHash: null, tokenIds: Array.from(tokens), blockSize: BS, loraId: null, medium: "GPU", ...o,
});
const eventHashes = (e: BlockStored) => computeBlockHashes(tokens, BS, storedBlockExtras(e, 3));
const requestHashes = (r: Parameters<typeof requestBlockExtras>[2]) => computeBlockHashes(tokens, BS, requestBlockExtras(3, BS, r));

test("extra_keys from the wire (LoRA name, [media id, offset] pairs, salt) hash as the request that made them", () => {
  const e = ev({ loraName: "sql", extraKeys: [["sql", "salt-1"], ["sql", ["m".repeat(64), 2]], ["sql", ["m".repeat(64), -2]]] });
  expect(eventHashes(e)).toEqual(requestHashes({ loraName: "sql", cacheSalt: "salt-1", mmItems: [{ mmId: "m".repeat(64), offset: 6, length: 4 }] }));
  expect(eventHashes(e)[0]).not.toBe(requestHashes({ loraName: "sql" })[0]!);
});

test("without extra_keys, lora_name goes on every block; [null] entries mean none", () => {
  expect(eventHashes(ev({ loraName: "sql" }))).toEqual(requestHashes({ loraName: "sql" }));
  expect(eventHashes(ev({ loraName: null, extraKeys: [null, null, null] }))).toEqual(computeBlockHashes(tokens, BS));
});

test("an adapter known only by lora_id (older vLLM, SGLang) never matches the base model's requests", () => {
  const h = eventHashes(ev({ loraId: 3 }));
  for (let i = 0; i < 3; i++) expect(h[i]).not.toBe(computeBlockHashes(tokens, BS)[i]!);
  expect(eventHashes(ev({ loraId: 3 }))).toEqual(h);
  expect(eventHashes(ev({ loraId: 4 }))[0]).not.toBe(h[0]!);
  // With a name, the name is the identity (the id is not part of it).
  expect(eventHashes(ev({ loraId: 3, loraName: "sql" }))).toEqual(requestHashes({ loraName: "sql" }));
});

test("SGLang's salt folds into the first block of a chain only", () => {
  expect(eventHashes(ev({ cacheSalt: "t" }))).toEqual(requestHashes({ cacheSalt: "t" }));
  expect(eventHashes(ev({ cacheSalt: "t", parentBlockHash: 9n }))).toEqual(computeBlockHashes(tokens, BS));
});

test("an extra key of an unknown shape still gives the block its own identity", () => {
  const h = eventHashes(ev({ extraKeys: [[{ what: 1 }], null, null] }));
  expect(h[0]).not.toBe(computeBlockHashes(tokens, BS)[0]!);
  expect(h[1]).toBe(computeBlockHashes(tokens, BS)[1]!);
});
