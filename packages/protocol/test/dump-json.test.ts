import { expect, test } from "bun:test";
import {
  DUMP_FIELDS as D, DUMP_JSON_BLOCK, DUMP_JSON_BLOCKS, DUMP_JSON_COPIES, DUMP_JSON_DP_RANK, DUMP_JSON_EVENT_ID, DUMP_JSON_PARENT, DUMP_JSON_TOKENS,
  DUMP_JSON_WORKER,
} from "../src/index.ts";

test("the JSON dump's fragments name DUMP_FIELDS' fields, and put together they make a RouterEvent JSON.parse reads", () => {
  const frag = { DUMP_JSON_WORKER, DUMP_JSON_EVENT_ID, DUMP_JSON_PARENT, DUMP_JSON_BLOCKS, DUMP_JSON_BLOCK, DUMP_JSON_TOKENS, DUMP_JSON_COPIES, DUMP_JSON_DP_RANK };
  expect(frag).toEqual({
    DUMP_JSON_WORKER: `{"${D.workerId}":`,
    DUMP_JSON_EVENT_ID: `,"${D.event}":{"${D.eventId}":`,
    DUMP_JSON_PARENT: `,"${D.data}":{"${D.stored}":{"${D.parentHash}":`,
    DUMP_JSON_BLOCKS: `,"${D.blocks}":[`,
    DUMP_JSON_BLOCK: `{"${D.blockHash}":`,
    DUMP_JSON_TOKENS: `,"${D.tokensHash}":`,
    DUMP_JSON_COPIES: `,"${D.copies}":`,
    DUMP_JSON_DP_RANK: `]}}},"${D.dpRank}":`,
  });
  const block = (h: number, t: number, copies?: number) => `${DUMP_JSON_BLOCK}${h}${DUMP_JSON_TOKENS}${t}${copies === undefined ? "" : DUMP_JSON_COPIES + copies}}`;
  const event = `${DUMP_JSON_WORKER}"w"${DUMP_JSON_EVENT_ID}7${DUMP_JSON_PARENT}null${DUMP_JSON_BLOCKS}${block(1, 2)},${block(3, 4, 0)}${DUMP_JSON_DP_RANK}1}`;
  expect(JSON.parse(event)).toEqual({
    worker_id: "w",
    event: { event_id: 7, data: { stored: { parent_hash: null, blocks: [{ block_hash: 1, tokens_hash: 2 }, { block_hash: 3, tokens_hash: 4, copies: 0 }] } } },
    dp_rank: 1,
  });
});
