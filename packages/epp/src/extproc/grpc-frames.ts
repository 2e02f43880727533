// gRPC's length-prefixed message framing (flag byte, u32 BE length, message), for the clients that speak gRPC on
// node:http2 without a gRPC library: ExtProcClient, and the bench's generator and floor server.

/** One uncompressed message. */
export function framed(msg: Uint8Array): Buffer {
  const out = Buffer.allocUnsafe(5 + msg.length);
  out[0] = 0;
  out.writeUInt32BE(msg.length, 1);
  out.set(msg, 5);
  return out;
}

/** Splits a stream's chunks into messages, handing each to `onMessage` until it returns false. */
export function messageReader(onMessage: (msg: Buffer) => boolean): (chunk: Buffer) => void {
  let pending: Buffer | undefined;
  let reading = true;
  return (chunk) => {
    if (!reading) return;
    let buf = pending ? Buffer.concat([pending, chunk]) : chunk;
    while (reading && buf.length >= 5) {
      const len = buf.readUInt32BE(1);
      if (buf.length < 5 + len) break;
      reading = onMessage(buf.subarray(5, 5 + len));
      buf = buf.subarray(5 + len);
    }
    pending = buf.length > 0 ? buf : undefined;
  };
}
