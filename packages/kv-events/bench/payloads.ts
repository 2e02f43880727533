// Bench payloads: K distinct vLLM batches, each one BlockStored of 16 blocks x 16 tokens,
// the default (vLLM today) encoding with int hashes (u64, mostly >= 2^32 as real hashes are), written to a file
// as [u32 length][payload]... so every publisher (Bun or Node) sends the same bytes.
import { writeFileSync } from "node:fs";
import { encodeBatch } from "../src/index.ts";

export const BLOCKS_PER_BATCH = 16;
export const BLOCK_SIZE = 16;

export function makePayloads(k: number): Uint8Array[] {
  let x = 0x243f6a8885a308d3n;
  const next = () => (x = BigInt.asUintN(64, x * 6364136223846793005n + 1442695040888963407n));
  const out: Uint8Array[] = [];
  for (let i = 0; i < k; i++) {
    const blockHashes = Array.from({ length: BLOCKS_PER_BATCH }, next);
    const tokenIds = Array.from({ length: BLOCKS_PER_BATCH * BLOCK_SIZE }, () => Number(next() % 150_000n));
    out.push(encodeBatch({
      ts: 1_700_000_000 + i / 1000,
      events: [{ type: "BlockStored", blockHashes, parentBlockHash: next(), tokenIds, blockSize: BLOCK_SIZE, loraId: null, medium: "GPU" }],
      dataParallelRank: 0,
    }));
  }
  return out;
}

export function writePayloadFile(path: string, payloads: Uint8Array[]): void {
  const parts: Buffer[] = [];
  for (const p of payloads) {
    const len = Buffer.alloc(4);
    len.writeUInt32BE(p.length);
    parts.push(len, Buffer.from(p));
  }
  writeFileSync(path, Buffer.concat(parts));
}
