// ZMTP 3.x wire pieces (ZeroMQ RFC 23 / RFC 37): greeting, frame headers, commands, metadata.
//
// greeting (64 B): 0xFF, 8 x 0x00, 0x7F, major=3, minor, mechanism "NULL" padded to 20 B,
//                  as-server (1 B), 31 x 0x00
// frame:           flags (bit0 MORE, bit1 LONG, bit2 COMMAND), size (1 B, or 8 B BE if LONG), body
// command body:    name-size (1 B), name, data
// READY data:      properties: name-size (1 B), name, value-size (4 B BE), value
// 3.1 commands:    SUBSCRIBE <prefix>, CANCEL <prefix>, PING <ttl 2 B><context 0..16 B>, PONG <context>

export const GREETING_SIZE = 64;
export const FLAG_MORE = 0x01;
export const FLAG_LONG = 0x02;
export const FLAG_COMMAND = 0x04;

export type SocketType = "PUB" | "SUB" | "XPUB" | "XSUB" | "ROUTER" | "DEALER" | "REQ" | "REP" | "PAIR" | "PUSH" | "PULL";

const COMPATIBLE: Record<string, readonly string[]> = {
  PUB: ["SUB", "XSUB"],
  SUB: ["PUB", "XPUB"],
  ROUTER: ["DEALER", "REQ", "ROUTER"],
  DEALER: ["ROUTER", "REP", "DEALER"],
};

export function compatible(ours: SocketType, peer: string): boolean {
  return COMPATIBLE[ours]?.includes(peer) ?? false;
}

export function encodeGreeting(minor: number, asServer: boolean): Buffer {
  const g = Buffer.alloc(GREETING_SIZE);
  g[0] = 0xff;
  g[9] = 0x7f;
  g[10] = 3;
  g[11] = minor;
  g.write("NULL", 12, "latin1");
  g[32] = asServer ? 1 : 0;
  return g;
}

export type Greeting = { major: number; minor: number; mechanism: string };

/** The peer greeting, or an error string when it is not ZMTP 3.x with NULL security. */
export function parseGreeting(b: Uint8Array): Greeting | string {
  if (b[0] !== 0xff || (b[9]! & 0x01) !== 1) return "bad signature";
  const major = b[10]!;
  if (major < 3) return `unsupported ZMTP major version ${major}`;
  let end = 12;
  while (end < 32 && b[end] !== 0) end++;
  const mechanism = Buffer.from(b.buffer, b.byteOffset + 12, end - 12).toString("latin1");
  if (mechanism !== "NULL") return `unsupported mechanism ${JSON.stringify(mechanism)}`;
  return { major, minor: b[11]!, mechanism };
}

/** Header bytes for a frame of `size` bytes. */
export function frameHeaderSize(size: number): number {
  return size > 255 ? 9 : 2;
}

/** Writes a frame header at `off` in `out`; returns the offset after it. */
export function writeFrameHeader(out: Uint8Array, off: number, flags: number, size: number): number {
  if (size > 255) {
    out[off] = flags | FLAG_LONG;
    // Sizes stay below 2^53; split in two u32 writes to avoid BigInt on the hot path.
    const hi = Math.floor(size / 0x100000000);
    const lo = size >>> 0;
    out[off + 1] = hi >>> 24; out[off + 2] = (hi >>> 16) & 0xff; out[off + 3] = (hi >>> 8) & 0xff; out[off + 4] = hi & 0xff;
    out[off + 5] = lo >>> 24; out[off + 6] = (lo >>> 16) & 0xff; out[off + 7] = (lo >>> 8) & 0xff; out[off + 8] = lo & 0xff;
    return off + 9;
  }
  out[off] = flags;
  out[off + 1] = size;
  return off + 2;
}

/** One contiguous buffer holding all frames of a message (one write per message). */
export function encodeMessage(frames: readonly Uint8Array[]): Buffer {
  let total = 0;
  for (const f of frames) total += frameHeaderSize(f.length) + f.length;
  const out = Buffer.allocUnsafe(total);
  let off = 0;
  const last = frames.length - 1;
  for (let i = 0; i <= last; i++) {
    const f = frames[i]!;
    off = writeFrameHeader(out, off, i < last ? FLAG_MORE : 0, f.length);
    out.set(f, off);
    off += f.length;
  }
  return out;
}

export function encodeCommand(name: string, data: Uint8Array = EMPTY): Buffer {
  const body = Buffer.allocUnsafe(1 + name.length + data.length);
  body[0] = name.length;
  body.write(name, 1, "latin1");
  body.set(data, 1 + name.length);
  const out = Buffer.allocUnsafe(frameHeaderSize(body.length) + body.length);
  const off = writeFrameHeader(out, 0, FLAG_COMMAND, body.length);
  out.set(body, off);
  return out;
}

export const EMPTY = new Uint8Array(0);

export function encodeReady(socketType: SocketType, identity?: Uint8Array): Buffer {
  const props: [string, Uint8Array][] = [["Socket-Type", Buffer.from(socketType, "latin1")]];
  if (identity !== undefined) props.push(["Identity", identity]);
  let size = 0;
  for (const [k, v] of props) size += 1 + k.length + 4 + v.length;
  const data = Buffer.allocUnsafe(size);
  let off = 0;
  for (const [k, v] of props) {
    data[off] = k.length;
    data.write(k, off + 1, "latin1");
    off += 1 + k.length;
    data.writeUInt32BE(v.length, off);
    data.set(v, off + 4);
    off += 4 + v.length;
  }
  return encodeCommand("READY", data);
}

export type Command = { name: string; data: Buffer };

export function parseCommand(body: Buffer): Command | undefined {
  if (body.length < 1) return undefined;
  const n = body[0]!;
  if (1 + n > body.length) return undefined;
  return { name: body.toString("latin1", 1, 1 + n), data: body.subarray(1 + n) };
}

/** READY / property metadata; property names are case-insensitive (RFC 23). */
export function parseMetadata(data: Buffer): Map<string, Buffer> | undefined {
  const out = new Map<string, Buffer>();
  let off = 0;
  while (off < data.length) {
    const n = data[off]!;
    if (off + 1 + n + 4 > data.length) return undefined;
    const name = data.toString("latin1", off + 1, off + 1 + n).toLowerCase();
    off += 1 + n;
    const len = data.readUInt32BE(off);
    off += 4;
    if (off + len > data.length) return undefined;
    out.set(name, data.subarray(off, off + len));
    off += len;
  }
  return out;
}
