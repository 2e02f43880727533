// vLLM's replay protocol (docs/CONTRACTS.md §4), spoken between a DEALER client and a ROUTER server:
//   request:  ["", start_seq (8 B BE)]
//   replies:  ["", topic, seq, payload] (newer vLLM) or ["", seq, payload] (older), one per
//             buffered batch with seq >= start, then an end marker with seq = -1 (8 x 0xFF)
//             and an empty payload.
import { decodeEpoch } from "@kv-epp/protocol";

export const END_SEQ = Buffer.alloc(8, 0xff);

export function encodeSeq(seq: bigint): Buffer {
  const b = Buffer.allocUnsafe(8);
  b.writeBigUInt64BE(BigInt.asUintN(64, seq));
  return b;
}

/** An 8-byte big-endian sequence number, or undefined when the frame is not one. */
export function decodeSeq(b: Uint8Array): bigint | undefined {
  if (b.length !== 8) return undefined;
  const hi = ((b[0]! << 24) | (b[1]! << 16) | (b[2]! << 8) | b[3]!) >>> 0;
  const lo = ((b[4]! << 24) | (b[5]! << 16) | (b[6]! << 8) | b[7]!) >>> 0;
  return (BigInt(hi) << 32n) | BigInt(lo);
}

/**
 * The seq frame of a live message or a replayed batch: vLLM's 8-byte big-endian seq, or the 24-byte
 * seq + publisher epoch of vLLM #57789 (open, not merged: the layout assumed here is the u64 seq first,
 * then the 16-byte epoch, the publisher's lifetime UUID; not verified against a running publisher). The
 * epoch is hex, null when the frame has none.
 */
export function decodeSeqFrame(b: Uint8Array): { seq: bigint; epoch: string | null } | undefined {
  if (b.length === 8) return { seq: decodeSeq(b)!, epoch: null };
  if (b.length !== 24) return undefined;
  return { seq: decodeSeq(b.subarray(0, 8))!, epoch: Buffer.from(b.buffer, b.byteOffset + 8, 16).toString("hex") };
}

const EPOCH_MARKER = Buffer.from("\x00sgl-kv-epoch=", "latin1");
const BARRIER_MARKER = Buffer.from("\x00sgl-kv-snapshot=", "latin1");
/**
 * The publisher epoch a topic frame carries: SGLang, when its publisher serves snapshots, sends every batch under
 * `<topic>\0sgl-kv-epoch=<epoch>` (a snapshot barrier appends `\0sgl-kv-snapshot=<id>` to it, an empty batch in
 * the stream's seq order), its seq frame staying 8 bytes. Null: no epoch in the topic (vLLM; SGLang without
 * snapshots); undefined: a marker with an empty, overlong or non-UTF-8 epoch (malformed). SGLang's replay replies
 * carry no topic: the epoch of a replayed batch is the live stream's.
 */
export function topicEpoch(topic: Uint8Array): string | null | undefined {
  const t = Buffer.from(topic.buffer, topic.byteOffset, topic.byteLength);
  const at = t.indexOf(EPOCH_MARKER);
  if (at < 0) return null;
  const start = at + EPOCH_MARKER.length;
  const barrier = t.indexOf(BARRIER_MARKER, start);
  const end = barrier < 0 ? t.length : barrier;
  return decodeEpoch(t.subarray(start, end)); // SGLang's readers refuse an epoch that is not UTF-8, or too long
}

export type ReplayReply = { kind: "batch"; seq: bigint; epoch: string | null; payload: Buffer } | { kind: "end" };

/** Parses one DEALER-side reply (delimiter included); undefined = malformed. */
export function parseReplayReply(frames: Buffer[]): ReplayReply | undefined {
  if (frames.length < 3 || frames.length > 4 || frames[0]!.length !== 0) return undefined;
  const seqFrame = frames[frames.length - 2]!;
  const payload = frames[frames.length - 1]!;
  if (seqFrame.length === 8 && seqFrame.equals(END_SEQ)) return payload.length === 0 ? { kind: "end" } : undefined;
  const f = decodeSeqFrame(seqFrame);
  return f === undefined ? undefined : { kind: "batch", seq: f.seq, epoch: f.epoch, payload };
}

/** Parses a ROUTER-side request [id, "", start_seq]; undefined = malformed. */
export function parseReplayRequest(frames: Buffer[]): { id: Buffer; start: bigint } | undefined {
  if (frames.length !== 3 || frames[1]!.length !== 0) return undefined;
  const start = decodeSeq(frames[2]!);
  return start === undefined ? undefined : { id: frames[0]!, start };
}
