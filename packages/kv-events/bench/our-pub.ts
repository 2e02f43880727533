// Bench publisher (Bun child): our PubSocket sending [topic, seq, payload] as fast as the
// subscriber drains, pacing on the socket's user-space queue so nothing is dropped.
import { readFileSync } from "node:fs";
import { encodeSeq, PubSocket } from "../src/index.ts";

const [file, totalArg] = process.argv.slice(2);
const total = Number(totalArg);
const raw = readFileSync(file!);
const payloads: Buffer[] = [];
for (let off = 0; off < raw.length;) {
  const n = raw.readUInt32BE(off);
  payloads.push(raw.subarray(off + 4, off + 4 + n));
  off += 4 + n;
}
const pub = new PubSocket({ hwm: 1_000_000 });
const endpoint = await pub.bind("tcp://127.0.1.9:0");
console.log(JSON.stringify({ endpoint }));
while (pub.subscriberCount === 0) await Bun.sleep(5);
await Bun.sleep(200); // the SUBSCRIBE follows READY; let it land
const topic = Buffer.from("kv");
let seq = 0;
const tick = () => new Promise((r) => setImmediate(r));
while (seq < total) {
  if (pub.maxQueued > 2000) {
    await tick();
    continue;
  }
  for (let k = 0; k < 256 && seq < total; k++, seq++) pub.send([topic, encodeSeq(BigInt(seq)), payloads[seq % payloads.length]!]);
  await tick();
}
while (pub.maxQueued > 0) await tick();
await Bun.sleep(500);
await pub.close();
