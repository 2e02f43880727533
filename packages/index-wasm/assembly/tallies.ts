// What the last batch did (read by the wrapper after applyBatch) and the totals since start.

export let totalRejected: u64 = 0;
export let totalUnknown: u64 = 0;
export let outBlocks: u32 = 0;
export let outUnknown: u32 = 0;
export let outRejected: u32 = 0;
export let outEvents: u32 = 0;
export let lastReject: u32 = 0; // 0 none, 1 unknown parent, 2 hash conflict

export function batchEvents(): u32 { return outEvents; }
export function batchBlocks(): u32 { return outBlocks; }
export function batchUnknown(): u32 { return outUnknown; }
export function batchRejected(): u32 { return outRejected; }
export function lastRejectReason(): u32 { return lastReject; }
export function rejectedTotal(): u64 { return totalRejected; }
export function unknownTotal(): u64 { return totalUnknown; }
